"""A module holding only some tileable ops of another, so one tile group can be searched alone.

The rest of the function is cut away at the group's boundary: every tensor the group reads from
an op outside it becomes a new function argument, and where an outside op read a group result a
call to an external declaration reads it instead, at the same place: a producer the group fuses
but an outside consumer still needs stays live (or is yielded by the loop) exactly as in the
whole module. `ts.uid` tags survive (the clone keeps attributes), so a plan
for the group applies to the extract unchanged, and its loop nests are the same nests the whole
module would get: the cost model prices each nest on its own, so the group's share of the whole
module's latency is the extract's latency.

Constants and static `tensor.empty` ops the group uses come along (they are not data, and an
empty init read from memory would be charged as traffic). Original arguments stay in place,
unused ones included, so `argN` shape hints still name the same tensors.
"""

from __future__ import annotations

from .graph import holder_in, uid_of, walk_ops
from .mlir import context, ir

# Ops with no data of their own: cloned into the extract rather than passed in as arguments.
_FREE_OPS = ("arith.constant", "tensor.empty")


class NotExtractable(Exception):
    """Why the ops cannot be searched on their own (the search then uses the whole module)."""


def _function_of(module: ir.OpView, uids: set[int]):
    found = []
    for op in module.regions[0].blocks[0].operations:
        if op.operation.name != "func.func" or not op.regions[0].blocks:
            continue
        top = [uid_of(o.operation) for o in op.regions[0].blocks[0].operations]
        if uids & set(top):
            found.append(op)
        if uids - set(top) and any(u in uids for u in top):
            raise NotExtractable("some of the ops are nested in regions, not in the function body")
    if not found:
        raise NotExtractable("the ops are nested in loops or other regions, not in a function body")
    if len(found) != 1:
        raise NotExtractable(f"the ops live in {len(found)} functions, not one")
    return found[0]


def extract_ops(tagged: ir.OpView, uids: set[int]) -> ir.OpView:
    """A new module with the ops tagged `uids` (one function's top-level ops) and what they need.

    Raises NotExtractable when that cannot be done faithfully: ops spread over functions or
    nested in regions, or a boundary tensor whose shape is dynamic (its extent would be lost
    with its producer).
    """
    with context():
        clone = tagged.operation.clone()
        try:
            _cut(clone, uids)
            clone.operation.verify()
        except NotExtractable:
            clone.operation.erase()
            raise
        except ir.MLIRError as err:  # a cut the verifier rejects: search the whole module instead
            clone.operation.erase()
            raise NotExtractable(f"the extract does not verify: {err}") from None
        return clone


def _inputs(ops: list, position: dict) -> list[set[int]]:
    """For each top-level op, the top-level ops whose results it (or an op nested in it) reads."""
    out = []
    for i, op in enumerate(ops):
        found = set()
        for inner in walk_ops(op.operation):
            for v in inner.operands:
                if isinstance(v, ir.OpResult):
                    j = position.get(holder_in(v.owner.operation, position))
                    if j is not None and j != i:
                        found.add(j)
        out.append(found)
    return out


def _reject_fusion_through_untileable_ops(ops: list, inputs: list[set[int]], keep: set[int]) -> None:
    """A group fused through ops without a tile (transpose -> collapse_shape -> matmul) is tiled
    with rewrite patterns (bubble_up_extract_slice) applied to whole functions: they rewrite the
    other groups' nests too, so the rest of the module is not constant across the group's plans
    and the extract would not score like the module."""
    after = set(keep)  # reached from a kept op (program order: producers come first)
    for i in range(len(ops)):
        if i not in after and inputs[i] & after:
            after.add(i)
    before = set(keep)  # reaching a kept op
    for i in reversed(range(len(ops))):
        if i in before:
            before |= inputs[i]
    between = {i for i in (after & before) - keep if uid_of(ops[i].operation) is None}
    if between:
        names = sorted({ops[i].operation.name for i in between})
        raise NotExtractable(f"the group is fused through {', '.join(names)}, whose tiling rewrites the whole function")


def _cut(module: ir.OpView, uids: set[int]) -> None:
    func = _function_of(module, uids)
    block = func.regions[0].blocks[0]
    ops = list(block.operations)
    position = {op.operation: i for i, op in enumerate(ops)}
    keep = {i for i, op in enumerate(ops) if uid_of(op.operation) in uids}
    if {uid_of(ops[i].operation) for i in keep} != uids:
        raise NotExtractable("some of the ops are not in the function body")
    inputs = _inputs(ops, position)
    _reject_fusion_through_untileable_ops(ops, inputs, keep)
    # Free producers of the kept ops, operands of nested ops (captured constants) included.
    stack = sorted(keep)
    while stack:
        for j in inputs[stack.pop()]:
            if j not in keep and ops[j].operation.name in _FREE_OPS and not list(ops[j].operands):
                keep.add(j)
                stack.append(j)
    ret = ops[-1]
    if ret.operation.name != "func.return":
        raise NotExtractable("the function does not end in func.return")
    last = len(ops) - 1
    data_ops = {i for i in keep if ops[i].operation.name not in _FREE_OPS}
    # Outside ops reading the group's data, located before anything is rewritten (below).
    outside_reads = []
    for j, op in enumerate(ops[:-1]):
        if j in keep:
            continue
        used = []
        for v in op.operands:
            if isinstance(v, ir.OpResult) and position.get(holder_in(v.owner.operation, position)) in data_ops and v not in used:
                used.append(v)
        if used:
            outside_reads.append((j, used))

    # Tensors entering the group (or returned from outside it) become new arguments. Every use
    # is located before any is rewritten: setting an operand changes the op's hash in these
    # bindings, so `position` lookups after a rewrite would miss it.
    loc = ir.Location.unknown()
    entering = []
    for i, op in enumerate(ops[:-1]):
        if i in keep:
            continue
        for r in op.results:
            uses = [(u, position.get(holder_in(u.owner.operation, position))) for u in r.uses]
            inside = [u for u, j in uses if j in keep or j == last]
            if not inside:
                continue
            if isinstance(r.type, ir.ShapedType) and not ir.ShapedType(r.type).has_static_shape:
                raise NotExtractable(f"a dynamically shaped tensor from {op.operation.name} enters the group")
            entering.append((r.type, [(u.owner, u.operand_number) for u in inside]))
    for value_type, uses in entering:
        arg = block.add_argument(value_type, loc)
        for owner, operand in uses:
            owner.operands[operand] = arg
    # Group results read outside it stay read at the same place, by a call the cost model does
    # not price: fusion keeps (or yields) a producer depending on where its other users are.
    module_body = module.regions[0].blocks[0]
    for j, used in outside_reads:
        op = ops[j]
        callee = f"__tilesearch_outside_use_{j}"
        with ir.InsertionPoint(module_body):  # a declaration: one empty region, no body
            ir.Operation.create(
                "func.func", regions=1, loc=loc,
                attributes={"sym_name": ir.StringAttr.get(callee), "sym_visibility": ir.StringAttr.get("private"),
                            "function_type": ir.TypeAttr.get(ir.FunctionType.get([v.type for v in used], []))},
            )
        with ir.InsertionPoint(op):
            ir.Operation.create("func.call", operands=used, loc=loc,
                                attributes={"callee": ir.FlatSymbolRefAttr.get(callee)})
    for i in reversed(range(last)):
        if i not in keep:
            ops[i].operation.erase()
    func_type = ir.FunctionType.get([a.type for a in block.arguments], [v.type for v in ret.operands])
    func.operation.attributes["function_type"] = ir.TypeAttr.get(func_type)
    if "arg_attrs" in func.operation.attributes:  # sized for the old signature
        del func.operation.attributes["arg_attrs"]
    _declare_other_functions(module, func, loc)


def _declare_other_functions(module: ir.OpView, kept, loc: ir.Location) -> None:
    """Every other function becomes a declaration of itself: its ops belong to the rest of the
    module (priced once, at the search context), and calls to it stay valid."""
    body = module.regions[0].blocks[0]
    for op in list(body.operations):
        if op.operation.name != "func.func" or op.operation == kept.operation or not op.regions[0].blocks:
            continue
        attrs = op.operation.attributes
        with ir.InsertionPoint(body):
            ir.Operation.create(
                "func.func", regions=1, loc=loc,
                attributes={"sym_name": attrs["sym_name"], "function_type": attrs["function_type"],
                            "sym_visibility": ir.StringAttr.get("private")},
            )
        op.operation.erase()

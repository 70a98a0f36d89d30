"""Structural fingerprints: equal for modules that differ only in SSA names, func symbol names,
locations or attribute order; different when any op, shape, element type, indexing map,
iterator type or region body differs.

The normal form is MLIR's own: the printer renames SSA values by position, attribute
dictionaries are sorted, locations are omitted; we additionally rename funcs by position and
drop tilesearch's own `ts.*` tags.
"""

from __future__ import annotations

import hashlib

from .mlir import attribute_names, context, ir

_OWN_ATTR_PREFIX = "ts."


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _strip_own_attrs(root: ir.Operation) -> None:
    def visit(op: ir.Operation) -> ir.WalkResult:
        for name in [n for n in attribute_names(op) if n.startswith(_OWN_ATTR_PREFIX)]:
            del op.attributes[name]
        return ir.WalkResult.ADVANCE

    root.walk(visit)


def _rename_funcs(module_op: ir.Operation) -> None:
    """Give every top-level symbol a positional name and update its uses."""
    body = module_op.regions[0].blocks[0]
    for index, op in enumerate(body.operations):
        if "sym_name" not in op.operation.attributes:
            continue
        old = ir.StringAttr(op.operation.attributes["sym_name"]).value
        new = f"s{index}"
        ir.SymbolTable.replace_all_symbol_uses(old, new, module_op)
        ir.SymbolTable.set_symbol_name(op.operation, new)


def normal_form(module: ir.Module | ir.OpView) -> str:
    """The module's canonical text: generic form, positional names, no locations or ts.* tags."""
    with context():
        clone = module.operation.clone()
        _strip_own_attrs(clone.operation)
        _rename_funcs(clone.operation)
        return clone.operation.get_asm(
            print_generic_op_form=True, enable_debug_info=False, assume_verified=True
        )


def module_fingerprint(module: ir.Module | ir.OpView) -> str:
    return _digest(normal_form(module))


def op_signature(op: ir.Operation) -> str:
    """A structural signature of one op, independent of where it stands and what it is called.

    Printed alone in generic form with a local scope, an op's operands defined outside it print
    as placeholders, so two ops with the same name, types, attributes and body get one
    signature wherever they are. Values captured from outside (a constant in a linalg body) are
    included by their defining op so relu(x, 0) and max(x, -inf) differ.
    """
    with context():
        clone = op.clone()
        try:
            _strip_own_attrs(clone.operation)
            text = clone.operation.get_asm(
                print_generic_op_form=True,
                enable_debug_info=False,
                use_local_scope=True,
                assume_verified=True,
            )
            captured = [
                v.owner.get_asm(print_generic_op_form=True, enable_debug_info=False, use_local_scope=True)
                for v in _captured_values(op)
                if not isinstance(v, ir.BlockArgument) and v.owner.name == "arith.constant"
            ]
        finally:
            clone.operation.erase()
    return _digest(text + "\n".join(captured))[:32]


def _captured_values(op: ir.Operation) -> list[ir.Value]:
    """Values used inside `op`'s regions but defined outside them."""
    inside: set = set()
    used: list[ir.Value] = []

    def visit(inner: ir.Operation) -> ir.WalkResult:
        if inner == op:
            return ir.WalkResult.ADVANCE
        for r in inner.results:
            inside.add(r)
        for region in inner.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    inside.add(arg)
        used.extend(inner.operands)
        return ir.WalkResult.ADVANCE

    for region in op.regions:
        for block in region.blocks:
            for arg in block.arguments:
                inside.add(arg)
    op.walk(visit, ir.WalkOrder.PRE_ORDER)
    return [v for v in used if v not in inside]

"""IREE's dispatches of a whole model, each as a plain module over tensors that the search takes.

Input: what `iree-compile --compile-to=executable-sources` prints for the model: the host
program (its `stream.cmd.dispatch` ops say which dispatch runs how often, with the model's
`--compile-to=flow` program for the trips of loops around them) and one
`hal.executable` per unique dispatch, whose function reads its operands through
`iree_tensor_ext.dispatch.tensor.load` and writes through `...tensor.store`. Each dispatch
function is cloned into a module of its own and rewritten, with the bindings, into
`func.func @name(tensor operands...) -> (stored tensors...)`: loads become arguments, stores
become the returned values, and the binding plumbing left dead is erased. A load that steps
over elements (a stride-2 convolution's input, as the matmul_like dispatch of a 1x1 one reads
it) becomes a strided `tensor.extract_slice` of the whole tensor, not a dense argument: its
elements are not contiguous, and the cost model and IREE must both see that. Its ops (the root and
whatever IREE fused around it) are untouched, so the search sees exactly what IREE will compile.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .errors import NotAModelError
from .mlir import attribute_names, context, func, ir, tensor
from .parse import parse_module

_LOAD = "iree_tensor_ext.dispatch.tensor.load"
_STORE = "iree_tensor_ext.dispatch.tensor.store"
_DISPATCH = "stream.cmd.dispatch"
# Ops that only compute binding offsets or push constants: erased once nothing reads them.
_PLUMBING_DIALECTS = ("hal.", "util.", "arith.", "iree_tensor_ext.")


@dataclass(frozen=True)
class Dispatch:
    """One unique dispatch of the model."""

    executable: str  # the hal.executable's symbol
    entry: str  # the exported function's symbol (IREE names it after the root: ..._matmul_64x768x768_f32)
    weight: int  # how many times one run of the model dispatches it
    module: str | None  # the dispatch as a plain module over tensors, or None with `reason`
    reason: str | None = None
    dynamic: bool = False  # it reads sizes or offsets at run time (a model exported with dynamic dims)


def _ops(block: ir.Block) -> list[ir.Operation]:
    return [op.operation for op in block.operations]


def _named(block: ir.Block, name: str) -> list[ir.Operation]:
    return [op for op in _ops(block) if op.name == name]


def dispatch_counts(program: ir.Module) -> Counter[str]:
    """How often the host program dispatches each entry point (`@exe::@variant::@entry`)."""
    counts: Counter[str] = Counter()

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == _DISPATCH:
            for entry in ir.ArrayAttr(op.attributes["entry_points"]):
                counts[str(ir.SymbolRefAttr(entry))] += 1
        return ir.WalkResult.ADVANCE

    program.operation.walk(visit)
    return counts


def _static_trip_count(loop: ir.Operation) -> int | None:
    """An scf.for's trips when its bounds and step are constants, else None."""
    bounds = []
    for value in list(loop.operands)[:3]:
        owner = value.owner
        if not isinstance(owner, ir.Operation) and hasattr(owner, "operation"):
            owner = owner.operation
        if not isinstance(owner, ir.Operation) or owner.name != "arith.constant":
            return None
        bounds.append(ir.IntegerAttr(owner.attributes["value"]).value)
    lower, upper, step = bounds
    return max(0, -(-(upper - lower) // step)) if step > 0 else None


def loop_dispatch_counts(flow_program: ir.Module) -> tuple[Counter[str], Counter[str]]:
    """Per `@executable::@entry` of a flow-level program (`--compile-to=flow`, where a model's
    loops are still scf.for: a GRU's time steps): its dispatch sites, and its runs per model run,
    each site counted once per trip of the loops around it (once for a loop whose trip count is
    not a constant)."""
    sites: Counter[str] = Counter()
    runs: Counter[str] = Counter()

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "flow.dispatch":
            trips, parent = 1, op.parent
            while parent is not None and parent.name != "builtin.module":
                if parent.name == "scf.for":
                    trips *= _static_trip_count(parent) or 1
                parent = parent.parent
            for entry in ir.ArrayAttr(op.attributes["entry_points"]):
                sites[str(ir.SymbolRefAttr(entry))] += 1
                runs[str(ir.SymbolRefAttr(entry))] += trips
        return ir.WalkResult.ADVANCE

    flow_program.operation.walk(visit)
    return sites, runs


def _dispatch_function(executable: ir.Operation) -> ir.Operation | None:
    for variant in _named(executable.regions[0].blocks[0], "hal.executable.variant"):
        for inner in _named(variant.regions[0].blocks[0], "builtin.module"):
            functions = _named(inner.regions[0].blocks[0], "func.func")
            if len(functions) == 1:
                return functions[0]
    return None


def _erase_dead_plumbing(block: ir.Block) -> None:
    changed = True
    while changed:
        changed = False
        for op in reversed(_ops(block)):
            if (op.name.startswith(_PLUMBING_DIALECTS) and len(op.regions) == 0 and len(op.results) > 0
                    and all(len(list(r.uses)) == 0 for r in op.results)):
                op.erase()
                changed = True


def _strided_source(load: ir.Operation) -> ir.RankedTensorType | None:
    """The whole tensor a load reads with static offsets, sizes and strides, one stride not 1;
    None for any other load (those read a dense tile, which the argument's own type says)."""
    strides = list(ir.DenseI64ArrayAttr(load.attributes["static_strides"]))
    dynamic = list(ir.DenseI32ArrayAttr(load.attributes["operandSegmentSizes"]))[1:]
    if all(s == 1 for s in strides) or any(dynamic):
        return None
    # The binding's type, !iree_tensor_ext.dispatch.tensor<readonly:tensor<...>>, has no Python
    # binding: its tensor type is parsed from what MLIR prints for it.
    printed = str(load.operands[0].type)
    inner = printed[printed.find(":") + 1:printed.rfind(">")]
    try:
        return ir.RankedTensorType(ir.Type.parse(inner))
    except (ValueError, TypeError):
        return None


def _as_argument(block: ir.Block, load: ir.Operation) -> None:
    """Replace a load with a new argument of the function (through a strided slice of the whole
    tensor where the load steps over elements)."""
    source = _strided_source(load)
    if source is None:
        load.results[0].replace_all_uses_with(block.add_argument(load.results[0].type, load.location))
    else:
        whole = block.add_argument(source, load.location)
        with ir.InsertionPoint(load), load.location:
            sliced = tensor.ExtractSliceOp(
                load.results[0].type, whole, [], [], [],
                *(ir.DenseI64ArrayAttr(load.attributes[a]) for a in ("static_offsets", "static_sizes", "static_strides")))
        load.results[0].replace_all_uses_with(sliced.result)
    load.erase()


def _is_elided(op: ir.Operation) -> bool:
    """A constant the model was read back without (MLIR prints an elided one as a resource of
    this name, numbered after the first in a context): the dispatch cannot be compiled or
    measured on its own."""
    return op.name == "arith.constant" and str(op.attributes["value"]).startswith("dense_resource<__elided__")


def _run_time_reads(block: ir.Block) -> list[str]:
    """The ops of a dispatch over tensors that still read IREE's interface at run time (sizes,
    offsets): what a dynamic dispatch keeps."""
    return sorted({op.name for op in _ops(block) if op.name.startswith(("hal.", "iree_tensor_ext."))})


def as_tensor_function(dispatch_function: ir.Operation) -> tuple[ir.Module, str | None]:
    """A new module holding the dispatch function over tensors, and why it cannot be searched
    (None when it can). Runs inside the process's context."""
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        clone = dispatch_function.clone()
    block = clone.regions[0].blocks[0]
    stored: list[ir.Value] = []
    for op in _ops(block):
        if op.name == _LOAD:
            _as_argument(block, op)
        elif op.name == _STORE:
            stored.append(op.operands[0])
            op.erase()
    for op in _named(block, "func.return"):
        with ir.InsertionPoint(op), op.location:
            func.ReturnOp(stored)
        op.erase()
    _erase_dead_plumbing(block)
    clone.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get([a.type for a in block.arguments], [v.type for v in stored]))
    for name in [n for n in attribute_names(clone) if n not in ("sym_name", "function_type")]:
        del clone.attributes[name]
    left = _run_time_reads(block)
    if left:
        return module, (f"dynamic: the dispatch reads sizes or offsets at run time ({', '.join(left)}); "
                        "give the model's dynamic inputs their sizes (`--shape-hint argN=AxB` on the CLI, "
                        '"shape_hints" in a job request) or export it with static shapes to tune it')
    if not stored:
        return module, "writes no tensor"
    if any(_is_elided(op) for op in _ops(block)):
        return module, "holds a constant too large to read back with the model (elided): left to IREE"
    if not module.operation.verify():
        return module, "the dispatch over tensors does not verify"
    return module, None


def dispatches_of(executable_sources: str, flow_program: str | None = None) -> list[Dispatch]:
    """Every unique dispatch of a model, weighted by how often the model runs it. The host
    program of the executable sources has its loops lowered to branches, so it counts dispatch
    sites; `flow_program` (the same model at `--compile-to=flow`) multiplies a dispatch's sites
    by the trips of the loops around them, where its sites are the same ones."""
    program = parse_module(executable_sources)
    flow = parse_module(flow_program) if flow_program is not None else None
    with context(), ir.Location.unknown():
        counts = dispatch_counts(program)
        flow_sites, flow_runs = loop_dispatch_counts(flow) if flow is not None else (Counter(), Counter())
        executables = _named(program.body, "hal.executable")
        if not executables:
            raise NotAModelError("no hal.executable in the input: expected the output of "
                                 "`iree-compile --compile-to=executable-sources` for a model")
        out = []
        for executable in executables:
            name = ir.StringAttr(executable.attributes["sym_name"]).value
            function = _dispatch_function(executable)
            if function is None:
                out.append(Dispatch(name, name, 0, None, "not one function in one variant"))
                continue
            entry = ir.StringAttr(function.attributes["sym_name"]).value
            weight = sum(n for ref, n in counts.items() if ref.startswith(f"@{name}::") and ref.endswith(f"::@{entry}"))
            if weight and flow_sites[f"@{name}::@{entry}"] == weight:
                weight = flow_runs[f"@{name}::@{entry}"]
            module, reason = as_tensor_function(function)
            dynamic = bool(_run_time_reads(module.body.operations[0].regions[0].blocks[0]))
            out.append(Dispatch(name, entry, weight, str(module), reason, dynamic))
        return out

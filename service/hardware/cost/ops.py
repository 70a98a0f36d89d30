"""What the cost model asks of single ops and values: names, tensor types, destinations."""

from __future__ import annotations

from service.ir.mlir import ir

DYNAMIC = ir.ShapedType.get_dynamic_size()
# Extent assumed for a dynamic dim nothing sizes (no shape hint, no static bound in the IR).
DEFAULT_DYNAMIC_EXTENT = 128
LOOP_OPS = ("scf.forall", "scf.for")

# Affine ops whose offset is one affine map of their operands (others, e.g. delinearize_index,
# have no `map` and several results).
AFFINE_MAP_OPS = ("affine.apply", "affine.min", "affine.max")

# Values that hold no data in memory: an operand made by them is not a read.
NO_DATA_OPS = ("tensor.empty",)

# TilingInterface ops outside linalg: data movement the cost model prices like a copy (no flops;
# every element read and written), tiled or not.
TENSOR_TILEABLE = ("tensor.pad", "tensor.concat")


def opname(op) -> str:
    # OpViews shadow `.name` (func.func returns its symbol); the Operation has the op name.
    return op.operation.name


def op_name_of(v: ir.Value) -> str:
    return opname(v.owner) if isinstance(v, ir.OpResult) else "a block argument"


def ranked(value: ir.Value) -> ir.RankedTensorType | None:
    t = value.type
    return t if isinstance(t, ir.RankedTensorType) else None


def element_bytes(t: ir.ShapedType) -> int:
    et = t.element_type
    if isinstance(et, ir.IndexType):
        return 8
    try:
        return max(1, et.width // 8)
    except AttributeError:
        return 4


def is_tileable(op) -> bool:
    name = opname(op)
    return (name.startswith("linalg.") and name not in ("linalg.yield", "linalg.index")) or name in TENSOR_TILEABLE


def body_ops(op, region: int = 0) -> list:
    if not op.regions or not op.regions[region].blocks:
        return []
    return list(op.regions[region].blocks[0].operations)


def through_slices(v: ir.Value) -> ir.Value:
    while isinstance(v, ir.OpResult) and opname(v.owner) == "tensor.extract_slice":
        v = v.owner.operands[0]
    return v


def dps_inits(op) -> list[ir.Value]:
    """The destination operands of a destination-style op or loop (iter_args, shared_outs)."""
    if opname(op) == "scf.for":
        return list(op.operands)[3:]
    if opname(op) == "scf.forall":
        return list(op.opview.outputs)
    n_out = len(op.results)
    return list(op.operands)[-n_out:] if n_out else []

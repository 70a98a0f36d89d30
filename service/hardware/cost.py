"""Analytical memory/latency cost model over a TILED CLONE (the module a plan produced).

Each top-level scf.forall / scf.for nest in the function body, and each tileable op standing
alone, is a *nest*. A nest is a tree of loop nodes; the root is a pseudo-node (one iteration,
depth 0) whose "iteration" is the whole nest. For each node we know its trip count, the slices
its body reads (tensor.extract_slice) and writes (insert_slice / parallel_insert_slice), the
linalg ops computed there and the nested loops.

- Footprint of one iteration of a node = data brought in from outside the node (deduplicated,
  union over inner loops) + the peak of intermediates live at once in its body (real program
  order, destination-passing ops reuse their dying init) -- not a max over ops (seed 000 TODO).
- Traffic into a level of capacity C: walk down the tree to the shallowest node whose one
  iteration fits C; from there, every slice from outside is fetched once per iteration in which
  it changes (invariant slices stay resident across iterations), times the enclosing trips.
- Latency of a nest = max(compute, traffic_l / bandwidth_l for every level) + loop overheads,
  with scf.forall iterations spread over cores in waves. Module latency = sum over nests.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from itertools import count

from pydantic import BaseModel, Field

from service.ir.graph import holder_in
from service.ir.hints import hint_for
from service.ir.mlir import context, ir, linalg
from service.ir.origin import loop_group

from .model import HardwareModel

log = logging.getLogger(__name__)

DYNAMIC = ir.ShapedType.get_dynamic_size()
DEFAULT_DYNAMIC_EXTENT = 128
# Part of every decision key: a stored decision is served only under the model that chose it.
# Bump on any change that moves a plan's predicted cost.
# 2: under two plan levels or more the plan chooses the register tile (_plan_chose_vector_tile).
# 3: two rows of B never overflow the register file (_microkernel_efficiency).
COST_MODEL_VERSION = "cost-model/3"
UID_ATTR = "ts.uid"
LOOP_OPS = ("scf.forall", "scf.for")
# Ops whose results are views or metadata: no data moves, no flops.
FREE_OPS = {"tensor.empty", "arith.constant", "tensor.dim", "tensor.expand_shape", "tensor.collapse_shape", "func.return"}
# Body ops that are not arithmetic.
NON_FLOP_BODY_OPS = {"linalg.yield", "linalg.index", "arith.constant", "arith.index_cast"}


# --- output ------------------------------------------------------------------------------------

class LevelCost(BaseModel):
    name: str
    footprint_bytes: int = Field(description="Largest live set assigned to this level (one iteration of the loop depth meant for it).")
    traffic_bytes: int = Field(description="Bytes this level serves to the next inner level (innermost: to the compute units).")
    capacity_bytes: int
    time_s: float = 0.0


class NestCost(BaseModel):
    root_op: str
    uids: list[int]
    loops: list[dict] = Field(description="Loop nodes: depth, kind, trips, footprint_bytes.")
    latency_s: float
    compute_s: float
    overhead_s: float
    bound_by: str
    flops: float
    flops_by_uid: dict[int, float] = Field(default_factory=dict)
    active_cores: int
    waves: int
    levels: list[LevelCost]
    reasons: list[str] = Field(default_factory=list, description="This nest's share of Cost.reasons.")


class Cost(BaseModel):
    hardware: str
    hardware_hash: str
    latency_s: float
    feasible: bool
    reasons: list[str] = Field(default_factory=list, description="Why infeasible (empty when feasible).")
    notes: list[str] = Field(default_factory=list, description="Soft findings: cache overflows, defaulted dynamic dims.")
    bound_by: str
    levels: list[LevelCost]
    flops: float
    recompute_flops: float
    unfused_intermediate_bytes: int = 0
    nests: list[NestCost]


# --- IR walking helpers ------------------------------------------------------------------------

# Affine ops whose offset is one affine map of their operands (others, e.g. delinearize_index,
# have no `map` and several results).
_AFFINE_MAP_OPS = ("affine.apply", "affine.min", "affine.max")


def _opname(op) -> str:
    # OpViews shadow `.name` (func.func returns its symbol); the Operation has the op name.
    return op.operation.name


def _ranked(value: ir.Value) -> ir.RankedTensorType | None:
    t = value.type
    return t if isinstance(t, ir.RankedTensorType) else None


def _element_bytes(t: ir.ShapedType) -> int:
    et = t.element_type
    if isinstance(et, ir.IndexType):
        return 8
    try:
        return max(1, et.width // 8)
    except AttributeError:
        return 4


def _uid(op) -> int | None:
    attrs = op.attributes
    if UID_ATTR in attrs:
        return ir.IntegerAttr(attrs[UID_ATTR]).value
    return None


# Values that hold no data in memory: an operand made by them is not a read.
_NO_DATA_OPS = ("tensor.empty",)

# TilingInterface ops outside linalg: data movement the cost model prices like a copy (no flops;
# every element read and written), tiled or not.
_TENSOR_TILEABLE = ("tensor.pad", "tensor.concat")


def _is_tileable(op) -> bool:
    name = _opname(op)
    return (name.startswith("linalg.") and name not in ("linalg.yield", "linalg.index")) or name in _TENSOR_TILEABLE


def _body_ops(op, region: int = 0) -> list:
    if not op.regions or not op.regions[region].blocks:
        return []
    return list(op.regions[region].blocks[0].operations)


@dataclass
class Slice:
    """One read or write of a tile of a tensor defined outside the node that holds it."""

    key: tuple
    source: ir.Value  # resolved through loop-carried block args
    bytes: int
    source_bytes: int
    deps: frozenset[int]  # ids of loop nodes whose induction variables move the slice
    node: "Node"
    is_write: bool = False


@dataclass
class Compute:
    op: object
    name: str
    uid: int | None
    points: int  # iteration points of one execution
    flops_per_point: int
    reduction_tile: list[int]
    parallel_tile: list[int]
    element_type: str
    element_bytes: int
    operand_bytes: int  # all operand + result tile bytes of one execution
    node: "Node"
    # Bytes of the accumulator (init operand + result) when it is carried by the enclosing
    # scf.for (iter_args, the reduction loop of a tiled contraction); 0 otherwise.
    carried_acc_bytes: int = 0
    # Rows of the register tile in the operand broadcast along the innermost parallel dim (A of
    # a matmul): (tile extent, byte stride in its whole tensor) per row dim; () if none.
    lhs_rows: tuple[tuple[int, int], ...] = ()


@dataclass
class Node:
    id: int
    op: object | None  # None for the nest's root pseudo-node
    kind: str  # "root", "forall", "for"
    trips: int
    depth: int
    parent: "Node | None"
    ivs: list[ir.Value] = field(default_factory=list)
    items: list = field(default_factory=list)  # body in program order (ops)
    slices: list[Slice] = field(default_factory=list)  # direct reads/writes of this body
    computes: list[Compute] = field(default_factory=list)
    children: list["Node"] = field(default_factory=list)
    defined: set = field(default_factory=set)  # values defined directly in this body

    def subtree(self):
        yield self
        for c in self.children:
            yield from c.subtree()

    def ancestors_and_self(self):
        n = self
        while n is not None:
            yield n
            n = n.parent

    @property
    def executions(self) -> int:
        """How many times this node's loop runs in total (product of enclosing trips)."""
        total = 1
        n = self.parent
        while n is not None:
            total *= n.trips
            n = n.parent
        return total


class _Analyzer:
    """Walks one function of the tiled clone. Holds the value -> node maps of the walk."""

    def __init__(self, hw: HardwareModel, shape_hints: dict[str, object] | None, func):
        self.hw = hw
        self.hints = _normalize_hints(shape_hints or {})
        self.func = func
        self.notes: list[str] = []
        self.ids = count()
        self.iv_node: dict[ir.Value, int] = {}
        self.value_node: dict[ir.Value, Node] = {}
        self.nodes: dict[int, Node] = {}
        args = list(func.regions[0].blocks[0].arguments)
        self.func_name = ir.StringAttr(func.attributes["sym_name"]).value
        self.arg_index = {a: i for i, a in enumerate(args)}
        self.intermediate_peaks: dict[int, int] = {}  # node id -> _intermediate_peak
        self.outside: dict[int, list] = {}  # node id -> _outside_slices
        # Dynamic dims sized by walking the IR (tensor.dim of a slice of an empty sized by an
        # affine.min ...): the same values are asked for again and again (dynamic_matmul: a
        # third of its cost), and the IR does not change while it is analysed.
        self.dynamic_shapes: dict[ir.Value, list[int]] = {}
        self.index_values: dict[ir.Value, int | None] = {}  # int_value of op results

    # ----- values
    def int_value(self, v: ir.Value) -> int | None:
        """A static index value, or None when it depends on an induction variable."""
        if v in self.index_values:
            return self.index_values[v]
        if isinstance(v, ir.OpResult):
            self.index_values[v] = self._int_value_of_result(v)
            return self.index_values[v]
        return None

    def _int_value_of_result(self, v: ir.OpResult) -> int | None:
        op = v.owner
        name = _opname(op)
        if name == "arith.constant":
            return ir.IntegerAttr(op.attributes["value"]).value
        if name == "tensor.dim":
            src, idx = op.operands
            i = self.int_value(idx)
            return None if i is None else self.shape(src)[i]
        if name in ("affine.apply", "affine.min", "affine.max"):
            n_dims, results = _compiled_map(op.attributes["map"])
            args = [self.int_value(o) for o in op.operands]
            vals = [_eval_affine(e, args, n_dims) for e in results]
            known = [x for x in vals if x is not None]
            if name == "affine.min" and known:
                return min(known)  # a tile-size bound: the full tile is the common case
            if name == "affine.max" and known:
                return max(known)
            return vals[0] if len(vals) == 1 else None
        if name in ("arith.addi", "arith.subi", "arith.muli", "arith.ceildivsi", "arith.divsi", "arith.minsi", "arith.minui"):
            a, b = (self.int_value(o) for o in op.operands)
            if a is None or b is None:
                return None
            return {"arith.addi": a + b, "arith.subi": a - b, "arith.muli": a * b,
                    "arith.ceildivsi": -(-a // b), "arith.divsi": a // b,
                    "arith.minsi": min(a, b), "arith.minui": min(a, b)}[name]
        if name == "arith.index_cast":
            return self.int_value(op.operands[0])
        return None

    def shape(self, v: ir.Value) -> list[int]:
        t = _ranked(v)
        if t is None:
            return []
        dims = list(t.shape)
        if DYNAMIC not in dims:
            return dims
        if v not in self.dynamic_shapes:
            self.dynamic_shapes[v] = [self.dynamic_extent(v, i) if d == DYNAMIC else d for i, d in enumerate(dims)]
        return list(self.dynamic_shapes[v])

    def dynamic_extent(self, v: ir.Value, dim: int) -> int:
        v = self.resolve(v)
        if isinstance(v, ir.BlockArgument) and v in self.arg_index:
            index = self.arg_index[v]
            hint = hint_for(self.hints, self.func_name, index)
            if hint is not None:
                return hint[dim] if dim < len(hint) else hint[-1]
            self._note(f"arg{index} dim {dim} of @{self.func_name} is dynamic and has no shape hint: "
                       f"assumed {DEFAULT_DYNAMIC_EXTENT}")
            return DEFAULT_DYNAMIC_EXTENT
        if isinstance(v, ir.OpResult):
            op = v.owner
            if _opname(op) == "tensor.empty":
                t = ir.RankedTensorType(v.type)
                dyn_index = sum(1 for d in list(t.shape)[:dim] if d == DYNAMIC)
                n = self.int_value(op.operands[dyn_index])
                if n is not None:
                    return n
            elif _opname(op) == "tensor.extract_slice":
                sizes = self.slice_sizes(op)
                return sizes[dim] if dim < len(sizes) else DEFAULT_DYNAMIC_EXTENT
            elif _opname(op) == "tensor.pad":
                view = op.opview
                low = self._static_or_int(op, "static_low", view.low)
                high = self._static_or_int(op, "static_high", view.high)
                return self.shape(op.operands[0])[dim] + low[dim] + high[dim]
            elif _opname(op).startswith("linalg.") or _opname(op) in LOOP_OPS:  # destination-style
                inits = _dps_inits(op)
                if v.result_number < len(inits):
                    return self.shape(inits[v.result_number])[dim]
        self._note(f"a dynamic dim of {op_name_of(v)} could not be sized: assumed {DEFAULT_DYNAMIC_EXTENT}")
        return DEFAULT_DYNAMIC_EXTENT

    def _note(self, text: str) -> None:
        # Debug only: the note travels in Cost.notes, and a search estimates thousands of
        # plans (its caller states the assumption once, e.g. the engine's warnings).
        if text not in self.notes:
            self.notes.append(text)
            log.debug(text)

    def resolve(self, v: ir.Value) -> ir.Value:
        """Follow loop-carried tensors (iter_args, shared_outs) back to the tensor they alias."""
        while isinstance(v, ir.BlockArgument):
            owner = v.owner.owner
            if owner is None:
                return v
            name = _opname(owner)
            n = v.arg_number
            if name == "scf.for" and n >= 1:
                v = owner.operands[3 + n - 1]
            elif name == "scf.forall":
                rank = len(ir.DenseI64ArrayAttr(owner.attributes["staticUpperBound"]))
                if n < rank:
                    return v
                v = owner.opview.outputs[n - rank]
            else:
                return v
        return v

    def slice_sizes(self, op) -> list[int]:
        """Sizes of a tensor.extract_slice, dynamic ones as ints where known."""
        return self.slice_operands(op, first=1)[2]

    def slice_operands(self, op, first: int) -> tuple[list[int], list, list[int]]:
        """(static offsets, dynamic offset values, sizes) of a slice op. Its offset and size
        operands follow its first `first` operands (the source, and the dest of an insert), one
        per dynamic entry of static_offsets / static_sizes: read directly, without an OpView and
        its segment-size attribute (the cost model's hottest path, ~17 slices per plan)."""
        operands = list(op.operands)
        static_offsets = list(ir.DenseI64ArrayAttr(op.attributes["static_offsets"]))
        static_sizes = list(ir.DenseI64ArrayAttr(op.attributes["static_sizes"]))
        n_offsets = sum(1 for s in static_offsets if s == DYNAMIC)
        n_sizes = sum(1 for s in static_sizes if s == DYNAMIC)
        dynamic_offsets = operands[first:first + n_offsets]
        sizes = self._mixed_ints(static_sizes, operands[first + n_offsets:first + n_offsets + n_sizes])
        return static_offsets, dynamic_offsets, sizes

    def _static_or_int(self, op, attr: str, dynamic_values) -> list[int]:
        """An op's mixed static/dynamic list (sizes, pads), dynamic entries as static ints where
        known, else the default extent."""
        return self._mixed_ints(ir.DenseI64ArrayAttr(op.attributes[attr]), list(dynamic_values))

    def _mixed_ints(self, static, dynamic: list) -> list[int]:
        out = []
        i = 0
        for s in static:
            if s == DYNAMIC:
                n = self.int_value(dynamic[i])
                i += 1
                out.append(n if n is not None else DEFAULT_DYNAMIC_EXTENT)
            else:
                out.append(s)
        return out

    def deps(self, values) -> frozenset[int]:
        """Loop nodes whose induction variables flow into these index values."""
        found: set[int] = set()
        stack = list(values)
        seen = set()
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in self.iv_node:
                found.add(self.iv_node[v])
            elif isinstance(v, ir.OpResult) and not v.owner.regions:
                stack.extend(v.owner.operands)
        return frozenset(found)

    def offset_key(self, v: ir.Value):
        if v in self.iv_node:
            return ("iv", self.iv_node[v], v.arg_number)
        c = self.int_value(v)
        if c is not None:
            return c
        if isinstance(v, ir.OpResult) and _opname(v.owner) in _AFFINE_MAP_OPS:
            # Attributes are uniqued in their context: the same map is the same attribute.
            return (_opname(v.owner), v.owner.attributes["map"], tuple(self.offset_key(o) for o in v.owner.operands))
        # Anything else (affine.delinearize_index from fusion across a collapse_shape, ...):
        # the value itself, so only slices at this very offset count as the same tile.
        return ("v", v)

    def value_key(self, v: ir.Value):
        # Values hash by identity of the underlying IR value; get_name() would run the printer
        # (~70 us a call, the cost model's hottest line).
        return ("arg", self.arg_index[v]) if v in self.arg_index else ("value", v)

    def bytes_of(self, v: ir.Value, shape: list[int] | None = None) -> int:
        t = _ranked(v)
        if t is None:
            return 0
        return math.prod(shape if shape is not None else self.shape(v)) * _element_bytes(t)

    # ----- tree
    def new_node(self, op, kind: str, trips: int, parent: Node | None) -> Node:
        node = Node(id=next(self.ids), op=op, kind=kind, trips=max(1, trips), depth=0 if parent is None else parent.depth + 1, parent=parent)
        self.nodes[node.id] = node
        if parent is not None:
            parent.children.append(node)
        return node

    def loop_trips(self, op) -> tuple[int, list[ir.Value]]:
        body = op.regions[0].blocks[0]
        if _opname(op) == "scf.for":
            lb, ub, step = (self.int_value(o) for o in list(op.operands)[:3])
            if ub is None:
                self._note(f"scf.for with a dynamic upper bound: assumed {DEFAULT_DYNAMIC_EXTENT} iterations")
                return DEFAULT_DYNAMIC_EXTENT, [body.arguments[0]]
            return max(1, -(-(ub - (lb or 0)) // (step or 1))), [body.arguments[0]]
        view = op.opview
        rank = len(ir.DenseI64ArrayAttr(op.attributes["staticUpperBound"]))
        bounds = []
        for attr, dyn in (("staticLowerBound", view.dynamicLowerBound), ("staticUpperBound", view.dynamicUpperBound), ("staticStep", view.dynamicStep)):
            dyn = list(dyn)
            vals = []
            for s in ir.DenseI64ArrayAttr(op.attributes[attr]):
                if s == DYNAMIC:
                    n = self.int_value(dyn.pop(0))
                    vals.append(n if n is not None else DEFAULT_DYNAMIC_EXTENT)
                else:
                    vals.append(s)
            bounds.append(vals)
        trips = math.prod(max(1, -(-(u - l) // s)) for l, u, s in zip(*bounds))
        return trips, list(body.arguments)[:rank]

    def build_body(self, node: Node, ops) -> None:
        for op in ops:
            name = _opname(op)
            node.items.append(op)
            for r in op.results:
                self.value_node[r] = node
                node.defined.add(r)
            if name in LOOP_OPS:
                trips, ivs = self.loop_trips(op)
                child = self.new_node(op, "forall" if name == "scf.forall" else "for", trips, node)
                child.ivs = ivs
                for iv in ivs:
                    self.iv_node[iv] = child.id
                inner = _body_ops(op)
                self.build_body(child, inner)
            elif name == "scf.forall.in_parallel":
                self.build_body(node, _body_ops(op))
            elif name == "scf.if":
                # Tiling a tensor.pad guards each tile with scf.if (then: an all-padding tile,
                # else: the producers fused through the pad): priced as one body, once per trip.
                for region in range(len(op.regions)):
                    self.build_body(node, _body_ops(op, region))
            elif name == "tensor.extract_slice":
                self.add_slice(node, op, op.operands[0], op.results[0], is_write=False)
            elif name in ("tensor.insert_slice", "tensor.parallel_insert_slice"):
                self.add_slice(node, op, op.operands[1], op.operands[0], is_write=True)
            elif _is_tileable(op):
                node.computes.append(self.compute_of(op, node))
                if node.kind != "root":
                    self.add_whole_reads(node, op)

    def add_slice(self, node: Node, op, source: ir.Value, tile: ir.Value, is_write: bool) -> None:
        static_offsets, dynamic_offsets, sizes = self.slice_operands(op, first=2 if is_write else 1)
        root = self.resolve(source)
        offsets = [self.offset_key(o) for o in dynamic_offsets]
        node.slices.append(
            Slice(
                key=(self.value_key(root), tuple(static_offsets), tuple(offsets), tuple(sizes)),
                source=root,
                bytes=self.bytes_of(tile, [s for s in sizes if s != 1] or [1]) if _ranked(tile) else 0,
                source_bytes=self.bytes_of(root),
                deps=self.deps(dynamic_offsets),
                node=node,
                is_write=is_write,
            )
        )

    def add_whole_reads(self, node: Node, op) -> None:
        """Tensors from outside the nest an op inside it reads whole, without a slice (a weight
        after fusion through a collapse_shape): they are live in the loop like any tile."""
        for v in op.operands:
            if _ranked(v) is None or isinstance(v, ir.BlockArgument) and v not in self.arg_index:
                continue  # scalars; loop-carried tensors (their tiles are the loop's slices)
            if isinstance(v, ir.OpResult) and (v in self.value_node or _opname(v.owner) in _NO_DATA_OPS):
                continue  # computed in this nest, or no data to read
            node.slices.append(self.whole(v, node))

    def whole(self, v: ir.Value, node: Node, is_write: bool = False) -> Slice:
        """All of tensor `v`, read (or written) in `node`'s body."""
        key = (self.value_key(v), "out") if is_write else (self.value_key(v), (), (), tuple(self.shape(v)))
        return Slice(key=key, source=v, bytes=self.bytes_of(v), source_bytes=self.bytes_of(v), deps=frozenset(),
                     node=node, is_write=is_write)

    def compute_of(self, op, node: Node) -> Compute:
        operands = [o for o in op.operands if _ranked(o) is not None]
        shapes = [self.shape(o) for o in operands]
        indexing_maps = linalg.get_indexing_maps(op)
        if indexing_maps is None:
            # TilingInterface ops without indexing maps (pack, unpack, pad, concat, softmax):
            # one iteration point per result element, all parallel.
            result = op.results[0] if len(op.results) else None
            extent = self.shape(result) if result is not None and _ranked(result) is not None else []
            return self._compute(op, node, operands, shapes, list(extent), [], list(extent), result)
        maps = [ir.AffineMapAttr(m).value for m in indexing_maps]
        tensor_maps = [m for m, o in zip(maps, op.operands) if _ranked(o) is not None] if len(maps) == len(list(op.operands)) else maps[-len(operands):]
        n_dims = maps[0].n_dims if maps else 0
        ranges = [1] * n_dims
        found = [False] * n_dims
        for m, shp in zip(tensor_maps, shapes):
            for pos, e in enumerate(m.results):
                if isinstance(e, ir.AffineDimExpr) and pos < len(shp) and not found[e.position]:
                    ranges[e.position] = shp[pos]
                    found[e.position] = True
        out_dims = {e.position for e in maps[-1].results if isinstance(e, ir.AffineDimExpr)} if maps else set()
        reduction = [ranges[d] for d in range(n_dims) if d not in out_dims]
        parallel = [ranges[d] for d in range(n_dims) if d in out_dims]
        c = self._compute(op, node, operands, shapes, ranges, reduction, parallel, operands[-1] if operands else None)
        if reduction and out_dims:
            c.lhs_rows = self._lhs_rows(operands, tensor_maps, ranges, out_dims, len(op.results))
        return c

    def _lhs_rows(self, operands, tensor_maps, ranges, out_dims: set[int], n_results: int) -> tuple[tuple[int, int], ...]:
        """(extent, byte stride) of each register-tile row dim in the broadcast input: the first
        input indexed by a reduction dim and a row dim (a parallel dim other than the innermost)
        but not the innermost parallel dim. Strides are those of the whole tensor the tile is cut
        from (row-major), which is where the rows sit in memory."""
        n_dim = max(out_dims)
        inputs = list(zip(operands, tensor_maps))[: max(0, len(operands) - n_results)]
        for v, m in inputs:
            dims = [e.position if isinstance(e, ir.AffineDimExpr) else None for e in m.results]
            if n_dim in dims or not any(d is not None and d not in out_dims for d in dims):
                continue
            shape = self.shape(self.root_tensor(v))
            t = _ranked(v)
            if t is None or len(shape) != len(dims):
                continue
            rows = tuple(
                (ranges[d], math.prod(shape[p + 1:]) * _element_bytes(t))
                for p, d in enumerate(dims) if d is not None and d in out_dims and ranges[d] > 1
            )
            if rows:
                return rows
        return ()

    def root_tensor(self, v: ir.Value) -> ir.Value:
        """The whole tensor a tile is cut from: through extract_slices and loop-carried args."""
        while True:
            r = _through_slices(self.resolve(v))
            if r == v:
                return v
            v = r

    def _carried_acc_bytes(self, op, node: Node) -> int:
        """Accumulator bytes of a reducing op whose inits are iter_args of its own scf.for."""
        if node.kind != "for" or node.op is None or _opname(node.op) != "scf.for":
            return 0
        body = node.op.regions[0].blocks[0]
        inits = _dps_inits(op)
        roots = [_through_slices(v) for v in inits]  # tiling leaves a full-size slice of the iter_arg
        carried = [v for v in roots if isinstance(v, ir.BlockArgument) and v.owner == body and v.arg_number > 0]
        if not inits or len(carried) != len(inits):
            return 0
        return sum(self.bytes_of(v) for v in inits) + sum(self.bytes_of(r) for r in op.results)

    def _compute(self, op, node: Node, operands, shapes, ranges, reduction, parallel, typed) -> Compute:
        """One execution of `op` over `ranges`; `typed` gives the element type (None: f32)."""
        t = _ranked(typed) if typed is not None else None
        return Compute(
            op=op,
            name=_opname(op),
            uid=_uid(op),
            points=math.prod(ranges) if ranges else 1,
            flops_per_point=_flops_per_point(op),
            reduction_tile=reduction,
            parallel_tile=parallel,
            element_type=str(t.element_type) if t else "f32",
            element_bytes=_element_bytes(t) if t else 4,
            operand_bytes=sum(self.bytes_of(o, s) for o, s in zip(operands, shapes)) + sum(self.bytes_of(r) for r in op.results),
            node=node,
            carried_acc_bytes=self._carried_acc_bytes(op, node) if reduction else 0,
        )


def _through_slices(v: ir.Value) -> ir.Value:
    while isinstance(v, ir.OpResult) and _opname(v.owner) == "tensor.extract_slice":
        v = v.owner.operands[0]
    return v


def op_name_of(v: ir.Value) -> str:
    return _opname(v.owner) if isinstance(v, ir.OpResult) else "a block argument"


def _dps_inits(op) -> list[ir.Value]:
    if _opname(op) == "scf.for":
        return list(op.operands)[3:]
    if _opname(op) == "scf.forall":
        return list(op.opview.outputs)
    n_out = len(op.results)
    return list(op.operands)[-n_out:] if n_out else []


def _flops_per_point(op) -> int:
    """Arithmetic ops in a linalg body (matmul/conv bodies: mulf + addf = 2)."""
    n = 0
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                if _opname(inner).split(".")[0] in ("arith", "math") and _opname(inner) not in NON_FLOP_BODY_OPS:
                    n += 1
    return n


# Affine maps as plain tuples, by attribute (uniqued per context, so each distinct map is read
# through the bindings once per worker instead of once per use: the search costs thousands of
# clones with the same few maps). An expression is ("c", value) | ("d", pos) | ("s", pos) |
# (op, lhs, rhs) with op one of + * floordiv ceildiv mod | None (not evaluable).
_COMPILED_MAPS: dict = {}
_MAX_COMPILED_MAPS = 4096


def _compiled_map(attr) -> tuple[int, tuple]:
    got = _COMPILED_MAPS.get(attr)
    if got is None:
        amap = ir.AffineMapAttr(attr).value
        got = (amap.n_dims, tuple(_compile_affine(e) for e in amap.results))
        if len(_COMPILED_MAPS) >= _MAX_COMPILED_MAPS:
            _COMPILED_MAPS.clear()
        _COMPILED_MAPS[attr] = got
    return got


def _compile_affine(e) -> tuple | None:
    if isinstance(e, ir.AffineConstantExpr):
        return ("c", e.value)
    if isinstance(e, ir.AffineDimExpr):
        return ("d", e.position)
    if isinstance(e, ir.AffineSymbolExpr):
        return ("s", e.position)
    if isinstance(e, ir.AffineBinaryExpr):
        for kind, op in ((ir.AffineAddExpr, "+"), (ir.AffineMulExpr, "*"), (ir.AffineFloorDivExpr, "floordiv"),
                         (ir.AffineCeilDivExpr, "ceildiv"), (ir.AffineModExpr, "mod")):
            if isinstance(e, kind):
                return (op, _compile_affine(e.lhs), _compile_affine(e.rhs))
    return None


def _eval_affine(e: tuple | None, args: list[int | None], n_dims: int) -> int | None:
    if e is None:
        return None
    kind = e[0]
    if kind == "c":
        return e[1]
    if kind == "d":
        return args[e[1]]
    if kind == "s":
        return args[n_dims + e[1]]
    a, b = _eval_affine(e[1], args, n_dims), _eval_affine(e[2], args, n_dims)
    if a is None or b is None:
        return None
    if kind == "+":
        return a + b
    if kind == "*":
        return a * b
    if kind == "floordiv":
        return a // b
    if kind == "ceildiv":
        return -(-a // b)
    return a % b


def _normalize_hints(hints: dict[str, object]) -> dict[str, list[int]]:
    """{'arg0': '128x1024' | [128, 1024] | 128} -> {'arg0': [128, 1024]}."""
    out = {}
    for k, v in hints.items():
        if isinstance(v, str):
            out[k] = [int(x) for x in v.lower().split("x")]
        elif isinstance(v, int):
            out[k] = [v]
        else:
            out[k] = [int(x) for x in v]
    return out


# --- per-node quantities -------------------------------------------------------------------------

def _defined_inside(node: Node, v: ir.Value, an: _Analyzer) -> bool:
    owner = an.value_node.get(v)
    while owner is not None:
        if owner is node:
            return True
        owner = owner.parent
    return False


def _outside_slices(node: Node, an: _Analyzer) -> list[tuple[Slice, int]]:
    """Slices in node's subtree whose data lives outside node, deduplicated, with their union
    bytes over one iteration of node (inner loops that move the slice multiply it, capped at the
    source tensor)."""
    if node.id not in an.outside:
        an.outside[node.id] = _compute_outside_slices(node, an)
    return an.outside[node.id]


def _compute_outside_slices(node: Node, an: _Analyzer) -> list[tuple[Slice, int]]:
    seen: dict[tuple, tuple[Slice, int]] = {}
    for n in node.subtree():
        for s in n.slices:
            if _defined_inside(node, s.source, an):
                continue
            inner_moves = 1
            m = n
            while m is not node:
                if m.id in s.deps:
                    inner_moves *= m.trips
                m = m.parent
            union = min(s.bytes * inner_moves, s.source_bytes or s.bytes * inner_moves)
            key = (s.key, n.id if n is not node else None)
            if key not in seen or seen[key][1] < union:
                seen[key] = (s, union)
    # A read and a write of the same tile are one buffer.
    by_tile: dict[tuple, tuple[Slice, int]] = {}
    for (k, _), (s, u) in seen.items():
        if k not in by_tile or by_tile[k][1] < u:
            by_tile[k] = (s, u)
    return list(by_tile.values())


def _intermediate_peak(node: Node, an: _Analyzer) -> int:
    """Peak bytes of intermediates (linalg results used by later ops) live at once in node's body."""
    if node.id not in an.intermediate_peaks:
        an.intermediate_peaks[node.id] = _compute_intermediate_peak(node, an)
    return an.intermediate_peaks[node.id]


def _compute_intermediate_peak(node: Node, an: _Analyzer) -> int:
    items = node.items
    position = {op.operation: i for i, op in enumerate(items)}
    live: dict[ir.Value, tuple[int, int, int]] = {}  # value -> (start, end, bytes)
    for i, op in enumerate(items):
        if not _is_tileable(op):
            continue
        for r in op.results:
            uses = list(r.uses)
            end = _last_use(uses, position)
            if end is None or all(_opname(u.owner) in ("tensor.insert_slice", "tensor.parallel_insert_slice", "scf.yield") for u in uses):
                continue  # the nest's output tile: counted as its destination slice
            size = an.bytes_of(r)
            inits = _dps_inits(op)
            # An op writing into a dying intermediate reuses that buffer.
            for init in inits:
                if init in live and live[init][1] == i:
                    start, _, b = live.pop(init)
                    live[r] = (start, end, max(b, size))
                    break
            else:
                live[r] = (i, end, size)
    peak = 0
    child_peak = {id(c.op): _intermediate_peak(c, an) for c in node.children}
    for i, op in enumerate(items):
        here = sum(b for s, e, b in live.values() if s <= i <= e) + child_peak.get(id(op), 0)
        peak = max(peak, here)
    return peak


def _last_use(uses, position: dict) -> int | None:
    """Index of the last body op (`position`: op -> index) using a value, directly or nested."""
    last = None
    for use in uses:
        holder = holder_in(use.owner.operation, position)
        if holder is not None:
            i = position[holder]
            last = i if last is None or i > last else last
    return last


def _footprint(node: Node, an: _Analyzer, cache: dict[int, int]) -> int:
    if node.id not in cache:
        cache[node.id] = sum(u for _, u in _outside_slices(node, an)) + _intermediate_peak(node, an)
    return cache[node.id]


def _misses(node: Node, capacity: float, an: _Analyzer, fp: dict[int, int]) -> float:
    """Bytes brought into a level of `capacity` during ONE execution of `node` (all its trips)."""
    if _footprint(node, an, fp) <= capacity:
        total = 0.0
        for s, union in _outside_slices(node, an):
            # Invariant in this loop: stays resident across its iterations.
            total += union * (node.trips if node.id in s.deps else 1)
        return total
    per_iteration = 0.0
    for s in node.slices:
        if not _defined_inside(node, s.source, an) or s.node is node:
            if _feeds_compute_here(s, node):
                per_iteration += s.bytes
    for c in node.computes:  # intermediates spill when the iteration does not fit
        per_iteration += sum(an.bytes_of(r) for r in c.op.results)
    for child in node.children:
        per_iteration += _misses(child, capacity, an, fp)
    return per_iteration * node.trips


def _feeds_compute_here(s: Slice, node: Node) -> bool:
    """A slice counts at this level unless it is only sliced further by inner loops (then the
    inner loops fetch the parts)."""
    if s.is_write or not node.children:
        return True
    return bool(node.computes)


# --- public API -----------------------------------------------------------------------------------

# Ops that keep what they read alive: returned values, and values passed to a call (which may
# do anything with them).
_LIVE_ROOTS = ("func.return", "func.call")


def _top_level_nests(func) -> list:
    """Live top-level loops and standalone tileable ops of a function body, in order."""
    ops = list(func.regions[0].blocks[0].operations)
    position = {op.operation: i for i, op in enumerate(ops)}
    live_at: set[int] = set()
    live = []
    for i in reversed(range(len(ops))):
        op = ops[i]
        is_live = _opname(op) in _LIVE_ROOTS or any(
            position.get(holder_in(u.owner.operation, position)) in live_at for r in op.results for u in r.uses
        )
        if not is_live:
            continue  # dead code left behind by fusion
        live_at.add(i)
        if _opname(op) in LOOP_OPS or _is_tileable(op):
            live.append(op)
    return list(reversed(live))


@dataclass
class NestMemo:
    """Nest costs a search reuses across the plans it scores: those of groups that tile one op
    on their own and fuse nothing (the standalone tilings every mlp_chain plan carries were a
    third of costing it). Such a group's nest is the same loops around the same op in every plan
    that has the group: its ops are its own, and what it reads from outside was made by a loop
    nest or not whatever the other groups do. The caller keys those groups (`keys`: the group's
    index in the applied plan -> a key of the group) and keeps `entries` for one module, hardware
    model and shape hints, on static shapes only (a dynamic dim is sized by walking the IR
    outside the nest). A nest that left a note is not kept (the note would be lost)."""

    keys: dict[int, object]
    entries: dict = field(default_factory=dict)  # key -> (NestCost, its flops by uid, unfused input bytes)
    limit: int = 4096

    def key_of(self, op) -> object | None:
        if not self.keys or _opname(op) not in LOOP_OPS:
            return None
        group = loop_group(op.operation)
        return self.keys.get(group) if group is not None else None

    def keep(self, key: object, entry: tuple) -> None:
        if len(self.entries) >= self.limit:
            self.entries.clear()
        self.entries[key] = entry


def estimate_cost(
    tiled: ir.Module,
    hardware: HardwareModel,
    shape_hints: dict[str, object] | None = None,
    original: ir.Module | None = None,
    memo: NestMemo | None = None,
) -> Cost:
    """Cost of a tiled clone on `hardware`. `original` (the module before tiling, same uids)
    makes recompute_flops exact; without it only ops computed in several nests count. `memo`:
    nest costs kept from earlier plans of the same module (NestMemo)."""
    with context():
        # Declarations (external funcs) have no body and cost nothing here.
        funcs = [
            op for op in tiled.body.operations
            if _opname(op) == "func.func" and len(op.regions[0].blocks) > 0
        ]
        nests: list[NestCost] = []
        reasons: list[str] = []
        notes: list[str] = []
        executed_by_uid: dict[int, float] = {}
        flops_by_nest_uid: list[dict[int, float]] = []
        unfused = 0
        for func in funcs:
            an = _Analyzer(hardware, shape_hints, func)
            nest_ops = _top_level_nests(func)
            produced_by_nest: set = set()
            for op in nest_ops:
                key = memo.key_of(op) if memo is not None else None
                if key is not None and key in memo.entries:
                    nest, per_uid, unfused_in = memo.entries[key]
                    reasons.extend(nest.reasons)
                    unfused += unfused_in
                    produced_by_nest.update(op.results)
                    nests.append(nest)
                    flops_by_nest_uid.append(per_uid)
                    for uid, f in per_uid.items():
                        executed_by_uid[uid] = executed_by_uid.get(uid, 0.0) + f
                    continue
                notes_before, unfused_before = len(an.notes), unfused
                root = an.new_node(None, "root", 1, None)
                an.build_body(root, [op])
                for r in op.results:  # the nest's results live in main memory, outside the nest
                    an.value_node.pop(r, None)
                # A zero-sized iteration space reads and writes nothing.
                if _is_tileable(op) and not any(c.points == 0 for c in root.computes):
                    # A standalone op reads whole operands, and its results land in main memory.
                    root.slices += [an.whole(an.resolve(o), root) for o in op.operands if _ranked(o) is not None]
                    root.slices += [an.whole(r, root, is_write=True) for r in op.results]
                elif not _is_tileable(op):
                    # A loop nest's results are its insert_slices into their destinations,
                    # counted there; only a result computed without any lands whole.
                    written = {s.source for n in root.subtree() for s in n.slices if s.is_write}
                    root.slices += [an.whole(r, root, is_write=True) for r, init in zip(op.results, _dps_inits(op))
                                    if an.resolve(init) not in written]
                # Inputs produced by an earlier nest went through main memory (un-fused).
                for s in _outside_slices(root, an):
                    if not s[0].is_write and s[0].source in produced_by_nest:
                        unfused += s[0].source_bytes
                produced_by_nest.update(op.results)
                nest, per_uid = _cost_nest(root, op, an, hardware, reasons)
                if key is not None and len(an.notes) == notes_before:
                    memo.keep(key, (nest, per_uid, unfused - unfused_before))
                nests.append(nest)
                flops_by_nest_uid.append(per_uid)
                for uid, f in per_uid.items():
                    executed_by_uid[uid] = executed_by_uid.get(uid, 0.0) + f
            notes.extend(an.notes)
        recompute = _recompute_flops(executed_by_uid, flops_by_nest_uid, original, hardware, shape_hints)
        if original is None and any(n.uids for n in nests):
            notes.append("recompute_flops counts only ops computed in several nests (pass the original module for halos)")
        levels = _sum_levels(nests, hardware)
        for lv, mem in zip(levels, hardware.memory_levels):
            if lv.footprint_bytes > lv.capacity_bytes and not mem.scratchpad and mem is not hardware.main_memory:
                notes.append(f"{lv.name} overflow (soft, cache): {_kib(lv.footprint_bytes)} live > {_kib(lv.capacity_bytes)} capacity")
        latency = sum(n.latency_s for n in nests)
        bound = max(nests, key=lambda n: n.latency_s).bound_by if nests else "compute"
        return Cost(
            hardware=hardware.name,
            hardware_hash=hardware.content_hash(),
            latency_s=latency,
            feasible=not reasons,
            reasons=reasons,
            notes=notes,
            bound_by=bound,
            levels=levels,
            flops=sum(n.flops for n in nests),
            recompute_flops=recompute,
            unfused_intermediate_bytes=unfused,
            nests=nests,
        )


def overlapped(times, p: float) -> float:
    """A soft roofline: resources that each need time t_i, overlapping imperfectly, take
    (sum t_i**p)**(1/p); the slowest alone when p is large, all of them in turn when p = 1."""
    ts = [t for t in times if t > 0]
    if not ts:
        return 0.0
    slowest = max(ts)
    return slowest * sum((t / slowest) ** p for t in ts) ** (1 / p)


def _kib(b: float) -> str:
    return f"{b / 1024:.0f} KiB" if b < 10 * 1024 * 1024 else f"{b / 1024 / 1024:.1f} MiB"


def _cost_nest(root: Node, op, an: _Analyzer, hw: HardwareModel, all_reasons: list[str]) -> tuple[NestCost, dict[int, float]]:
    reasons: list[str] = []  # this nest's, also added to all_reasons
    fp: dict[int, int] = {}
    nodes = list(root.subtree())
    band = _band_levels(root)
    max_depth = max(band.values())
    # A band's tile is one iteration of its innermost loop (e.g. the j loop of an i/j band).
    band_tiles = [n for n in nodes if not (len(n.children) == 1 and band[n.children[0].id] == band[n.id])]
    footprint_at_depth = [max((_footprint(n, an, fp) for n in band_tiles if band[n.id] == d), default=0) for d in range(max_depth + 1)]

    # Parallelism: the outermost scf.forall is distributed over cores in waves.
    top = root.children[0] if root.children else None
    cores = hw.compute.cores
    if top is not None and top.kind == "forall":
        active = min(cores, top.trips)
        waves = -(-top.trips // cores)
        utilization = top.trips / (waves * cores)
    else:
        active, waves, utilization = 1, 1, 1 / cores

    # Flops, vector-lane use, compute-side (innermost level) traffic.
    flops = 0.0
    per_uid: dict[int, float] = {}
    inner_traffic = 0.0
    weighted_lane_use = 0.0
    elem_type = "f32"
    for n in nodes:
        for c in n.computes:
            runs = n.executions * n.trips if n.kind != "root" else 1
            f = runs * c.points * c.flops_per_point
            flops += f
            inner_traffic += runs * c.operand_bytes
            if c.carried_acc_bytes and n.kind != "root":
                # The compiler keeps a loop-carried accumulator in registers across the
                # reduction loop (IREE hoists its transfer_read/write): it moves once per loop
                # run, plus what spills past the register file every step.
                spilled = _spilled_fraction(c, hw)
                inner_traffic -= (runs - n.executions) * c.carried_acc_bytes * (1.0 - spilled)
            if c.uid is not None:
                per_uid[c.uid] = per_uid.get(c.uid, 0.0) + f
            lanes = max(1, hw.compute.vector_width_bytes // c.element_bytes)
            last = c.parallel_tile[-1] if c.parallel_tile else 1
            # A carried accumulator lives through every trip of the loop that carries it.
            acc_trips = n.trips if c.carried_acc_bytes and n.kind != "root" else 1
            weighted_lane_use += f * (last / (math.ceil(last / lanes) * lanes)) * _microkernel_efficiency(c, band[n.id], hw, acc_trips)
            if f and c.flops_per_point:
                elem_type = c.element_type
            _check_vector_tile(c, band[n.id], hw, reasons)
    lane_use = weighted_lane_use / flops if flops else 1.0
    streamed_bytes = sum(
        (n.executions * n.trips if n.kind != "root" else 1) * c.points * c.element_bytes
        for n in nodes for c in n.computes if c.reduction_tile
    )
    compute_s = flops / (hw.effective_peak(elem_type) * utilization * lane_use) if flops else 0.0

    # Traffic per level: level i serves the misses of level i+1; the innermost serves the ALUs.
    levels = hw.memory_levels
    level_costs: list[LevelCost] = []
    times = {"compute": compute_s}
    for i, lv in enumerate(levels):
        depth = max(0, max_depth - (len(levels) - 1 - i))
        footprint = footprint_at_depth[depth] * (active if lv.shared and depth >= 1 else 1)
        if i + 1 < len(levels):
            inner = levels[i + 1]
            cap = inner.capacity_bytes / (active if inner.shared else 1)
            traffic = _misses(root, cap, an, fp)
        else:
            traffic = inner_traffic
        if i == len(levels) - 2 and not levels[-1].scratchpad and footprint_at_depth[max_depth] > levels[-1].capacity_bytes:
            # The innermost tile overflows the innermost cache: operands of reducing ops stream
            # from this level with reuse of one vector load per vector FMA only.
            traffic += streamed_bytes
        eff = hw.calibration.bandwidth_efficiency.get(lv.name, 1.0)
        bandwidth = lv.bandwidth_bytes_per_s * eff * (1 if lv.shared else active)
        t = traffic / bandwidth
        times[lv.name] = t
        level_costs.append(LevelCost(name=lv.name, footprint_bytes=int(footprint), traffic_bytes=int(traffic), capacity_bytes=lv.capacity_bytes, time_s=t))
        if lv.scratchpad and footprint_at_depth[depth] > lv.capacity_bytes:
            reasons.append(
                f"{lv.name} overflow: {_kib(footprint_at_depth[depth])} live > {_kib(lv.capacity_bytes)} capacity "
                f"(loop depth {depth} of nest at {_opname(op)})"
            )

    # Loop overheads: iterations inside the distributed forall run on `active` cores at once.
    overhead = 0.0
    for n in nodes:
        if n.kind == "root":
            continue
        iterations = n.executions * n.trips
        in_forall = top is not None and top.kind == "forall"
        share = hw.innermost_loop_overhead_fraction if not n.children else 1.0
        overhead += iterations * hw.effective_loop_overhead_s() * share / (active if in_forall else 1)

    bound_by = max(times, key=times.get)
    latency = overlapped(times.values(), hw.overlap_exponent) + overhead
    loops = [{"depth": n.depth, "level": band[n.id], "kind": n.kind, "trips": n.trips, "footprint_bytes": _footprint(n, an, fp)} for n in nodes if n.kind != "root"]
    uids = sorted({c.uid for n in nodes for c in n.computes if c.uid is not None})
    all_reasons.extend(reasons)
    return (
        NestCost(root_op=_opname(op), uids=uids, loops=loops, latency_s=latency, compute_s=compute_s, overhead_s=overhead, bound_by=bound_by, flops=flops, flops_by_uid=per_uid, active_cores=active, waves=waves, levels=level_costs, reasons=reasons),
        per_uid,
    )


def _band_levels(root: Node) -> dict[int, int]:
    """Tiling level of each loop node: loops perfectly nested in each other (one plan level tiling
    several dims makes one scf.for per dim) form one band and share a level."""
    levels = {root.id: 0}
    for n in root.subtree():
        for c in n.children:
            perfectly_nested = n.kind == "for" and c.kind == "for" and len(n.children) == 1 and not n.slices and not n.computes
            levels[c.id] = levels[n.id] + (0 if perfectly_nested else 1)
    return levels


def _plan_chose_vector_tile(c: Compute, level: int) -> bool:
    """Whether the plan, not IREE, chose this compute's vector tile: under two plan levels or
    more, IREE's vector tile is the plan's second level (service.measure.lowering's mapping).
    - In a loop carrying its accumulator under a distribution level, with no vector level
      between, the vector tile is the whole enclosing tile: a [32, 32] distribution tile with
      k = 2 is a 32x32 register tile (0.80x IREE's default on matmul_1024, Zen 3, where the
      model had priced it at full speed, the optimum of the whole space).
    - Under a vector level with no reduction level, the reduction is not tiled: attention's
      [1, 4, 8] tile with its fill fused is a 4x8 register tile over all of K = 64 (0.79x
      IREE's default, Zen 1, priced at full speed while its accumulator was not loop-carried).
    A single level (seed 000's super tiling) tiles for memory only: the compiler picks the
    vector tile."""
    return level >= 2


def _microkernel_efficiency(c: Compute, level: int, hw: HardwareModel, acc_trips: int) -> float:
    """Fraction of FMA peak a CPU register tile reaches (1.0 where the plan does not choose it).

    For a contraction whose vector tile the plan chose (_plan_chose_vector_tile), per reduction
    step the tile [.., m, n] needs m*ceil(n/lanes) accumulator registers, ceil(n/lanes) for the
    row of B and one broadcast of A; it issues acc FMAs and m + ceil(n/lanes) loads.
    - spills: more registers than the file holds -> accumulators go through L1 each step, and
      each output tile pays _SPILL_STEPS_PER_REGISTER reduction steps per register past the
      file, on top of its own (the reduction tile x `acc_trips`, the trips of the loop that
      carries the accumulator);
    - pipeline: fewer independent accumulators than latency x ports leaves FMA units idle;
    - loads: more loads than FMAs per step makes the tile load-bound (as many ports of each);
    - rows: tiles taller than the hardware's register_tile_rows run proportionally slower;
    - set conflicts: rows of A that share an L1 set past its ways miss every step.
    (32-row tiles once measured 4-6x slower than this model without a register charge for the
    rows of A; the set-conflict term explains it: at K = 1040 the same tiles ran at full speed.)
    """
    regs = hw.compute.vector_registers
    if regs is None or not _plan_chose_vector_tile(c, level) or not c.reduction_tile or len(c.parallel_tile) < 1:
        return 1.0
    n_vecs = _vectors_per_row(c, hw)
    m = math.prod(c.parallel_tile[:-1]) if len(c.parallel_tile) > 1 else 1
    if m == 0 or n_vecs == 0:  # an empty tile: nothing to compute
        return 1.0
    acc = m * n_vecs
    needed = acc + n_vecs + 1
    spill = min(1.0, regs / needed)
    k = math.prod(c.reduction_tile)
    if needed > regs:
        steps = k * acc_trips
        spill *= steps / (steps + (needed - regs) * _SPILL_STEPS_PER_REGISTER)
    # The step's tile of B, [k, n], is read into registers beside the accumulators. Two rows of
    # B cost nothing more, whether or not the accumulators fit (Zen 2, 1024^3 matmul, 6x16
    # tiles, 12 accumulators and 15 registers at k = 1: k = 2 ran 1.46x IREE's default, k = 1
    # 1.31x); more rows do where they overflow the register file, or beside accumulators that
    # spill already (Zen 3, same matmul, 8x16 tiles: k = 2 ran 2.07x, k = 4, 8, 16 1.67, 1.65,
    # 1.53x).
    b_overflows = k > 2 and (needed > regs or regs < acc + k * n_vecs + 1)
    b_tile = _B_TILE_OVERFLOW_EFFICIENCY if b_overflows else 1.0
    pipeline = min(1.0, acc / hw.compute.fma_pipeline_depth)
    loads = min(1.0, acc / (m + n_vecs))
    rows = hw.compute.register_tile_rows
    tall = min(1.0, rows / m) if rows else 1.0
    return spill * b_tile * pipeline * loads * tall * _set_conflict_efficiency(c, hw)


# What a spilling register tile pays per output tile, in reduction steps per register past the
# file. Measured (AMD Zen 3, AVX2, 16 ymm; CPU time, paired with IREE's default): 8x16 tiles
# (19 registers with B's row and A's broadcast) ran 1.2-1.35x faster than 4x16 on matmuls with
# K = 1024 and 0.7-0.8x as fast with K = 64 (attention_scores, a 4096x64x512 matmul); the
# per-step charge alone cannot tell the two apart. Fitted to the K = 64 ratio.
_SPILL_STEPS_PER_REGISTER = 16

# Speed left when the accumulators fit the register file and the reduction step's tile of B does
# not. Measured (Intel Xeon, AVX-512, 32 zmm; 128x1024 and 1024x1024 matmuls, CPU time, paired):
# 8x32 tiles at k = 8 and 16 ran 1.23-1.31x slower than at k = 4, 4x64 at k = 8 and 16 1.14-1.27x
# slower than at k = 2, 16x16 at k = 16 1.09-1.38x slower than at k = 4; about 1.2x, not growing
# with the overflow (the excess is re-read from L1 rather than spilled).
_B_TILE_OVERFLOW_EFFICIENCY = 1 / 1.2


def _set_conflict_efficiency(c: Compute, hw: HardwareModel) -> float:
    """Fraction of speed left when the register tile's rows of A evict each other in L1.

    Each reduction step reads one element from every row of A. Rows a power-of-two pitch apart
    map to the same few sets of a set-associative L1; with more rows per set than ways, every
    step misses. Measured (AMD Zen 4, L1d 32 KiB / 8 ways / 64 B lines, 512x1024 matmul): at
    K = 1024 (rows 4 KiB apart, all in one set) 16x16 tiles ran 2.0x and 32x16 5x slower than
    8x32; at K = 1040 all ran alike; at K = 512 (two sets) 16x16 alike, 32x16 2.5x slower.
    The model: ways / (most rows in one set), from the innermost level's associativity."""
    l1 = hw.memory_levels[-1]
    if not c.lhs_rows or l1.associativity is None or l1.line_bytes is None:
        return 1.0
    sets = max(1, l1.capacity_bytes // (l1.associativity * l1.line_bytes))
    return min(1.0, l1.associativity / _rows_per_set(c.lhs_rows, l1.line_bytes, sets))


@functools.lru_cache(maxsize=4096)
def _rows_per_set(rows: tuple[tuple[int, int], ...], line_bytes: int, sets: int) -> int:
    """Most rows (extent, stride per row dim) whose first line falls in one cache set."""
    offsets = [0]
    for extent, stride in rows:
        offsets = [o + i * stride for o in offsets for i in range(extent)]
        if len(offsets) > 4096:  # not a register tile: no vector tile is this tall
            return 1
    return max(Counter((o // line_bytes) % sets for o in offsets).values())


def _vectors_per_row(c: Compute, hw: HardwareModel) -> int:
    """Vector registers one row of the register tile spans (its innermost parallel extent)."""
    lanes = max(1, hw.compute.vector_width_bytes // c.element_bytes)
    return math.ceil((c.parallel_tile[-1] if c.parallel_tile else 1) / lanes)


def _spilled_fraction(c: Compute, hw: HardwareModel) -> float:
    """Fraction of an accumulator tile that does not fit the vector register file beside one
    row of B and a broadcast of A (all of it when the register file is unknown)."""
    regs = hw.compute.vector_registers
    if regs is None:
        return 1.0
    acc_regs = math.ceil(c.carried_acc_bytes / 2 / hw.compute.vector_width_bytes)  # init + result: one tile
    spare = regs - _vectors_per_row(c, hw) - 1
    return max(0.0, 1.0 - max(0, spare) / acc_regs) if acc_regs else 0.0


def _check_vector_tile(c: Compute, level: int, hw: HardwareModel, reasons: list[str]) -> None:
    """IREE's CPU backend rejects vector tiles (parallel product x reduction tile) of
    hw.max_vector_tile_bytes or more (512 native vectors: 32 KiB with AVX-512, 16 KiB with AVX2).
    Only where the plan chose the vector tile (_plan_chose_vector_tile)."""
    if hw.max_vector_tile_bytes is None or not _plan_chose_vector_tile(c, level) or not c.reduction_tile:
        return
    size = c.points * c.element_bytes
    if size >= hw.max_vector_tile_bytes:
        dims = "x".join(str(d) for d in c.parallel_tile + c.reduction_tile)
        reasons.append(
            f"vector tile too large: {c.name} (uid {c.uid}) tile {dims} = {c.points} {c.element_type} elements "
            f"({_kib(size)}) >= {_kib(hw.max_vector_tile_bytes)} limit"
        )


def _sum_levels(nests: list[NestCost], hw: HardwareModel) -> list[LevelCost]:
    out = []
    for i, lv in enumerate(hw.memory_levels):
        out.append(
            LevelCost(
                name=lv.name,
                footprint_bytes=max((n.levels[i].footprint_bytes for n in nests), default=0),
                traffic_bytes=sum(n.levels[i].traffic_bytes for n in nests),
                capacity_bytes=lv.capacity_bytes,
                time_s=sum(n.levels[i].time_s for n in nests),
            )
        )
    return out


def _recompute_flops(executed: dict[int, float], per_nest: list[dict[int, float]], original: ir.Module | None, hw: HardwareModel, hints) -> float:
    """Flops computed beyond what the untiled program needs, per original op (uid)."""
    if original is not None:
        base: dict[int, float] = {}
        for n in estimate_cost(original, hw, hints).nests:
            for uid, f in n.flops_by_uid.items():
                base[int(uid)] = base.get(int(uid), 0.0) + f
        return sum(max(0.0, f - base[uid]) for uid, f in executed.items() if uid in base)
    # Without the original: an op computed in several nests is recomputed in all but the largest.
    return sum(f - max(d.get(uid, 0.0) for d in per_nest) for uid, f in executed.items())


def cost_of_plan(source: str | bytes, plan_json: dict, hardware_name: str, shape_hints: dict[str, object] | None = None) -> dict:
    """Parse, apply a plan to a clone, and cost it; JSON in, JSON out (runs in sandbox workers)."""
    from service.ir.graph import tag_tileable_ops
    from service.ir.parse import parse_module
    from service.ir.plan import Plan
    from service.ir.transform import apply_plan

    from .profiles import get_profile

    hardware = get_profile(hardware_name)
    plan = Plan.model_validate(plan_json)
    with context():
        tagged = tag_tileable_ops(parse_module(source))
        tiled = apply_plan(tagged, plan).module
        return estimate_cost(tiled, hardware, shape_hints, original=tagged).model_dump(mode="json")

"""The walk of a tiled clone's function into loop-nest trees (nest.py), with the index
arithmetic, shapes and dynamic extents it needs on the way."""

from __future__ import annotations

import logging
import math
from itertools import count

from service.ir.graph import flops_per_point, innermost_step, uid_of
from service.ir.hints import hint_for
from service.ir.mlir import ir, linalg

from .affine import compiled_map, eval_affine
from .nest import Compute, Node, Slice
from .ops import (
    AFFINE_MAP_OPS,
    DEFAULT_DYNAMIC_EXTENT,
    DYNAMIC,
    LOOP_OPS,
    NO_DATA_OPS,
    body_ops,
    dps_inits,
    element_bytes,
    is_tileable,
    op_name_of,
    opname,
    ranked,
    through_slices,
)

log = logging.getLogger(__name__)


class Analyzer:
    """Walks one function of the tiled clone into loop-nest trees (build_body), sizing what it
    meets: static index values, shapes with their dynamic dims, loop trips, slices, computes.
    Holds the value -> node maps of the walk and the per-node caches of memory.py."""

    def __init__(self, shape_hints: dict[str, object] | None, func):
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
        self.intermediate_peaks: dict[int, int] = {}  # node id -> memory.intermediate_peak
        self.outside: dict[int, list] = {}  # node id -> memory.outside_slices
        # Dynamic dims sized by walking the IR (tensor.dim of a slice of an empty sized by an
        # affine.min ...): the same values are asked for again and again, and the IR does not
        # change while it is analysed.
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
        name = opname(op)
        if name == "arith.constant":
            return ir.IntegerAttr(op.attributes["value"]).value
        if name == "tensor.dim":
            src, idx = op.operands
            i = self.int_value(idx)
            return None if i is None else self.shape(src)[i]
        if name in AFFINE_MAP_OPS:
            n_dims, results = compiled_map(op.attributes["map"])
            args = [self.int_value(o) for o in op.operands]
            vals = [eval_affine(e, args, n_dims) for e in results]
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
        t = ranked(v)
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
            if opname(op) == "tensor.empty":
                t = ir.RankedTensorType(v.type)
                dyn_index = sum(1 for d in list(t.shape)[:dim] if d == DYNAMIC)
                n = self.int_value(op.operands[dyn_index])
                if n is not None:
                    return n
            elif opname(op) == "tensor.extract_slice":
                sizes = self.slice_sizes(op)
                return sizes[dim] if dim < len(sizes) else DEFAULT_DYNAMIC_EXTENT
            elif opname(op) == "tensor.pad":
                view = op.opview
                low = self._static_or_int(op, "static_low", view.low)
                high = self._static_or_int(op, "static_high", view.high)
                return self.shape(op.operands[0])[dim] + low[dim] + high[dim]
            elif opname(op).startswith("linalg.") or opname(op) in LOOP_OPS:  # destination-style
                inits = dps_inits(op)
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
            name = opname(owner)
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
        its segment-size attribute (the cost model's hottest path)."""
        operands = list(op.operands)
        static_offsets = list(ir.DenseI64ArrayAttr(op.attributes["static_offsets"]))
        static_sizes = list(ir.DenseI64ArrayAttr(op.attributes["static_sizes"]))
        n_offsets = sum(1 for s in static_offsets if s == DYNAMIC)
        n_sizes = sum(1 for s in static_sizes if s == DYNAMIC)
        dynamic_offsets = operands[first:first + n_offsets]
        sizes = self._mixed_ints(static_sizes, operands[first + n_offsets:first + n_offsets + n_sizes])
        if n_sizes:  # a tile larger than its dim: affine.min(dim - iv, tile) is the dim, not the tile
            whole = self.shape(operands[first - 1])  # the slice's source (extract) or dest (insert)
            sizes = [min(n, whole[d]) if s == DYNAMIC and d < len(whole) else n
                     for d, (s, n) in enumerate(zip(static_sizes, sizes))]
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
        if isinstance(v, ir.OpResult) and opname(v.owner) in AFFINE_MAP_OPS:
            # Attributes are uniqued in their context: the same map is the same attribute.
            return (opname(v.owner), v.owner.attributes["map"], tuple(self.offset_key(o) for o in v.owner.operands))
        # Anything else (affine.delinearize_index from fusion across a collapse_shape, ...):
        # the value itself, so only slices at this very offset count as the same tile.
        return ("v", v)

    def value_key(self, v: ir.Value):
        # Values hash by identity of the underlying IR value; get_name() would run the printer
        # (~70 us a call, the cost model's hottest line).
        return ("arg", self.arg_index[v]) if v in self.arg_index else ("value", v)

    def bytes_of(self, v: ir.Value, shape: list[int] | None = None) -> int:
        t = ranked(v)
        if t is None:
            return 0
        return math.prod(shape if shape is not None else self.shape(v)) * element_bytes(t)

    # ----- tree
    def new_node(self, op, kind: str, trips: int, parent: Node | None) -> Node:
        node = Node(id=next(self.ids), op=op, kind=kind, trips=max(1, trips), depth=0 if parent is None else parent.depth + 1, parent=parent)
        self.nodes[node.id] = node
        if parent is not None:
            parent.children.append(node)
        return node

    def loop_trips(self, op) -> tuple[int, list[ir.Value]]:
        body = op.regions[0].blocks[0]
        if opname(op) == "scf.for":
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
            name = opname(op)
            node.items.append(op)
            for r in op.results:
                self.value_node[r] = node
            if name in LOOP_OPS:
                trips, ivs = self.loop_trips(op)
                child = self.new_node(op, "forall" if name == "scf.forall" else "for", trips, node)
                for iv in ivs:
                    self.iv_node[iv] = child.id
                inner = body_ops(op)
                self.build_body(child, inner)
            elif name == "scf.forall.in_parallel":
                self.build_body(node, body_ops(op))
            elif name == "scf.if":
                # Tiling a tensor.pad guards each tile with scf.if (then: an all-padding tile,
                # else: the producers fused through the pad): priced as one body, once per trip.
                for region in range(len(op.regions)):
                    self.build_body(node, body_ops(op, region))
            elif name == "tensor.extract_slice":
                self.add_slice(node, op, op.operands[0], op.results[0], is_write=False)
            elif name in ("tensor.insert_slice", "tensor.parallel_insert_slice"):
                self.add_slice(node, op, op.operands[1], op.operands[0], is_write=True)
            elif is_tileable(op):
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
                bytes=self.bytes_of(tile, [s for s in sizes if s != 1] or [1]) if ranked(tile) else 0,
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
            if ranked(v) is None or isinstance(v, ir.BlockArgument) and v not in self.arg_index:
                continue  # scalars; loop-carried tensors (their tiles are the loop's slices)
            if isinstance(v, ir.OpResult) and (v in self.value_node or opname(v.owner) in NO_DATA_OPS):
                continue  # computed in this nest, or no data to read
            node.slices.append(self.whole(v, node))

    def whole(self, v: ir.Value, node: Node, is_write: bool = False) -> Slice:
        """All of tensor `v`, read (or written) in `node`'s body."""
        key = (self.value_key(v), "out") if is_write else (self.value_key(v), (), (), tuple(self.shape(v)))
        return Slice(key=key, source=v, bytes=self.bytes_of(v), source_bytes=self.bytes_of(v), deps=frozenset(),
                     node=node, is_write=is_write)

    def compute_of(self, op, node: Node) -> Compute:
        operands = [o for o in op.operands if ranked(o) is not None]
        shapes = [self.shape(o) for o in operands]
        indexing_maps = linalg.get_indexing_maps(op)
        if indexing_maps is None:
            # TilingInterface ops without indexing maps (pack, unpack, pad, concat, softmax):
            # one iteration point per result element, all parallel.
            result = op.results[0] if len(op.results) else None
            extent = self.shape(result) if result is not None and ranked(result) is not None else []
            return self._compute(op, node, operands, shapes, list(extent), [], list(extent), result)
        maps = [ir.AffineMapAttr(m).value for m in indexing_maps]
        tensor_maps = [m for m, o in zip(maps, op.operands) if ranked(o) is not None] if len(maps) == len(list(op.operands)) else maps[-len(operands):]
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
            lhs = self._lhs_input(operands, tensor_maps, out_dims, len(op.results))
            if lhs is not None:
                c.lhs_rows, c.dynamic_rows = self._register_tile_rows(*lhs, ranges, out_dims)
            rhs_k = _rhs_k_input(operands, tensor_maps, out_dims, len(op.results))
            c.rhs_k_contiguous = rhs_k is not None
            if rhs_k is not None:
                c.rhs_rows = self._register_tile_rows(*rhs_k, ranges, out_dims)[0]
            else:
                c.strided_rhs_elements = self._strided_rhs_elements(operands, tensor_maps, ranges, out_dims, len(op.results))
                if not c.strided_rhs_elements:
                    self._rhs_row_walk(c, operands, tensor_maps, ranges, out_dims, len(op.results))
            self._first_input_vectors(c, operands, tensor_maps, ranges, out_dims, len(op.results))
        return c

    def _first_input_vectors(self, c: Compute, operands, tensor_maps, ranges, out_dims: set[int], n_results: int) -> None:
        """Sets `second_input_rows` and `masked_first_input` of a contraction whose first input,
        read densely, is the one the output's innermost dim indexes and whose second is not."""
        inputs = list(zip(operands, tensor_maps))[: max(0, len(operands) - n_results)]
        if len(inputs) < 2:
            return
        n_dim = max(out_dims)
        (x, x_map), (_, w_map) = inputs[:2]
        x_dims = [e.position if isinstance(e, ir.AffineDimExpr) else None for e in x_map.results]
        w_dims = {e.position for e in w_map.results if isinstance(e, ir.AffineDimExpr)}
        if n_dim not in x_dims or n_dim in w_dims or innermost_step(self.resolve(x)) != 1:
            return
        c.second_input_rows = math.prod(ranges[d] for d in w_dims if d in out_dims)
        t = ranked(x)
        c.masked_first_input = t is not None and t.shape[x_dims.index(n_dim)] == DYNAMIC

    def _strided_rhs_elements(self, operands, tensor_maps, ranges, out_dims: set[int], n_results: int) -> int:
        """B's elements per reduction point (B: `_rhs_input`) when it is cut through a slice that
        steps over elements along the output row (a stride-2 convolution's input along the output
        row); 0 when B's rows are dense."""
        rhs = self._rhs_input(operands, tensor_maps, out_dims, n_results)
        if rhs is None:
            return 0
        v, dims = rhs
        if innermost_step(self.resolve(v)) == 1:
            return 0
        return math.prod(ranges[d] for d in dims if d in out_dims)

    def _rhs_row_walk(self, c: Compute, operands, tensor_maps, ranges, out_dims: set[int], n_results: int) -> None:
        """Sets `rhs_root`, `rhs_run_bytes` and `rhs_walk_rows` of a contraction whose register
        tile reads a part of each row of B (`_rhs_input`) at a time: the tile narrower than B's
        rows. Extents and strides are those of the whole tensor the tile is cut from, where B's
        rows sit in memory."""
        rhs = self._rhs_input(operands, tensor_maps, out_dims, n_results)
        if rhs is None:
            return
        v, dims = rhs
        n_dim = max(out_dims)
        root, t = self.root_tensor(v), ranked(v)
        whole = self.shape(root)
        if t is None or len(whole) != len(dims) or ranges[n_dim] >= whole[-1]:
            return
        size = element_bytes(t)
        rows = tuple((whole[p], math.prod(whole[p + 1:]) * size)
                     for p, d in enumerate(dims) if d not in out_dims and whole[p] > 1)
        if rows:
            c.rhs_root, c.rhs_run_bytes, c.rhs_walk_rows = root, ranges[n_dim] * size, rows

    @staticmethod
    def _rhs_input(operands, tensor_maps, out_dims: set[int], n_results: int) -> tuple[ir.Value, list[int]] | None:
        """B of a contraction and the iteration dim of each of its dims: the first input indexed
        by plain dims whose innermost is the output's innermost dim."""
        n_dim = max(out_dims)
        for v, m in list(zip(operands, tensor_maps))[: max(0, len(operands) - n_results)]:
            dims = [e.position for e in m.results if isinstance(e, ir.AffineDimExpr)]
            if dims and dims[-1] == n_dim and len(dims) == len(list(m.results)):
                return v, dims
        return None

    def _lhs_input(self, operands, tensor_maps, out_dims: set[int], n_results: int) -> tuple[ir.Value, list] | None:
        """The input a register tile broadcasts along its innermost parallel dim (A of a matmul)
        and the iteration dim of each of its dims: the first input indexed by a reduction dim and
        a row dim (a parallel dim other than the innermost) but not the innermost parallel dim."""
        n_dim = max(out_dims)
        for v, m in list(zip(operands, tensor_maps))[: max(0, len(operands) - n_results)]:
            dims = [e.position if isinstance(e, ir.AffineDimExpr) else None for e in m.results]
            if n_dim not in dims and any(d is not None and d not in out_dims for d in dims):
                return v, dims
        return None

    def _register_tile_rows(self, v: ir.Value, dims: list, ranges, out_dims: set[int]) -> tuple[tuple[tuple[int, int], ...], bool]:
        """(extent, byte stride) of each of an input's register-tile row dims (the output dims
        that index it: A's rows, or a B stored [n, k]'s), and whether one of them is dynamic in
        its tile type (a tile that does not divide the rows it tiles). Strides are those of the
        whole tensor the tile is cut from (row-major), where the rows sit in memory."""
        shape = self.shape(self.root_tensor(v))
        t = ranked(v)
        if t is None or len(shape) != len(dims):
            return (), False
        row_positions = [p for p, d in enumerate(dims) if d is not None and d in out_dims and ranges[d] > 1]
        rows = tuple((ranges[dims[p]], math.prod(shape[p + 1:]) * element_bytes(t)) for p in row_positions)
        return rows, any(t.shape[p] == DYNAMIC for p in row_positions)

    def root_tensor(self, v: ir.Value) -> ir.Value:
        """The whole tensor a tile is cut from: through extract_slices and loop-carried args."""
        while True:
            r = through_slices(self.resolve(v))
            if r == v:
                return v
            v = r

    def _carried_acc_bytes(self, op) -> int:
        """Accumulator bytes (init operand + result) of a reducing op whose loop carries them."""
        return sum(self.bytes_of(v) for v in dps_inits(op)) + sum(self.bytes_of(r) for r in op.results)

    @staticmethod
    def _carried_inits(inits, node: Node, sliced: bool = True) -> list | None:
        """The inits' positions among the iter_args of `node`'s scf.for when every init is one
        (`sliced`: through its slices, as tiling leaves a full-size slice of the iter_arg);
        None otherwise."""
        if not inits or node.kind != "for" or node.op is None or opname(node.op) != "scf.for":
            return None
        body = node.op.regions[0].blocks[0]
        roots = [through_slices(v) for v in inits] if sliced else inits
        if not all(isinstance(v, ir.BlockArgument) and v.owner == body and v.arg_number > 0 for v in roots):
            return None
        return [v.arg_number - 1 for v in roots]

    def _accumulator_loop(self, op, node: Node) -> Node | None:
        """The outermost loop of the reduction nest that carries the op's accumulator (None: its
        own scf.for does not): each scf.for whose iter_args hold it, from the op's own up through
        inits that are the enclosing loop's iter_args (a convolution tiled along channels and both
        filter dims carries it through three loops; the compiler keeps it in registers across all
        of them)."""
        positions = self._carried_inits(dps_inits(op), node)
        if positions is None:
            return None
        while node.parent is not None:
            # An enclosing loop carries the same tile only when it hands its iter_arg on whole:
            # a parallel loop's iter_arg is the whole output, sliced per trip.
            loop_inits = dps_inits(node.op)
            positions = self._carried_inits([loop_inits[i] for i in positions], node.parent, sliced=False)
            if positions is None:
                break
            node = node.parent
        return node

    def _compute(self, op, node: Node, operands, shapes, ranges, reduction, parallel, typed) -> Compute:
        """One execution of `op` over `ranges`; `typed` gives the element type (None: f32)."""
        t = ranked(typed) if typed is not None else None
        loop = self._accumulator_loop(op, node) if reduction else None
        return Compute(
            op=op,
            name=opname(op),
            uid=uid_of(op),
            points=math.prod(ranges) if ranges else 1,
            flops_per_point=flops_per_point(op),
            reduction_tile=reduction,
            parallel_tile=parallel,
            element_type=str(t.element_type) if t else "f32",
            element_bytes=element_bytes(t) if t else 4,
            operand_bytes=sum(self.bytes_of(o, s) for o, s in zip(operands, shapes)) + sum(self.bytes_of(r) for r in op.results),
            node=node,
            carried_acc_bytes=self._carried_acc_bytes(op) if loop is not None else 0,
            accumulator_loop=loop,
        )


def _rhs_k_input(operands, tensor_maps, out_dims: set[int], n_results: int) -> tuple[ir.Value, list[int]] | None:
    """B stored [n, k] (as nn.Linear keeps weights) and the iteration dim of each of its dims: the
    first input indexed by plain dims, among them the output's innermost, with a reduction dim
    innermost; None when no input is."""
    last = tensor_maps[-1].results[-1] if tensor_maps and len(tensor_maps[-1].results) else None
    if not isinstance(last, ir.AffineDimExpr):
        return None
    for v, m in list(zip(operands, tensor_maps))[: max(0, len(operands) - n_results)]:
        dims = [e.position for e in m.results if isinstance(e, ir.AffineDimExpr)]
        if last.position in dims and dims[-1] not in out_dims and len(dims) == len(list(m.results)):
            return v, dims
    return None


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

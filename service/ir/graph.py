"""Op graph: the tileable ops of a module, their iteration domains and the data-flow DAG.

Which ops are tileable is MLIR's answer, not a list of names: a transform script matches every
op implementing TilingInterface and annotates it. Each gets a stable integer uid (`ts.uid`) in
program order; the uids are how plans, scripts and origin maps name ops.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .fingerprint import op_signature
from .mlir import attribute_names, context, ir, linalg, transform_interpreter

UID_ATTR = "ts.uid"
COPY_OF_ATTR = "ts.copy_of"  # on a fill's copy: the uid of the fill it copies (see _untie_shared_fills)
TILEABLE_MARK = "ts.tileable"
FUSE_GROUP_ATTRS = ("tilesearch.fuse_group", "torq-fuse-group")

# Ops that forward a tensor without computing on it: data-flow edges pass through them
# (listed on the edge), but they cannot sit inside a tiled loop as they are.
PASS_THROUGH_OPS = frozenset(
    {
        "tensor.expand_shape",
        "tensor.collapse_shape",
        "tensor.extract_slice",
        "tensor.cast",
        "tensor.bitcast",
        "tensor.reshape",
    }
)

_FIND_TILEABLE = f"""
module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @__transform_main(%root: !transform.any_op {{transform.readonly}}) {{
    %ops = transform.structured.match interface{{TilingInterface}} in %root
      : (!transform.any_op) -> !transform.any_op
    transform.annotate %ops "{TILEABLE_MARK}" : !transform.any_op
    transform.yield
  }}
}}
"""


_ELEMENT_BYTES = {"f64": 8, "i64": 8, "f32": 4, "i32": 4, "f16": 2, "bf16": 2, "i16": 2, "i8": 1, "i1": 1}


def element_bytes(element_type: str) -> int:
    """Bytes of one element of a type named as TileableOp names them (4 when unknown)."""
    return _ELEMENT_BYTES.get(element_type, 4)


@dataclass(frozen=True)
class DynamicDim:
    """A loop dim whose extent is only known at run time: dim `dim` of SSA value `value`."""

    value: str
    dim: int
    arg_index: int | None  # function argument number when `value` is one (shape hints name it)


@dataclass
class TileableOp:
    uid: int
    name: str
    func: str
    kind: str  # contraction | convolution | reduction | elementwise | fill | data_movement | other
    loop_ranges: list[int | None]
    iterator_types: list[str]
    indexing_maps: list[str] | None
    dynamic_dims: dict[int, DynamicDim]
    operand_shapes: list[list[int | None] | None]  # None for scalars
    operand_element_types: list[str]
    result_shapes: list[list[int | None]]
    num_inputs: int
    flops_per_point: int
    fuse_groups: list[int]
    copy_of: int | None = None  # a shared fill's copy for one of its readers: the original's uid
    # Parallel loop dims every operand reads as a plain dim: a contraction's batch dims, each
    # index an independent problem (an elementwise op's dims are all of this kind).
    batch_dims: list[int] = field(default_factory=list)
    # Per operand (the indexing maps' order): the loop dim of each of its indices, innermost
    # (contiguous in memory) last; None for an index that is not a plain dim.
    operand_dims: list[list[int | None]] = field(default_factory=list)
    # Per operand: elements between neighbours along its innermost dim in the tensor it is read
    # from (innermost_step); above 1 for a stride-2 convolution's input read as a matmul's.
    operand_steps: list[int] = field(default_factory=list)
    signature: str = ""
    producers: list[int] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)

    @property
    def element_type(self) -> str:
        return self.operand_element_types[-1] if self.operand_element_types else ""

    @property
    def reduction_dims(self) -> list[int]:
        return [i for i, t in enumerate(self.iterator_types) if t == "reduction"]

    @property
    def parallel_dims(self) -> list[int]:
        return [i for i, t in enumerate(self.iterator_types) if t == "parallel"]

    def rhs_contiguous_reduction_dim(self) -> int | None:
        """For a contraction whose B operand (the input the innermost parallel dim indexes) is
        contiguous along a reduction dim, as `nn.Linear` weights stored [out, in] are: that dim."""
        if self.kind != "contraction" or not self.parallel_dims:
            return None
        n = self.parallel_dims[-1]
        for dims in self.operand_dims[: self.num_inputs]:
            if n in dims and dims and dims[-1] is not None and self.iterator_types[dims[-1]] == "reduction":
                return dims[-1]
        return None

    def convolution_dims(self) -> ConvolutionDims | None:
        """A convolution's loop dims by role, as IREE infers them from the indexing maps
        (`linalg::inferConvolutionDims`); None for any other op."""
        if self.kind != "convolution" or not self.indexing_maps:
            return None
        return convolution_dims(self.indexing_maps)


@dataclass(frozen=True)
class ConvolutionDims:
    """A convolution's loop dims by role (MLIR's `ConvolutionDimensions`), or their extents, and
    the strides of its output image dims and dilations of its filter dims."""

    batch: tuple[int, ...]
    output_image: tuple[int, ...]
    output_channel: tuple[int, ...]
    filter_loop: tuple[int, ...]
    input_channel: tuple[int, ...]
    depth: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]

    @property
    def is_pooling(self) -> bool:
        """A window over each channel, no filter of its own: neither output nor depthwise channels."""
        return not (self.output_channel or self.depth)


CONVOLUTION_ROLES = ("batch", "output_image", "output_channel", "filter_loop", "input_channel", "depth")


def convolution_dims(indexing_maps: list[str]) -> ConvolutionDims | None:
    """MLIR's inference of a convolution's dims from its indexing maps (input, filter, output);
    None when they are not a convolution's."""
    with context():
        maps = [ir.AffineMapAttr(ir.Attribute.parse(m if m.startswith("affine_map<") else f"affine_map<{m}>")).value
                for m in indexing_maps[:3]]
        dims = linalg.infer_convolution_dimensions_from_maps(maps)
        if dims is None:
            return None
        return ConvolutionDims(**{name: tuple(int(d) for d in getattr(dims, name))
                                  for name in (*CONVOLUTION_ROLES, "strides", "dilations")})


@dataclass(frozen=True)
class Edge:
    """Result `result` of `producer` feeds operand `operand` of `consumer`, through `via` ops."""

    producer: int
    consumer: int
    result: int
    operand: int
    via: tuple[str, ...] = ()


@dataclass
class OpGraph:
    ops: dict[int, TileableOp]
    edges: list[Edge]
    fuse_groups: dict[int, list[int]]
    non_tileable_on_edges: list[str]
    # Transitive closures, asked for thousands of times by plan checks (the graph is not
    # modified after build_graph).
    _upstream: dict[int, frozenset[int]] = field(default_factory=dict, repr=False, compare=False)
    _downstream: dict[int, frozenset[int]] = field(default_factory=dict, repr=False, compare=False)

    def op(self, uid: int) -> TileableOp:
        return self.ops[uid]

    def has_static_shapes(self) -> bool:
        """Every tensor a tileable op reads or writes has a static shape."""
        return all(d is not None for op in self.ops.values() for shape in [*op.operand_shapes, *op.result_shapes]
                   if shape is not None for d in shape)

    def topological_order(self) -> list[int]:
        """Uids in an order where every producer precedes its consumers (program order is one)."""
        return sorted(self.ops)

    def edges_into(self, uid: int) -> list[Edge]:
        return [e for e in self.edges if e.consumer == uid]

    def edges_from(self, uid: int) -> list[Edge]:
        return [e for e in self.edges if e.producer == uid]

    def upstream(self, uid: int) -> frozenset[int]:
        """All ops whose results reach `uid` (transitively)."""
        if uid not in self._upstream:
            self._upstream[uid] = self._closure(uid, "producers")
        return self._upstream[uid]

    def downstream(self, uid: int) -> frozenset[int]:
        """All ops `uid`'s results reach (transitively)."""
        if uid not in self._downstream:
            self._downstream[uid] = self._closure(uid, "consumers")
        return self._downstream[uid]

    def _closure(self, uid: int, direction: str) -> frozenset[int]:
        seen: set[int] = set()
        stack = [uid]
        while stack:
            for v in getattr(self.ops[stack.pop()], direction):
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return frozenset(seen)

    def to_json(self) -> dict:
        return {
            "ops": [
                {
                    **{k: v for k, v in asdict(op).items() if k != "dynamic_dims"},
                    "dynamic_dims": {str(d): asdict(v) for d, v in op.dynamic_dims.items()},
                }
                for op in self.ops.values()
            ],
            "edges": [asdict(e) for e in self.edges],
            "fuse_groups": {str(k): v for k, v in self.fuse_groups.items()},
        }


# --------------------------------------------------------------------------- tagging


def walk_ops(root: ir.Operation) -> list[ir.Operation]:
    ops: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        ops.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit, ir.WalkOrder.PRE_ORDER)
    return ops


def holder_in(op: ir.Operation, body: dict | set) -> ir.Operation | None:
    """The op of a block (`body`: its ops) that is `op` or holds it in its regions; None when
    `op` is outside the block. Walking up from a use is cheaper than down every region."""
    while op is not None and op not in body:
        op = op.parent
    return op


def _untie_shared_fills(root: ir.Operation) -> list[tuple[ir.Operation, ir.Operation]]:
    """Give every reader of a shared `linalg.fill` but the first a copy of its own, placed just
    before the reader. Returns (original, copy) pairs.

    CSE merges identical fills, so in an imported model one fill often initialises several
    matmuls or convolutions. Shared, it can be fused into one tile group only and stays a whole
    tensor for the others (1.5 MiB for a ResNet stage, more than any scratchpad). A fill reads
    nothing, so a copy per reader costs nothing; IREE's dispatch formation clones fills into
    every dispatch the same way. Tensors are values, so the copies compute what the original did.
    """
    ops = walk_ops(root)
    position = {op: i for i, op in enumerate(ops)}
    # Every reader is found before any is rewritten: rewriting an operand changes an op's hash
    # in these bindings, so a lookup by op after a rewrite would miss.
    shared = []
    for fill in ops:
        if fill.name != "linalg.fill" or len(fill.results) != 1 or not isinstance(fill.results[0].type, ir.RankedTensorType):
            continue
        readers = sorted({use.owner.operation for use in fill.results[0].uses}, key=position.__getitem__)
        if len(readers) > 1:
            shared.append((fill, readers[1:]))
    pairs = []
    for fill, readers in shared:
        result = fill.results[0]
        for reader in readers:
            copy = fill.clone(ip=ir.InsertionPoint(reader))
            for i, operand in enumerate(reader.operands):
                if operand == result:
                    reader.operands[i] = copy.results[0]
            pairs.append((fill, copy.operation))
    return pairs


def tag_tileable_ops(module: ir.Module) -> ir.OpView:
    """A copy of `module` with `ts.uid = i` on every TilingInterface op, in program order.

    The input module is not modified. Stale `ts.*` attributes in the input are dropped first so
    a resubmitted tiled module is tagged afresh. A fill read by several ops is first given a
    copy per reader (`_untie_shared_fills`), each tagged `ts.copy_of` with the original's uid.
    """
    with context():
        tagged = module.operation.clone()
        for op in walk_ops(tagged.operation):
            for name in [n for n in attribute_names(op) if n.startswith("ts.")]:
                del op.attributes[name]
        copies = _untie_shared_fills(tagged.operation)
        script = ir.Module.parse(_FIND_TILEABLE)
        transform_interpreter.apply_named_sequence(
            tagged.operation, script.body.operations[0], script
        )
        uid = 0
        i64 = ir.IntegerType.get_signless(64)
        for op in walk_ops(tagged.operation):
            if TILEABLE_MARK in op.attributes:
                del op.attributes[TILEABLE_MARK]
                op.attributes[UID_ATTR] = ir.IntegerAttr.get(i64, uid)
                uid += 1
        for original, copy in copies:
            if UID_ATTR in original.attributes:
                copy.attributes[COPY_OF_ATTR] = original.attributes[UID_ATTR]
    return tagged


def uid_of(op: ir.Operation) -> int | None:
    attr = op.attributes[UID_ATTR] if UID_ATTR in op.attributes else None
    return None if attr is None else ir.IntegerAttr(attr).value


# --------------------------------------------------------------------------- per-op facts


def _shape(t: ir.Type) -> list[int | None] | None:
    if not isinstance(t, ir.ShapedType):
        return None
    st = ir.ShapedType(t)
    if not st.has_rank:
        return None
    return [None if st.is_dynamic_dim(i) else st.get_dim_size(i) for i in range(st.rank)]


def _element_type(t: ir.Type) -> str:
    return str(ir.ShapedType(t).element_type) if isinstance(t, ir.ShapedType) else str(t)


def _num_inputs(op: ir.Operation) -> int:
    """Number of `ins` operands; the rest are inits (`outs`)."""
    if "operandSegmentSizes" in op.attributes:
        return ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])[0]
    return max(len(op.operands) - len(op.results), 0)


def _iterator_types_from_attr(attr: ir.Attribute) -> list[str]:
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    return ["parallel" if a == parallel else "reduction" for a in ir.ArrayAttr(attr)]


def _affine_maps(op: ir.Operation) -> list[ir.AffineMap] | None:
    maps = linalg.get_indexing_maps(op)
    if maps is None:
        return None
    return [ir.AffineMapAttr(a).value for a in maps]


def _dim_position(expr: ir.AffineExpr) -> int | None:
    return ir.AffineDimExpr(expr).position if isinstance(expr, ir.AffineDimExpr) else None


def _value_name(value: ir.Value) -> str:
    return value.get_name()


def _arg_index(value: ir.Value) -> int | None:
    if isinstance(value, ir.BlockArgument):
        parent = value.owner.owner
        if parent is not None and parent.operation.name == "func.func":
            return value.arg_number
    return None


def _constant_index(value: ir.Value) -> int | None:
    if isinstance(value, ir.OpResult) and value.owner.name == "arith.constant":
        attr = value.owner.attributes["value"]
        if isinstance(attr, ir.IntegerAttr):
            return attr.value
    return None


def _dynamic_source(value: ir.Value, dim: int) -> DynamicDim:
    """Where a dynamic tensor dim comes from: follow inits, tensor.empty sizes and tensor.dim
    back to the value (ideally a function argument) whose run-time shape sizes it."""
    for _ in range(64):  # bounded: IR is acyclic here, this is only a guard
        if not isinstance(value, ir.OpResult):
            break
        owner = value.owner
        if owner.name == "tensor.empty":
            shape = _shape(value.type) or []
            k = sum(1 for s in shape[:dim] if s is None)
            size = owner.operands[k]
            if isinstance(size, ir.OpResult) and size.owner.name == "tensor.dim":
                index = _constant_index(size.owner.operands[1])
                if index is None:
                    break
                value, dim = size.owner.operands[0], index
                continue
            break
        if UID_ATTR in owner.attributes and "operandSegmentSizes" in owner.attributes:
            # Destination-style op: a result has the shape of its init operand.
            init = _num_inputs(owner) + value.result_number
            if init >= len(owner.operands):
                break
            value = owner.operands[init]
            continue
        if owner.name in PASS_THROUGH_OPS and owner.name in ("tensor.cast",):
            value = owner.operands[0]
            continue
        break
    return DynamicDim(_value_name(value), dim, _arg_index(value))


def _structured_domain(
    op: ir.Operation, maps: list[ir.AffineMap]
) -> tuple[list[int | None], dict[int, DynamicDim]]:
    """Loop ranges of a linalg structured op: each loop dim is sized by an operand dim that
    its indexing map reads as that loop dim alone (e.g. a conv's output rows, not its input)."""
    n_loops = maps[0].n_dims if maps else 0
    ranges: list[int | None] = [None] * n_loops
    sized: list[bool] = [False] * n_loops
    dynamic: dict[int, DynamicDim] = {}
    for operand, amap in zip(op.operands, maps):
        shape = _shape(operand.type)
        if shape is None:
            continue
        for tensor_dim, expr in enumerate(amap.results):
            loop = _dim_position(expr)
            if loop is None or sized[loop]:
                continue
            if shape[tensor_dim] is None:
                if loop not in dynamic:
                    dynamic[loop] = _dynamic_source(operand, tensor_dim)
                continue
            ranges[loop] = shape[tensor_dim]
            sized[loop] = True
            dynamic.pop(loop, None)
    return ranges, dynamic


def _result_domain(op: ir.Operation, shape_of: ir.Value) -> tuple[list[int | None], dict[int, DynamicDim]]:
    shape = _shape(shape_of.type) or []
    dynamic = {i: _dynamic_source(shape_of, i) for i, s in enumerate(shape) if s is None}
    return list(shape), dynamic


def _non_structured_domain(op: ir.Operation) -> tuple[list[int | None], list[str], dict[int, DynamicDim]]:
    """Iteration domains of TilingInterface ops without indexing maps, as MLIR defines them."""
    if op.name == "linalg.pack":
        # Loops over the outer (tiled) dims of the packed result: the source rank leading dims.
        src_rank = len(_shape(op.operands[0].type) or [])
        ranges, dynamic = _result_domain(op, op.results[0])
        ranges = ranges[:src_rank]
        dynamic = {d: v for d, v in dynamic.items() if d < src_rank}
        return ranges, ["parallel"] * src_rank, dynamic
    ranges, dynamic = _result_domain(op, op.results[0]) if op.results else ([], {})
    iterators = ["parallel"] * len(ranges)
    if op.name == "linalg.softmax" and "dimension" in op.attributes:
        reduced = ir.IntegerAttr(op.attributes["dimension"]).value
        if 0 <= reduced < len(iterators):
            iterators[reduced] = "reduction"
    return ranges, iterators, dynamic


# Payload ops that are not arithmetic.
NON_FLOP_PAYLOAD_OPS = frozenset({"linalg.yield", "linalg.index", "arith.constant", "arith.index_cast"})
FLOP_DIALECTS = ("arith", "math", "complex")


def flops_per_point(op: ir.Operation | ir.OpView) -> int:
    """Arithmetic ops executed per iteration point: the arith/math/complex ops of the payload
    (a matmul's mulf + addf = 2). The op graph and the cost model both count with this."""
    count = 0
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                name = inner.operation.name
                if name.split(".")[0] in FLOP_DIALECTS and name not in NON_FLOP_PAYLOAD_OPS:
                    count += 1
    return count


def _fuse_groups(op: ir.Operation) -> list[int]:
    for name in FUSE_GROUP_ATTRS:
        if name not in op.attributes:
            continue
        attr = op.attributes[name]
        if isinstance(attr, ir.ArrayAttr):
            return [ir.IntegerAttr(a).value for a in ir.ArrayAttr(attr)]
        if isinstance(attr, ir.DenseI64ArrayAttr):
            return list(ir.DenseI64ArrayAttr(attr))
        if isinstance(attr, ir.IntegerAttr):
            return [ir.IntegerAttr(attr).value]
    return []


def _kind(op: ir.Operation, iterators: list[str], flops: int) -> str:
    if op.name == "linalg.fill":
        return "fill"
    try:
        if linalg.isa_contraction_op(op):
            return "contraction"
        if linalg.isa_convolution_op(op):
            return "convolution"
    except Exception:  # not a LinalgOp: the queries only apply to structured ops
        pass
    if op.name.startswith("linalg.pooling") or op.name.startswith("linalg.depthwise_conv"):
        return "convolution"
    if "reduction" in iterators:
        return "reduction"
    if op.name in ("linalg.pack", "linalg.unpack", "tensor.pad", "linalg.transpose", "linalg.copy",
                   "linalg.broadcast", "tensor.concat"):
        return "data_movement"
    if flops > 0:
        return "elementwise"
    return "data_movement" if op.name == "linalg.generic" else "other"


def _enclosing_func(op: ir.Operation) -> str:
    parent = op.parent
    while parent is not None:
        if parent.operation.name == "func.func":
            return ir.StringAttr(parent.attributes["sym_name"]).value
        parent = parent.parent
    return ""


def _structured_iterator_types(op: ir.Operation, maps: list[ir.AffineMap]) -> list[str]:
    if "iterator_types" in op.attributes:
        return _iterator_types_from_attr(op.attributes["iterator_types"])
    # Named ops: a loop dim is parallel iff an init (output) map reads it (OpDSL's rule).
    out_dims = {_dim_position(e) for m in maps[_num_inputs(op):] for e in m.results}
    return ["parallel" if d in out_dims else "reduction" for d in range(maps[0].n_dims)]


def describe_op(op: ir.Operation, uid: int) -> TileableOp:
    maps = _affine_maps(op)
    if maps:
        ranges, dynamic = _structured_domain(op, maps)
        iterators = _structured_iterator_types(op, maps)
        map_text = [str(m) for m in maps]
        batch = [d for d, t in enumerate(iterators)
                 if t == "parallel" and all(d in {_dim_position(e) for e in m.results} for m in maps)]
        operand_dims = [[_dim_position(e) for e in m.results] for m in maps]
    else:
        ranges, iterators, dynamic = _non_structured_domain(op)
        map_text, batch, operand_dims = None, [], []
    flops = flops_per_point(op)
    return TileableOp(
        uid=uid,
        name=op.name,
        func=_enclosing_func(op),
        kind=_kind(op, iterators, flops),
        loop_ranges=ranges,
        iterator_types=iterators,
        indexing_maps=map_text,
        dynamic_dims=dynamic,
        operand_shapes=[_shape(v.type) for v in op.operands],
        operand_element_types=[_element_type(v.type) for v in op.operands],
        result_shapes=[_shape(r.type) or [] for r in op.results],
        num_inputs=_num_inputs(op),
        flops_per_point=flops,
        fuse_groups=_fuse_groups(op),
        copy_of=ir.IntegerAttr(op.attributes[COPY_OF_ATTR]).value if COPY_OF_ATTR in op.attributes else None,
        batch_dims=batch,
        operand_dims=operand_dims,
        operand_steps=[innermost_step(v) for v in op.operands],
    )


def innermost_step(value: ir.Value) -> int:
    """Elements between neighbours along the innermost dim of the tensor `value` is cut from:
    the product of the innermost static strides of the rank-keeping `tensor.extract_slice`s it
    comes through (1 where a stride is dynamic or a slice drops dims: read as dense)."""
    step = 1
    while isinstance(value, ir.OpResult) and value.owner.name == "tensor.extract_slice":
        source = value.owner.operands[0]
        strides = list(ir.DenseI64ArrayAttr(value.owner.attributes["static_strides"]))
        if not (isinstance(source.type, ir.RankedTensorType) and isinstance(value.type, ir.RankedTensorType)):
            return 1
        if ir.RankedTensorType(source.type).rank != ir.RankedTensorType(value.type).rank or strides[-1] < 1:
            return 1
        step *= strides[-1]
        value = source
    return step


# --------------------------------------------------------------------------- the graph


def _trace_producer(value: ir.Value) -> tuple[ir.Operation | None, int, tuple[str, ...]]:
    """The tileable op whose result reaches `value`, passing through PASS_THROUGH_OPS."""
    via: list[str] = []
    while True:
        if isinstance(value, ir.BlockArgument):
            return None, 0, tuple(via)
        res = ir.OpResult(value)
        owner = res.owner
        if UID_ATTR in owner.attributes:
            return owner, res.result_number, tuple(via)
        if owner.name in PASS_THROUGH_OPS:
            via.append(owner.name)
            value = owner.operands[0]
            continue
        return None, 0, tuple(via)


def build_graph(tagged: ir.Module | ir.OpView) -> OpGraph:
    """The op graph of a module tagged by `tag_tileable_ops`."""
    with context():
        ops: dict[int, TileableOp] = {}
        handles: dict[int, ir.Operation] = {}
        for op in walk_ops(tagged.operation):
            uid = uid_of(op)
            if uid is None:
                continue
            desc = describe_op(op, uid)
            desc.signature = op_signature(op)
            ops[uid] = desc
            handles[uid] = op
        edges: list[Edge] = []
        crossed: set[str] = set()
        for uid, op in handles.items():
            for idx, operand in enumerate(op.operands):
                producer, result, via = _trace_producer(operand)
                if producer is None:
                    continue
                puid = uid_of(producer)
                edges.append(Edge(puid, uid, result, idx, via))
                crossed.update(via)
        for e in edges:
            if e.producer not in ops[e.consumer].producers:
                ops[e.consumer].producers.append(e.producer)
            if e.consumer not in ops[e.producer].consumers:
                ops[e.producer].consumers.append(e.consumer)
        groups: dict[int, list[int]] = {}
        for uid, desc in ops.items():
            for g in desc.fuse_groups:
                groups.setdefault(g, []).append(uid)
    return OpGraph(ops=ops, edges=edges, fuse_groups=groups, non_tileable_on_edges=sorted(crossed))

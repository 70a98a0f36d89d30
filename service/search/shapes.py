"""Shape hints and buckets: what the user wrote, checked against the module, and the hints of
each bucket of a bucketed search.

Hints name function arguments by position: `argN` in every function of the module, `FUNC.argN`
in function @FUNC only (service/ir/hints.py); buckets name `[FUNC.]argN`, one dim `[FUNC.]argN.D`
or, with a label such as M, every dynamic dim. A hint the module cannot use would give a plan for shapes that never occur, or crash
the cost model (a zero dim), so it is a ShapeHintError whose message says what to fix: the CLI
exits with code 2, the API answers 422.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from service.hardware.model import HardwareModel
from service.ir.graph import OpGraph, element_bytes, walk_ops
from service.ir.hints import HINT_NAME, hint_for, hint_key, split_hint_key
from service.ir.mlir import context, ir, linalg

from .errors import SearchInputError, ShapeHintError
from .space import DEFAULT_DYNAMIC_EXTENT

# A bucket names [FUNC.]argN as a hint does, or one of its dims: [FUNC.]argN.D.
_ARG_DIM = re.compile(HINT_NAME.pattern + r"(?:\.(?P<dim>\d+))?")
_HINT_FORM, _HINT_EXAMPLE = "argN=AxB (FUNC.argN=AxB for one function)", "arg0=128x1024"
_BUCKET_FORM, _BUCKET_EXAMPLE = "NAME=v1,v2,...", "M=1,16,128,1024"


@dataclass(frozen=True)
class Argument:
    """A function argument as hints name it: `argN` of `func`."""

    name: str  # argN
    index: int  # N
    func: str
    type: str  # as MLIR prints it, e.g. tensor<?x768xf32>
    shape: tuple[int | None, ...] | None  # None dims are dynamic; None: not a ranked shaped type
    # Sizes of open dims that other arguments fix through a loop they share (implied_sizes).
    implied: tuple[tuple[int, int], ...] = ()

    @property
    def dynamic_dims(self) -> list[int]:
        return [d for d, s in enumerate(self.shape or ()) if s is None]


def _defined_functions(module: ir.Module) -> list[tuple[str, ir.Operation]]:
    """(name, op) of every function with a body (declarations take no hints); in a context."""
    return [(ir.StringAttr(op.attributes["sym_name"]).value, op) for op in module.body.operations
            if op.operation.name == "func.func" and len(op.regions[0].blocks) > 0]


def function_arguments(module: ir.Module) -> list[Argument]:
    """The arguments of every function with a body (declarations take no hints)."""
    out: list[Argument] = []
    with context():
        for func, op in _defined_functions(module):
            for i, arg in enumerate(op.regions[0].blocks[0].arguments):
                shape = None
                if isinstance(arg.type, ir.ShapedType) and ir.ShapedType(arg.type).has_rank:
                    st = ir.ShapedType(arg.type)
                    shape = tuple(None if st.is_dynamic_dim(d) else st.get_dim_size(d) for d in range(st.rank))
                out.append(Argument(f"arg{i}", i, func, str(arg.type), shape))
    return out


# --------------------------------------------------------------------------- syntax


def _pairs(items: list[str] | dict, what: str, form: str, example: str) -> list[tuple[str, object]]:
    """(name, value) pairs from CLI strings 'NAME=VALUE' or a JSON object; a name given twice is
    an error (the last one would silently win)."""
    if isinstance(items, dict):
        pairs = [(str(k).strip(), v) for k, v in items.items()]
    else:
        pairs = []
        for s in items:
            name, eq, value = s.partition("=")
            if not eq or not name.strip():
                raise ShapeHintError(f"{what} {s!r}: write {form}, e.g. {example}")
            pairs.append((name.strip(), value))
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            raise ShapeHintError(f"{what} {name} is given twice; give it once")
        seen.add(name)
    return pairs


def _sizes(value: object, sep: str, shown: str, example: str, dims: bool) -> list[int]:
    """'128x1024' / '1,16' / 128 / [128, 1024] -> [128, 1024], each a whole number >= 1."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.lower().split(sep)] if value.strip() else []
    elif isinstance(value, int) and not isinstance(value, bool):
        parts = [value]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise ShapeHintError(f"{shown}: give whole numbers, e.g. {example}")
    sizes = []
    for i, p in enumerate(parts):
        n = None
        if isinstance(p, (int, str)) and not isinstance(p, bool):
            try:
                n = int(p)
            except ValueError:
                pass
        if n is None:
            raise ShapeHintError(f"{shown}: {p!r} is not a whole number; write e.g. {example}")
        if n < 1:
            what = f"dim {i} is {n}; every dim" if dims else f"{n} is not a size; every value"
            raise ShapeHintError(f"{shown}: {what} must be at least 1, e.g. {example}")
        sizes.append(n)
    if not sizes:
        raise ShapeHintError(f"{shown}: no sizes given; write e.g. {example}")
    return sizes


def _show(value: object, sep: str) -> str:
    return value if isinstance(value, str) else sep.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def parse_shape_hints(items: list[str] | dict | None) -> dict[str, list[int]]:
    """['arg0=128x1024', 'f2.arg0=8x4x4'] or {'arg0': '128x1024' | [128, 1024]} ->
    {'arg0': [128, 1024], 'f2.arg0': [8, 4, 4]} (names as service/ir/hints.py reads them)."""
    if not items:
        return {}
    out = {}
    for name, value in _pairs(items, "shape hint", _HINT_FORM, _HINT_EXAMPLE):
        shown = f"shape hint {name}={_show(value, 'x')}"
        parts = split_hint_key(name)
        if parts is None:
            raise ShapeHintError(f"{shown}: name a function argument as argN (N: its position; every function) or "
                                 f"FUNC.argN (function @FUNC only), e.g. {_HINT_EXAMPLE}")
        key = hint_key(*parts)
        if key in out:
            raise ShapeHintError(f"shape hint {key} is given twice; give it once")
        out[key] = _sizes(value, "x", shown, _HINT_EXAMPLE, dims=True)
    return out


def parse_buckets(items: list[str] | dict | None) -> dict[str, list[int]]:
    """['M=1,16,128,1024'] -> {'M': [1, 16, 128, 1024]} (sorted, each value once)."""
    if not items:
        return {}
    out = {}
    for name, value in _pairs(items, "bucket", _BUCKET_FORM, _BUCKET_EXAMPLE):
        shown = f"bucket {name}={_show(value, ',')}"
        if (name.startswith(("arg", "@")) or ".arg" in name) and not _ARG_DIM.fullmatch(name):
            raise ShapeHintError(f"{shown}: name an argument's dynamic dims as argN, one of them as argN.D "
                                 f"(e.g. arg0.0; FUNC.argN[.D] in one function), or use a label such as M for "
                                 f"every dynamic dim")
        values = _sizes(value, ",", shown, _BUCKET_EXAMPLE, dims=False)
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ShapeHintError(f"{shown}: {', '.join(map(str, repeated))} listed more than once; list each size once")
        out[name] = sorted(values)
    return out


# --------------------------------------------------------------------------- against the module


def several_functions(args: list[Argument]) -> bool:
    """Whether the arguments come from more than one function (messages then name it)."""
    return len({a.func for a in args}) > 1


def _listing(args: list[Argument]) -> str:
    """'arg0 tensor<?x768xf32>, arg1 ...' (functions named when the module has several)."""
    several = several_functions(args)
    return ", ".join(f"{a.name} {a.type}" + (f" of @{a.func}" if several else "") for a in args) or "none"


def _example(key: str, arg: Argument, given: list[int]) -> str:
    """The hint `arg` takes under the name `key`: its static dims, and the given sizes for its
    dynamic dims."""
    assert arg.shape is not None
    if len(given) == len(arg.shape):
        sizes = [given[d] if s is None else s for d, s in enumerate(arg.shape)]
    else:
        fill = iter(given)
        sizes = [next(fill, DEFAULT_DYNAMIC_EXTENT) if s is None else s for s in arg.shape]
    return f"{key}={'x'.join(map(str, sizes))}"


def _hinted_arguments(name: str, hints: dict[str, list[int]], arguments: list[Argument]) -> list[Argument]:
    """The arguments the hint `name` sizes: `FUNC.argN` one, `argN` that of every function
    without a `FUNC.argN` of its own."""
    func, index = split_hint_key(name) or (None, -1)
    shown = f"shape hint {name}={'x'.join(map(str, hints[name]))}"
    if func is not None:
        functions = sorted({a.func for a in arguments})
        if func not in functions:
            raise ShapeHintError(f"{shown}: the module has no function @{func}; its functions: "
                                 f"{', '.join('@' + f for f in functions) or 'none'}")
        named = [a for a in arguments if a.func == func and a.index == index]
        if not named:
            raise ShapeHintError(f"{shown}: @{func} has no arg{index}; its arguments: "
                                 f"{_listing([a for a in arguments if a.func == func])}")
        return named
    every = [a for a in arguments if a.index == index]
    if not every:
        raise ShapeHintError(f"{shown}: the module has no {name}; its arguments: {_listing(arguments)}")
    named = [a for a in every if hint_key(a.func, index) not in hints]
    if not named:
        raise ShapeHintError(f"{shown}: every function's {name} has a hint of its own "
                             f"({', '.join(hint_key(a.func, index) for a in every)}); drop {name}")
    return named


def check_shape_hints(hints: dict[str, list[int]], arguments: list[Argument]) -> None:
    """Every hint names an argument with dynamic dims, with its rank and its static dims."""
    dynamic = [a for a in arguments if a.dynamic_dims]
    for name, sizes in hints.items():
        shown = f"shape hint {name}={'x'.join(map(str, sizes))}"
        named = _hinted_arguments(name, hints, arguments)
        targets = [a for a in named if a.dynamic_dims]
        if not targets:
            others = f"arguments with dynamic dims: {_listing(dynamic)}" if dynamic else "the module has no dynamic dims"
            raise ShapeHintError(f"{shown}: {name} is static ({', '.join(a.type for a in named)}) and needs no hint; {others}")
        # Functions whose argN differ cannot share one hint: say how to give each its own.
        per_function = (f"; or give each function its own, e.g. {hint_key(targets[1].func, targets[1].index)}=..."
                        if len(targets) > 1 and len({a.type for a in targets}) > 1 else "")
        for arg in targets:
            assert arg.shape is not None
            where = f"{name} of @{arg.func}" if len(targets) > 1 else name
            if len(sizes) != len(arg.shape):
                raise ShapeHintError(f"{shown}: {where} has rank {len(arg.shape)} ({arg.type}); "
                                     f"give {len(arg.shape)} dims, e.g. {_example(name, arg, sizes)}{per_function}")
            for d, (size, static) in enumerate(zip(sizes, arg.shape)):
                if static is not None and size != static:
                    raise ShapeHintError(f"{shown}: dim {d} of {where} is {static} ({arg.type}); "
                                         f"keep its static dims, e.g. {_example(name, arg, sizes)}{per_function}")


@dataclass(frozen=True)
class BucketDim:
    """A dynamic loop dim a bucket can size: dim `dim` of argument `index` of @`func`."""

    func: str
    index: int
    dim: int


def _bucketable(graph: OpGraph) -> list[BucketDim]:
    """Every dynamic loop dim that a function argument sizes (what a bucket can set)."""
    return sorted({BucketDim(op.func, dyn.arg_index, dyn.dim) for op in graph.ops.values()
                   for dyn in op.dynamic_dims.values() if dyn.arg_index is not None},
                  key=lambda b: (b.func, b.index, b.dim))


def _bucket_name(b: BucketDim, qualified: bool) -> str:
    return f"{hint_key(b.func if qualified else None, b.index)}.{b.dim}"


def check_buckets(buckets: dict[str, list[int]], graph: OpGraph, arguments: list[Argument]) -> None:
    """Every bucket names dynamic dims the module's ops have: `[FUNC.]argN`, `[FUNC.]argN.D`, or
    a label (all)."""
    dims = _bucketable(graph)
    several = several_functions(arguments)
    types = {(a.func, a.index): a.type for a in arguments}
    choices = ", ".join(f"{_bucket_name(b, several)} ({types.get((b.func, b.index), '?')})" for b in dims)
    functions = sorted({a.func for a in arguments})
    for name, values in buckets.items():
        shown = f"bucket {name}={','.join(map(str, values))}"
        if not dims:
            unnamed = [f"op {op.uid} loop {d}" for op in graph.ops.values() for d in op.dynamic_dims]
            if unnamed:
                raise ShapeHintError(f"{shown}: the module's dynamic dims ({', '.join(unnamed)}) are not sized by a "
                                     "function argument, so a bucket cannot set them")
            raise ShapeHintError(f"{shown}: the module has no dynamic dims (every shape is static), so one plan "
                                 "serves every size; drop the bucket")
        match = _ARG_DIM.fullmatch(name)
        if match is None:
            continue  # a label: every dynamic dim
        func, index, dim = match.group("func"), int(match.group("arg")), match.group("dim")
        if func is not None and func not in functions:
            raise ShapeHintError(f"{shown}: the module has no function @{func}; its functions: "
                                 f"{', '.join('@' + f for f in functions)}")
        arg = f"arg{index}" + (f" of @{func}" if func is not None else "")
        typed = sorted({t for (f, i), t in types.items() if i == index and (func is None or f == func)})
        if not typed:
            raise ShapeHintError(f"{shown}: the module has no {arg}; dynamic dims: {choices}")
        if not bucketed_dims(graph, name):
            what = f"{arg} ({', '.join(typed)}) has no dynamic dim" if dim is None else \
                f"dim {dim} of {arg} ({', '.join(typed)}) is not dynamic"
            raise ShapeHintError(f"{shown}: {what}; dynamic dims: {choices}")


def check_shapes(module: ir.Module, graph: OpGraph, hints: dict[str, list[int]],
                 buckets: dict[str, list[int]]) -> list[Argument]:
    """Parsed hints and buckets against the module (ShapeHintError on the first misfit); returns
    the module's arguments, which bucket_hints takes."""
    if len(buckets) > 1:
        raise ShapeHintError("one bucketed dim per search: pass a single --bucket NAME=v1,v2,...")
    arguments = function_arguments(module)
    check_shape_hints(hints, arguments)
    check_hints_agree(module, hints)
    check_buckets(buckets, graph, arguments)
    return arguments


def _loop_reads(module: ir.Module, hints: dict[str, list[int]]):
    """Each linalg op reading function arguments directly: (function, op, [(argN, its dim, the
    op's loop dim, the dim's size as hinted or typed, -1 when still open)]); in a context."""
    for name, func in _defined_functions(module):
        args = list(func.regions[0].blocks[0].arguments)
        for op in walk_ops(func.operation):
            maps = linalg.get_indexing_maps(op) if op.name.startswith("linalg.") else None
            if maps is None or len(maps) != len(op.operands):
                continue
            reads = []
            for value, amap in zip(op.operands, maps):
                if not isinstance(value, ir.BlockArgument) or value not in args or not isinstance(value.type, ir.RankedTensorType):
                    continue
                hint = hint_for(hints, name, value.arg_number)
                shape = list(hint) if hint is not None else list(ir.RankedTensorType(value.type).shape)
                for d, e in enumerate(ir.AffineMapAttr(amap).value.results):
                    if isinstance(e, ir.AffineDimExpr) and d < len(shape):
                        reads.append((value.arg_number, d, ir.AffineDimExpr(e).position, shape[d] if shape[d] >= 0 else -1))
            yield name, op, reads


def check_hints_agree(module: ir.Module, hints: dict[str, list[int]]) -> None:
    """Two arguments an op reads along the same loop dim must be as long there: a batch matmul
    given arg0=4x128x64 and arg1=8x64x128 has no batch size (the cost model would take the
    first and plan for a shape that never runs)."""
    if not hints:
        return
    with context():
        for name, op, reads in _loop_reads(module, hints):
            seen: dict[int, tuple[str, int, int]] = {}  # loop dim -> (argN, its dim, size)
            for index, d, loop, size in reads:
                if size < 0:
                    continue
                here = (f"arg{index}", d, size)
                first = seen.setdefault(loop, here)
                if first[2] != here[2]:
                    raise ShapeHintError(
                        f"shape hints disagree: {op.name} in @{name} reads dim {first[1]} of {first[0]} "
                        f"({first[2]}) and dim {d} of {here[0]} ({here[2]}) as the same loop; "
                        "give both the same size")


def implied_sizes(module: ir.Module, hints: dict[str, list[int]]) -> dict[tuple[str, int], dict[int, int]]:
    """(function, argN) -> {dim: size} for the open dims of arguments an op reads along a loop
    that another argument (hinted or static) fixes: what a hint for them must say to agree."""
    out: dict[tuple[str, int], dict[int, int]] = {}
    with context():
        for name, _op, reads in _loop_reads(module, hints):
            known = {loop: size for _i, _d, loop, size in reads if size >= 0}
            for index, d, loop, size in reads:
                if size < 0 and loop in known:
                    out.setdefault((name, index), {})[d] = known[loop]
    return out


# --------------------------------------------------------------------------- buckets


def bucketed_dims(graph: OpGraph, name: str) -> list[BucketDim]:
    """The dynamic dims the bucket `name` sizes: `[FUNC.]argN` (its dynamic dims), `[FUNC.]argN.D`
    (one dim), or any other label (every dynamic dim of the module, e.g. M for a token count)."""
    match = _ARG_DIM.fullmatch(name)
    if match is None:
        return _bucketable(graph)
    func, index, dim = match.group("func"), int(match.group("arg")), match.group("dim")
    return [b for b in _bucketable(graph)
            if b.index == index and (func is None or b.func == func) and (dim is None or b.dim == int(dim))]


def bucket_hints(graph: OpGraph, arguments: list[Argument], name: str, value: int,
                 base: dict[str, list[int]]) -> dict[str, list[int]]:
    """Shape hints for one bucket: `base` with every dim the bucket sizes set to `value`. Each
    goes under the name the argument's hint is read from: `argN` unless a function has its own
    hint or several functions have an argN, then `FUNC.argN`."""
    hints = {k: list(v) for k, v in base.items()}
    for b in bucketed_dims(graph, name):
        shared = sum(1 for a in arguments if a.index == b.index) == 1 and hint_key(b.func, b.index) not in base
        key = hint_key(None if shared else b.func, b.index)
        full = hints.get(key) or list(hint_for(base, b.func, b.index) or _arg_shape(arguments, b))
        full[b.dim] = value
        hints[key] = full
    return hints


def _arg_shape(arguments: list[Argument], b: BucketDim) -> list[int]:
    """The argument's shape with its dynamic dims at the default."""
    for arg in arguments:
        if arg.func == b.func and arg.index == b.index and arg.shape is not None:
            return [s if s is not None else DEFAULT_DYNAMIC_EXTENT for s in arg.shape]
    return [DEFAULT_DYNAMIC_EXTENT] * (b.dim + 1)


def check_fits_main_memory(graph: OpGraph, hardware: HardwareModel, hints: dict[str, list[int]] | None = None) -> None:
    """SearchInputError when one op's operands alone exceed the hardware's main memory, at their
    static sizes or the ones the shape hints give: no plan can run it, and a search would price
    plans at absurd times (a 2^62 dim, ~1e45 s)."""
    capacity = hardware.main_memory.capacity_bytes
    for op in graph.ops.values():
        extents = _loop_extents(op, hints or {})
        sizes = []
        for shape, dims, element_type in zip(op.operand_shapes, op.operand_dims or [None] * len(op.operand_shapes),
                                             op.operand_element_types):
            if shape is None:
                continue  # a scalar
            resolved = [d if d is not None else (extents[loop] if dims and loop is not None else None)
                        for d, loop in zip(shape, dims or [None] * len(shape))]
            if any(d is None for d in resolved):
                break  # a size not known here: the op is not checked
            sizes.append(math.prod(resolved) * element_bytes(element_type))
        else:
            need = sum(sizes)
            if need > capacity:
                shown = "x".join("?" if r is None else str(r) for r in extents)
                raise SearchInputError(
                    f"{op.name} (uid {op.uid}) works on {_gib(need)} of tensors, more than {hardware.name}'s main "
                    f"memory ({hardware.main_memory.name}, {_gib(capacity)}): no tiling can run it there; check its "
                    f"dims ({shown}{', with the shape hints' if op.dynamic_dims else ''})")


def _loop_extents(op, hints: dict[str, list[int]]) -> list[int | None]:
    """The op's loop ranges, a dynamic one sized by the hint on the argument it comes from."""
    out = list(op.loop_ranges)
    for loop, dyn in op.dynamic_dims.items():
        hint = hint_for(hints, op.func, dyn.arg_index) if dyn.arg_index is not None else None
        if hint is not None and dyn.dim < len(hint):
            out[loop] = hint[dyn.dim]
    return out


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"

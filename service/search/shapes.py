"""Shape hints and buckets: what the user wrote, checked against the module, and the hints of
each bucket of a bucketed search.

Hints name function arguments by position (`argN`, as the cost model does) in every function of
the module. A hint the module cannot use would give a plan for shapes that never occur, or crash
the cost model (a zero dim), so it is a ShapeHintError whose message says what to fix: the CLI
exits with code 2, the API answers 422.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.ir.graph import OpGraph
from service.ir.mlir import context, ir

from .space import DEFAULT_DYNAMIC_EXTENT

_ARG = re.compile(r"arg(\d+)")
_ARG_DIM = re.compile(r"arg(\d+)(?:\.(\d+))?")
_HINT_FORM, _HINT_EXAMPLE = "argN=AxB", "arg0=128x1024"
_BUCKET_FORM, _BUCKET_EXAMPLE = "NAME=v1,v2,...", "M=1,16,128,1024"


class ShapeHintError(ValueError):
    """A shape hint or bucket the module cannot use; the message says what to fix."""


@dataclass(frozen=True)
class Argument:
    """A function argument as hints name it: `argN` of `func`."""

    name: str
    func: str
    type: str  # as MLIR prints it, e.g. tensor<?x768xf32>
    shape: tuple[int | None, ...] | None  # None dims are dynamic; None: not a ranked shaped type

    @property
    def dynamic_dims(self) -> list[int]:
        return [d for d, s in enumerate(self.shape or ()) if s is None]


def function_arguments(module: ir.Module) -> list[Argument]:
    """The arguments of every function with a body (declarations take no hints)."""
    out: list[Argument] = []
    with context():
        for op in module.body.operations:
            if op.operation.name != "func.func" or len(op.regions[0].blocks) == 0:
                continue
            func = ir.StringAttr(op.attributes["sym_name"]).value
            for i, arg in enumerate(op.regions[0].blocks[0].arguments):
                shape = None
                if isinstance(arg.type, ir.ShapedType) and ir.ShapedType(arg.type).has_rank:
                    st = ir.ShapedType(arg.type)
                    shape = tuple(None if st.is_dynamic_dim(d) else st.get_dim_size(d) for d in range(st.rank))
                out.append(Argument(f"arg{i}", func, str(arg.type), shape))
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
    """['arg0=128x1024', ...] or {'arg0': '128x1024' | [128, 1024]} -> {'arg0': [128, 1024]}."""
    if not items:
        return {}
    out = {}
    for name, value in _pairs(items, "shape hint", _HINT_FORM, _HINT_EXAMPLE):
        shown = f"shape hint {name}={_show(value, 'x')}"
        if not _ARG.fullmatch(name):
            raise ShapeHintError(f"{shown}: name a function argument as argN (N: its position), e.g. {_HINT_EXAMPLE}")
        out[name] = _sizes(value, "x", shown, _HINT_EXAMPLE, dims=True)
    return out


def parse_buckets(items: list[str] | dict | None) -> dict[str, list[int]]:
    """['M=1,16,128,1024'] -> {'M': [1, 16, 128, 1024]} (sorted, each value once)."""
    if not items:
        return {}
    out = {}
    for name, value in _pairs(items, "bucket", _BUCKET_FORM, _BUCKET_EXAMPLE):
        shown = f"bucket {name}={_show(value, ',')}"
        if name.startswith("arg") and not _ARG_DIM.fullmatch(name):
            raise ShapeHintError(f"{shown}: name an argument's dynamic dims as argN, one of them as argN.D "
                                 f"(e.g. arg0.0), or use a label such as M for every dynamic dim")
        values = _sizes(value, ",", shown, _BUCKET_EXAMPLE, dims=False)
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ShapeHintError(f"{shown}: {', '.join(map(str, repeated))} listed more than once; list each size once")
        out[name] = sorted(values)
    return out


# --------------------------------------------------------------------------- against the module


def _listing(args: list[Argument]) -> str:
    """'arg0 tensor<?x768xf32>, arg1 ...' (functions named when the module has several)."""
    several = len({a.func for a in args}) > 1
    return ", ".join(f"{a.name} {a.type}" + (f" of @{a.func}" if several else "") for a in args) or "none"


def _example(arg: Argument, given: list[int]) -> str:
    """The hint `arg` takes: its static dims, and the given sizes for its dynamic dims."""
    assert arg.shape is not None
    if len(given) == len(arg.shape):
        sizes = [given[d] if s is None else s for d, s in enumerate(arg.shape)]
    else:
        fill = iter(given)
        sizes = [next(fill, DEFAULT_DYNAMIC_EXTENT) if s is None else s for s in arg.shape]
    return f"{arg.name}={'x'.join(map(str, sizes))}"


def check_shape_hints(hints: dict[str, list[int]], arguments: list[Argument]) -> None:
    """Every hint names an argument with dynamic dims, with its rank and its static dims."""
    dynamic = [a for a in arguments if a.dynamic_dims]
    for name, sizes in hints.items():
        shown = f"shape hint {name}={'x'.join(map(str, sizes))}"
        named = [a for a in arguments if a.name == name]
        if not named:
            raise ShapeHintError(f"{shown}: the module has no {name}; its arguments: {_listing(arguments)}")
        targets = [a for a in named if a.dynamic_dims]
        if not targets:
            others = f"arguments with dynamic dims: {_listing(dynamic)}" if dynamic else "the module has no dynamic dims"
            raise ShapeHintError(f"{shown}: {name} is static ({', '.join(a.type for a in named)}) and needs no hint; {others}")
        for arg in targets:
            assert arg.shape is not None
            if len(sizes) != len(arg.shape):
                raise ShapeHintError(f"{shown}: {name} has rank {len(arg.shape)} ({arg.type}); "
                                     f"give {len(arg.shape)} dims, e.g. {_example(arg, sizes)}")
            for d, (size, static) in enumerate(zip(sizes, arg.shape)):
                if static is not None and size != static:
                    raise ShapeHintError(f"{shown}: dim {d} of {name} is {static} ({arg.type}); "
                                         f"keep its static dims, e.g. {_example(arg, sizes)}")


def _bucketable(graph: OpGraph) -> list[tuple[int, int]]:
    """(argument, dim) of every dynamic loop dim that an argument sizes (what a bucket can set)."""
    return sorted({(dyn.arg_index, dyn.dim) for op in graph.ops.values() for dyn in op.dynamic_dims.values()
                   if dyn.arg_index is not None})


def check_buckets(buckets: dict[str, list[int]], graph: OpGraph, arguments: list[Argument]) -> None:
    """Every bucket names dynamic dims the module's ops have: `argN`, `argN.D`, or a label (all)."""
    dims = _bucketable(graph)
    types = {a.name: a.type for a in arguments}
    choices = ", ".join(f"arg{i}.{d} ({types.get(f'arg{i}', '?')})" for i, d in dims)
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
        index, dim = int(match.group(1)), match.group(2)
        arg = f"arg{index}"
        if dim is None and not any(i == index for i, _ in dims):
            what = f"{arg} ({types[arg]}) has no dynamic dim" if arg in types else f"the module has no {arg}"
            raise ShapeHintError(f"{shown}: {what}; dynamic dims: {choices}")
        if dim is not None and (index, int(dim)) not in dims:
            what = f"dim {dim} of {arg} ({types[arg]}) is not dynamic" if arg in types else f"the module has no {arg}"
            raise ShapeHintError(f"{shown}: {what}; dynamic dims: {choices}")


def check_shapes(module: ir.Module, graph: OpGraph, hints: dict[str, list[int]],
                 buckets: dict[str, list[int]]) -> list[Argument]:
    """Parsed hints and buckets against the module (ShapeHintError on the first misfit); returns
    the module's arguments, which bucket_hints takes."""
    if len(buckets) > 1:
        raise ShapeHintError("one bucketed dim per search: pass a single --bucket NAME=v1,v2,...")
    arguments = function_arguments(module)
    check_shape_hints(hints, arguments)
    check_buckets(buckets, graph, arguments)
    return arguments


# --------------------------------------------------------------------------- buckets


def bucketed_dims(graph: OpGraph, name: str) -> list[tuple[int, int]]:
    """(argument index, dim) of each dynamic dim the bucket `name` sizes: `argN` (its dynamic
    dims), `argN.D` (one dim), or any other label (every dynamic dim of the module, e.g. M for
    a token count)."""
    match = _ARG_DIM.fullmatch(name)
    return [(index, dim) for index, dim in _bucketable(graph)
            if not match or (int(match.group(1)) == index and (match.group(2) is None or int(match.group(2)) == dim))]


def bucket_hints(graph: OpGraph, arguments: list[Argument], name: str, value: int,
                 base: dict[str, list[int]]) -> dict[str, list[int]]:
    """Shape hints for one bucket: `base` with every dim the bucket sizes set to `value`."""
    hints = {k: list(v) for k, v in base.items()}
    for index, dim in bucketed_dims(graph, name):
        key = f"arg{index}"
        full = hints.get(key) or _arg_shape(arguments, key, dim)
        full[dim] = value
        hints[key] = full
    return hints


def _arg_shape(arguments: list[Argument], name: str, dim: int) -> list[int]:
    """The argument's shape with its dynamic dims at the default (a function where `dim` is dynamic)."""
    for arg in arguments:
        if arg.name == name and dim in arg.dynamic_dims:
            assert arg.shape is not None
            return [s if s is not None else DEFAULT_DYNAMIC_EXTENT for s in arg.shape]
    return [DEFAULT_DYNAMIC_EXTENT] * (dim + 1)

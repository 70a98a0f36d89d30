"""A plan forced into a module: its configs set as `compilation_info` on the anchor ops.

The attribute is set with the real MLIR bindings on the op each group anchors; the result is
the module text iree-compile gets, the function to time and its arguments (shapes from the
module, or from shape hints for dynamic dims), and the input files the benchmark reads.

Ops whose forced config IREE ignores (convolutions without a batch dim in this version) raise
`NotMeasurable` instead of producing a measurement of IREE's own config under the plan's name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np

from service.ir.graph import describe_op, element_bytes, tag_tileable_ops, uid_of, walk_ops
from service.ir.hints import hint_for
from service.ir.mlir import attribute_names, context, ir

from .lowering import (
    CONFIGURABLE_KINDS,
    CONVOLUTION_PIPELINE,
    LoweringConfig,
    as_iree_compiles,
    compilation_info_text,
    convolution_not_configured,
    iree_configures_convolution,
    iree_keeps_own_pipeline,
    lowering_config_from_levels,
    translation_info_text,
)
from .tools import host_translation_info

_NUMPY_DTYPES = {
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "i1": np.bool_,
}


class NotMeasurable(Exception):
    """This plan cannot be measured with IREE's compilation_info on this version; says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Finding ops in a module

# An anchor is an op uid (`ts.uid`, as the search's plans name ops) or (op name, index among
# the ops of that name in pre-order).
AnchorRef = Union[int, tuple[str, int]]


def _ops_where(module: ir.Module | ir.OpView, keep: Callable[[ir.Operation], bool]) -> list[ir.Operation]:
    return [op for op in walk_ops(module.operation) if keep(op)]


def _strip_uid_tags(module: ir.Module | ir.OpView) -> None:
    """Drop the IR core's `ts.*` tags: iree-compile gets the module as the user wrote it."""
    for op in walk_ops(module.operation):
        for name in attribute_names(op):
            if name.startswith("ts."):
                del op.attributes[name]


def find_anchor(module: ir.Module | ir.OpView, anchor: AnchorRef) -> ir.Operation:
    """The op an AnchorRef names: an int is a `ts.uid` (the module tagged by tag_tileable_ops)."""
    if isinstance(anchor, bool):
        raise TypeError("anchor must be an op uid or (name, index)")
    if isinstance(anchor, int):
        ops = _ops_where(module, lambda op: uid_of(op) == anchor)
        if len(ops) != 1:
            raise LookupError(f"no op with uid {anchor} in the module")
        return ops[0]
    name, index = anchor
    ops = _ops_where(module, lambda op: op.name == name)
    if not 0 <= index < len(ops):
        raise LookupError(f"no {name} #{index}: the module has {len(ops)} of them")
    return ops[index]


def _func_name(func: ir.Operation) -> str:
    return ir.StringAttr(func.attributes["sym_name"]).value


# --------------------------------------------------------------------------------------------
# The function to time and its inputs


@dataclass(frozen=True)
class ArgumentSpec:
    shape: tuple[int, ...]
    element_type: str


def function_arguments(func: ir.Operation, shape_hints: Mapping[str, Sequence[int]] | None = None) -> list[ArgumentSpec]:
    """Shapes and element types (as IREE compiles them) of a func's tensor arguments. A dynamic
    dim takes its size from `shape_hints` (`argN` or `FUNC.argN` -> full shape, as `tune
    --shape-hint` gives it); one without a hint is NotMeasurable."""
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
    hints = shape_hints or {}
    args = []
    for i, t in enumerate(ftype.inputs):
        rt = t.maybe_downcast() if hasattr(t, "maybe_downcast") else t
        if not isinstance(rt, ir.RankedTensorType):
            raise NotMeasurable(f"argument {i} of @{_func_name(func)} is {t}, not a ranked tensor")
        shape = tuple(rt.shape)
        if not rt.has_static_shape:
            hint = hint_for(hints, _func_name(func), i)
            if hint is None:
                raise NotMeasurable(
                    f"argument {i} of @{_func_name(func)} has dynamic dims ({t}): "
                    f"give its shape (arg{i}=...) or benchmark a static specialization of the module"
                )
            if len(hint) != len(shape) or any(d != ir.ShapedType.get_dynamic_size() and d != h for d, h in zip(shape, hint)):
                raise ValueError(f"shape hint for arg{i} of @{_func_name(func)}, {'x'.join(map(str, hint))}, does not fit {t}")
            shape = tuple(int(h) for h in hint)
        args.append(ArgumentSpec(shape, as_iree_compiles(str(rt.element_type))))
    return args


# What a measurement's inputs may take in all: they are written to disk and held by the
# benchmark beside its outputs, on the machine that serves requests.
MAX_INPUT_BYTES = 2 * 1024**3


def write_inputs(arguments: Sequence[ArgumentSpec], directory: Path, seed: int = 0) -> list[str]:
    """`--input=` flags with random data of the arguments' shapes (.npy files). NotMeasurable
    when they would take more than MAX_INPUT_BYTES, or cannot be given on the command line."""
    total = sum(math.prod(a.shape) * element_bytes(a.element_type) for a in arguments)
    if total > MAX_INPUT_BYTES:
        raise NotMeasurable(f"its inputs take {total / 1024**3:.3g} GiB, more than the {MAX_INPUT_BYTES // 1024**3} GiB "
                            "a measurement may: measure it at smaller shapes (shape hints) or leave measuring out")
    rng = np.random.default_rng(seed)
    flags = []
    for i, arg in enumerate(arguments):
        dtype = _NUMPY_DTYPES.get(arg.element_type)
        if arg.element_type.startswith("complex"):
            raise NotMeasurable(f"argument {i} is a tensor of {arg.element_type}: iree-benchmark-module takes no "
                                "complex input on the command line")
        if dtype is None:  # e.g. bf16: numpy has no dtype; a splat has the same timing
            dims = "x".join(str(d) for d in arg.shape)
            flags.append(f"--input={dims}{'x' if dims else ''}{arg.element_type}=1")
            continue
        if dtype in (np.float32, np.float64):
            data = rng.standard_normal(arg.shape, dtype=dtype)
        elif np.issubdtype(dtype, np.floating):
            data = rng.standard_normal(arg.shape, dtype=np.float32).astype(dtype)
        else:
            data = rng.integers(0, 2 if dtype is np.bool_ else 8, arg.shape).astype(dtype)
        path = directory / f"arg{i}.npy"
        np.save(path, data)
        flags.append(f"--input=@{path}")
    return flags


# --------------------------------------------------------------------------------------------
# Plan -> module with compilation_info attributes


def _groups(plan: Any) -> list[Mapping[str, Any]]:
    data = plan if isinstance(plan, Mapping) else plan.model_dump()
    groups = data.get("groups") or []
    if not groups:
        raise ValueError("the plan has no groups")
    return groups


@dataclass(frozen=True)
class ForcedModule:
    """A module text with configs forced on its anchors, and what the benchmark needs."""

    text: str
    function: str
    arguments: list[ArgumentSpec]
    configs: list[LoweringConfig]


def force_plan(
    module_text: str,
    plan: Any,
    *,
    translation_info: str | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> ForcedModule:
    """Parse `module_text`, set each group's config as `compilation_info` on its anchor op.

    A group's `anchor` is an AnchorRef. `translation_info` defaults to the one IREE's own config uses on this host
    (host_translation_info), so that only the tile sizes differ from IREE's default; a convolution
    takes IREE's convolution pipeline. Raises NotMeasurable for anchors whose config IREE would
    silently drop (other ops IREE ignores a config on are caught after compiling, by comparing
    with the configs IREE dumps).
    """
    translation_info = translation_info or host_translation_info()
    with context():
        module = tag_tileable_ops(ir.Module.parse(module_text))  # a tagged clone: ints in the plan are ts.uid values
        configs: list[LoweringConfig] = []
        funcs: set[str] = set()
        for group in _groups(plan):
            op = find_anchor(module, group["anchor"])
            described = describe_op(op, uid=-1)
            convolution = described.kind == "convolution"
            if convolution and not iree_configures_convolution(described):
                why = convolution_not_configured(described)
                raise NotMeasurable(f"{op.name}: a forced convolution plan cannot be measured: {why}")
            if why := iree_keeps_own_pipeline(described):
                raise NotMeasurable(f"a forced plan cannot be measured: {why}")
            if described.kind not in CONFIGURABLE_KINDS:
                continue  # IREE's CPU backend takes tile sizes for its root op only: it tiles this one itself
            label = f"{group['anchor']} ({op.name})"
            config = lowering_config_from_levels(group["levels"], described.iterator_types, anchor=label)
            pipeline = translation_info_text(CONVOLUTION_PIPELINE) if convolution else translation_info
            op.attributes["compilation_info"] = ir.Attribute.parse(compilation_info_text(config, pipeline))
            configs.append(config)
            if not described.func:
                raise LookupError(f"{op.name} is not inside a func.func")
            funcs.add(described.func)
        if not configs:
            raise NotMeasurable("no group of the plan anchors a contraction: IREE's CPU backend takes "
                                "tile sizes on its root contraction or convolution only")
        if len(funcs) != 1:
            raise NotMeasurable(f"plan anchors span several functions {sorted(funcs)}: time one at a time")
        (function,) = funcs
        func = _ops_where(module, lambda op: op.name == "func.func" and _func_name(op) == function)[0]
        arguments = function_arguments(func, shape_hints)
        _strip_uid_tags(module)
        return ForcedModule(str(module), function, arguments, configs)


def default_module(module_text: str, function: str | None = None,
                   shape_hints: Mapping[str, Sequence[int]] | None = None) -> ForcedModule:
    """The module as is (IREE picks its own config), with the function to time."""
    with context():
        module = ir.Module.parse(module_text)
        funcs = _ops_where(module, lambda op: op.name == "func.func")
        if function is not None:
            funcs = [f for f in funcs if _func_name(f) == function]
        if not funcs:
            raise LookupError(f"no func.func {'@' + function if function else ''} in the module")
        func = funcs[0]
        return ForcedModule(str(module), _func_name(func), function_arguments(func, shape_hints), [])

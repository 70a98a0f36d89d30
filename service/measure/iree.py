"""Measure a tiling plan on this CPU with IREE: force it as a `compilation_info`, compile, time.

A plan's levels map onto IREE's CPU lowering config (DESIGN.md, Candidates):
level 0 -> `distribution`, level 1 -> `vector_common_parallel`, level 2 -> `vector_reduction`.
The attribute is set on the anchor op with the real MLIR bindings, the module is compiled with
`iree-compile` for the host CPU and timed with `iree-benchmark-module` (median over repetitions).
IREE's own default (no attribute) is timed the same way, so the two are comparable.

Failures are data, not crashes: a config IREE rejects is a `Measurement(ok=False, error=...)`.
Ops whose forced config IREE ignores (convolutions in this version) raise `NotMeasurable`
instead of producing a measurement of IREE's own config under the plan's name.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import logging
import os
import re
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
from pydantic import BaseModel, Field

from service.ir.graph import describe_op
from service.ir.hints import hint_for
from service.ir.mlir import context, ir, tool_path

PARALLEL = "parallel"
REDUCTION = "reduction"
DEFAULT_PIPELINE = "DoubleTilingExpert"

log = logging.getLogger(__name__)

# Op kinds (service.ir.graph) whose tiling IREE's CPU backend can be told through compilation_info.
CONFIGURABLE_KINDS = ("contraction", "convolution")
# Ops whose `compilation_info` IREE 3.13 silently drops and replaces with its own config (checked
# for conv_2d; other ops are caught after compiling, by comparing with the configs IREE dumps).
_IGNORED_CONFIG_PREFIXES = ("linalg.conv_", "linalg.depthwise_conv_")

# Ops never counted when anchors are addressed by index among linalg ops (they are region
# terminators / helpers, not tileable ops).
_NOT_TILEABLE = frozenset({"linalg.yield", "linalg.index"})

_COMPILE_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)
_BENCH_DEVICE = "local-task"

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


class LoweringConfig(BaseModel):
    """IREE CPU lowering config of one op: tile sizes per IREE tiling level, over its loop dims."""

    distribution: list[int]
    vector_common_parallel: list[int]
    vector_reduction: list[int]
    anchor: str | None = Field(default=None, description="which op it is on, for reports")


class Measurement(BaseModel):
    """One timed compile of a module. ok=False carries IREE's first error line, no timing."""

    ok: bool
    median_s: float | None = None
    samples_s: list[float] = Field(default_factory=list)
    # Process CPU time per call, all worker threads together. On a shared machine wall time
    # swings 2-4x with other people's load; CPU time moves far less (see cpu_per_core_s).
    cpu_median_s: float | None = None
    cpu_samples_s: list[float] = Field(default_factory=list)
    error: str | None = None
    config: list[LoweringConfig] = Field(
        default_factory=list,
        description="forced configs, or for IREE's default the configs IREE chose",
    )
    iree_version: str


def benchmark_threads() -> int:
    """Worker threads of IREE's local-task device here: one per physical core by default."""
    return os.cpu_count() or 1


def cpu_per_core_s(m: Measurement) -> float | None:
    """A load-robust estimate of uncontended wall time: CPU time spread over the worker threads.
    Exact when every worker is busy for the whole call (all sampled plans have >= 2 tiles)."""
    return m.cpu_median_s / benchmark_threads() if m.ok and m.cpu_median_s else None


class Comparison(BaseModel):
    """A forced plan and IREE's default, measured on the same inputs in one call."""

    forced: Measurement
    default: Measurement

    @property
    def speedup_over_default(self) -> float | None:
        if self.forced.ok and self.default.ok and self.forced.median_s:
            return self.default.median_s / self.forced.median_s
        return None


# --------------------------------------------------------------------------------------------
# Pure mapping: plan levels -> IREE lowering config -> attribute text


def _level_sizes(level: Any) -> list[int]:
    sizes = level["tile_sizes"] if isinstance(level, Mapping) else level.tile_sizes
    return [int(s) for s in sizes]


def lowering_config_from_levels(
    levels: Sequence[Any], iterator_types: Sequence[str], *, anchor: str | None = None
) -> LoweringConfig:
    """Map a group's tiling levels (outermost first) onto IREE's three CPU tiling levels.

    level 0 -> distribution over parallel dims (IREE rejects reduction entries there),
    level 1 -> vector_common_parallel (reduction entries 0),
    level 2 -> vector_reduction (parallel entries 0). A missing level is all zeros (untiled).
    Loop kinds are not mapped: IREE always distributes level 0 over workgroups.
    """
    if len(levels) > 3:
        raise ValueError(f"IREE's CPU config has 3 tiling levels, the plan has {len(levels)}")
    rank = len(iterator_types)
    for kind in iterator_types:
        if kind not in (PARALLEL, REDUCTION):
            raise ValueError(f"unknown iterator type {kind!r}")
    sized = [_level_sizes(level) for level in levels] + [[0] * rank] * (3 - len(levels))
    for i, sizes in enumerate(sized):
        if len(sizes) != rank:
            raise ValueError(f"level {i} has {len(sizes)} tile sizes, the anchor has {rank} loops")
        if any(s < 0 for s in sizes):
            raise ValueError(f"level {i} has a negative tile size: {sizes}")
    is_par = [kind == PARALLEL for kind in iterator_types]
    return LoweringConfig(
        distribution=[s if p else 0 for s, p in zip(sized[0], is_par)],
        vector_common_parallel=[s if p else 0 for s, p in zip(sized[1], is_par)],
        vector_reduction=[0 if p else s for s, p in zip(sized[2], is_par)],
        anchor=anchor,
    )


def lowering_config_text(config: LoweringConfig) -> str:
    return (
        "#iree_cpu.lowering_config<"
        f"distribution = {config.distribution}, "
        f"vector_common_parallel = {config.vector_common_parallel}, "
        f"vector_reduction = {config.vector_reduction}>"
    )


def translation_info_text(pipeline: str = DEFAULT_PIPELINE) -> str:
    """A translation_info with the pipeline alone (no pipeline options)."""
    return f"#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<{pipeline}>>"


def compilation_info_text(config: LoweringConfig, translation_info: str | None = None) -> str:
    """The `compilation_info` attribute text that forces `config` on an op (DESIGN.md syntax),
    with `translation_info` (default: DoubleTilingExpert without options)."""
    return (
        "#iree_codegen.compilation_info<"
        f"lowering_config = {lowering_config_text(config)}, "
        f"translation_info = {translation_info or translation_info_text()}>"
    )


def vector_tile_elements(config: LoweringConfig) -> int:
    """Elements of the innermost vector tile: product of non-zero vector_common_parallel sizes
    times the non-zero reduction sizes. IREE fails at 512 native vectors or more (8192 f32 with
    AVX-512, 4096 with AVX2: the host profile's max_vector_tile_bytes)."""
    n = 1
    for s in config.vector_common_parallel + config.vector_reduction:
        if s:
            n *= s
    return n


# --------------------------------------------------------------------------------------------
# Finding ops in a module

# An anchor is: an int (op uid; until the IR core's graph lands, the index of the op among the
# module's tileable linalg ops in pre-order), (op name, index among ops of that name), or a
# predicate over ops.
AnchorRef = Union[int, tuple[str, int], Callable[[ir.Operation], bool]]


def _walk(module: ir.Module | ir.OpView, keep: Callable[[ir.Operation], bool]) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if keep(op):
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return found


def linalg_ops(module: ir.Module | ir.OpView) -> list[ir.Operation]:
    """Tileable linalg ops in pre-order (the order anchors are numbered in, before uids)."""
    return _walk(module, lambda op: op.name.startswith("linalg.") and op.name not in _NOT_TILEABLE)


def _uid_tagging() -> Callable[[ir.Module], ir.OpView] | None:
    """The IR core's uid tagging (`ts.uid` on TilingInterface ops), or None before it lands."""
    try:
        from service.ir.graph import tag_tileable_ops
    except ImportError:
        return None
    return tag_tileable_ops


def _strip_uid_tags(module: ir.Module | ir.OpView) -> None:
    """Drop the IR core's `ts.*` tags: iree-compile gets the module as the user wrote it."""
    for op in _walk(module, lambda op: True):
        for name in [a if isinstance(a, str) else a.name for a in op.attributes]:
            if name.startswith("ts."):
                del op.attributes[name]


def find_anchor(module: ir.Module | ir.OpView, anchor: AnchorRef) -> ir.Operation:
    """The op an AnchorRef names. An int is a `ts.uid` when the module is tagged, else the index
    among linalg ops in pre-order (the IR core's numbering for linalg-only modules)."""
    if isinstance(anchor, bool):
        raise TypeError("anchor must be an op uid, (name, index) or a predicate")
    if isinstance(anchor, int):
        tagged = _walk(module, lambda op: "ts.uid" in op.attributes)
        if tagged:
            ops = [op for op in tagged if ir.IntegerAttr(op.attributes["ts.uid"]).value == anchor]
            if len(ops) != 1:
                raise LookupError(f"no op with uid {anchor} in the module")
            return ops[0]
        ops = linalg_ops(module)
        if not 0 <= anchor < len(ops):
            raise LookupError(f"no anchor op with uid {anchor}: the module has {len(ops)} linalg ops")
        return ops[anchor]
    if isinstance(anchor, tuple):
        name, index = anchor
        ops = _walk(module, lambda op: op.name == name)
        if not 0 <= index < len(ops):
            raise LookupError(f"no {name} #{index}: the module has {len(ops)} of them")
        return ops[index]
    ops = _walk(module, anchor)
    if len(ops) != 1:
        raise LookupError(f"anchor predicate matched {len(ops)} ops, expected exactly 1")
    return ops[0]


def _enclosing_func(op: ir.Operation) -> ir.Operation:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        parent = parent.parent
    if parent is None:
        raise LookupError(f"{op.name} is not inside a func.func")
    return parent


def _func_name(func: ir.Operation) -> str:
    return ir.StringAttr(func.attributes["sym_name"]).value


@dataclass(frozen=True)
class ArgumentSpec:
    shape: tuple[int, ...]
    element_type: str


def function_arguments(func: ir.Operation, shape_hints: Mapping[str, Sequence[int]] | None = None) -> list[ArgumentSpec]:
    """Shapes and element types of a func's tensor arguments. A dynamic dim takes its size from
    `shape_hints` (`argN` or `FUNC.argN` -> full shape, as `tune --shape-hint` gives it);
    one without a hint is NotMeasurable."""
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
        args.append(ArgumentSpec(shape, str(rt.element_type)))
    return args


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
    anchor_of: Callable[[Any], AnchorRef] | None = None,
    translation_info: str | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> ForcedModule:
    """Parse `module_text`, set each group's config as `compilation_info` on its anchor op.

    `anchor_of` maps a group's `anchor` field to an AnchorRef (default: the field itself, an
    int uid). `translation_info` defaults to the one IREE's own config uses on this host
    (host_translation_info), so that only the tile sizes differ from IREE's default.
    Raises NotMeasurable for anchors whose config IREE would silently drop.
    """
    translation_info = translation_info or host_translation_info()
    with context():
        module = ir.Module.parse(module_text)
        tagging = _uid_tagging()
        if tagging is not None:
            module = tagging(module)  # a tagged clone: ints in the plan are ts.uid values
        configs: list[LoweringConfig] = []
        funcs: set[str] = set()
        for group in _groups(plan):
            ref = anchor_of(group["anchor"]) if anchor_of else group["anchor"]
            op = find_anchor(module, ref)
            if op.name.startswith(_IGNORED_CONFIG_PREFIXES):
                raise NotMeasurable(
                    f"{op.name}: IREE 3.13 silently drops a compilation_info on convolutions and "
                    "keeps its own config, so a forced conv plan cannot be measured"
                )
            described = describe_op(op, uid=-1)
            if described.kind not in CONFIGURABLE_KINDS:
                continue  # IREE's CPU backend takes tile sizes for its root op only: it tiles this one itself
            label = f"{group['anchor']} ({op.name})"
            config = lowering_config_from_levels(group["levels"], described.iterator_types, anchor=label)
            op.attributes["compilation_info"] = ir.Attribute.parse(compilation_info_text(config, translation_info))
            configs.append(config)
            funcs.add(_func_name(_enclosing_func(op)))
        if not configs:
            raise NotMeasurable("no group of the plan anchors a contraction: IREE's CPU backend takes "
                                "tile sizes on its root contraction or convolution only")
        if len(funcs) != 1:
            raise NotMeasurable(f"plan anchors span several functions {sorted(funcs)}: time one at a time")
        (function,) = funcs
        func = _walk(module, lambda op: op.name == "func.func" and _func_name(op) == function)[0]
        arguments = function_arguments(func, shape_hints)
        _strip_uid_tags(module)
        return ForcedModule(str(module), function, arguments, configs)


def default_module(module_text: str, function: str | None = None,
                   shape_hints: Mapping[str, Sequence[int]] | None = None) -> ForcedModule:
    """The module as is (IREE picks its own config), with the function to time."""
    with context():
        module = ir.Module.parse(module_text)
        funcs = _walk(module, lambda op: op.name == "func.func")
        if function is not None:
            funcs = [f for f in funcs if _func_name(f) == function]
        if not funcs:
            raise LookupError(f"no func.func {'@' + function if function else ''} in the module")
        func = funcs[0]
        return ForcedModule(str(module), _func_name(func), function_arguments(func, shape_hints), [])


# --------------------------------------------------------------------------------------------
# Compile and benchmark (subprocesses, time limits)


def iree_version() -> str:
    return "; ".join(
        f"{p}=={importlib.metadata.version(p)}" for p in ("iree-base-compiler", "iree-base-runtime")
    )


class ToolFailure(Exception):
    """An IREE tool exited non-zero or timed out; `line` is the first error line."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


def first_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in lines:
        if "error:" in ln or "ERROR" in ln or "INVALID_ARGUMENT" in ln:
            return ln
    return lines[0] if lines else "failed without a message"


def compile_module(mlir_path: Path, vmfb_path: Path, configs_dir: Path, timeout_s: float) -> None:
    """iree-compile for this host's CPU; dumps the chosen executable configurations too."""
    cmd = [
        tool_path("iree-compile"),
        str(mlir_path),
        *_COMPILE_FLAGS,
        f"--iree-hal-dump-executable-configurations-to={configs_dir}",
        "-o",
        str(vmfb_path),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolFailure(f"iree-compile timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise ToolFailure(first_error_line(proc.stderr))


_LOWERING_CONFIG_RE = re.compile(r"#iree_cpu\.lowering_config<[^<>]*>")


def chosen_lowering_configs(configs_dir: Path) -> list[str]:
    """The lowering configs IREE used, as printed in its executable-configuration dumps."""
    found: list[str] = []
    for path in sorted(configs_dir.glob("*.mlir")):
        found.extend(_LOWERING_CONFIG_RE.findall(path.read_text()))
    return found


def chosen_translation_infos(configs_dir: Path) -> list[str]:
    """The translation_info attributes IREE gave the dispatch functions, read from its
    executable-configuration dumps with the real MLIR parser."""
    found: list[str] = []
    with context():
        for path in sorted(configs_dir.glob("*.mlir")):
            module = ir.Module.parse(path.read_text())
            for op in _walk(module, lambda op: "translation_info" in op.attributes):
                found.append(str(op.attributes["translation_info"]))
    return found


# A static matmul: what IREE's CPU default chooses for it shows the pipeline options it uses on
# this host. On x86 without AVX-512 (an AVX2 AMD EPYC) it turns on loop peeling (remainders
# peeled, not masked); a forced config without it ran masked vectors, 2.4x slower than IREE's
# default at IREE's own tile sizes on a dynamic matmul.
_PROBE_MATMUL = """
func.func @probe(%a: tensor<64x64xf32>, %b: tensor<64x64xf32>, %c: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %r = linalg.matmul ins(%a, %b : tensor<64x64xf32>, tensor<64x64xf32>) outs(%c : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %r : tensor<64x64xf32>
}
"""


@functools.cache
def host_translation_info() -> str:
    """The translation_info IREE's own CPU config gives a matmul on this host (pipeline and
    options, e.g. `{enable_loop_peeling}` on AVX2), from one probe compile per process; the
    plain DoubleTilingExpert one when the probe fails or IREE picks another pipeline (a forced
    config is a DoubleTilingExpert config)."""
    plain = translation_info_text()
    with tempfile.TemporaryDirectory(prefix="tilesearch-probe-") as tmp:
        workdir = Path(tmp)
        (workdir / "probe.mlir").write_text(_PROBE_MATMUL)
        try:
            compile_module(workdir / "probe.mlir", workdir / "probe.vmfb", workdir / "configs", 120.0)
            chosen = chosen_translation_infos(workdir / "configs")
        except (ToolFailure, OSError, ir.MLIRError) as err:
            log.warning("IREE's pipeline options on this host are unknown (%s); forcing %s", err, plain)
            return plain
    ours = [t for t in chosen if f"#iree_cpu.pipeline<{DEFAULT_PIPELINE}>" in t]
    return ours[0] if ours else plain


def _config_from_text(text: str) -> LoweringConfig | None:
    fields = dict(re.findall(r"(\w+) = \[([^\]]*)\]", text))
    if "distribution" not in fields:
        return None  # helper ops (e.g. the fill) get vector-only configs; not the root's
    as_list = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    return LoweringConfig(
        distribution=as_list(fields["distribution"]),
        vector_common_parallel=as_list(fields.get("vector_common_parallel", "")),
        vector_reduction=as_list(fields.get("vector_reduction", "")),
        anchor="chosen by IREE",
    )


def write_inputs(arguments: Sequence[ArgumentSpec], directory: Path, seed: int = 0) -> list[str]:
    """`--input=` flags with random data of the arguments' shapes (.npy files)."""
    rng = np.random.default_rng(seed)
    flags = []
    for i, arg in enumerate(arguments):
        dtype = _NUMPY_DTYPES.get(arg.element_type)
        if dtype is None:  # e.g. bf16: numpy has no dtype; a splat has the same timing
            dims = "x".join(str(d) for d in arg.shape)
            flags.append(f"--input={dims}{'x' if dims else ''}{arg.element_type}=1")
            continue
        if np.issubdtype(dtype, np.floating):
            data = rng.standard_normal(arg.shape).astype(dtype)
        else:
            data = rng.integers(0, 2 if dtype is np.bool_ else 8, arg.shape).astype(dtype)
        path = directory / f"arg{i}.npy"
        np.save(path, data)
        flags.append(f"--input=@{path}")
    return flags


@dataclass(frozen=True)
class BenchSamples:
    real_s: list[float]  # wall time per call, one per repetition (mean over its runs)
    cpu_s: list[float]  # process CPU time per call (all threads), same repetitions


def benchmark_module(
    vmfb_path: Path,
    function: str,
    input_flags: Sequence[str],
    *,
    repetitions: int,
    min_time_s: float,
    timeout_s: float,
) -> BenchSamples:
    """Seconds per call, one sample per repetition (each the mean over that repetition's runs)."""
    cmd = [
        tool_path("iree-benchmark-module"),
        f"--module={vmfb_path}",
        f"--device={_BENCH_DEVICE}",
        f"--function={function}",
        *input_flags,
        f"--benchmark_repetitions={repetitions}",
        f"--benchmark_min_time={min_time_s:g}s",
        "--benchmark_format=json",
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolFailure(f"iree-benchmark-module timed out after {timeout_s:g} s") from None
    if proc.returncode != 0:
        raise ToolFailure(first_error_line(proc.stderr or proc.stdout))
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise ToolFailure("iree-benchmark-module printed no JSON report") from None
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    runs = [b for b in report.get("benchmarks", []) if b.get("run_type") == "iteration"]
    if not runs:
        raise ToolFailure("iree-benchmark-module reported no iterations")
    return BenchSamples(
        real_s=[b["real_time"] * scale[b["time_unit"]] for b in runs],
        cpu_s=[b["cpu_time"] * scale[b["time_unit"]] for b in runs],
    )


@dataclass(frozen=True)
class BenchSettings:
    repetitions: int = 5
    min_time_s: float = 0.1
    compile_timeout_s: float = 180.0
    bench_timeout_s: float = 180.0


@dataclass
class _Compiled:
    """A compiled module ready to time, or the Measurement that says why it is not."""

    prepared: ForcedModule
    vmfb_path: Path
    configs: list[LoweringConfig]
    failure: Measurement | None = None


def _compile(prepared: ForcedModule, workdir: Path, tag: str, settings: BenchSettings) -> _Compiled:
    mlir_path = workdir / f"{tag}.mlir"
    vmfb_path = workdir / f"{tag}.vmfb"
    configs_dir = workdir / f"{tag}_configs"
    mlir_path.write_text(prepared.text)
    try:
        compile_module(mlir_path, vmfb_path, configs_dir, settings.compile_timeout_s)
    except ToolFailure as failure:
        failed = Measurement(ok=False, error=failure.line, config=prepared.configs, iree_version=iree_version())
        return _Compiled(prepared, vmfb_path, prepared.configs, failed)
    chosen = chosen_lowering_configs(configs_dir) if configs_dir.exists() else []
    if not prepared.configs:
        reported = [c for c in map(_config_from_text, chosen) if c is not None]
        return _Compiled(prepared, vmfb_path, reported)
    # IREE may silently keep its own config; then timing it under the plan's name would lie.
    for config in prepared.configs:
        wanted = lowering_config_text(config)
        if wanted not in chosen:
            raise NotMeasurable(
                f"IREE did not keep the forced config {wanted} on {config.anchor}; "
                f"it used {chosen or 'nothing it reported'}"
            )
    return _Compiled(prepared, vmfb_path, prepared.configs)


def _time_rounds(
    compiled: Sequence[_Compiled], input_flags: Sequence[str], settings: BenchSettings, rounds: int
) -> list[Measurement]:
    """Time each compiled module; with rounds > 1 they alternate (A B A B ...), so a load burst
    from other processes on this shared machine hits all of them alike."""
    samples: list[list[float]] = [[] for _ in compiled]
    cpu_samples: list[list[float]] = [[] for _ in compiled]
    errors: list[str | None] = [c.failure.error if c.failure else None for c in compiled]
    reps_per_round = max(1, settings.repetitions // rounds)
    for _ in range(rounds):
        for i, c in enumerate(compiled):
            if errors[i] is not None:
                continue
            try:
                got = benchmark_module(
                    c.vmfb_path,
                    c.prepared.function,
                    input_flags,
                    repetitions=reps_per_round,
                    min_time_s=settings.min_time_s,
                    timeout_s=settings.bench_timeout_s,
                )
                samples[i] += got.real_s
                cpu_samples[i] += got.cpu_s
            except ToolFailure as failure:
                errors[i] = failure.line
    version = iree_version()
    out = []
    for c, got, cpu, error in zip(compiled, samples, cpu_samples, errors):
        if error is not None:
            out.append(Measurement(ok=False, error=error, config=c.configs, iree_version=version))
        else:
            out.append(Measurement(ok=True, median_s=statistics.median(got), samples_s=got,
                                   cpu_median_s=statistics.median(cpu), cpu_samples_s=cpu,
                                   config=c.configs, iree_version=version))
    return out


def _measure(prepared: ForcedModule, workdir: Path, tag: str, settings: BenchSettings,
             input_flags: Sequence[str]) -> Measurement:
    return _time_rounds([_compile(prepared, workdir, tag, settings)], input_flags, settings, 1)[0]


def measure_plan(
    module_text: str,
    plan: Any,
    *,
    settings: BenchSettings = BenchSettings(),
    anchor_of: Callable[[Any], AnchorRef] | None = None,
    keep_dir: Path | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> Measurement:
    """Force `plan` on the module, compile, time. Raises NotMeasurable (convs, dynamic dims
    without a shape hint)."""
    prepared = force_plan(module_text, plan, anchor_of=anchor_of, shape_hints=shape_hints)
    with _workdir(keep_dir) as workdir:
        flags = write_inputs(prepared.arguments, workdir)
        return _measure(prepared, workdir, "forced", settings, flags)


def measure_default(
    module_text: str,
    *,
    function: str | None = None,
    settings: BenchSettings = BenchSettings(),
    keep_dir: Path | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> Measurement:
    """Time the module with IREE's own configs; `config` reports the ones IREE chose."""
    prepared = default_module(module_text, function, shape_hints)
    with _workdir(keep_dir) as workdir:
        flags = write_inputs(prepared.arguments, workdir)
        return _measure(prepared, workdir, "default", settings, flags)


def measure_plan_and_default(
    module_text: str,
    plan: Any,
    *,
    settings: BenchSettings = BenchSettings(),
    anchor_of: Callable[[Any], AnchorRef] | None = None,
    keep_dir: Path | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> Comparison:
    """The forced plan and IREE's default on the same random inputs, compiled in one temp dir
    and timed in alternating rounds (one repetition each) so that both see the same load.
    `shape_hints` sizes dynamic dims (argN -> shape) for the inputs; both modules stay dynamic."""
    (forced,), default = measure_plans_and_default(module_text, [plan], settings=settings, anchor_of=anchor_of,
                                                   keep_dir=keep_dir, shape_hints=shape_hints)
    return Comparison(forced=forced, default=default)


def measure_plans_and_default(
    module_text: str,
    plans: Sequence[Any],
    *,
    settings: BenchSettings = BenchSettings(),
    anchor_of: Callable[[Any], AnchorRef] | None = None,
    keep_dir: Path | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> tuple[list[Measurement], Measurement]:
    """Several forced plans and IREE's default, timed in alternating rounds (A B C default A B
    C default ...), so that a burst of outside load hits them alike. Raises NotMeasurable."""
    forced = [force_plan(module_text, plan, anchor_of=anchor_of, shape_hints=shape_hints) for plan in plans]
    if not forced:
        raise ValueError("no plans to measure")
    default = default_module(module_text, forced[0].function, shape_hints)
    with _workdir(keep_dir) as workdir:
        flags = write_inputs(forced[0].arguments, workdir)
        compiled = [_compile(f, workdir, f"forced{i}", settings) for i, f in enumerate(forced)]
        compiled.append(_compile(default, workdir, "default", settings))
        *timed, timed_default = _time_rounds(compiled, flags, settings, settings.repetitions)
        return timed, timed_default


class _workdir:
    """A fresh temp dir per call (artifacts removed after), or `keep` to inspect them."""

    def __init__(self, keep: Path | None):
        self._keep = keep
        self._tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> Path:
        if self._keep is not None:
            self._keep.mkdir(parents=True, exist_ok=True)
            return self._keep
        self._tmp = tempfile.TemporaryDirectory(prefix="tilesearch-measure-")
        return Path(self._tmp.name)

    def __exit__(self, *exc: object) -> Literal[False]:
        if self._tmp is not None:
            self._tmp.cleanup()
        return False

"""Measure a plan on this CPU against IREE's own default: compile both, time them alike.

The plan is forced on its anchors (forcing.py), the module compiled with `iree-compile` for the
host CPU and timed with `iree-benchmark-module` (median over repetitions). IREE's own default
(no attribute) is timed the same way on the same inputs, in alternating rounds, so the two are
comparable on a machine shared with other load.

Failures are data, not crashes: a config IREE rejects is a `Measurement(ok=False, error=...)`.
A plan IREE cannot be told (convolutions, dynamic dims without a shape hint, a forced config
IREE silently replaced) raises `NotMeasurable`.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from .forcing import ForcedModule, NotMeasurable, default_module, force_plan, write_inputs
from .lowering import LoweringConfig, lowering_config_of, lowering_config_text
from .rounds import round_order
from .tools import (
    BENCH_DEVICE,
    DISPATCH_REPEAT,
    ToolFailure,
    benchmark_module,
    benchmark_threads,
    chosen_lowering_configs,
    compile_module,
    configure_in_process,
    configure_module,
    iree_version,
)


class Measurement(BaseModel):
    """One timed compile of a module. ok=False carries IREE's first error line, no timing."""

    ok: bool
    median_s: float | None = None
    samples_s: list[float] = Field(default_factory=list)
    # Process CPU time per call, all worker threads together. On a shared machine wall time
    # swings with other processes' load; CPU time moves far less (see cpu_per_core_s).
    cpu_median_s: float | None = None
    cpu_samples_s: list[float] = Field(default_factory=list)
    error: str | None = None
    config: list[LoweringConfig] = Field(
        default_factory=list,
        description="forced configs, or for IREE's default the configs IREE chose",
    )
    iree_version: str


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


@dataclass(frozen=True)
class BenchSettings:
    repetitions: int = 5
    min_time_s: float = 0.1
    compile_timeout_s: float = 180.0
    bench_timeout_s: float = 180.0
    # local-task (what a model runs on) or local-sync: the caller's one thread, the tiling's own
    # work without the task executor's hand-off between workers (benchmarks only).
    device: str = BENCH_DEVICE
    # Each dispatch run this many times back to back in a call, timed per run: as inside a model,
    # the executor's workers are already running. Timed alone (1), every call first wakes them,
    # which can cost more than a short dispatch's tiles (docs/benchmarks.md, session 27).
    dispatch_repeat: int = DISPATCH_REPEAT


@dataclass
class _Compiled:
    """A compiled module ready to time, or the Measurement that says why it is not."""

    prepared: ForcedModule
    vmfb_path: Path
    configs: list[LoweringConfig]
    failure: Measurement | None = None


def _compile(prepared: ForcedModule, workdir: Path, tag: str, settings: BenchSettings,
             dropped_fails: bool = False) -> _Compiled:
    """Compile one module. A forced config IREE silently replaced raises NotMeasurable, or with
    `dropped_fails` becomes this module's failure (one plan among several is not the caller's error)."""
    mlir_path = workdir / f"{tag}.mlir"
    vmfb_path = workdir / f"{tag}.vmfb"
    configs_dir = workdir / f"{tag}_configs"
    mlir_path.write_text(prepared.text)
    try:
        compile_module(mlir_path, vmfb_path, configs_dir, settings.compile_timeout_s, settings.dispatch_repeat)
    except ToolFailure as failure:
        failed = Measurement(ok=False, error=failure.line, config=prepared.configs, iree_version=iree_version())
        return _Compiled(prepared, vmfb_path, prepared.configs, failed)
    chosen = chosen_lowering_configs(configs_dir) if configs_dir.exists() else []
    if not prepared.configs:
        reported = [c for c in (lowering_config_of(text, anchor="chosen by IREE") for text in chosen) if c is not None]
        return _Compiled(prepared, vmfb_path, reported)
    # IREE may silently keep its own config; then timing it under the plan's name would lie.
    for config in prepared.configs:
        wanted = lowering_config_text(config)
        if wanted not in chosen:
            reason = (f"IREE did not keep the forced config {wanted} on {config.anchor}; "
                      f"it used {chosen or 'nothing it reported'}")
            if not dropped_fails:
                raise NotMeasurable(reason)
            failed = Measurement(ok=False, error=reason, config=prepared.configs, iree_version=iree_version())
            return _Compiled(prepared, vmfb_path, prepared.configs, failed)
    return _Compiled(prepared, vmfb_path, prepared.configs)


def _time_rounds(
    compiled: Sequence[_Compiled], input_flags: Sequence[str], settings: BenchSettings, rounds: int
) -> list[Measurement]:
    """Time each compiled module; with rounds > 1 they alternate, so a load burst from other
    processes on this shared machine hits all of them alike, each in every position of a round
    equally often (`round_order`)."""
    samples: list[list[float]] = [[] for _ in compiled]
    cpu_samples: list[list[float]] = [[] for _ in compiled]
    errors: list[str | None] = [c.failure.error if c.failure else None for c in compiled]
    reps_per_round = max(1, settings.repetitions // rounds)
    for r in range(rounds):
        for i in round_order(len(compiled), r):
            c = compiled[i]
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
                    device=settings.device,
                    batch_size=settings.dispatch_repeat,
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
    keep_dir: Path | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> Measurement:
    """Force `plan` on the module, compile, time. Raises NotMeasurable (convs, dynamic dims
    without a shape hint)."""
    prepared = force_plan(module_text, plan, shape_hints=shape_hints)
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


def iree_default_configs(module_text: str | bytes, timeout_s: float, *, in_process: bool = False) -> list[str]:
    """The lowering configs IREE's CPU backend chooses for the module's dispatches on this host
    when told nothing (no spec, no forced config), as MLIR prints them: configured, not compiled
    to code, not timed. Raises ToolFailure when IREE cannot take the module. `in_process`: with
    IREE's compiler API in this process (tools.configure_in_process: sandbox workers only)."""
    with _workdir(None) as workdir:
        mlir_path = workdir / ("module.mlirbc" if isinstance(module_text, bytes) else "module.mlir")
        if isinstance(module_text, bytes):
            mlir_path.write_bytes(module_text)
        else:
            mlir_path.write_text(module_text)
        configs_dir = workdir / "configs"
        (configure_in_process if in_process else configure_module)(mlir_path, configs_dir, timeout_s)
        return chosen_lowering_configs(configs_dir) if configs_dir.exists() else []


def measure_plan_and_default(
    module_text: str,
    plan: Any,
    *,
    settings: BenchSettings = BenchSettings(),
    keep_dir: Path | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> Comparison:
    """The forced plan and IREE's default on the same random inputs, compiled in one temp dir
    and timed in alternating rounds (one repetition each) so that both see the same load.
    `shape_hints` sizes dynamic dims (argN -> shape) for the inputs; both modules stay dynamic."""
    (forced,), default = measure_plans_and_default(module_text, [plan], settings=settings,
                                                   keep_dir=keep_dir, shape_hints=shape_hints)
    return Comparison(forced=forced, default=default)


def measure_plans_and_default(
    module_text: str,
    plans: Sequence[Any],
    *,
    settings: BenchSettings = BenchSettings(),
    keep_dir: Path | None = None,
    shape_hints: Mapping[str, Sequence[int]] | None = None,
) -> tuple[list[Measurement], Measurement]:
    """Several forced plans and IREE's default, timed in alternating rounds (A B C default A B
    C default ...), so that a burst of outside load hits them alike. Raises NotMeasurable when
    the module cannot be forced at all; a plan whose config IREE replaced is a failed Measurement."""
    forced = [force_plan(module_text, plan, shape_hints=shape_hints) for plan in plans]
    if not forced:
        raise ValueError("no plans to measure")
    default = default_module(module_text, forced[0].function, shape_hints)
    with _workdir(keep_dir) as workdir:
        flags = write_inputs(forced[0].arguments, workdir)
        compiled = [_compile(f, workdir, f"forced{i}", settings, dropped_fails=True) for i, f in enumerate(forced)]
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

"""Fit the cost model's free parameters to IREE measurements on this machine.

1. Contraction workloads from a directory (convolutions and dynamic shapes are skipped with the
   reason: IREE cannot be forced on them, see iree.py).
2. A sample of plans per workload, spanning good and bad tilings, all inside IREE's limits.
3. Each plan is measured (iree.py, cached on disk) and predicted (apply_plan -> estimate_cost).
4. The calibration factors (compute efficiency, per-level bandwidth efficiencies, loop overhead
   scale) are fitted by minimising the squared error of log latency, in log-parameter space;
   on a CPU, once for each combination of the discrete register-tile terms (fit_profile).
5. Honesty: every workload is also held out once (fit on the others, score on it), and that
   held-out error is what the report leads with.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field
from scipy import optimize, stats

from service.hardware.cost import overlapped
from service.hardware.model import Calibration, HardwareModel

from .cache import MeasurementCache, measurement_key
from .forcing import NotMeasurable
from .lowering import LoweringConfig, lowering_config_from_levels
from .timing import (
    BenchSettings,
    Measurement,
    cpu_per_core_s,
    measure_default,
    measure_plan,
    measure_plan_and_default,
)

# IREE rejects vector tiles of 512 native vectors or more: 8192 f32 elements with AVX-512, the
# sampler's default bound; max_vector_elements(hardware) gives a host's own (4095 with AVX2).
MAX_VECTOR_ELEMENTS = 8192 - 1
DIST_SIZES = (16, 32, 64, 128, 256, 512)
VECTOR_SHAPES = ((1, 1), (1, 4), (2, 8), (4, 8), (4, 16), (8, 8), (8, 16), (8, 32), (16, 16),
                 (4, 32), (16, 32), (32, 16), (1, 64), (2, 32), (32, 32))
REDUCTION_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
# Always measured: IREE's own default for matmuls and the DESIGN.md config that beats it.
ANCHOR_CONFIGS = (((64, 64), (8, 16), 16), ((256, 256), (8, 32), 16))

# Fitted parameters live in log space within these bounds (factor of the nominal figure).
COMPUTE_BOUNDS = (0.02, 2.0)
BANDWIDTH_BOUNDS = (0.02, 5.0)
OVERHEAD_BOUNDS = (0.01, 100.0)
# Pulls unidentifiable parameters back to nominal instead of letting them wander.
RIDGE = 1e-3
# Register-tile terms tried by fit_profile (Compute.register_tile_rows, fma_pipeline_depth); None:
# no row limit (L1 set conflicts, read from sysfs, price tall tiles on their own).
REGISTER_TILE_ROWS = (None, 4, 8, 16, 32)
FMA_PIPELINE_DEPTHS = (4, 8, 16)


# --------------------------------------------------------------------------------------------
# Workloads and plans


@dataclass
class ContractionWorkload:
    """A module with one contraction anchor, and the ops IREE would fuse into its dispatch."""

    name: str
    text: str
    anchor: int
    loop_ranges: list[int]
    iterator_types: list[str]
    fuse: list[int]


def dispatch_members(graph: Any, anchor: int) -> list[int]:
    """The ops IREE puts in the anchor's dispatch: fill producers, elementwise consumers and
    the broadcasts/fills feeding those consumers, plus any fuse group the anchor is in."""
    members: set[int] = {p for p in graph.op(anchor).producers if graph.op(p).kind == "fill"}
    upstream = graph.upstream(anchor)
    for c in graph.downstream(anchor):
        if graph.op(c).kind != "elementwise":
            continue
        members.add(c)
        for p in graph.op(c).producers:
            if p not in upstream and p != anchor and graph.op(p).kind in ("fill", "data_movement"):
                members.add(p)
    for group in graph.fuse_groups.values():
        if anchor in group:
            members.update(group)
    members.discard(anchor)
    return sorted(members)


def load_contraction_workloads(directory: Path) -> tuple[list[ContractionWorkload], dict[str, str]]:
    """Measurable contraction workloads in `directory`, and the skipped ones with the reason."""
    from service.ir.graph import build_graph, tag_tileable_ops
    from service.ir.parse import parse_module

    found: list[ContractionWorkload] = []
    skipped: dict[str, str] = {}
    for path in sorted(directory.glob("*.mlir")):
        text = path.read_text()
        graph = build_graph(tag_tileable_ops(parse_module(text)))
        kinds = {op.kind for op in graph.ops.values()}
        anchors = [u for u, op in graph.ops.items() if op.kind == "contraction"]
        if "convolution" in kinds:
            skipped[path.stem] = "convolution: IREE drops a forced compilation_info on convs"
            continue
        if len(anchors) != 1:
            skipped[path.stem] = f"{len(anchors)} contractions (calibration wants exactly one)"
            continue
        op = graph.op(anchors[0])
        if op.dynamic_dims or any(r is None for r in op.loop_ranges):
            skipped[path.stem] = "dynamic dims: calibration samples static shapes (measure one at a shape with tilesearch measure --shape-hint)"
            continue
        found.append(
            ContractionWorkload(path.stem, text, anchors[0], list(op.loop_ranges),
                                list(op.iterator_types), dispatch_members(graph, anchors[0]))
        )
    return found, skipped


def _mn_dims(w: ContractionWorkload) -> tuple[int, int]:
    """The two innermost parallel dims (M, N); outer parallel dims (batch) are tiled by 1."""
    parallel = [i for i, t in enumerate(w.iterator_types) if t == "parallel"]
    return parallel[-2], parallel[-1]


def plan_for(w: ContractionWorkload, dist: tuple[int, int], vec: tuple[int, int], red: int) -> dict:
    """A three-level plan on the anchor: distribution, vector (parallel), reduction tiles."""
    m, n = _mn_dims(w)
    rank = len(w.iterator_types)
    level0, level1, level2 = [0] * rank, [0] * rank, [0] * rank
    for d, kind in enumerate(w.iterator_types):
        if kind == "parallel":
            level0[d] = level1[d] = 1  # batch dims: one at a time
        else:
            level2[d] = min(red, w.loop_ranges[d]) if d == w.iterator_types.index("reduction") else 1
    level0[m], level0[n] = dist
    level1[m], level1[n] = vec
    return {
        "groups": [
            {
                "anchor": w.anchor,
                "fuse": list(w.fuse),
                "levels": [
                    {"tile_sizes": level0, "loop": "forall"},
                    {"tile_sizes": level1, "loop": "for"},
                    {"tile_sizes": level2, "loop": "for"},
                ],
            }
        ]
    }


def iree_config_of(w: ContractionWorkload, plan: dict) -> LoweringConfig:
    return lowering_config_from_levels(plan["groups"][0]["levels"], w.iterator_types)


def max_vector_elements(hardware: HardwareModel) -> int:
    """The largest f32 vector tile IREE compiles for `hardware` (the calibration workloads are
    f32): an AVX2 host's 16 KiB limit made half the sampled large tiles fail to compile."""
    limit = hardware.max_vector_tile_bytes
    return MAX_VECTOR_ELEMENTS if limit is None else limit // 4 - 1


def sample_plans(w: ContractionWorkload, count: int, seed: int = 0,
                 max_elements: int = MAX_VECTOR_ELEMENTS) -> list[dict]:
    """`count` distinct plans IREE accepts (vector tiles of at most `max_elements`), from tiny
    vector tiles (slow) to large ones, always including IREE's default-like config and the
    DESIGN.md one where they fit."""
    m, n = _mn_dims(w)
    k = w.loop_ranges[w.iterator_types.index("reduction")]
    extent_m, extent_n = w.loop_ranges[m], w.loop_ranges[n]

    def valid(dist, vec, red) -> bool:
        return (dist[0] <= extent_m and dist[1] <= extent_n and extent_m % dist[0] == 0
                and extent_n % dist[1] == 0 and vec[0] <= dist[0] and vec[1] <= dist[1]
                and red <= k and vec[0] * vec[1] * red <= max_elements)

    space = [(d, v, r) for d in itertools.product(DIST_SIZES, DIST_SIZES)
             for v in VECTOR_SHAPES for r in REDUCTION_SIZES if valid(d, v, r)]
    rng = random.Random(f"{w.name}:{seed}")
    rng.shuffle(space)
    # Spread over vector tile sizes (the biggest lever): round-robin over log2-size buckets.
    # Tiny vector tiles (< 64 elements) are far off anything a search would pick and slow to
    # time, so only a few of them ride along as the clearly bad end.
    buckets: dict[int, list] = {}
    for cfg in space:
        buckets.setdefault(int(math.log2(cfg[1][0] * cfg[1][1] * cfg[2])), []).append(cfg)
    # The order does not depend on `count` (a longer sample extends a shorter one), so the
    # measurement cache serves calibration and the fidelity benchmark alike.
    chosen = [c for c in ANCHOR_CONFIGS if valid(*c)]
    tiny = [c for key in sorted(buckets) if key < 6 for c in buckets[key][:1]]
    chosen += [c for c in tiny[1::2] if c not in chosen][:2]
    realistic = {key: cfgs for key, cfgs in buckets.items() if key >= 6}
    while len(chosen) < count and any(realistic.values()):
        for key in sorted(realistic):
            if realistic[key] and len(chosen) < count:
                cfg = realistic[key].pop()
                if cfg not in chosen:
                    chosen.append(cfg)
    return [plan_for(w, *cfg) for cfg in chosen[:count]]


# --------------------------------------------------------------------------------------------
# Measured and predicted samples


class Sample(BaseModel):
    """One plan on one workload. `measured_s` is what the model is held to (see timing_of);
    `raw_s` and `default_s` are the plan's and its paired IREE default's times as measured."""

    workload: str
    plan: dict
    measured_s: float | None = None
    raw_s: float | None = None
    default_s: float | None = None
    error: str | None = None


def measure_cached(text: str, plan: dict | None, settings: BenchSettings,
                   cache: MeasurementCache) -> Measurement:
    """Measure a plan (None: IREE's default), reusing a cached measurement of the same thing."""
    key = measurement_key(text, plan, settings)
    hit = cache.get(key)
    if hit is not None:
        return hit
    result = measure_default(text, settings=settings) if plan is None else measure_plan(text, plan, settings=settings)
    cache.put(key, result)
    return result


def measure_paired_cached(text: str, plan: dict, settings: BenchSettings,
                          cache: MeasurementCache) -> tuple[Measurement, Measurement]:
    """The plan and IREE's default timed in alternating rounds (cached as a pair)."""
    key = measurement_key(text, {"paired_with_default": plan}, settings)
    forced, default = cache.get(key), cache.get(key + ":default")
    if forced is not None and default is not None:
        return forced, default
    result = measure_plan_and_default(text, plan, settings=settings)
    cache.put(key, result.forced)
    cache.put(key + ":default", result.default)
    return result.forced, result.default


def normalize_to_default(samples: Sequence[Sample]) -> list[Sample]:
    """Rescale each plan's time by (workload's median default / its paired default).

    The machine is shared: a plan timed during someone else's test run is slower for reasons
    unrelated to the plan. IREE's default, timed in the same rounds, sees the same load, so the
    ratio plan/default is the load-independent quantity; it is put back in seconds with the
    workload's median default.
    """
    reference: dict[str, float] = {}
    for name in {s.workload for s in samples}:
        defaults = [s.default_s for s in samples if s.workload == name and s.default_s]
        if defaults:
            reference[name] = statistics.median(defaults)
    out = []
    for s in samples:
        if s.raw_s and s.default_s and s.workload in reference:
            s = s.model_copy(update={"measured_s": s.raw_s / s.default_s * reference[s.workload]})
        out.append(s)
    return out


# "cpu": process CPU time / worker threads (cpu_per_core_s): moves least with other people's
# load, the default. "wall": wall-clock medians, normalized by the paired IREE default.
TIMINGS = ("cpu", "wall")


def timing_of(m: Measurement, timing: str) -> float | None:
    if not m.ok:
        return None
    return cpu_per_core_s(m) if timing == "cpu" else m.median_s


def paired_sample(w: ContractionWorkload, plan: dict, settings: BenchSettings,
                  cache: MeasurementCache, timing: str = "cpu") -> Sample:
    """One plan timed paired with IREE's default (not yet normalized: see finish_samples)."""
    try:
        forced, default = measure_paired_cached(w.text, plan, settings, cache)
    except NotMeasurable as exc:
        return Sample(workload=w.name, plan=plan, error=exc.reason)
    ok = forced.ok and default.ok
    return Sample(workload=w.name, plan=plan,
                  raw_s=timing_of(forced, timing) if ok else None,
                  default_s=timing_of(default, timing) if ok else None,
                  error=forced.error or default.error)


def finish_samples(samples: Sequence[Sample], timing: str) -> list[Sample]:
    """Set measured_s: wall times are normalized by the paired default, CPU times taken as is."""
    if timing == "wall":
        return normalize_to_default(samples)
    return [s.model_copy(update={"measured_s": s.raw_s}) for s in samples]


def measure_samples(
    workloads: Sequence[ContractionWorkload],
    plans_per_workload: int,
    settings: BenchSettings,
    cache: MeasurementCache,
    progress: Callable[[str], None] = lambda _: None,
    timing: str = "cpu",
    max_elements: int = MAX_VECTOR_ELEMENTS,
) -> list[Sample]:
    """Each sampled plan timed paired with IREE's default (alternating rounds)."""
    samples = []
    for w in workloads:
        for i, plan in enumerate(sample_plans(w, plans_per_workload, max_elements=max_elements)):
            s = paired_sample(w, plan, settings, cache, timing)
            samples.append(s)
            progress(f"{w.name} plan {i + 1}/{plans_per_workload}: "
                     + (f"{s.raw_s * 1e3:.2f} ms (default {s.default_s * 1e3:.2f} ms, {timing})"
                        if s.raw_s else f"failed: {s.error}"))
    return finish_samples(samples, timing)


@dataclass
class CostTerms:
    """A prediction split into the parts the calibration factors scale, per nest:
    latency = overlapped(compute / compute_eff, level_time / bandwidth_eff[level]) + overhead * scale."""

    nests: list[tuple[float, dict[str, float], float]]  # (compute_s, {level: time_s}, overhead_s)
    feasible: bool
    overlap_exponent: float

    def latency_s(self, cal: Calibration) -> float:
        if not self.feasible:
            return math.inf
        total = 0.0
        for compute_s, level_times, overhead_s in self.nests:
            times = [compute_s / cal.compute_efficiency] + [
                t / cal.bandwidth_efficiency.get(name, 1.0) for name, t in level_times.items()]
            total += overlapped(times, self.overlap_exponent) + overhead_s * cal.loop_overhead_scale
        return total


def cost_terms(cost: Any, hardware: HardwareModel) -> CostTerms:
    """Terms of a Cost estimated under nominal factors (Calibration()) on `hardware`."""
    return CostTerms(
        nests=[(n.compute_s, {lv.name: lv.time_s for lv in n.levels}, n.overhead_s) for n in cost.nests],
        feasible=cost.feasible,
        overlap_exponent=hardware.overlap_exponent,
    )


# A non-nominal calibration the fast path is checked against, once per sample.
_PROBE = dict(compute_efficiency=0.37, loop_overhead_scale=2.9)


class Predictor:
    """Predicted latency of (workload, plan) on a hardware model.

    The tiled clone is built once per sample (apply_plan). The fit evaluates thousands of
    calibrations, so each sample's cost is estimated once under nominal factors and split into
    CostTerms; the terms are rescaled per calibration. Each sample's terms are checked once
    against a full estimate under a probe calibration; if the cost model ever combines its parts
    differently, that sample falls back to full estimates (slow but exact).
    """

    def __init__(self, workloads: Sequence[ContractionWorkload]):
        from service.ir.parse import parse_module

        self._originals = {w.name: parse_module(w.text) for w in workloads}
        self._tiled: dict[tuple[str, str], Any] = {}
        self._terms: dict[tuple[str, str, str], CostTerms | None] = {}  # None: exact only

    def _key(self, workload: str, plan: dict) -> tuple[str, str]:
        from service.ir.plan import Plan

        return workload, Plan.model_validate(plan).canonical_json()

    def tiled(self, workload: str, plan: dict) -> Any:
        from service.ir.plan import Plan
        from service.ir.transform import apply_plan

        key = self._key(workload, plan)
        if key not in self._tiled:
            self._tiled[key] = apply_plan(self._originals[workload], Plan.model_validate(plan)).module
        return self._tiled[key]

    def cost(self, workload: str, plan: dict, hardware: HardwareModel) -> Any:
        from service.hardware.cost import estimate_cost

        return estimate_cost(self.tiled(workload, plan), hardware, original=self._originals[workload])

    def exact_latency_s(self, workload: str, plan: dict, hardware: HardwareModel) -> float:
        cost = self.cost(workload, plan, hardware)
        return cost.latency_s if cost.feasible else math.inf

    def latency_s(self, workload: str, plan: dict, hardware: HardwareModel) -> float:
        """Predicted seconds; inf when the model calls the plan infeasible."""
        nominal = with_calibration(hardware, Calibration())
        key = (*self._key(workload, plan), nominal.content_hash())
        if key not in self._terms:
            terms = cost_terms(self.cost(workload, plan, nominal), nominal)
            probe = Calibration(**_PROBE, bandwidth_efficiency={
                lv.name: 0.3 + 0.1 * i for i, lv in enumerate(nominal.memory_levels)})
            exact = self.exact_latency_s(workload, plan, with_calibration(nominal, probe))
            fast = terms.latency_s(probe)
            agrees = (exact == fast) or (math.isfinite(exact) and abs(fast - exact) <= 1e-6 * exact)
            self._terms[key] = terms if agrees else None
        terms = self._terms[key]
        if terms is None:
            return self.exact_latency_s(workload, plan, hardware)
        return terms.latency_s(hardware.calibration)


# --------------------------------------------------------------------------------------------
# Fitting


def parameter_names(hardware: HardwareModel) -> list[str]:
    return ["compute_efficiency", *[f"bandwidth_efficiency.{lv.name}" for lv in hardware.memory_levels],
            "loop_overhead_scale"]


def _bounds(hardware: HardwareModel) -> list[tuple[float, float]]:
    bw = [tuple(map(math.log, BANDWIDTH_BOUNDS))] * len(hardware.memory_levels)
    return [tuple(map(math.log, COMPUTE_BOUNDS)), *bw, tuple(map(math.log, OVERHEAD_BOUNDS))]


def calibration_from_vector(hardware: HardwareModel, theta: Sequence[float], fitted_on: Sequence[str] = ()) -> Calibration:
    levels = hardware.memory_levels
    return Calibration(
        compute_efficiency=math.exp(theta[0]),
        bandwidth_efficiency={lv.name: math.exp(t) for lv, t in zip(levels, theta[1:1 + len(levels)])},
        loop_overhead_scale=math.exp(theta[-1]),
        fitted_on=list(fitted_on),
    )


def with_calibration(hardware: HardwareModel, calibration: Calibration) -> HardwareModel:
    return hardware.model_copy(update={"calibration": calibration})


def log_errors(samples: Sequence[Sample], predictor: Predictor, hardware: HardwareModel) -> np.ndarray:
    """log(predicted / measured) per measured sample; a huge error when the model says infeasible
    for a plan IREE ran (the fit must not learn to call real plans infeasible)."""
    out = []
    for s in samples:
        pred = predictor.latency_s(s.workload, s.plan, hardware)
        out.append(math.log(pred / s.measured_s) if math.isfinite(pred) and pred > 0 else 10.0)
    return np.array(out)


def _fit_continuous(train: Sequence[Sample], predictor: Predictor, base: HardwareModel,
                    max_evals: int) -> tuple[Calibration, float]:
    """The calibration factors minimising mean squared log error (+ ridge), and that loss."""
    names = sorted({s.workload for s in train})
    base = with_calibration(base, Calibration())

    def loss(theta: np.ndarray) -> float:
        hw = with_calibration(base, calibration_from_vector(base, theta))
        err = log_errors(train, predictor, hw)
        return float(np.mean(err**2) + RIDGE * np.sum(theta**2))

    start = np.zeros(len(parameter_names(base)))
    result = optimize.minimize(loss, start, method="Powell", bounds=_bounds(base),
                               options={"maxfev": max_evals, "xtol": 1e-3, "ftol": 1e-6})
    return calibration_from_vector(base, result.x, fitted_on=names), float(result.fun)


def _measured(samples: Sequence[Sample]) -> list[Sample]:
    train = [s for s in samples if s.measured_s]
    if not train:
        raise ValueError("no successful measurements to fit on")
    return train


def fit_calibration(
    samples: Sequence[Sample], predictor: Predictor, base: HardwareModel, max_evals: int = 600
) -> Calibration:
    """Calibration factors minimising mean squared log error on `samples` (measured ones)."""
    return _fit_continuous(_measured(samples), predictor, base, max_evals)[0]


def with_register_tile(hardware: HardwareModel, rows: int | None, pipeline_depth: int) -> HardwareModel:
    compute = hardware.compute.model_copy(update={"register_tile_rows": rows, "fma_pipeline_depth": pipeline_depth})
    return hardware.model_copy(update={"compute": compute})


def fit_profile(
    samples: Sequence[Sample], predictor: Predictor, base: HardwareModel, max_evals: int = 600
) -> HardwareModel:
    """`base` with fitted register-tile terms (CPU only) and calibration factors.

    The register-tile terms are small integers the continuous fit cannot move through, and what
    the cost model does not explain otherwise (L1 set conflicts, from the profile's cache
    associativity, explain the row limits measured so far) may differ between
    microarchitectures: every combination gets its own continuous fit and the one with the
    least loss is kept.
    """
    train = _measured(samples)
    if base.compute.vector_registers is None:
        return with_calibration(base, _fit_continuous(train, predictor, base, max_evals)[0])
    best: tuple[float, HardwareModel] | None = None
    for rows, depth in itertools.product(REGISTER_TILE_ROWS, FMA_PIPELINE_DEPTHS):
        candidate = with_register_tile(base, rows, depth)
        calibration, loss = _fit_continuous(train, predictor, candidate, max_evals)
        if best is None or loss < best[0]:
            best = (loss, with_calibration(candidate, calibration))
    return best[1]


# --------------------------------------------------------------------------------------------
# Scores and the report


class FitScore(BaseModel):
    """How well predictions match measurements on some samples."""

    samples: int
    rmse_log: float = Field(description="root mean square of log(pred/measured); 0.1 ~ 10% off")
    spearman: float | None = None
    kendall: float | None = None


def score(samples: Sequence[Sample], predictor: Predictor, hardware: HardwareModel) -> FitScore:
    measured = [s for s in samples if s.measured_s]
    err = log_errors(measured, predictor, hardware)
    preds = [predictor.latency_s(s.workload, s.plan, hardware) for s in measured]
    meas = [s.measured_s for s in measured]
    rho = tau = None
    if len(measured) >= 3:
        rho = float(stats.spearmanr(preds, meas).statistic)
        tau = float(stats.kendalltau(preds, meas).statistic)
    return FitScore(samples=len(measured), rmse_log=float(np.sqrt(np.mean(err**2))) if len(err) else math.nan,
                    spearman=_finite(rho), kendall=_finite(tau))


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


class HeldOut(BaseModel):
    """One workload held out: fitted on the others, scored on it, before and after."""

    workload: str
    nominal: FitScore
    calibrated: FitScore


class CalibrationReport(BaseModel):
    hardware: str
    timing: str = "cpu"
    parameters: dict[str, float]
    train: dict[str, FitScore]  # "nominal" / "calibrated", on all measured samples
    held_out: list[HeldOut]
    skipped_workloads: dict[str, str]
    failed_samples: list[Sample] = Field(default_factory=list)
    profile_path: str | None = None


def _parameters(fitted: HardwareModel) -> dict[str, float]:
    cal = fitted.calibration
    out = {"compute_efficiency": cal.compute_efficiency, "loop_overhead_scale": cal.loop_overhead_scale}
    out.update({f"bandwidth_efficiency.{k}": v for k, v in cal.bandwidth_efficiency.items()})
    if fitted.compute.vector_registers is not None:
        out["fma_pipeline_depth"] = fitted.compute.fma_pipeline_depth
        if fitted.compute.register_tile_rows is not None:
            out["register_tile_rows"] = fitted.compute.register_tile_rows
    return out


def held_out_scores(samples: Sequence[Sample], predictor: Predictor, base: HardwareModel) -> list[HeldOut]:
    """Leave one workload out: fit on the rest, score the left-out one (nominal vs calibrated)."""
    names = sorted({s.workload for s in samples if s.measured_s})
    out = []
    for name in names:
        train = [s for s in samples if s.workload != name and s.measured_s]
        test = [s for s in samples if s.workload == name and s.measured_s]
        if not train:
            continue
        fitted = fit_profile(train, predictor, base)
        out.append(HeldOut(workload=name, nominal=score(test, predictor, with_calibration(base, Calibration())),
                           calibrated=score(test, predictor, fitted)))
    return out


def calibrate(
    hardware: HardwareModel,
    workloads_dir: Path,
    *,
    plans_per_workload: int = 12,
    settings: BenchSettings = BenchSettings(repetitions=3, min_time_s=0.05),
    cache: MeasurementCache | None = None,
    out: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
    timing: str = "cpu",
) -> tuple[HardwareModel, CalibrationReport]:
    """Measure, fit on all workloads, score held-out workloads, save the calibrated profile."""
    workloads, skipped = load_contraction_workloads(workloads_dir)
    if not workloads:
        raise ValueError(f"no measurable contraction workloads in {workloads_dir} (skipped: {skipped})")
    cache = cache if cache is not None else MeasurementCache()
    samples = measure_samples(workloads, plans_per_workload, settings, cache, progress, timing,
                              max_vector_elements(hardware))
    predictor = Predictor(workloads)
    base = with_calibration(hardware, Calibration())
    progress("fitting")
    fitted = fit_profile(samples, predictor, base)
    report = CalibrationReport(
        hardware=hardware.name,
        timing=timing,
        parameters=_parameters(fitted),
        train={"nominal": score(samples, predictor, base), "calibrated": score(samples, predictor, fitted)},
        held_out=held_out_scores(samples, predictor, base),
        skipped_workloads=skipped,
        failed_samples=[s for s in samples if not s.measured_s],
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(fitted.model_dump_json(indent=2))
        report.profile_path = str(out)
    return fitted, report


def format_report(report: CalibrationReport) -> str:
    """Plain-text report: held-out first (the honest number), then training fit and parameters."""

    def fmt(s: FitScore) -> str:
        rho = f"{s.spearman:+.2f}" if s.spearman is not None else "  n/a"
        return f"rmse(log) {s.rmse_log:6.3f}  spearman {rho}  (n={s.samples})"

    lines = [f"calibration of {report.hardware} ({report.timing} timing)", "held out (fit on the other workloads):"]
    for h in report.held_out:
        lines.append(f"  {h.workload:<18} nominal {fmt(h.nominal)}")
        lines.append(f"  {'':<18} fitted  {fmt(h.calibrated)}")
    lines.append("all workloads (training fit):")
    for label, s in report.train.items():
        lines.append(f"  {label:<10} {fmt(s)}")
    lines.append("parameters: " + ", ".join(f"{k}={v:.3g}" for k, v in report.parameters.items()))
    for name, why in report.skipped_workloads.items():
        lines.append(f"skipped {name}: {why}")
    if report.failed_samples:
        lines.append(f"{len(report.failed_samples)} plans failed to measure, e.g. {report.failed_samples[0].error}")
    if report.profile_path:
        lines.append(f"saved {report.profile_path}")
    return "\n".join(lines)

"""Calibration's samples: each sampled plan timed (cached on disk), paired with IREE's default
so that a loaded machine can be told from a slow plan."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from pydantic import BaseModel, Field

from .cache import MeasurementCache, measurement_key
from .calibration_plans import MAX_VECTOR_ELEMENTS, ContractionWorkload, sample_plans
from .forcing import NotMeasurable
from .timing import (
    BenchSettings,
    Measurement,
    cpu_per_core_s,
    measure_default,
    measure_plan,
    measure_plan_and_default,
)


class Sample(BaseModel):
    """One plan on one workload. `measured_s` is what the model is held to (see timing_of);
    `raw_s` and `default_s` are the plan's and its paired IREE default's times as measured."""

    workload: str
    plan: dict
    measured_s: float | None = None
    raw_s: float | None = None
    default_s: float | None = None
    error: str | None = None
    # The two timings as taken, for the store (not part of the reports' JSON).
    forced: Measurement | None = Field(default=None, exclude=True, repr=False)
    default: Measurement | None = Field(default=None, exclude=True, repr=False)


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
                  error=forced.error or default.error, forced=forced, default=default)


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

"""Fit the cost model's free parameters to IREE measurements on this machine.

1. Contraction workloads from a directory (convolutions and dynamic shapes are skipped with the
   reason: IREE cannot be forced on them, see forcing.py) and a sample of plans per workload,
   spanning good and bad tilings, all inside IREE's limits (calibration_plans.py).
2. Each plan is measured (timing.py, cached on disk; calibration_samples.py) and predicted
   (apply_plan -> estimate_cost; calibration_fit.py).
3. The calibration factors (compute efficiency, per-level bandwidth efficiencies, loop overhead
   scale) are fitted by minimising the squared error of log latency, in log-parameter space;
   on a CPU, once for each combination of the discrete register-tile terms (fit_profile).
4. `tilesearch calibrate` stores the timings (measure_workloads here) and fits to every
   measurement stored for the host, judged on held-out modules (online_fit.py); `score` is how
   well a profile predicts some samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field
from scipy import stats

from service.hardware.model import HardwareModel

from .cache import MeasurementCache
from .calibration_fit import Predictor, log_errors
from .calibration_plans import ContractionWorkload, load_contraction_workloads, max_vector_elements
from .calibration_samples import Sample, measure_samples
from .timing import BenchSettings


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


def measure_workloads(
    hardware: HardwareModel,
    workloads_dir: Path,
    *,
    plans_per_workload: int = 12,
    settings: BenchSettings = BenchSettings(repetitions=3, min_time_s=0.05),
    cache: MeasurementCache | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[list[ContractionWorkload], list[Sample], dict[str, str]]:
    """`tilesearch calibrate`'s timings, for the store: the workloads, each sampled plan timed
    paired with IREE's default (CPU time per thread), and the workloads skipped with why."""
    workloads, skipped = load_contraction_workloads(workloads_dir)
    if not workloads:
        raise ValueError(f"no measurable contraction workloads in {workloads_dir} (skipped: {skipped})")
    cache = cache if cache is not None else MeasurementCache.for_this_host()
    samples = measure_samples(workloads, plans_per_workload, settings, cache, progress, "cpu",
                              max_vector_elements(hardware))
    return workloads, samples, skipped

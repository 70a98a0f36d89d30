"""Fit the cost model's free parameters to IREE measurements on this machine.

1. Contraction workloads from a directory (convolutions and dynamic shapes are skipped with the
   reason: IREE cannot be forced on them, see forcing.py) and a sample of plans per workload,
   spanning good and bad tilings, all inside IREE's limits (calibration_plans.py).
2. Each plan is measured (timing.py, cached on disk; calibration_samples.py) and predicted
   (apply_plan -> estimate_cost; calibration_fit.py).
3. The calibration factors (compute efficiency, per-level bandwidth efficiencies, loop overhead
   scale) are fitted by minimising the squared error of log latency, in log-parameter space;
   on a CPU, once for each combination of the discrete register-tile terms (fit_profile).
4. Honesty (this module): every workload is also held out once (fit on the others, score on
   it), and that held-out error is what the report leads with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field
from scipy import stats

from service.hardware.model import Calibration, HardwareModel

from .cache import MeasurementCache
from .calibration_fit import Predictor, fit_profile, log_errors, with_calibration
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
    cache = cache if cache is not None else MeasurementCache.for_this_host()
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

"""Learning from the measurements the service stores: the cost model's fidelity on them, and a
calibrated profile fitted to them that is worth using only when it predicts modules it was not
fitted on better than the profile it would replace.

Pure: module texts and samples in (service.tiling.learning reads them from the store), scores
and a fitted profile out. A sample's `workload` is the module's fingerprint, `measured_s` its
load-robust time (CPU time per benchmark thread, timing.cpu_per_core_s).

Fidelity, per module (the search only ever ranks the plans of one module):
- Spearman's rho of predicted against measured time over the module's measured plans;
- top-1 regret: the measured time of the plan the model predicts fastest, over the fastest
  measured, minus 1 (0: the model's pick is the best measured plan);
- rmse of log(predicted / measured).

The verdict holds modules out (each module in turn up to five, else five folds of modules): fit
on the others (fit_profile, calibration's fit), score each held-out module under that fit and
under the base profile; the medians over the held-out modules decide (`verdict`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, Field
from scipy import stats

from service.hardware.model import Calibration, HardwareModel
from service.ir.plan import Plan

from .calibration_fit import Predictor, fit_calibration, fit_profile, with_calibration
from .calibration_samples import Sample

# The calibrated profile may lose this much rank correlation / add this much regret on the
# held-out modules (medians) and still count as no worse: single-module scores are noisy.
RHO_TOLERANCE = 0.02
REGRET_TOLERANCE = 0.02
# ... and must gain at least one of these: rho, regret, or log error by this factor.
RHO_GAIN = 0.01
REGRET_GAIN = 0.01
RMSE_GAIN = 0.9
MIN_HELD_OUT_MODULES = 3


@dataclass(frozen=True)
class StoredModule:
    """A module as the store keeps it: its fingerprint (what samples name) and its text."""

    name: str
    text: str


@dataclass(frozen=True)
class FitSettings:
    """How hard a fit tries, and what bounds its cost on a large store. `register_tiles`: also
    search the discrete register-tile terms (fit_profile; 15 continuous fits), else the
    continuous factors alone."""

    max_evals: int = 300
    register_tiles: bool = True
    max_samples: int = 400  # per fit (bounded): the loss is evaluated over every sample, max_evals times
    max_folds: int = 5  # held-out folds of modules (leave-one-module-out up to this many modules)


class ModuleScore(BaseModel):
    module: str = Field(description="the module's fingerprint")
    n: int = Field(description="measured plans scored")
    spearman: float | None = Field(description="rank correlation; None below 3 plans or when either side is constant")
    regret: float | None = Field(description="measured time of the predicted-fastest plan / fastest measured - 1")
    rmse_log: float | None


class Fidelity(BaseModel):
    """How a profile predicts a host's stored measurements."""

    n_measurements: int = Field(description="distinct (module, plan) pairs scored")
    n_modules: int
    spearman_rho: float | None = Field(description="median over modules of the per-module rho")
    spearman_rho_pooled: float | None = Field(description="rho over every pair at once (sizes dominate it)")
    median_regret: float | None = Field(description="median over modules with >= 2 plans of the top-1 regret")
    median_rmse_log: float | None
    per_module: list[ModuleScore] = Field(default_factory=list)
    unpredictable: int = Field(default=0, description="samples skipped: the plan no longer applies to the module")


class HeldOutModule(BaseModel):
    module: str
    base: ModuleScore
    calibrated: ModuleScore


class ScoreSummary(BaseModel):
    """Medians over the held-out modules."""

    spearman: float | None
    regret: float | None
    rmse_log: float | None


class OnlineFit(BaseModel):
    """A profile fitted to stored measurements, and whether it beats the base on held-out modules."""

    profile: HardwareModel
    n_measurements: int
    n_modules: int
    held_out: list[HeldOutModule]
    base: ScoreSummary
    calibrated: ScoreSummary
    better: bool
    reason: str


def merge_repeats(samples: Sequence[Sample]) -> list[Sample]:
    """One sample per (module, plan): the median of its measured times (a plan measured by
    several requests is one point, not several)."""
    groups: dict[tuple[str, str], list[Sample]] = {}
    for s in samples:
        if s.measured_s and s.measured_s > 0:
            groups.setdefault((s.workload, Plan.model_validate(s.plan).canonical_json()), []).append(s)
    return [group[0].model_copy(update={"measured_s": statistics.median(x.measured_s for x in group)})
            for group in groups.values()]


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def module_score(module: str, samples: Sequence[Sample], predicted: Sequence[float]) -> ModuleScore:
    """Rank correlation, top-1 regret and log error of one module's predictions."""
    measured = [s.measured_s for s in samples]
    rho = None
    if len(samples) >= 3 and len(set(measured)) > 1 and len(set(predicted)) > 1:
        rho = _finite(stats.spearmanr(predicted, measured).statistic)
    regret = None
    if len(samples) >= 2:
        pick = min(range(len(samples)), key=lambda i: predicted[i])
        regret = measured[pick] / min(measured) - 1.0
    errors = [math.log(p / m) if math.isfinite(p) and p > 0 else 10.0 for p, m in zip(predicted, measured)]
    rmse = float(np.sqrt(np.mean(np.square(errors)))) if errors else None
    return ModuleScore(module=module, n=len(samples), spearman=rho, regret=regret, rmse_log=rmse)


def _by_module(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.workload, []).append(s)
    return out


def _predictable(samples: Sequence[Sample], predictor: Predictor, hardware: HardwareModel) -> tuple[list[Sample], int]:
    """The samples whose plan still applies to its module (and the count of those that do not)."""
    kept, dropped = [], 0
    for s in samples:
        try:
            predictor.latency_s(s.workload, s.plan, hardware)
        except Exception:  # a stored plan MLIR no longer applies: skipped, counted
            dropped += 1
            continue
        kept.append(s)
    return kept, dropped


def fidelity(samples: Sequence[Sample], predictor: Predictor, hardware: HardwareModel) -> Fidelity:
    """`hardware`'s fidelity on measured samples (repeats merged)."""
    merged, dropped = _predictable(merge_repeats(samples), predictor, hardware)
    per_module, pooled_p, pooled_m = [], [], []
    for module, group in sorted(_by_module(merged).items()):
        predicted = [predictor.latency_s(module, s.plan, hardware) for s in group]
        per_module.append(module_score(module, group, predicted))
        pooled_p += predicted
        pooled_m += [s.measured_s for s in group]
    pooled = None
    if len(pooled_m) >= 3 and len(set(pooled_m)) > 1 and len(set(pooled_p)) > 1:
        pooled = _finite(stats.spearmanr(pooled_p, pooled_m).statistic)
    return Fidelity(
        n_measurements=len(merged), n_modules=len(per_module),
        spearman_rho=_median([m.spearman for m in per_module]), spearman_rho_pooled=pooled,
        median_regret=_median([m.regret for m in per_module]),
        median_rmse_log=_median([m.rmse_log for m in per_module]),
        per_module=per_module, unpredictable=dropped,
    )


def _fit(train: Sequence[Sample], predictor: Predictor, base: HardwareModel, settings: FitSettings) -> HardwareModel:
    nominal = with_calibration(base, Calibration())
    if settings.register_tiles:
        return fit_profile(train, predictor, nominal, settings.max_evals)
    return with_calibration(nominal, fit_calibration(train, predictor, nominal, settings.max_evals))


def _summary(scores: Sequence[ModuleScore]) -> ScoreSummary:
    return ScoreSummary(spearman=_median([s.spearman for s in scores]), regret=_median([s.regret for s in scores]),
                        rmse_log=_median([s.rmse_log for s in scores]))


def verdict(base: ScoreSummary, calibrated: ScoreSummary, held_out_modules: int) -> tuple[bool, str]:
    """Whether the calibrated profile predicts held-out modules better than the base, and why."""
    if held_out_modules < MIN_HELD_OUT_MODULES:
        return False, f"held out on {held_out_modules} modules; a verdict needs {MIN_HELD_OUT_MODULES}"

    def worse(c: float | None, b: float | None, tolerance: float, higher_is_better: bool) -> bool:
        if c is None or b is None:
            return False
        return c < b - tolerance if higher_is_better else c > b + tolerance

    if worse(calibrated.spearman, base.spearman, RHO_TOLERANCE, True):
        return False, f"ranks held-out plans worse (median rho {calibrated.spearman:.2f} against {base.spearman:.2f})"
    if worse(calibrated.regret, base.regret, REGRET_TOLERANCE, False):
        return False, f"picks worse held-out plans (median regret {calibrated.regret:.1%} against {base.regret:.1%})"
    gains = []
    if calibrated.spearman is not None and base.spearman is not None and calibrated.spearman > base.spearman + RHO_GAIN:
        gains.append(f"median rho {base.spearman:.2f} -> {calibrated.spearman:.2f}")
    if calibrated.regret is not None and base.regret is not None and calibrated.regret < base.regret - REGRET_GAIN:
        gains.append(f"median regret {base.regret:.1%} -> {calibrated.regret:.1%}")
    if calibrated.rmse_log is not None and base.rmse_log is not None and calibrated.rmse_log < RMSE_GAIN * base.rmse_log:
        gains.append(f"median log error {base.rmse_log:.2f} -> {calibrated.rmse_log:.2f}")
    if not gains:
        return False, "no better than the uncalibrated profile on held-out modules"
    return True, "better on held-out modules: " + ", ".join(gains)


def _spread(group: Sequence[Sample], k: int) -> list[Sample]:
    """At most k of a module's samples, spanning its measured range (fastest and slowest kept)."""
    if len(group) <= k:
        return list(group)
    ordered = sorted(group, key=lambda s: s.measured_s)
    picks = sorted({round(i * (len(ordered) - 1) / (k - 1)) for i in range(k)})
    return [ordered[i] for i in picks]


def bounded(samples: Sequence[Sample], limit: int) -> list[Sample]:
    """At most about `limit` samples, the same share from every module (a fit's cost grows with
    its samples; the modules matter more than many plans of one)."""
    groups = _by_module(samples)
    per_module = max(2, limit // max(1, len(groups)))
    return [s for _, group in sorted(groups.items()) for s in _spread(group, per_module)]


def module_folds(modules: Sequence[str], folds: int) -> list[list[str]]:
    """Modules dealt into `folds` groups (each one held out at a time): one module per fold up
    to MAX_FOLDS modules, so a fit on many modules costs MAX_FOLDS + 1 fits, not one per module."""
    ordered = sorted(modules)
    n = max(1, min(folds, len(ordered)))
    return [ordered[i::n] for i in range(n)]


def fit_online(modules: Sequence[StoredModule], samples: Sequence[Sample], base: HardwareModel,
               settings: FitSettings = FitSettings(), label: str = "stored measurements",
               progress: Callable[[str], None] = lambda _: None) -> OnlineFit:
    """Fit `base` to the samples, hold modules out (fit on the others, score the held-out ones
    on all their samples), and judge the fit against `base`."""
    predictor = Predictor(modules)
    merged, _ = _predictable(merge_repeats(samples), predictor, base)
    if not merged:
        raise ValueError("no successful measurements of a module the store holds")
    groups = _by_module(merged)
    progress(f"fitting on {len(merged)} measurements of {len(groups)} modules")
    fitted = _fit(bounded(merged, settings.max_samples), predictor, base, settings)
    fitted = fitted.model_copy(update={"calibration": fitted.calibration.model_copy(
        update={"fitted_on": [f"{label}: {len(merged)} plans of {len(groups)} modules"]})})
    held_out = []
    folds = module_folds(list(groups), settings.max_folds)
    for i, fold in enumerate(folds):
        train = [s for s in merged if s.workload not in fold]
        if not train:
            continue
        progress(f"holding out {len(fold)} module(s), fold {i + 1}/{len(folds)}")
        held_fit = _fit(bounded(train, settings.max_samples), predictor, base, settings)
        for module in fold:
            test = groups[module]
            held_out.append(HeldOutModule(
                module=module,
                base=module_score(module, test, [predictor.latency_s(module, s.plan, base) for s in test]),
                calibrated=module_score(module, test, [predictor.latency_s(module, s.plan, held_fit) for s in test]),
            ))
    base_summary = _summary([h.base for h in held_out])
    calibrated_summary = _summary([h.calibrated for h in held_out])
    better, reason = verdict(base_summary, calibrated_summary, len(held_out))
    return OnlineFit(profile=fitted, n_measurements=len(merged), n_modules=len(groups), held_out=held_out,
                     base=base_summary, calibrated=calibrated_summary, better=better, reason=reason)


def fidelity_of(modules: Sequence[StoredModule], samples: Sequence[Sample], hardware: HardwareModel) -> Fidelity:
    """`fidelity` with a predictor over `modules` (a sandbox task: it parses MLIR)."""
    return fidelity(samples, Predictor(modules), hardware)


def format_online_fit(fit: OnlineFit, version: int, names: dict[str, str] | None = None) -> str:
    """Plain text: held-out modules first (the verdict rests on them), then the verdict."""
    names = names or {}

    def fmt(s: ModuleScore | ScoreSummary) -> str:
        rho = f"{s.spearman:+.2f}" if s.spearman is not None else "  n/a"
        regret = f"{s.regret:6.1%}" if s.regret is not None else "   n/a"
        rmse = f"{s.rmse_log:.3f}" if s.rmse_log is not None else "n/a"
        return f"rho {rho}  regret {regret}  rmse(log) {rmse}"

    lines = [f"calibration version {version} of {fit.profile.name}: {fit.n_measurements} plans of "
             f"{fit.n_modules} modules", "held out (fit on the other modules):"]
    for h in fit.held_out:
        label = names.get(h.module, h.module[:16])
        lines.append(f"  {label:<18} uncalibrated {fmt(h.base)}  (n={h.base.n})")
        lines.append(f"  {'':<18} calibrated   {fmt(h.calibrated)}")
    lines.append(f"  {'median':<18} uncalibrated {fmt(fit.base)}")
    lines.append(f"  {'':<18} calibrated   {fmt(fit.calibrated)}")
    lines.append(("used: " if fit.better else "not used: ") + fit.reason)
    return "\n".join(lines)

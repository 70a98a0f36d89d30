"""Measure-in-the-loop refinement: the cost model ranks, IREE decides among the top few.

The model orders plans well (docs/benchmarks.md, cost model fidelity) but near the best its order is as
good as the measurement noise allows, and it misses what it does not model (IREE's
dynamic-shape codegen, fused epilogues). So, like an autotuner, measure the K distinct feasible
plans the search predicted fastest on this machine, with IREE, in alternating rounds beside
IREE's default, and answer with the fastest measured.

Ranked by CPU time per call (load-robust on a shared machine; wall time swings with others'
load). The speedup of the chosen plan is biased upwards (it won a noisy contest); report
speedups from fresh measurements, as benchmarks/search.py does.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from service.ir.plan import Plan
from service.measure.forcing import NotMeasurable
from service.measure.timing import BenchSettings, Measurement, measure_plans_and_default

from .candidate import Evaluation
from .guard import MEASURED_MARGIN
from .results import TuneResult


class MeasuredPlan(BaseModel):
    plan: dict
    plan_hash: str
    predicted_latency_s: float
    measured: Measurement


class Refinement(BaseModel):
    candidates: list[MeasuredPlan] = Field(default_factory=list, description="in predicted order")
    default: Measurement | None = None
    chosen: int | None = Field(default=None, description="index of the fastest measured candidate")
    not_measurable: str | None = None

    def summary(self) -> dict:
        """The CLI's --json `measured` block."""
        def cpu(m: Measurement | None) -> float | None:
            return m.cpu_median_s if m is not None and m.ok else None

        return {
            "default_cpu_s": cpu(self.default),
            "chosen": self.chosen,
            "not_measurable": self.not_measurable,
            "candidates": [
                {"plan_hash": c.plan_hash, "predicted_latency_s": c.predicted_latency_s, "cpu_s": cpu(c.measured),
                 "wall_s": c.measured.median_s if c.measured.ok else None, "error": c.measured.error}
                for c in self.candidates
            ],
        }


def is_forceable(t: Evaluation) -> bool:
    """A feasible, costed plan that IREE can be given as a config: it tiles something, and is not
    the super-tiling baseline, which leaves the vector tiles to the compiler (a forced config's
    zeros make the whole distribution tile one vector op, and IREE refuses it: "large vector
    sizes")."""
    return (t.stage == "cost" and t.feasible and t.latency_s is not None and bool(t.plan and t.plan.get("groups"))
            and t.source != "supertiling")


def top_plans(result: TuneResult, k: int) -> list[tuple[dict, str, float]]:
    """The k feasible plans with the lowest predicted latency that IREE would compile
    differently: (plan, hash, latency). The harness forces tile sizes only (IREE forms its own
    dispatches and distributes level 0 itself), so plans that differ only in loop kinds or
    fusion choices are one measurement. Only plans IREE can be forced to (`is_forceable`)."""
    seen: set[tuple] = set()
    ranked = []
    for t in sorted((t for t in result.trials if is_forceable(t)), key=lambda t: t.latency_s):
        key = _as_measured(t.plan)
        if key in seen:
            continue
        seen.add(key)
        ranked.append((t.plan, t.plan_hash, t.latency_s))
        if len(ranked) == k:
            break
    return ranked


def _as_measured(plan: dict) -> tuple:
    """What IREE is forced to: each group's anchor and tile sizes per level."""
    return tuple(sorted((g["anchor"], tuple(tuple(lv["tile_sizes"]) for lv in g["levels"])) for g in plan["groups"]))


def refine(source: str, result: TuneResult, k: int, settings: BenchSettings = BenchSettings()) -> Refinement:
    """Measure the top-k predicted plans and IREE's default; `chosen` is the fastest measured."""
    if result.buckets:
        raise ValueError("measuring a bucketed search: measure one bucket at a time (--shape-hint)")
    top = top_plans(result, k)
    if not top:
        return Refinement(not_measurable="no feasible tiled plan to measure")
    try:
        measured, default = measure_plans_and_default(source, [p for p, _, _ in top], settings=settings,
                                                      shape_hints=result.shape_hints or None)
    except NotMeasurable as exc:
        return Refinement(not_measurable=exc.reason)
    candidates = [MeasuredPlan(plan=p, plan_hash=h, predicted_latency_s=lat, measured=m)
                  for (p, h, lat), m in zip(top, measured)]
    timed = [(c.measured.cpu_median_s, i) for i, c in enumerate(candidates) if c.measured.ok and c.measured.cpu_median_s]
    return Refinement(candidates=candidates, default=default, chosen=min(timed)[1] if timed else None)


def with_measured_choice(result: TuneResult, refinement: Refinement) -> TuneResult:
    """`result` answering with the refinement's choice (its predicted cost from the search), and
    the measurements under `measured`. Unchanged plan when nothing could be measured."""
    update: dict = {"measured": refinement.summary()}
    if refinement.chosen is not None:
        chosen = refinement.candidates[refinement.chosen]
        ev = next(t for t in result.trials if t.plan_hash == chosen.plan_hash and t.cost is not None)
        update |= {"plan": chosen.plan, "plan_hash": chosen.plan_hash, "predicted": ev.cost, "feasible": ev.feasible}
    return result.model_copy(update=update)


def _iree_default_fastest(refinement: Refinement) -> bool:
    """The fastest measured plan is not MEASURED_MARGIN faster (CPU time per call) than IREE's
    default: a tie within timing noise is IREE's own build (a plan can copy IREE's config)."""
    if refinement.chosen is None or refinement.default is None or not refinement.default.ok:
        return False
    default, chosen = refinement.default.cpu_median_s, refinement.candidates[refinement.chosen].measured.cpu_median_s
    return default is not None and chosen is not None and chosen * (1 + MEASURED_MARGIN) > default


def _kept_default_reason(refinement: Refinement) -> str:
    """Why IREE's default was kept (`_iree_default_fastest`), said once for every surface: the
    CLI's summary and a decision's no_tuning_spec."""
    default, chosen = refinement.default.cpu_median_s, refinement.candidates[refinement.chosen].measured.cpu_median_s
    if default <= chosen:
        return "IREE's default measured fastest: kept"
    return (f"IREE's default kept: the best candidate measured {default / chosen:.2f}x, less than the "
            f"{MEASURED_MARGIN:.0%} a measured config must gain to ship")


def _iree_default_trial(result: TuneResult):
    """The trial that priced IREE's own config (the search's start, service.search.guard), else the
    untiled plan's: what the answer predicts when it leaves the op to IREE."""
    wanted = (result.iree_default or {}).get("plan_hash")
    return next((t for t in result.trials if wanted and t.plan_hash == wanted),
                next(t for t in result.trials if t.source == "untiled"))


def measured_answer(result: TuneResult, refinement: Refinement, k: int) -> TuneResult:
    """The answer of a `--measure-top k` search: the fastest measured plan, or, when IREE's
    default measured fastest, the untiled plan (IREE keeps its own config); `measured` says
    which was kept."""
    chosen = with_measured_choice(result, refinement)
    kept = "candidate" if refinement.chosen is not None else "predicted"
    if _iree_default_fastest(refinement):
        default = _iree_default_trial(result)
        kept = "iree_default"
        chosen = chosen.model_copy(update={"plan": {"groups": []}, "plan_hash": Plan().plan_hash(),
                                           "predicted": default.cost or {"latency_s": default.latency_s},
                                           "feasible": default.feasible})
    update: dict = {"measured": (chosen.measured or {}) | {"top": k, "kept": kept}}
    if kept == "iree_default":
        update["measured"]["reason"] = _kept_default_reason(refinement)
    if refinement.not_measurable:
        update["warnings"] = [*chosen.warnings, f"measure_top: nothing measured ({refinement.not_measurable}); "
                                                "the predicted best answers"]
    return chosen.model_copy(update=update)

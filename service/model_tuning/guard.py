"""Never ship a config worse than IREE's own: each tuned dispatch against IREE's default.

IREE's default config of a dispatch's root (read from the configuration dump of the model built
without a spec) becomes a plan of ours: the root's group, fusing what IREE fuses into its
dispatch, with IREE's three tiling levels (`service.measure.lowering.levels_from_lowering_config`).
That plan is priced by the search's own evaluator, as the search prices its plans. A dispatch keeps its tuned config only when it
is predicted faster than IREE's default by PREDICTED_MARGIN, or, when measured
(`--measure-top`), measured faster by MEASURED_MARGIN; otherwise it is left to IREE, and its
report line carries both numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.hardware.model import HardwareModel
from service.ir.graph import OpGraph, TileableOp
from service.measure.calibration_plans import dispatch_members
from service.measure.lowering import levels_from_lowering_config, lowering_config_of
from service.measure.forcing import NotMeasurable
from service.measure.timing import BenchSettings, measure_plans_and_default
from service.search.evaluator import price_plans
from service.search.refine import MeasuredPlan, Refinement, top_plans
from service.search.results import TuneResult

# A tuned config must beat IREE's default by this much to ship: the cost model's error near the
# optimum, and the timing noise, are of that order, and a tie is IREE's (it is what users get
# without tilesearch).
PREDICTED_MARGIN = 0.05
MEASURED_MARGIN = 0.05


def iree_default_plan(graph: OpGraph, root: TileableOp, config_text: str | None) -> dict | None:
    """IREE's default lowering config of `root` as a plan over the dispatch module (None: IREE
    gave the root no config with a distribution level, or one of another rank)."""
    if config_text is None:
        return None
    try:
        config = lowering_config_of(config_text)
    except ValueError:
        return None
    rank = len(root.iterator_types)
    if config is None or any(len(sizes) != rank for sizes in
                             (config.distribution, config.vector_common_parallel, config.vector_reduction)):
        return None
    return {"groups": [{"anchor": root.uid, "fuse": dispatch_members(graph, root.uid),
                        "levels": levels_from_lowering_config(config)}]}


def predicted_default_s(module: str, hardware: HardwareModel, default_plan: dict | None) -> float | None:
    """The cost model's latency for IREE's default plan on the dispatch module, by the search's
    own evaluator; None when it has no default plan or MLIR could not apply it."""
    if default_plan is None:
        return None
    (ev,) = price_plans(module, hardware, [default_plan])
    return ev.latency_s if ev.stage == "cost" else None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def predicted_verdict(tuned_s: float | None, default_s: float | None) -> str | None:
    """Why the tuned plan must not ship against IREE's default by prediction, or None (ship it)."""
    if tuned_s is None or default_s is None:
        return None
    if tuned_s * (1 + PREDICTED_MARGIN) > default_s:
        return (f"IREE's default predicted as fast: {_ms(default_s)} vs {_ms(tuned_s)} tuned "
                f"(a tuned config ships {PREDICTED_MARGIN:.0%} faster or not at all)")
    return None


@dataclass(frozen=True)
class MeasuredVerdict:
    """What timing the top plans beside IREE's default decided (CPU time per call)."""

    keep: bool
    plan: dict | None  # the fastest measured plan, when it ships
    tuned_s: float | None
    default_s: float | None
    reason: str


def measure_against_default(module: str, result: TuneResult, k: int, default_plan: dict | None,
                            settings: BenchSettings = BenchSettings()) -> tuple[Refinement, MeasuredVerdict | None]:
    """Time the k plans predicted fastest and IREE's default on this CPU, the dispatch compiled on
    its own, in alternating rounds. IREE's default is the config the model's own build gave the
    root, forced (`default_plan`): compiled alone, IREE configures a dispatch differently (it
    collapses a 1x1 convolution's spatial dims into one), so its stand-alone default is not the
    model's; that one is the reference only when the model's config has no plan. The verdict is
    None when nothing could be compared (the prediction decides then)."""
    top = top_plans(result, k)
    if not top:
        return Refinement(not_measurable="no feasible tiled plan to measure"), None
    plans = [p for p, _, _ in top] + ([default_plan] if default_plan is not None else [])
    try:
        measured, standalone = measure_plans_and_default(module, plans, settings=settings)
    except NotMeasurable as exc:
        return Refinement(not_measurable=exc.reason), None
    candidates = [MeasuredPlan(plan=p, plan_hash=h, predicted_latency_s=lat, measured=m)
                  for (p, h, lat), m in zip(top, measured)]
    timed = [(c.measured.cpu_median_s, i) for i, c in enumerate(candidates) if c.measured.ok and c.measured.cpu_median_s]
    refinement = Refinement(candidates=candidates, default=standalone, chosen=min(timed)[1] if timed else None)
    reference = measured[-1] if default_plan is not None else standalone
    if refinement.chosen is None or not reference.ok or reference.cpu_median_s is None:
        return refinement, None
    chosen = candidates[refinement.chosen]
    tuned_s, default_s = chosen.measured.cpu_median_s, reference.cpu_median_s
    if tuned_s * (1 + MEASURED_MARGIN) > default_s:
        return refinement, MeasuredVerdict(
            False, None, tuned_s, default_s,
            f"IREE's default measured as fast: {_ms(default_s)} vs {_ms(tuned_s)} tuned "
            f"(CPU time per call; a tuned config ships {MEASURED_MARGIN:.0%} faster or not at all)")
    return refinement, MeasuredVerdict(True, chosen.plan, tuned_s, default_s,
                                       f"measured {_ms(tuned_s)} against IREE's default {_ms(default_s)} "
                                       f"({default_s / tuned_s:.2f}x, CPU time per call)")

"""Never answer with a config worse than IREE's own: a tuned plan against IREE's default.

IREE's default config of a contraction (from iree-compile for this host: the model built
without a spec, or the single module configured) becomes a plan of ours: the root's group,
fusing what IREE fuses into its dispatch, with IREE's three tiling levels
(`service.measure.lowering.levels_from_lowering_config`). That plan is priced by the search's
own evaluator, as the search prices its plans. A tuned plan is answered only when it is
predicted faster than IREE's default by a margin (a model's dispatch: PREDICTED_MARGIN; a single
module: engine.KEEP_START_MARGIN, the model's top-1 regret), or, when measured, measured faster by
MEASURED_MARGIN; otherwise the op is left to IREE, and the answer says why with both numbers.

`tune_from_iree_default` is the single-module decision (the REST API's, a job item's, `tilesearch
tune`'s): the search starts from IREE's default and the guard judges its pick. Whole models
(`service.model_tuning`) read IREE's default per dispatch from the model's build and guard each
dispatch, weighted by its calls.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, Field

from service.hardware.model import HardwareModel
from service.hardware.profiles import HOST_CPU
from service.ir.analysis import cached_analysis
from service.ir.graph import OpGraph, TileableOp
from service.ir.plan import Plan
from service.measure.calibration_plans import dispatch_members
from service.measure.lowering import leaves_no_vector_tile, levels_from_lowering_config, lowering_config_of
from service.measure.timing import iree_default_configs
from service.measure.tools import ToolFailure

from . import engine
from .candidate import Evaluation
from .engine import tune
from .evaluator import price_plans
from .results import TuneResult
from .tile_sizes import is_dense_pixel_contraction, vectorizes_first_input

log = logging.getLogger(__name__)

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


def measured_only(root: TileableOp) -> str | None:
    """What a root is when its config ships only when measured faster than IREE's (None: a
    prediction may ship it): the cost model does not rank its configs well enough."""
    if root.kind == "convolution":
        return "a convolution: the cost model is unchecked on convolutions"
    if vectorizes_first_input(root) and is_dense_pixel_contraction(root):
        return ("a contraction vectorized along its first input over two pixel dims (a 1x1 convolution over "
                "NCHW kept 4-D: out[co, h, w] = X[ci, h, w] x W[co, ci]): the cost model prices IREE's lowering "
                "of the collapsed form only (benchmarks/pointwise_fidelity.py, docs/benchmarks.md)")
    return None


def unmeasured_reason(what: str, measured_how: str = "on this machine (measure_top, tune --measure-top K)") -> str:
    """Why a measured-only root (`measured_only` says `what` it is) is left to IREE unmeasured."""
    return f"{what}; its config ships only when measured faster {measured_how}: IREE's own config is kept"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f} ms"


def predicted_verdict(tuned_s: float | None, default_s: float | None, margin: float | None = None) -> str | None:
    """Why the tuned plan must not ship against IREE's default by prediction, or None (ship it).
    margin: PREDICTED_MARGIN (a model's dispatch) unless given."""
    margin = PREDICTED_MARGIN if margin is None else margin
    if tuned_s is None or default_s is None:
        return None
    if tuned_s * (1 + margin) > default_s:
        return (f"IREE's default predicted as fast: {_ms(default_s)} vs {_ms(tuned_s)} tuned "
                f"(a tuned config ships {margin:.0%} faster or not at all)")
    return None


def measured_verdict(tuned_s: float | None, default_s: float | None) -> str | None:
    """Why the fastest measured plan must not ship against IREE's default, both timed inside the
    model (`in_model.py`), or None (ship it). Nothing to compare: IREE's config is kept."""
    if tuned_s is None or default_s is None:
        return "not measured inside the model: IREE's own config is kept"
    if tuned_s * (1 + MEASURED_MARGIN) > default_s:
        return (f"IREE's default measured as fast inside the model: {_ms(default_s)} vs {_ms(tuned_s)} tuned "
                f"(wall time per model run; a tuned config ships {MEASURED_MARGIN:.0%} faster or not at all)")
    return None


# iree-compile up to the executable configurations takes well under a second for one dispatch;
# a module IREE chokes on must not hold the search.
CONFIGURE_TIMEOUT_S = 30.0


class IreeDefault(BaseModel):
    """IREE's default config of a module's one contraction, as IREE printed it and as a plan."""

    anchor: int = Field(description="the contraction's uid")
    config: str = Field(description="the lowering_config IREE gave it")
    plan: dict = Field(description="the config as a plan of ours (iree_default_plan)")


def iree_default_of(source: str | bytes, *, in_process: bool = False) -> IreeDefault | None:
    """IREE's default for the module's contraction, configured by iree-compile for this host.
    None when there is nothing to compare against: not exactly one contraction, a dynamic dim
    (no spec can match it), IREE failing on the module, or no config of the root's rank (the
    dispatch's root is then not the contraction). `in_process`: see iree_default_configs."""
    graph = cached_analysis(source).graph
    roots = [op for op in graph.ops.values() if op.kind == "contraction"]
    if len(roots) != 1 or any(r is None for r in roots[0].loop_ranges):
        return None
    (root,) = roots
    try:
        configs = iree_default_configs(source, CONFIGURE_TIMEOUT_S, in_process=in_process)
    except ToolFailure as failure:
        log.info("IREE's default config unknown, iree-compile failed: %s", failure)
        return None
    found = [(text, plan) for text in configs if (plan := iree_default_plan(graph, root, text)) is not None]
    if len(found) != 1:
        return None
    ((text, plan),) = found
    return IreeDefault(anchor=root.uid, config=text, plan=plan)


def _tiled_pick(result: TuneResult, graph: OpGraph) -> Evaluation | None:
    """What the guard judges: the search's answer when it tiles, else its fastest feasible tiled
    trial that IREE can take as configs (`leaves_no_vector_tile`). An untiled contraction is
    compiled with IREE's own config, whatever the model prices an untiled loop nest at, so the
    untiled plan is no rival to IREE's default."""
    if result.feasible and result.plan.get("groups"):
        return Evaluation(plan=result.plan, plan_hash=result.plan_hash, feasible=True,
                          latency_s=result.predicted.get("latency_s"), cost=result.predicted)
    tiled = [t for t in result.trials if t.stage == "cost" and t.feasible and t.latency_s is not None
             and t.plan and t.plan.get("groups") and not leaves_no_vector_tile(graph, Plan.model_validate(t.plan))]
    return min(tiled, key=lambda t: t.latency_s, default=None)


def guarded(source: str | bytes, result: TuneResult, hardware: HardwareModel, default: IreeDefault) -> TuneResult:
    """The search's tiled pick (`_tiled_pick`), or IREE's own config (the untiled plan: no spec,
    IREE configures the op) when the pick is not predicted faster than IREE's default by
    engine.KEEP_START_MARGIN. `iree_default` records the default's predicted cost and which answered."""
    pick = _tiled_pick(result, cached_analysis(source).graph)
    # One pricing for both: IREE's default, and a pick taken from the trials (the search answered
    # untiled) for its full breakdown, as the engine re-costs the plan it answers.
    repriced = pick is not None and pick.plan_hash != result.plan_hash
    ev, *picked = price_plans(source, hardware, [default.plan, *([pick.plan] if repriced else [])])
    default_s = ev.latency_s if ev.stage == "cost" else None
    if pick is None:
        verdict = "no feasible tiled plan was found: IREE's default is kept"
    else:
        # A single module's pick must be predicted faster by the engine's own keep-the-start margin
        # (about the model's top-1 regret on the broad corpus); the engine itself answers its best
        # and leaves this judgement here (tune_from_iree_default).
        verdict = predicted_verdict(pick.latency_s, default_s, margin=engine.KEEP_START_MARGIN)
        if verdict is None and (what := measured_only(cached_analysis(source).graph.op(default.anchor))):
            verdict = unmeasured_reason(what)
    if verdict is not None:
        verdict += (f"; the best of {result.evaluations} plans searched"
                    + ("" if result.complete else ", cut short by the time limit"))
    record: dict[str, Any] = {"anchor": default.anchor, "config": default.config, "predicted_s": default_s,
                              "kept": verdict is not None, "reason": verdict}
    if verdict is None and not repriced:
        return result.model_copy(update={"iree_default": record})
    if verdict is None:  # the search answered untiled: its best tiled trial instead
        return result.model_copy(update={"plan": pick.plan, "plan_hash": pick.plan_hash,
                                         "predicted": picked[0].cost or pick.cost, "feasible": True,
                                         "iree_default": record})
    return result.model_copy(update={"plan": {"groups": []}, "plan_hash": Plan().plan_hash(),
                                     "predicted": ev.cost or {"latency_s": default_s}, "feasible": ev.feasible,
                                     "iree_default": record})


def tune_from_iree_default(source: str, hardware: HardwareModel, *, guard: bool = True,
                           warm_start_plans: list[dict] | None = None, configure_in_process: bool = False,
                           **search: Any) -> TuneResult:
    """The single-module decision: `engine.tune` started from IREE's default config (when the
    module has one contraction IREE configures), its pick then judged against that default
    (`guard`; off when measurements will judge it instead). Only for `host-cpu`: IREE's default
    is read for the machine the service runs on, and means nothing for another target.
    `configure_in_process`: IREE configures the module in this process (a sandbox worker's)."""
    default = (None if search.get("buckets") or hardware.name != HOST_CPU
               else iree_default_of(source, in_process=configure_in_process))
    starts = [*(warm_start_plans or []), *([default.plan] if default else [])]
    # The guard is the one judge of a pick against IREE's default: the engine answers its best,
    # not its start kept by its own margin, so that the reason names the best plan found.
    keep_start = 0.0 if default is not None and guard else None
    result = tune(source, hardware, warm_start_plans=starts or None, keep_start_margin=keep_start, **search)
    if default is None:
        return result
    if not guard:  # measurements judge; the default's trial is its prediction (refine.measured_answer)
        plan_hash = Plan.model_validate(default.plan).plan_hash()
        start = next((t for t in result.trials if t.plan_hash == plan_hash and t.stage == "cost"), None)
        return result.model_copy(update={"iree_default": {"anchor": default.anchor, "config": default.config,
                                                          "plan_hash": plan_hash,
                                                          "predicted_s": start.latency_s if start else None}})
    return guarded(source, result, hardware, default)

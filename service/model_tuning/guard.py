"""Never ship a config worse than IREE's own: each tuned dispatch against IREE's default.

IREE's default config of a dispatch's root (read from the configuration dump of the model built
without a spec) becomes a plan of ours: the root's group, fusing what IREE fuses into its
dispatch, with IREE's three tiling levels (`service.measure.lowering.levels_from_lowering_config`).
That plan is priced by the search's own evaluator, as the search prices its plans. A dispatch keeps its tuned config only when it
is predicted faster than IREE's default by PREDICTED_MARGIN, or, when measured
(`--measure-top`, inside the model: `in_model.py`), measured faster by MEASURED_MARGIN; otherwise
it is left to IREE, and its report line carries both numbers.
"""

from __future__ import annotations

from service.hardware.model import HardwareModel
from service.ir.graph import OpGraph, TileableOp
from service.measure.calibration_plans import dispatch_members
from service.measure.lowering import levels_from_lowering_config, lowering_config_of
from service.search.evaluator import price_plans

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


def measured_verdict(tuned_s: float | None, default_s: float | None) -> str | None:
    """Why the fastest measured plan must not ship against IREE's default, both timed inside the
    model (`in_model.py`), or None (ship it). Nothing to compare: IREE's config is kept."""
    if tuned_s is None or default_s is None:
        return "not measured inside the model: IREE's own config is kept"
    if tuned_s * (1 + MEASURED_MARGIN) > default_s:
        return (f"IREE's default measured as fast inside the model: {_ms(default_s)} vs {_ms(tuned_s)} tuned "
                f"(wall time per model run; a tuned config ships {MEASURED_MARGIN:.0%} faster or not at all)")
    return None

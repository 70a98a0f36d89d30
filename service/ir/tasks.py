"""IR work as plain functions over text and JSON: what sandbox workers run.

Each worker process keeps its MLIR context and a small cache of analysed modules keyed by the
text's hash, so repeated work on one module does not re-parse it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from .analysis import Analysis, analyze
from .plan import Plan
from .transform import apply_plan

_CACHE_SIZE = 16
_analyses: OrderedDict[str, Analysis] = OrderedDict()


def cached_analysis(source: str, *, max_ops: int | None = None) -> Analysis:
    key = hashlib.sha256(source.encode("utf-8", "surrogatepass")).hexdigest()
    hit = _analyses.get(key)
    if hit is not None:
        _analyses.move_to_end(key)
        return hit
    result = analyze(source, max_ops=max_ops)
    _analyses[key] = result
    if len(_analyses) > _CACHE_SIZE:
        _analyses.popitem(last=False)
    return result


def inspect_module(source: str, max_ops: int | None = None) -> dict:
    """Fingerprint and op graph of a module, as JSON."""
    a = cached_analysis(source, max_ops=max_ops)
    return {"fingerprint": a.fingerprint, **a.graph.to_json()}


def apply_plan_to_text(source: str, plan_json: dict, max_ops: int | None = None) -> dict:
    """Tiled module text, transform script and origin map for a plan."""
    a = cached_analysis(source, max_ops=max_ops)
    applied = apply_plan(a.tagged, Plan.model_validate(plan_json), a.graph)
    return {
        "tiled_module": str(applied.module),
        "transform_script": applied.script,
        "origin": applied.origin.to_json(),
    }

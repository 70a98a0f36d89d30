"""What a job needs done in a sandbox worker (MLIR and IREE stay out of the API process):
a model's dispatches as items, and the merged tuning spec of a job's finished items."""

from __future__ import annotations

import tempfile
from pathlib import Path

from service.ir.analysis import analyze
from service.ir.errors import IRError
from service.measure.tools import host_translation_info
from service.measure.tuning_spec import ContractionMatcher, contraction_matcher, tuning_spec
from service.model_tuning.tune import classify_dispatches

from .contract import ModelDispatch, ModelItems


def model_items(model_text: str) -> ModelItems:
    """IREE forms the model's dispatches; the tunable ones become items (weighted by how often
    one run of the model dispatches them), the others are reported with why."""
    with tempfile.TemporaryDirectory(prefix="tilesearch-job-model-") as tmp:
        model = Path(tmp) / "model.mlir"
        model.write_text(model_text)
        tunable, left = classify_dispatches(model, Path(tmp))
    return ModelItems(
        tunable=[ModelDispatch(name=d.entry, module=d.module or "", weight=d.weight) for d in tunable],
        left_to_iree=[{"name": r.name, "weight": r.weight, "root_op": r.root_op, "reason": r.reason} for r in left],
    )


def merged_spec(items: list[tuple[str, dict]], host_cpu: bool) -> str | None:
    """One tuning spec for the items' plans, `(module text, plan)` heaviest first: a matcher per
    distinct contraction anchor (the first, heaviest, item's config wins a shared one).
    None: no plan configures a contraction."""
    translation = host_translation_info() if host_cpu else None
    matchers: dict[tuple, ContractionMatcher] = {}
    for module, plan in items:
        try:
            graph = analyze(module).graph
        except IRError:
            continue  # a done item parsed when it ran; nothing to add if that changed
        for group in plan.get("groups", []):
            m = contraction_matcher(graph.op(group["anchor"]), group["levels"], f"item_{len(matchers)}", translation)
            if m is not None:
                matchers.setdefault(m.matched, m)
    return tuning_spec(list(matchers.values())) if matchers else None

"""What a job needs done in a sandbox worker (MLIR and IREE stay out of the API process):
a model's dispatches as items, and the merged tuning spec of a job's finished items."""

from __future__ import annotations

import tempfile
from pathlib import Path

from service.ir.analysis import analyze
from service.ir.errors import IRError
from service.ir.plan import Plan
from service.measure.tools import host_translation_info
from service.measure.tuning_spec import ContractionMatcher, contraction_matcher, symbol_part, tuning_spec, why_no_spec
from service.model_tuning.model_input import ModelInputError
from service.model_tuning.static_shapes import (all_dynamic_message, input_labels, mlir_dynamic_inputs, sized_for,
                                                static_mlir_text)
from service.model_tuning.tune import classify_dispatches

from .contract import LeftToIree, ModelDispatch, ModelItems


def model_items(model_text: str, shape_hints: dict[str, list[int]] | None = None) -> ModelItems:
    """IREE forms the model's dispatches (its dynamic inputs sized by `shape_hints` first); the
    tunable ones become items (weighted by how often one run of the model dispatches them), the
    others are reported with why. ModelInputError when every dispatch it has is dynamic."""
    with tempfile.TemporaryDirectory(prefix="tilesearch-job-model-") as tmp:
        model = Path(tmp) / "model.mlir"
        still_dynamic = None
        if shape_hints:
            model_text, still_dynamic = static_mlir_text(model_text.encode(), "the model", shape_hints)
        model.write_text(model_text)
        found = model_file_items(model, Path(tmp))
        if (dynamic := found.only_dynamic()) is not None:
            inputs = still_dynamic if shape_hints else mlir_dynamic_inputs(model.read_bytes())
            raise ModelInputError(all_dynamic_message("the model", dynamic, len(found.left_to_iree), inputs,
                                                      bool(shape_hints), in_request=True))
        found.still_dynamic = input_labels(still_dynamic or [])
        return found


def model_file_items(model: Path, workdir: Path) -> ModelItems:
    """`model_items` of an MLIR file IREE compiles (ModelInputError when it cannot)."""
    tunable, left = classify_dispatches(model, workdir)
    return ModelItems(
        tunable=[ModelDispatch(name=d.entry, module=d.module or "", weight=d.weight) for d in tunable],
        left_to_iree=[LeftToIree(name=r.name, weight=r.weight, root_op=r.root_op, reason=r.reason or "",
                                 dynamic=r.dynamic) for r in left],
    )


def merged_spec(items: list[tuple[str, str, dict, str | None]], host_cpu: bool,
                shape_hints: dict[str, list[int]] | None = None, sized_model: str | None = None,
                still_dynamic: list[str] | None = None) -> tuple[str | None, list[str]]:
    """One tuning spec for the items' plans, `(name, module text, plan, why the decision has no
    spec as stored with it, or None)` heaviest first: a matcher per distinct contraction anchor
    (the first, heaviest, item's config wins a shared one), and why each item that adds none is
    left out (the decision's own reason, e.g. IREE's default kept, else read off its plan). The
    spec is None when no plan configures a contraction; otherwise its text opens with those
    reasons as comments (and, for a model sized by `shape_hints`, the sizes it matches, the sized
    model's file name when the client gave it, and the inputs the hints left open)."""
    translation = host_translation_info() if host_cpu else None
    matchers: dict[tuple, ContractionMatcher] = {}
    left_out: list[str] = []
    for name, module, plan, stored_reason in items:
        try:
            graph = analyze(module).graph
        except IRError:
            continue  # a done item parsed when it ran; nothing to add if that changed
        found = 0
        for group in plan.get("groups", []):
            symbol = f"{symbol_part(name)[:60] or 'item'}_{len(matchers)}"
            m = contraction_matcher(graph.op(group["anchor"]), group["levels"], symbol, translation)
            if m is not None:
                matchers.setdefault(m.matched, m)
                found += 1
        if not found:
            left_out.append(f"item {name!r}: {stored_reason or why_no_spec(graph, Plan.model_validate(plan))}")
    if not matchers:
        return None, left_out
    notes = "".join(f"// not in this spec: {line}\n" for line in left_out)
    for_model = sized_for(shape_hints, sized_model, still_dynamic) if shape_hints else None
    return notes + tuning_spec(list(matchers.values()), for_model=for_model), left_out

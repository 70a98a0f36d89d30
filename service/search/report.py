"""Presenting a TuneResult: text summary lines and the files `tilesearch tune --out DIR` writes."""

from __future__ import annotations

import json
from pathlib import Path

from service.ir.analysis import analyze
from service.ir.plan import Plan
from service.ir.transform import apply_plan

from .results import TuneResult


def _ms(latency: float | None) -> str:
    return "n/a" if latency is None else f"{latency * 1e3:.3f} ms"


def summary_lines(result: TuneResult) -> list[str]:
    base = result.baseline or {}
    best = result.predicted.get("latency_s")
    kept = bool(result.iree_default and result.iree_default.get("kept")) or (result.measured or {}).get("kept") == "iree_default"
    predicted = "predicted (IREE's default config)" if kept else "predicted"
    lines = [
        f"best plan ({result.strategy}, seed {result.seed}): {json.dumps(result.plan)}"
        + ("  (none: IREE's default config is kept, see below)" if kept else ""),
        f"{predicted}: {_ms(best)}  feasible={result.feasible}  bound by {result.predicted.get('bound_by', '?')}",
        f"super-tiling baseline (tilesearch's simple heuristic, not IREE): {_ms(base.get('latency_s'))}  "
        f"feasible={base.get('feasible')}"
        + (f"  ({base.get('reason')})" if base.get("reason") else ""),
    ]
    if best and base.get("latency_s") and not kept:
        lines.append(f"predicted speedup over the super-tiling baseline (not over IREE): {base['latency_s'] / best:.2f}x")
    lines.append(
        f"evaluated {result.evaluations} candidate{'' if result.evaluations == 1 else 's'} in {result.elapsed_s:.1f} s "
        f"({result.evaluations_per_s:.0f}/s while evaluating), space {result.space_size}"
        + ("" if result.complete else "  [time budget hit: search incomplete]")
    )
    lines += measured_lines(result.measured)
    lines += iree_default_lines(result.iree_default)
    for b in result.dispatch or []:
        lines.append(f"dispatch {b['dim']} in ({b['min_exclusive']}, {b['max_inclusive']}]: plan {b['plan_hash']} (bucket {b['bucket']})")
    if not result.feasible:
        lines.append("NO FEASIBLE PLAN: " + "; ".join(result.predicted.get("reasons", [])))
    return lines


def iree_default_lines(default: dict | None) -> list[str]:
    """What the search's pick was judged against: IREE's own config of the contraction."""
    if not default or "predicted_s" not in default:
        return []
    line = f"IREE's default {default['config']}: predicted {_ms(default['predicted_s'])}"
    if default.get("kept"):
        return [line, f"kept IREE's default: {default['reason']}"]
    return [line]


def measured_lines(measured: dict | None) -> list[str]:
    """`tune --measure-top K`: each candidate's predicted and measured time (CPU per call)."""
    if not measured:
        return []
    if measured.get("not_measurable"):
        return [f"measured: not measurable ({measured['not_measurable']}); the predicted best stands"]
    default = measured.get("default_cpu_s")
    lines = [f"measured with IREE on this CPU (CPU time per call; IREE's default {_ms(default)}):"]
    for i, c in enumerate(measured["candidates"]):
        got = c["cpu_s"]
        vs = f"  {default / got:.2f}x IREE's default" if got and default else ""
        mark = "  <- chosen" if i == measured.get("chosen") and measured.get("kept") != "iree_default" else ""
        shown = _ms(got) if got else f"FAILED {c['error']}"
        lines.append(f"  {i + 1}. {c['plan_hash'][:12]} predicted {_ms(c['predicted_latency_s'])}, measured {shown}{vs}{mark}")
    if measured.get("kept") == "iree_default":
        lines.append(f"{measured['reason']} (the answer leaves the ops to IREE's own configs)")
    return lines


def write_outputs(result: TuneResult, source: str, out_dir: Path) -> list[Path]:
    """plan.json, result.json, and for a non-empty plan transform.mlir + tiled.mlir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    (out_dir / "plan.json").write_text(json.dumps(result.plan, indent=2) + "\n")
    written.append(out_dir / "plan.json")
    (out_dir / "result.json").write_text(result.model_dump_json(indent=2, exclude={"trials"}) + "\n")
    written.append(out_dir / "result.json")
    (out_dir / "trials.json").write_text(json.dumps([t.model_dump(exclude={"cost"}) for t in result.trials], indent=1) + "\n")
    written.append(out_dir / "trials.json")
    plan = Plan.model_validate(result.plan)
    if plan.groups:
        a = analyze(source)
        applied = apply_plan(a.tagged, plan, a.graph)
        (out_dir / "transform.mlir").write_text(applied.script)
        (out_dir / "tiled.mlir").write_text(str(applied.module) + "\n")
        written += [out_dir / "transform.mlir", out_dir / "tiled.mlir"]
    return written

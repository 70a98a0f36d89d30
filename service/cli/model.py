"""`tilesearch model tune|size|runs|spec|bench`: whole models in, one IREE tuning spec out."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from .common import _ir_failure, _model_hints, _positive_seconds, _ready_store, _sized_model_path, _writable_spec_path

model_app = typer.Typer(help="Whole models: IREE's dispatches in, one tuning spec out.", no_args_is_help=True)


@model_app.command("tune")
def model_tune_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, metavar="MODEL.mlir|MODEL.onnx", help="a whole model IREE takes (linalg, torch, ...; ONNX is imported with iree-import-onnx)"),
    hardware: str = typer.Option("host-cpu", "--hardware", help="hardware profile name"),
    spec_out: Path = typer.Option(..., "--spec-out", help="write the IREE tuning spec here"),
    budget: int | None = typer.Option(None, "--budget", min=1, help="plans to evaluate over the whole model (default 64 per tunable dispatch)"),
    seconds: float | None = typer.Option(None, "--seconds", callback=_positive_seconds, help="wall-clock limit for the search"),
    measure_top: int = typer.Option(0, "--measure-top", min=0, help="time each tuned root's K best predicted plans inside the model (IREE's profiler) beside IREE's default build, then the whole model with the spec"),
    seed: int = typer.Option(0, "--seed"),
    shape_hint: list[str] = typer.Option([], "--shape-hint", help="sizes for a model's dynamic inputs, e.g. arg0=16x512 "
                                                                  "(argN: the model's N-th input; an ONNX input also by "
                                                                  "its name); the spec matches the model so sized, "
                                                                  "written beside it"),
    store: bool = typer.Option(True, "--store/--no-store", help="keep the run, its spec and its dispatches' "
                                                                 "decisions in the store (DATABASE_URL)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Tune every dispatch IREE forms for the model and write one tuning spec IREE is shown to apply."""
    import json

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from service.hardware.profiles import UnknownHardwareError, get_profile
    from service.ir.errors import IRError
    from service.model_tuning import ModelInputError, SpecNotApplied, tune_model
    from service.search.errors import SearchInputError

    try:
        hw = get_profile(hardware)
    except UnknownHardwareError as exc:
        raise _ir_failure(exc) from None
    if not hw.is_cpu:  # the spec is compiled and checked by IREE's llvm-cpu backend, here
        typer.echo(f"error: --hardware {hardware} is not a CPU profile: `model tune` compiles the model for this "
                   f"CPU with IREE and checks the spec there; use host-cpu (or a profile calibrated from it)", err=True)
        raise typer.Exit(2)
    hints = _model_hints(file, shape_hint)
    _writable_spec_path(spec_out, file)  # before minutes of tuning, not after
    older = spec_out.exists()
    sessions = _store_sessions(skippable=True) if store else None  # before the search: a store that is not ready costs nothing
    columns = (TextColumn("tuning {task.fields[dispatch]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True, disable=as_json or not sys.stderr.isatty()) as bar:
        task = bar.add_task("model", total=None, dispatch="")

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, dispatch=name[-40:])

        try:
            report = tune_model(file, hw, spec_out, budget=budget, seconds=seconds, seed=seed,
                                measure_top=measure_top, progress=progress, shape_hints=hints or None)
        except (ModelInputError, IRError, SearchInputError) as exc:  # a hint, or a model too large for memory
            raise _ir_failure(exc) from None
        except SpecNotApplied as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(3) from None
    run_id = None
    if sessions is not None:
        from service.model_tuning.runs import store_model_run

        options = {"budget": budget, "seconds": seconds, "seed": seed, "measure_top": measure_top,
                   **({"shape_hints": hints} if hints else {})}
        run_id = store_model_run(sessions, file.read_bytes(), file.name.split(".")[0], hw, report, options)
    if as_json:
        typer.echo(json.dumps(report.summary() | {"run_id": run_id}, indent=2))
        return
    table = Table(title=f"{file.name} on {hw.name}: {sum(d.tuned for d in report.dispatches)} of "
                        f"{len(report.dispatches)} dispatches tuned")
    table.add_column("dispatch", overflow="fold")  # whole: it is how the spec's matchers are named
    # Both time columns are the cost model's, per call: a model run calls a dispatch `weight` times.
    for col in ("weight", "root", "tuned", "predicted ms", "IREE default, predicted ms", "reason"):
        table.add_column(col)
    for d in report.dispatches:
        table.add_row(d.name, str(d.weight), d.root_op or "-", "yes" if d.tuned else "no", _ms(d.predicted_s),
                      _ms(d.iree_default_predicted_s), d.reason or "")
    Console(width=max(Console().width, 160)).print(table)
    typer.echo(f"tuned in {report.elapsed_s:.1f} s (predicted times are per call of a dispatch; a run calls it `weight` times)")
    if report.spec:
        checked = "IREE applied it to every tuned dispatch" if report.verified else "not checked against IREE's configurations"
        typer.echo(f"wrote {report.spec} ({checked}); predicted {report.predicted_total_s * 1e3:.3f} ms for the tuned dispatches")
        if report.static_model:
            typer.echo(f"wrote {report.static_model}, the model with its inputs sized as hinted: the spec matches its "
                       "dispatches, so compile (and `model bench`) that model with the spec")
    else:
        if any(d.predicted_s is not None for d in report.dispatches):
            typer.echo("no tuned config beat IREE's default (the reasons above): no spec written, IREE's own configs stand")
        else:
            typer.echo("nothing to tune: no spec written")
        if older:
            typer.echo(f"removed the older {spec_out}, so that it is not taken for this run's spec")
    if report.dynamic_inputs:
        typer.echo(f"still dynamic after the hints: {', '.join(report.dynamic_inputs)}: the dispatches that read them "
                   "stay IREE's, and `model bench` needs every input sized; give them --shape-hint too")
    if report.measured_model_s is not None and report.iree_default_measured_model_s is not None:
        typer.echo(f"measured inside the model (all dispatches per run): IREE's default "
                   f"{report.iree_default_measured_model_s * 1e3:.3f} ms, with the spec {report.measured_model_s * 1e3:.3f} ms"
                   + (f" (faster in {report.measured_model_rounds[0]} of {report.measured_model_rounds[1]} alternating rounds)"
                      if report.measured_model_rounds else ""))
    if run_id is not None:
        typer.echo(f"stored as model run {run_id}" + (f" (`tilesearch model spec {run_id}` prints its spec again)"
                                                       if report.spec else ""))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _store_sessions(skippable: bool = False):
    """Sessions on the store of DATABASE_URL, which must be at the migrations' head (exit 2 if not;
    `skippable`: the command has --no-store, and the error says so)."""
    sessions, why = _ready_store()  # leaves no empty SQLite file where there was none
    if sessions is None:
        hint = "" if "tilesearch db upgrade" in why else ": run `tilesearch db upgrade`"
        typer.echo(f"error: the store is not ready ({why}){hint}" + (", or pass --no-store" if skippable else ""), err=True)
        raise typer.Exit(2)
    return sessions


@model_app.command("size")
def model_size_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, metavar="MODEL.mlir|MODEL.onnx", help="a whole model with dynamic inputs"),
    shape_hint: list[str] = typer.Option(..., "--shape-hint", help="sizes for the model's dynamic inputs, e.g. "
                                                                   "arg0=16x512 (argN: its N-th input; an ONNX input "
                                                                   "also by its name)"),
    sized_model: Path | None = typer.Option(None, "--sized-model", "-o", help="where the sized model is written "
                                                                              "(default: MODEL.sized.mlir|onnx here)"),
) -> None:
    """Write the model with its dynamic inputs sized by the hints: the model that a spec tuned with
    the same hints matches (a REST model job's, say), as `model tune` and `job submit` write it."""
    import tempfile

    import onnx

    from service.ir.errors import IRError
    from service.model_tuning import ModelInputError
    from service.model_tuning.model_input import check_model_file
    from service.model_tuning.static_shapes import (ONNX_SUFFIX, copy_model, hints_shown, input_labels, onnx_arguments,
                                                    static_model)
    from service.search.errors import ShapeHintError

    hints = _model_hints(file, shape_hint)
    out = _sized_model_path(file, sized_model)
    with tempfile.TemporaryDirectory(prefix="tilesearch-model-size-") as tmp:
        try:
            check_model_file(file)
            static, still_dynamic = static_model(file, hints, Path(tmp))
        except (ModelInputError, IRError, ShapeHintError) as exc:
            raise _ir_failure(exc) from None
        copy_model(static, out)
    typer.echo(f"wrote {out}, {file.name} with its inputs sized {hints_shown(hints)}")
    if out.suffix.lower() == ONNX_SUFFIX:  # by the graph's own names, and those sized through a shared dim name
        inputs = onnx_arguments(onnx.load(str(out), load_external_data=False).graph)
        typer.echo(f"its inputs: {', '.join(input_labels(inputs))}")
    if still_dynamic:
        typer.echo(f"still dynamic: {', '.join(a.name for a in still_dynamic)} (give them --shape-hint too)")


@model_app.command("runs")
def model_runs_cmd(
    limit: int = typer.Option(20, "--limit", min=1, max=500, help="newest first"),
    as_json: bool = typer.Option(False, "--json", help="print JSON (each run with its per-dispatch report)"),
) -> None:
    """The stored model runs, newest first."""
    import json

    from service.model_tuning.runs import stored_runs
    from service.store.db import session_scope

    with session_scope(_store_sessions()) as session:
        runs, _ = stored_runs(session, limit=limit)
    if as_json:
        typer.echo(json.dumps([r.model_dump(mode="json") for r in runs], indent=2))
        return
    if not runs:
        typer.echo("no model runs stored")
        return
    for r in runs:
        tuned = sum(d.tuned for d in r.dispatches)
        predicted = f"predicted {r.predicted_total_s * 1e3:.3f} ms" if tuned else "nothing tuned"
        typer.echo(f"{r.id:>5}  {r.created_at:%Y-%m-%d %H:%M:%S}  {r.name}  {r.hardware}  {tuned}/{len(r.dispatches)} "
                   f"tuned  {predicted}  {r.elapsed_s:.1f} s  {'spec' if r.has_spec else 'no spec'}")


@model_app.command("spec")
def model_spec_cmd(
    run_id: int = typer.Argument(..., help="a stored model run (tilesearch model runs)"),
    out: Path | None = typer.Option(None, "-o", "--out", help="write the spec here (default: stdout)"),
) -> None:
    """The IREE tuning spec of a stored model run."""
    from service.store import model_runs
    from service.store.db import session_scope

    with session_scope(_store_sessions()) as session:
        run = model_runs.get_model_run(session, run_id)
        spec = None if run is None else run.spec
    if run is None:
        typer.echo(f"error: no model run {run_id}", err=True)
        raise typer.Exit(2)
    if spec is None:
        # Every dispatch is left to IREE: no spec is the answer (as `job spec` says it), and an
        # older file at --out is stale.
        if out is not None:
            out.unlink(missing_ok=True)
        typer.echo(f"note: no tuning spec{f' written to {out}' if out else ''}: model run {run_id} tuned no dispatch, "
                   "every one is left to IREE's own config", err=True)
        return
    if out is None:
        typer.echo(spec, nl=False)
        return
    out.write_text(spec)
    typer.echo(f"wrote {out}", err=True)


@model_app.command("bench")
def model_bench_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, metavar="MODEL.mlir|MODEL.onnx", help="the model the spec was tuned for"),
    spec: Path = typer.Option(..., "--spec", exists=True, dir_okay=False, help="IREE tuning spec"),
    rounds: int = typer.Option(5, "--rounds", min=1, help="interleaved rounds of both builds"),
    function: str | None = typer.Option(None, "--function", help="the function to run (default: the model's one public function)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Time the whole model compiled with and without the spec (iree-benchmark-module, interleaved)."""
    from service.measure.tools import ToolFailure
    from service.model_tuning import ModelInputError, bench_model

    function = function.removeprefix("@") if function else None  # as MLIR prints it, or bare
    try:
        result = bench_model(file, spec, rounds=rounds, function=function)
    except (ModelInputError, ToolFailure) as exc:
        raise _ir_failure(exc) from None
    if as_json:  # the text's reading too: each build's middle half, and the rounds' verdict
        import json

        typer.echo(json.dumps(result.model_dump(mode="json") | {
            "default_middle_half_s": list(_middle_half(result.default_samples_s)),
            "tuned_middle_half_s": list(_middle_half(result.tuned_samples_s)),
            "resolved": result.resolved, "within_noise": result.resolved is None}, indent=2))
        return
    default_q, tuned_q = _middle_half_ms(result.default_samples_s), _middle_half_ms(result.tuned_samples_s)
    typer.echo(f"{file.name}{f' @{function}' if function else ''}: IREE default {result.default_median_s * 1e3:.3f} ms "
               f"(middle half {default_q}), with the spec {result.tuned_median_s * 1e3:.3f} ms (middle half {tuned_q}); "
               f"median wall time of {len(result.default_samples_s)} runs each, {rounds} interleaved rounds: "
               f"{result.speedup:.2f}x; the spec changed {result.dispatches_changed} of {result.dispatches} dispatches")
    typer.echo(f"the spec's build was faster in {result.tuned_faster_rounds} of {rounds} rounds "
               f"(sign test p = {result.sign_test_p:.2f}: the chance of that many if both builds were equally fast)")
    # One verdict, the paired rounds': each times both builds back to back, under the same load,
    # which the spread of all samples (the middle halves) does not see through.
    if result.resolved is None:
        typer.echo("the rounds do not resolve the difference: it is within this machine's noise "
                   "(more --rounds, or a quieter machine)")
    else:
        overlap = _overlap(result.default_samples_s, result.tuned_samples_s)
        typer.echo(f"the rounds resolve it: the spec's build is {result.resolved}"
                   + (" (the middle halves overlap: load moved both builds alike between rounds)" if overlap else ""))


def _middle_half(samples: list[float]) -> tuple[float, float]:
    import statistics

    if len(samples) < 2:
        return samples[0], samples[0]
    q = statistics.quantiles(samples, n=4)
    return q[0], q[2]


def _middle_half_ms(samples: list[float]) -> str:
    lo, hi = _middle_half(samples)
    return f"{lo * 1e3:.3f}-{hi * 1e3:.3f} ms"


def _overlap(a: list[float], b: list[float]) -> bool:
    (a_lo, a_hi), (b_lo, b_hi) = _middle_half(a), _middle_half(b)
    return a_lo <= b_hi and b_lo <= a_hi

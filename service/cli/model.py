"""`tilesearch model tune|bench`: whole models in, one IREE tuning spec out."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from .common import _ir_failure

model_app = typer.Typer(help="Whole models: IREE's dispatches in, one tuning spec out.", no_args_is_help=True)


@model_app.command("tune")
def model_tune_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="a whole model IREE takes (linalg, torch, ...)"),
    hardware: str = typer.Option("host-cpu", "--hardware", help="hardware profile name"),
    spec_out: Path = typer.Option(..., "--spec-out", help="write the IREE tuning spec here"),
    budget: int | None = typer.Option(None, "--budget", min=1, help="plans to evaluate over the whole model (default 64 per tunable dispatch)"),
    seconds: float | None = typer.Option(None, "--seconds", help="wall-clock limit for the search"),
    measure_top: int = typer.Option(0, "--measure-top", min=0, help="measure each tuned dispatch's K best predicted plans beside IREE's default"),
    seed: int = typer.Option(0, "--seed"),
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

    try:
        hw = get_profile(hardware)
    except UnknownHardwareError as exc:
        raise _ir_failure(exc) from None
    columns = (TextColumn("tuning {task.fields[dispatch]}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True, disable=as_json or not sys.stderr.isatty()) as bar:
        task = bar.add_task("model", total=None, dispatch="")

        def progress(name: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, dispatch=name[-40:])

        try:
            report = tune_model(file, hw, spec_out, budget=budget, seconds=seconds, seed=seed,
                                measure_top=measure_top, progress=progress)
        except (ModelInputError, IRError) as exc:
            raise _ir_failure(exc) from None
        except SpecNotApplied as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(3) from None
    if as_json:
        typer.echo(json.dumps(report.summary(), indent=2))
        return
    table = Table(title=f"{file.name} on {hw.name}: {sum(d.tuned for d in report.dispatches)} of "
                        f"{len(report.dispatches)} dispatches tuned")
    for col in ("dispatch", "weight", "root", "tuned", "predicted ms", "reason"):
        table.add_column(col)
    for d in report.dispatches:
        table.add_row(d.name, str(d.weight), d.root_op or "-", "yes" if d.tuned else "no",
                      f"{d.predicted_s * 1e3:.3f}" if d.predicted_s is not None else "-", d.reason or "")
    Console(width=max(Console().width, 160)).print(table)
    if report.spec:
        typer.echo(f"wrote {report.spec} (IREE applied it to every tuned dispatch: {report.verified}); "
                   f"predicted {report.predicted_total_s * 1e3:.3f} ms for the tuned dispatches")
    else:
        typer.echo("nothing to tune: no spec written")


@model_app.command("bench")
def model_bench_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="the model the spec was tuned for"),
    spec: Path = typer.Option(..., "--spec", exists=True, dir_okay=False, help="IREE tuning spec"),
    rounds: int = typer.Option(5, "--rounds", min=1, help="interleaved rounds of both builds"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Time the whole model compiled with and without the spec (iree-benchmark-module, interleaved)."""
    from service.measure.tools import ToolFailure
    from service.model_tuning import ModelInputError, bench_model

    try:
        result = bench_model(file, spec, rounds=rounds)
    except (ModelInputError, ToolFailure) as exc:
        raise _ir_failure(exc) from None
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    typer.echo(f"{file.name}: IREE default {result.default_median_s * 1e3:.3f} ms, with the spec "
               f"{result.tuned_median_s * 1e3:.3f} ms (median of {len(result.default_samples_s)}): "
               f"{result.speedup:.2f}x")

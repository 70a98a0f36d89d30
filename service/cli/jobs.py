"""`tilesearch worker` and `tilesearch job submit|watch|spec`: batch jobs."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import _ir_failure, _positive_seconds, _read_text, server_errors

def worker_cmd(
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="items at once (one sandbox process each)"),
    queue: list[str] | None = typer.Option(None, "--queue", help="queues to take items from (repeatable); default: "
                                                                 "every search item, and the measured items of this host"),
) -> None:
    """Run job items from the queue (PostgreSQL: DATABASE_URL; SQLite jobs run inside `serve`)."""
    from service.config import get_settings
    from service.jobs.wiring import WorkerCannotStart, serve_worker

    try:
        serve_worker(get_settings(), concurrency, queue or None)
    except WorkerCannotStart as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


job_app = typer.Typer(help="Batch tuning jobs on a tilesearch server.", no_args_is_help=True)
_SERVER = typer.Option("http://127.0.0.1:8000", "--server", help="the tilesearch server")
_TOKEN = typer.Option(None, "--token", envvar="TILESEARCH_API_TOKEN", help="bearer token, when the server has one")


def _job_client(server: str, token: str | None):
    from service.client import TilesearchClient

    return TilesearchClient(server, token)


@job_app.command("submit")
def job_submit_cmd(
    path: Path = typer.Argument(..., exists=True, metavar="MODEL.mlir|MODEL.onnx|DIR", help="a model (MLIR or ONNX file: its dispatches are the items) or a "
                                                      "directory of modules (*.mlir: each file one item)"),
    hardware: str = typer.Option(..., "--hardware", help="hardware profile name"),
    budget: int = typer.Option(64, "--budget", min=1, help="plans to evaluate per item"),
    seconds: float | None = typer.Option(None, "--seconds", callback=_positive_seconds, help="time limit per item"),
    measure_top: int = typer.Option(0, "--measure-top", min=0, help="time each item's K best plans with IREE"),
    server: str = _SERVER,
    token: str | None = _TOKEN,
) -> None:
    """Queue a job; prints its id (follow it with `tilesearch job watch ID`)."""
    body: dict = {"hardware": hardware, "budget": budget, "seconds": seconds, "measure_top": measure_top}
    if path.is_dir():
        files = sorted(path.glob("*.mlir"))
        if not files:
            raise _ir_failure(f"{path} holds no *.mlir file")
        body["items"] = [{"name": f.stem, "module": _read_text(f)} for f in files]
    else:
        body["dispatches"] = _model_dispatches(path)
    with server_errors(server), _job_client(server, token) as client:
        answer = client.submit_job(body)
    left = len(body["dispatches"]["left_to_iree"]) if "dispatches" in body else 0
    typer.echo(f"job {answer['id']}: {answer['state']}, {answer['items']['total']} items"
               + (f" ({left} more dispatches left to IREE)" if left else ""), err=True)
    typer.echo(answer["id"])


def _model_dispatches(path: Path) -> dict:
    """The model's dispatches as IREE forms them here (ONNX imported with IREE's importer first),
    as the job's "dispatches": a model's weights stay on this machine, whatever their size.
    Refused as `model tune` refuses the file."""
    import tempfile

    from service.jobs.tasks import model_file_items
    from service.model_tuning import ModelInputError
    from service.model_tuning.model_input import importable_model

    if path.suffix.lower() == ".mlir":
        _read_text(path)  # bytes that are not UTF-8 named by line and column, as every command names them
    typer.echo(f"forming {path.name}'s dispatches with IREE ...", err=True)
    with tempfile.TemporaryDirectory(prefix="tilesearch-job-model-") as tmp:
        try:
            found = model_file_items(importable_model(path, Path(tmp)), Path(tmp))
        except ModelInputError as exc:
            raise _ir_failure(exc) from None
    if why := found.why_nothing_to_tune(path.name):  # as the server would refuse it, said before any request
        raise _ir_failure(why)
    return found.model_dump(mode="json")


@job_app.command("watch")
def job_watch_cmd(job_id: int, server: str = _SERVER, token: str | None = _TOKEN,
                  interval: float = typer.Option(1.0, "--interval", min=0.1)) -> None:
    """A progress bar of the job's items, trials and ETA until it ends; exit 1 unless it succeeded."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("job {task.fields[job]} {task.fields[state]}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("running {task.fields[running]} failed {task.fields[failed]} trials {task.fields[trials]} "
                          "eta {task.fields[eta]} elapsed"), TimeElapsedColumn())
    with server_errors(server), _job_client(server, token) as client:
        job = client.job(job_id)  # before the bar: a wrong id or server is one error line, no bar
        with Progress(*columns) as progress:
            job = _follow(client, job, progress, interval)
        failed = client.job_items(job_id, state="failed") if job["items"]["failed"] else []
    for item in failed:  # which items, and why: the bar only counts them
        typer.echo(f"failed: {item['name']}: {item['error']}", err=True)
    if job["state"] != "succeeded":
        raise typer.Exit(1)


def _follow(client, job: dict, progress, interval: float) -> dict:
    """Update the bar from the job's counts until it ends; its last state."""
    import time

    bar = progress.add_task("job", total=None, job=job["id"], state="", running=0, failed=0, trials=0, eta="-")
    while True:
        n = job["items"]
        progress.update(bar, total=n["total"], completed=n["done"] + n["failed"] + n["cancelled"],
                        state=job["state"], running=n["running"], failed=n["failed"], trials=job["trials"],
                        eta="-" if job["eta_s"] is None else f"{job['eta_s']:.0f}s")
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(interval)
        job = client.job(job["id"])


@job_app.command("spec")
def job_spec_cmd(job_id: int, out: Path | None = typer.Option(None, "-o", "--out", help="write the merged tuning spec here "
                                                                                      "(default: print it)"),
                 server: str = _SERVER, token: str | None = _TOKEN) -> None:
    """The job's merged IREE tuning spec (its done items' configs)."""
    from service.client import TilesearchError

    with server_errors(server), _job_client(server, token) as client:
        try:
            spec = client.job_spec(job_id)
        except TilesearchError as exc:
            if not (isinstance(exc.detail, dict) and exc.detail.get("error") == "NoSpec"):
                raise
            # Every item is left to IREE: no spec is the answer, and an older file there is stale.
            if out is not None:
                out.unlink(missing_ok=True)
            typer.echo(f"note: no tuning spec{f' written to {out}' if out else ''}: {exc.message}", err=True)
            return
    if out is None:
        typer.echo(spec, nl=False)
        return
    out.write_text(spec)
    typer.echo(f"wrote {out}", err=True)

"""`tilesearch worker` and `tilesearch job submit|watch|spec`: batch jobs."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import _ir_failure, _model_hints, _positive_seconds, _read_text, _sized_model_path, server_errors

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
    shape_hint: list[str] = typer.Option([], "--shape-hint", help="a model's dynamic inputs sized, e.g. arg0=16x512 "
                                                                  "(argN: its N-th input; an ONNX input also by its "
                                                                  "name): the job's spec matches the model so sized"),
    sized_model: Path | None = typer.Option(None, "--sized-model", help="with --shape-hint: where the model so sized "
                                                                        "is written, to compile with the job's spec "
                                                                        "(default: MODEL.sized.mlir|onnx here)"),
    server: str = _SERVER,
    token: str | None = _TOKEN,
) -> None:
    """Queue a job; prints its id (follow it with `tilesearch job watch ID`)."""
    body: dict = {"hardware": hardware, "budget": budget, "seconds": seconds, "measure_top": measure_top}
    if path.is_dir():
        if shape_hint:
            raise _ir_failure("--shape-hint sizes a model's inputs; a directory's modules are tuned as written "
                              "(give them static shapes, or submit the model)")
        files = sorted(path.glob("*.mlir"))
        if not files:
            raise _ir_failure(f"{path} holds no *.mlir file")
        body["items"] = [{"name": f.stem, "module": _read_text(f)} for f in files]
    else:
        hints = _model_hints(path, shape_hint)
        out = _sized_model_path(path, sized_model) if hints else None
        if sized_model is not None and not hints:
            raise _ir_failure("--sized-model names where the model sized by --shape-hint is written: give --shape-hint too")
        body["dispatches"] = _model_dispatches(path, hints, out)
        if hints and out is not None:
            body |= {"shape_hints": hints, "sized_model": out.name}
    with server_errors(server), _job_client(server, token) as client:
        answer = client.submit_job(body)
    left = len(body["dispatches"]["left_to_iree"]) if "dispatches" in body else 0
    typer.echo(f"job {answer['id']}: {answer['state']}, {answer['items']['total']} items"
               + (f" ({left} more dispatches left to IREE)" if left else ""), err=True)
    typer.echo(answer["id"])


def _model_dispatches(path: Path, hints: dict[str, list[int]], sized_out: Path | None) -> dict:
    """The model's dispatches as IREE forms them here (its dynamic inputs sized by `hints` first,
    that model written to `sized_out`; ONNX imported with IREE's importer), as the job's
    "dispatches": a model's weights stay on this machine, whatever their size. Refused as
    `model tune` refuses the file."""
    import tempfile

    from service.jobs.tasks import model_file_items
    from service.model_tuning import ModelInputError
    from service.model_tuning.model_input import check_model_file, importable_model
    from service.model_tuning.static_shapes import all_dynamic_message, copy_model, dynamic_inputs, input_labels, static_model
    from service.search.errors import ShapeHintError

    if path.suffix.lower() == ".mlir":
        _read_text(path)  # bytes that are not UTF-8 named by line and column, as every command names them
    typer.echo(f"forming {path.name}'s dispatches with IREE ...", err=True)
    with tempfile.TemporaryDirectory(prefix="tilesearch-job-model-") as tmp:
        try:
            check_model_file(path)
            static, still_dynamic = static_model(path, hints, Path(tmp)) if hints else (None, None)
            found = model_file_items(importable_model(static or path, Path(tmp)), Path(tmp))
            if (dynamic := found.only_dynamic()) is not None:
                inputs = still_dynamic if hints else dynamic_inputs(path)
                raise ModelInputError(all_dynamic_message(path.name, dynamic, len(found.left_to_iree), inputs,
                                                          bool(hints)))
            found.still_dynamic = input_labels(still_dynamic or [])
        except (ModelInputError, ShapeHintError) as exc:
            raise _ir_failure(exc) from None
        if why := found.why_nothing_to_tune(path.name):  # as the server would refuse it, said before any request
            raise _ir_failure(why)
        if static is not None and sized_out is not None:
            copy_model(static, sized_out)
            typer.echo(f"wrote {sized_out}, the model with its inputs sized as hinted: the job's spec matches its "
                       "dispatches, so compile (and `model bench`) that model with the spec", err=True)
            if still_dynamic:
                typer.echo(f"still dynamic after the hints: {', '.join(a.name for a in still_dynamic)}: the "
                           "dispatches that read them stay IREE's", err=True)
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

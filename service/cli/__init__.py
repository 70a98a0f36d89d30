"""`tilesearch` command line: thin wrappers over the library (no logic lives here)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from .common import (
    _hardware_here,
    _ir_failure,
    _positive_seconds,
    _read_module,
    _read_text,
    _ready_store,
    _run_ir_task,
    _writable_spec_path,
    server_errors,
)
from .jobs import job_app, worker_cmd
from .model import model_app

app = typer.Typer(
    name="tilesearch",
    help="Tile-and-fuse search for MLIR tensor programs.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command("inspect")
def inspect_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, metavar="MODULE.mlir", help="MLIR module (text or bytecode)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """List the tileable ops of a module (uid, loop ranges, iterators, producers/consumers)."""
    import json

    from rich.console import Console
    from rich.table import Table

    from service.ir.errors import IRError
    from service.ir.tasks import inspect_module

    try:
        info = _run_ir_task(inspect_module, _read_module(file))
    except IRError as exc:
        raise _ir_failure(exc) from None
    if as_json:
        typer.echo(json.dumps(info.model_dump(), indent=2))
        return
    table = Table(title=f"{file.name}  fingerprint {info.fingerprint[:16]}")
    for col in ("uid", "op", "kind", "loop ranges", "iterators", "dtype", "producers", "consumers", "fuse group"):
        table.add_column(col)
    for op in info.ops:
        table.add_row(
            str(op["uid"]),
            op["name"] + (f" (copy of {op['copy_of']})" if op.get("copy_of") is not None else ""),
            op["kind"],
            "x".join("?" if r is None else str(r) for r in op["loop_ranges"]),
            " ".join("r" if t == "reduction" else "p" for t in op["iterator_types"]),
            op["operand_element_types"][-1] if op["operand_element_types"] else "",
            ", ".join(map(str, op["producers"])),
            ", ".join(map(str, op["consumers"])),
            ", ".join(map(str, op["fuse_groups"])),
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)


@app.command("apply")
def apply_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, metavar="MODULE.mlir", help="MLIR module"),
    plan: Path = typer.Option(..., "--plan", exists=True, dir_okay=False, help="plan JSON"),
    script_out: Path | None = typer.Option(None, "--script-out", help="write the transform script here"),
    origin_json: bool = typer.Option(False, "--origin-json", help="also print the origin map as JSON"),
) -> None:
    """Apply a tile-and-fuse plan to a clone of the module and print the tiled module."""
    import json

    from pydantic import ValidationError

    from service.ir.errors import IRError
    from service.ir.tasks import apply_plan_to_text

    try:
        plan_json = json.loads(plan.read_text())
    except json.JSONDecodeError as exc:
        typer.echo(f"error: {plan} is not JSON: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        result = _run_ir_task(apply_plan_to_text, _read_module(file), plan_json)
    except (IRError, ValidationError) as exc:
        raise _ir_failure(exc) from None
    if script_out is not None:
        script_out.write_text(result.transform_script)
    typer.echo(result.tiled_module)
    if origin_json:
        typer.echo(json.dumps(result.origin, indent=2))


@app.command("measure")
def measure_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, metavar="MODULE.mlir", help="MLIR module"),
    plan: Path = typer.Option(..., "--plan", exists=True, dir_okay=False, help="plan JSON"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    repetitions: int = typer.Option(5, "--repetitions", min=1),
    min_time_s: float = typer.Option(0.1, "--min-time", help="seconds per repetition"),
    shape_hint: list[str] = typer.Option([], "--shape-hint", help="input shapes for dynamic dims, e.g. arg0=128x1024 (f2.arg0=... for function @f2 only)"),
) -> None:
    """Time a plan forced on IREE (host CPU) and IREE's own default, medians of repetitions."""
    import json

    from service.measure.forcing import NotMeasurable
    from service.measure.timing import BenchSettings, cpu_per_core_s, measure_plan_and_default
    from service.search.shapes import ShapeHintError, parse_shape_hints

    settings = BenchSettings(repetitions=repetitions, min_time_s=min_time_s)
    try:
        result = measure_plan_and_default(
            _read_text(file), json.loads(plan.read_text()), settings=settings,
            shape_hints=parse_shape_hints(shape_hint) or None,
        )
    except NotMeasurable as exc:
        typer.echo(f"not measurable: {exc.reason}", err=True)
        raise typer.Exit(2) from None
    except (ShapeHintError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        payload = result.model_dump() | {"speedup_over_default": result.speedup_over_default}
        typer.echo(json.dumps(payload, indent=2))
        return
    for label, m in (("forced", result.forced), ("iree default", result.default)):
        configs = "; ".join(
            f"dist={c.distribution} vec={c.vector_common_parallel} red={c.vector_reduction}"
            for c in m.config
        )
        if m.ok:
            cpu = cpu_per_core_s(m)
            typer.echo(
                f"{label:>12}: median {m.median_s * 1e3:.3f} ms wall, {cpu * 1e3:.3f} ms CPU/core "
                f"over {len(m.samples_s)} reps  [{configs}]"
            )
        else:
            typer.echo(f"{label:>12}: FAILED {m.error}  [{configs}]")
    if result.speedup_over_default is not None:
        cpu_speedup = cpu_per_core_s(result.default) / cpu_per_core_s(result.forced)
        typer.echo(
            f"     speedup: {result.speedup_over_default:.2f}x wall, {cpu_speedup:.2f}x CPU/core "
            "over IREE's default (CPU time moves less with other load on this machine)"
        )


@app.command("calibrate")
def calibrate_cmd(
    hardware: str = typer.Option("host-cpu", "--hardware", help="profile to calibrate"),
    workloads: Path | None = typer.Option(None, "--workloads", exists=True, file_okay=False,
                                          help="dir of .mlir to measure first (without: fit what is stored)"),
    out: Path | None = typer.Option(None, "--out", help="also write the fitted profile JSON here"),
    plans: int = typer.Option(12, "--plans", min=3, help="plans measured per workload"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Measure plans with IREE (--workloads), store the timings, and fit a calibrated profile to
    every measurement stored for this host; the service uses it only if it predicts held-out
    modules better than the uncalibrated profile."""
    import json

    from service.config import get_settings
    from service.hardware.profiles import UnknownHardwareError
    from service.measure.calibrate import measure_workloads
    from service.measure.online_fit import format_online_fit
    from service.store.db import session_scope
    from service.tiling.hardware import HardwareCatalog, find_base_hardware
    from service.tiling.learning import Learner, record_calibration_samples

    sessions, why = _ready_store()
    if sessions is None:
        typer.echo(f"error: calibrate stores its measurements and fits in the database: {why}", err=True)
        raise typer.Exit(2)
    progress = (lambda msg: None) if as_json else (lambda msg: typer.echo(f"  {msg}", err=True))
    try:
        with session_scope(sessions) as session:
            base = find_base_hardware(session, hardware).model
        names: dict[str, str] = {}
        skipped: dict[str, str] = {}
        if workloads is not None:
            found, samples, skipped = measure_workloads(base, workloads, plans_per_workload=plans, progress=progress)
            with session_scope(sessions) as session:
                stored, names = record_calibration_samples(session, found, samples, base)
            progress(f"stored {stored} measurements")
        row, fit = Learner(sessions, HardwareCatalog(sessions), get_settings()).fit_now(hardware, progress=progress)
    except (UnknownHardwareError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(fit.profile.model_dump_json(indent=2))
    if as_json:
        typer.echo(json.dumps({"version": row.version, "used": row.used, "reason": row.reason,
                               "skipped_workloads": skipped, "fit": fit.model_dump(mode="json")}, indent=2))
        return
    typer.echo(format_online_fit(fit, row.version, names))
    for name, reason in skipped.items():
        typer.echo(f"skipped {name}: {reason}")
    if out is not None:
        typer.echo(f"wrote {out}")


db_app = typer.Typer(help="The decision store's schema (Alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")

_DB_URL_HELP = "database URL (default: TILESEARCH_DATABASE_URL / DATABASE_URL / var/tilesearch.db)"


@db_app.command("upgrade")
def db_upgrade_cmd(
    rev: str = typer.Argument("head", help="target revision"),
    url: str | None = typer.Option(None, "--url", help=_DB_URL_HELP),
) -> None:
    """Migrate the store up to REV (default: the latest)."""
    from service.store import migrate

    migrate.upgrade(url, rev)
    typer.echo(f"database at {migrate.current(url) or 'base (empty)'}")


@db_app.command("downgrade")
def db_downgrade_cmd(
    rev: str = typer.Argument(..., help="target revision, -1, or base (drops every table)"),
    url: str | None = typer.Option(None, "--url", help=_DB_URL_HELP),
) -> None:
    """Migrate the store down to REV."""
    from service.store import migrate

    migrate.downgrade(url, rev)
    typer.echo(f"database at {migrate.current(url) or 'base (empty)'}")


@db_app.command("current")
def db_current_cmd(url: str | None = typer.Option(None, "--url", help=_DB_URL_HELP)) -> None:
    """Print the store's revision and whether it is the latest."""
    from service.store import migrate

    revision = migrate.current(url)
    heads = migrate.head_revisions()
    state = "head" if revision in heads else f"not at head {', '.join(sorted(heads))}"
    typer.echo(f"{revision or 'base (empty)'} ({state})")
    if revision not in heads:
        raise typer.Exit(1)


hardware_app = typer.Typer(help="Hardware profiles (built-in and calibrated JSON).", no_args_is_help=True)
app.add_typer(hardware_app, name="hardware")


@hardware_app.command("list")
def hardware_list_cmd() -> None:
    """Names of the known hardware profiles."""
    from service.hardware.profiles import get_profile, list_profiles

    for name in list_profiles():
        hw = get_profile(name)
        typer.echo(f"{name}\t{hw.content_hash()}\t{hw.description}")


@hardware_app.command("show")
def hardware_show_cmd(
    name: str = typer.Argument(..., help="profile name"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """A profile's memory levels, compute and calibration."""
    from rich.console import Console
    from rich.table import Table

    from service.hardware.profiles import UnknownHardwareError, get_profile

    try:
        hw = get_profile(name)
    except UnknownHardwareError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(hw.model_dump_json(indent=2))
        return
    table = Table(title=f"{hw.name}  hash {hw.content_hash()}  cores {hw.compute.cores}  peak {hw.compute.peak_flops_per_s}")
    for col in ("level", "capacity", "bandwidth GB/s", "shared", "scratchpad"):
        table.add_column(col)
    for lv in hw.memory_levels:
        table.add_row(lv.name, f"{lv.capacity_bytes:,}", f"{lv.bandwidth_bytes_per_s / 1e9:.1f}", str(lv.shared), str(lv.scratchpad))
    Console(width=None if sys.stdout.isatty() else 200).print(table)


@app.command("cost")
def cost_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, metavar="MODULE.mlir", help="MLIR module"),
    plan: Path = typer.Option(..., "--plan", exists=True, dir_okay=False, help="plan JSON"),
    hardware: str = typer.Option("host-cpu", "--hardware", help="hardware profile name"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    shape_hint: list[str] = typer.Option([], "--shape-hint", help="dynamic shapes, e.g. arg0=128x1024 (f2.arg0=... for function @f2 only)"),
) -> None:
    """Predicted latency, feasibility, footprint and traffic per memory level of a plan."""
    import json

    from pydantic import ValidationError
    from rich.console import Console
    from rich.table import Table

    from service.hardware.cost import cost_of_plan
    from service.hardware.profiles import UnknownHardwareError
    from service.ir.errors import IRError

    from service.search.shapes import ShapeHintError, parse_shape_hints

    try:
        hints = parse_shape_hints(shape_hint)
        result = _run_ir_task(cost_of_plan, _read_module(file), json.loads(plan.read_text()), hardware, hints)
    except (IRError, ValidationError, UnknownHardwareError, json.JSONDecodeError, ShapeHintError) as exc:
        raise _ir_failure(exc) from None
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    verdict = "feasible" if result["feasible"] else "INFEASIBLE"
    table = Table(title=f"{file.name} on {hardware}: {result['latency_s'] * 1e3:.3f} ms, {verdict}, bound by {result['bound_by']}")
    for col in ("level", "footprint", "capacity", "traffic", "time ms"):
        table.add_column(col)
    for lv in result["levels"]:
        table.add_row(lv["name"], f"{lv['footprint_bytes']:,}", f"{lv['capacity_bytes']:,}", f"{lv['traffic_bytes']:,}", f"{lv['time_s'] * 1e3:.3f}")
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    console.print(f"flops {result['flops']:.4g}  recompute {result['recompute_flops']:.4g}  nests {len(result['nests'])}")
    for line in result["reasons"]:
        console.print(f"[red]reason:[/red] {line}")
    for line in result["notes"]:
        console.print(f"note: {line}")


@app.command("tune")
def tune_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, metavar="MODULE.mlir", help="MLIR module"),
    hardware: str = typer.Option("host-cpu", "--hardware", help="hardware profile name"),
    budget: int = typer.Option(300, "--budget", min=1, help="distinct plans to evaluate"),
    seconds: float | None = typer.Option(None, "--seconds", callback=_positive_seconds, help="wall-clock limit"),
    strategy: str = typer.Option("tpe", "--strategy", help="tpe | nsga2 | random | exhaustive | supertiling"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    out: Path | None = typer.Option(None, "--out", help="write plan.json, transform.mlir, tiled.mlir here"),
    shape_hint: list[str] = typer.Option([], "--shape-hint", help="dynamic shapes, e.g. arg0=128x1024 (f2.arg0=... for function @f2 only)"),
    bucket: list[str] = typer.Option([], "--bucket", help="per-bucket plans, e.g. M=1,16,128,1024"),
    workers: int = typer.Option(2, "--workers", min=1, help="evaluation processes"),
    server: str | None = typer.Option(None, "--server", help="ask a tilesearch API (e.g. http://127.0.0.1:8000) instead of searching here"),
    token: str | None = typer.Option(None, "--token", envvar="TILESEARCH_API_TOKEN", help="bearer token for --server"),
    measure_top: int = typer.Option(0, "--measure-top", min=0,
                                    help="measure the K plans predicted fastest with IREE on this CPU and answer with the fastest measured"),
    spec_out: Path | None = typer.Option(None, "--spec-out", help="write the IREE tuning spec of the chosen plan here"),
) -> None:
    """Search tile-and-fuse plans; prints the best, its predicted cost and the super-tiling baseline."""
    import json

    _writable_spec_path(spec_out, file)
    older_spec = spec_out is not None and spec_out.exists()
    if server is not None:
        if measure_top:
            typer.echo("error: --measure-top runs IREE on this machine; drop --server", err=True)
            raise typer.Exit(2)
        _tune_via_server(server, token, file, hardware, budget, seconds, strategy, seed, as_json, out, shape_hint, bucket,
                         spec_out, older_spec)
        return
    if measure_top and bucket:
        typer.echo("error: --measure-top measures one shape: use --shape-hint instead of --bucket", err=True)
        raise typer.Exit(2)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from service.hardware.profiles import UnknownHardwareError
    from service.ir.errors import IRError
    from service.search.errors import SearchInputError
    from service.search.guard import tune_from_iree_default
    from service.search.report import summary_lines, write_outputs

    sessions, store_why = _ready_store()
    try:
        hw = _hardware_here(sessions, hardware)
    except UnknownHardwareError as exc:
        raise _ir_failure(exc) from None
    if spec_out is not None and not hw.is_cpu:  # before the search, not after
        typer.echo(f"error: --spec-out: {hardware} is not a CPU profile, and a tuning spec configures IREE's llvm-cpu "
                   "backend; drop --spec-out (the plan and tiled IR are the answer: --out)", err=True)
        raise typer.Exit(2)
    source = _read_module(file)
    columns = (TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TextColumn("best {task.fields[best]}"), TimeElapsedColumn())
    with Progress(*columns, transient=True, disable=as_json or not sys.stderr.isatty(), console=None) as bar:
        task = bar.add_task("tune", total=budget, best="-")

        def progress(done: int, total: int, best: float | None) -> None:
            bar.update(task, completed=min(done, total), best=f"{best * 1e3:.3f} ms" if best else "-")

        try:
            result = tune_from_iree_default(source, hw, guard=not measure_top, budget=budget, seconds=seconds,
                                            strategy=strategy, seed=seed, shape_hints=shape_hint, buckets=bucket,
                                            workers=workers, progress=progress)
        except (IRError, SearchInputError) as exc:  # the input's fault; any other error is ours
            raise _ir_failure(exc) from None
    if measure_top:
        from service.search.refine import measured_answer, refine
        from service.store.db import session_scope
        from service.tiling.learning import record_refinement

        if isinstance(source, bytes):
            raise _ir_failure(ValueError("--measure-top takes MLIR text, not bytecode"))
        refinement = refine(source, result, measure_top)
        result = measured_answer(result, refinement, measure_top)
        stored = 0
        if sessions is not None and refinement.candidates:
            with session_scope(sessions) as session:
                stored = record_refinement(session, source, refinement, hw, shape_hints=result.shape_hints or None)
        if not as_json:  # --json prints JSON only
            typer.echo(f"stored {stored} measurements for this host's calibration" if sessions is not None
                       else f"note: measurements not stored: {store_why}", err=True)
    written = write_outputs(result, source, out) if out else []
    no_spec = None
    if spec_out is not None and not result.plan.get("groups"):
        _no_spec_written(spec_out, as_json, (result.iree_default or {}).get("reason"), older=older_spec)
    elif spec_out is not None:
        no_spec = _write_spec(source, result.plan, hw, spec_out)
        if no_spec is None:
            written.append(f"{spec_out} (IREE tuning spec)")
    if as_json:
        summary = result.summary()
        if spec_out is not None:  # what a build script needs to know: is there a spec, and if not, why
            written_spec = spec_out.exists()
            summary["tuning_spec"] = str(spec_out) if written_spec else None
            summary["no_tuning_spec"] = None if written_spec else (no_spec or (result.iree_default or {}).get("reason")
                                                                    or "the answer keeps IREE's own configs")
        typer.echo(json.dumps(summary, indent=2))
    else:
        for w in result.warnings:
            typer.echo(f"warning: {w}", err=True)
        for line in summary_lines(result):
            typer.echo(line)
        for path in written:
            typer.echo(f"wrote {path}")
        if spec_out is not None and no_spec is None and spec_out.exists() and not measure_top:
            typer.echo("note: the spec's configs were chosen by prediction, not measured; `--measure-top 3` times "
                       "the plans predicted fastest against IREE's default on this CPU before answering", err=True)
    if no_spec is not None:  # after the answer: the search's result is still worth having
        _no_spec_written(spec_out, as_json, no_spec, plan_tiles=True, older=older_spec)
    if not result.feasible and not as_json:
        raise typer.Exit(3)


def _no_spec_written(path: Path, as_json: bool, why: str | None = None, plan_tiles: bool = False,
                    older: bool = False) -> None:
    """No spec: the answer leaves every op to IREE (the best plan tiles nothing, or IREE's
    default was predicted as fast or measured fastest), or (`plan_tiles`) its plan is not one
    IREE takes as a config (a convolution IREE 3.13 drops a config for or computes as a
    contraction, dynamic dims). Either
    way IREE compiles with its own configs, so no spec is the right output, not an error, and an
    older file there would be a stale answer (`older`: one was there before this run; say so)."""
    path.unlink(missing_ok=True)
    if not as_json:
        lead = "the plan cannot be given to IREE as a config" if plan_tiles else "the answer keeps IREE's own configs"
        typer.echo(f"note: no tuning spec written to {path}: {lead}" + (f" ({why})" if why else "")
                   + ("; IREE compiles the module with its own configs" if plan_tiles else ""), err=True)
        if older:
            typer.echo(f"removed the older {path}, so that it is not taken for this answer's spec", err=True)


def _write_spec(source: str | bytes, plan: dict, hardware, path: Path) -> str | None:
    """Write the plan's IREE tuning spec (its contraction anchors' configs) to `path`; or say
    why it has none, and remove an older spec there (a build must not pick up a stale one)."""
    from service.ir.analysis import cached_analysis
    from service.ir.plan import Plan
    from service.tiling.worker import iree_configs, spec_not_applied

    validated = Plan.model_validate(plan)
    # cached: spec_not_applied reads the same module's analysis
    configs = iree_configs(cached_analysis(source).graph, validated, hardware)
    why = configs["no_tuning_spec"]
    if configs["tuning_spec"] is not None:  # proof IREE uses it, as `model tune` proves a model's
        why = spec_not_applied(source, validated, configs["tuning_spec"], hardware)
    if why is not None:
        path.unlink(missing_ok=True)
        return why
    path.write_text(configs["tuning_spec"])
    return None


def _tune_via_server(server: str, token: str | None, file: Path, hardware: str, budget: int, seconds: float | None,
                     strategy: str, seed: int, as_json: bool, out: Path | None, shape_hint: list[str],
                     bucket: list[str], spec_out: Path | None = None, older_spec: bool = False) -> None:
    """`tune --server`: the same request through the API (stored decisions are reused there);
    `spec_out` gets the decision's tuning spec."""
    import json

    from service.client import TilesearchClient
    from service.search.engine import parse_buckets, parse_shape_hints

    source = _read_text(file)
    try:
        shape_hints, buckets = parse_shape_hints(shape_hint) or None, parse_buckets(bucket) or None
    except ValueError as exc:
        raise _ir_failure(exc) from None
    with server_errors(server), TilesearchClient(server, token) as client:
        decision = client.tile(source, hardware, budget=budget, seconds=seconds, strategy=strategy, seed=seed,
                               shape_hints=shape_hints, buckets=buckets)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(decision.plan, indent=2) + "\n")
        (out / "decision.json").write_text(decision.model_dump_json(indent=2) + "\n")
        for name, text in (("transform.mlir", decision.transform_script), ("tiled.mlir", decision.tiled_module)):
            if text:
                (out / name).write_text(text)
    no_spec = spec_written = None
    if spec_out is not None and decision.tuning_spec:
        spec_out.write_text(decision.tuning_spec)
        spec_written = spec_out
    elif spec_out is not None and not (decision.plan or {}).get("groups"):
        _no_spec_written(spec_out, as_json, decision.no_tuning_spec, older=older_spec)
    elif spec_out is not None:
        no_spec = decision.no_tuning_spec or "the server's decision configures no contraction IREE takes a config for"
    if as_json:
        typer.echo(decision.model_dump_json(indent=2))
    else:
        _print_server_decision(server, decision, out, spec_written)
    if no_spec is not None:
        _no_spec_written(spec_out, as_json, no_spec, plan_tiles=True, older=older_spec)


def _print_server_decision(server: str, decision, out: Path | None, spec_written: Path | None) -> None:
    import json

    latency = (decision.predicted_cost or {}).get("latency_s")
    base = (decision.baseline or {}).get("latency_s")
    typer.echo(f"decision {decision.id} ({decision.cache}) from {server}")
    typer.echo(f"plan: {json.dumps(decision.plan)}")
    if latency is not None:
        typer.echo(f"predicted: {latency * 1e3:.3f} ms" + (f"  (super-tiling baseline {base * 1e3:.3f} ms)" if base else ""))
    if decision.complete is False:
        typer.echo("note: the search time limit cut the budget (best plan so far)")
    if decision.no_tuning_spec:
        typer.echo(f"no tuning spec: {decision.no_tuning_spec}")
    if out:
        typer.echo(f"wrote {out}")
    if spec_written:
        typer.echo(f"wrote {spec_written} (IREE tuning spec)")


@app.command("serve")
def serve_cmd(
    host: str = typer.Option("127.0.0.1", "--host", help="interface to bind"),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    workers: int = typer.Option(1, "--workers", min=1, help="API processes (each with its own MLIR worker pool)"),
    log_level: str = typer.Option("info", "--log-level"),
) -> None:
    """Run the HTTP API (reads DATABASE_URL; run `tilesearch db upgrade` first)."""
    import uvicorn

    uvicorn.run("service.api.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=log_level, http="httptools", loop="uvloop")


app.add_typer(model_app, name="model")
app.add_typer(job_app, name="job")
app.command("worker")(worker_cmd)

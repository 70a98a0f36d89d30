"""`tilesearch` command line: thin wrappers over the library (no logic lives here)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    name="tilesearch",
    help="Tile-and-fuse search for MLIR tensor programs.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command("measure")
def measure_cmd(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="MLIR module"),
    plan: Path = typer.Option(..., "--plan", exists=True, dir_okay=False, help="plan JSON"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    repetitions: int = typer.Option(5, "--repetitions", min=1),
    min_time_s: float = typer.Option(0.1, "--min-time", help="seconds per repetition"),
) -> None:
    """Time a plan forced on IREE (host CPU) and IREE's own default, medians of repetitions."""
    import json

    from service.measure.iree import BenchSettings, NotMeasurable, measure_plan_and_default

    settings = BenchSettings(repetitions=repetitions, min_time_s=min_time_s)
    try:
        result = measure_plan_and_default(
            file.read_text(), json.loads(plan.read_text()), settings=settings
        )
    except NotMeasurable as exc:
        typer.echo(f"not measurable: {exc.reason}", err=True)
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
            typer.echo(f"{label:>12}: median {m.median_s * 1e3:.3f} ms over {len(m.samples_s)} reps  [{configs}]")
        else:
            typer.echo(f"{label:>12}: FAILED {m.error}  [{configs}]")
    if result.speedup_over_default is not None:
        typer.echo(f"     speedup: {result.speedup_over_default:.2f}x over IREE's default")


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


if __name__ == "__main__":
    app()

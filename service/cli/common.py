"""What the `tilesearch` commands share: reading a module, running an IR task in a sandbox
worker, and turning the caller's mistakes into exit code 2."""

from __future__ import annotations

from pathlib import Path

import typer


def _ir_failure(exc: Exception) -> typer.Exit:
    """Print an IR core error (with line:column diagnostics) to stderr; exit code 2."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


def _run_ir_task(fn, *args, timeout: float = 60.0):
    """Run an IR task in a sandbox worker: a crash or hang inside MLIR ends the task, not us."""
    from service.ir.sandbox import Sandbox

    with Sandbox(workers=1) as sandbox:
        return sandbox.run(fn, *args, timeout=timeout)


def _read_module(path: Path) -> str | bytes:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data  # MLIR bytecode


def _ready_store():
    """A sessionmaker on the configured database when its schema is at head, else None; and why."""
    from service.store.db import make_sessionmaker
    from service.store.migrate import ready_engine

    engine, why = ready_engine()
    return (make_sessionmaker(engine) if engine is not None else None), why


def _hardware_here(sessions, name: str):
    """`name` as the service resolves it (a calibration in use on this host included) when the
    store is there, else the profile."""
    from service.hardware.profiles import get_profile
    from service.store.db import session_scope
    from service.tiling.hardware import find_hardware

    if sessions is None:
        return get_profile(name)
    with session_scope(sessions) as session:
        return find_hardware(session, name).model

"""What the `tilesearch` commands share: reading a module, running an IR task in a sandbox
worker, turning the caller's mistakes into exit code 2, and a server's errors into one line."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer


def _ir_failure(exc: Exception | str) -> typer.Exit:
    """Print an IR core error (with line:column diagnostics) to stderr; exit code 2. A plan or
    request that fails validation says which field and why, one line each, without pydantic's
    documentation links."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        fields = [f"{'.'.join(map(str, e['loc'])) or exc.title}: {e['msg']} (got {e['input']!r})"
                  for e in exc.errors(include_url=False)]
        exc = f"{exc.title} is not valid: " + "; ".join(fields)
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(2)


def _run_ir_task(fn, *args, timeout: float = 60.0):
    """Run an IR task in a sandbox worker: a crash or hang inside MLIR ends the task, not us."""
    from service.ir.sandbox import Sandbox

    with Sandbox(workers=1) as sandbox:
        return sandbox.run(fn, *args, timeout=timeout)


def _read_module(path: Path) -> str | bytes:
    """The file as MLIR text, or bytes for MLIR bytecode; exit 2 naming the line and column of
    a byte that is neither."""
    from service.ir.errors import InvalidTextError
    from service.ir.parse import decode_source

    if path.suffix.lower() == ".onnx":
        raise _ir_failure(f"{path} is an ONNX model; this command takes one MLIR module. "
                          f"A model is tuned with `tilesearch model tune {path}` (IREE imports ONNX there)")
    try:
        return decode_source(path.read_bytes())
    except InvalidTextError as exc:
        raise _ir_failure(f"{path}: {exc}") from None


def _read_text(path: Path) -> str:
    """The file as MLIR text (not bytecode): for what goes to a server as JSON."""
    source = _read_module(path)
    if isinstance(source, bytes):
        raise _ir_failure(f"{path}: MLIR bytecode; the server takes MLIR text")
    return source


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


# What to do about an HTTP error, beyond the server's own message.
_HINTS = {
    401: "pass --token or set TILESEARCH_API_TOKEN to the server's token",
    403: "the server refused this token",
    413: "the server's TILESEARCH_MAX_BODY_BYTES bounds a request: raise it there, send fewer modules at once, or "
         "tune here with `tilesearch tune` / `tilesearch model tune`",
}


@contextmanager
def server_errors(server: str) -> Iterator[None]:
    """Around a command's talk with a tilesearch server: an HTTP error or an unreachable server
    becomes one `error: ...` line on stderr (the server's message and what to do) and exit 2 for
    the caller's mistakes (4xx), 1 otherwise, instead of a traceback."""
    from service.client import ServerUnreachable, TilesearchError

    try:
        yield
    except ServerUnreachable as exc:
        typer.echo(f"error: {exc}: is `tilesearch serve` running there? (--server URL)", err=True)
        raise typer.Exit(1) from None
    except TilesearchError as exc:
        hint = _HINTS.get(exc.status_code)
        if hint is None and exc.status_code >= 500 and exc.status_code != 503:
            hint = "the server failed: its log says why"
        typer.echo(f"error: {exc.message} (HTTP {exc.status_code} from {server})" + (f": {hint}" if hint else ""),
                   err=True)
        raise typer.Exit(2 if 400 <= exc.status_code < 500 else 1) from None


def _writable_spec_path(spec_out: Path | None, source: Path) -> None:
    """--spec-out names a file in an existing folder, not the input itself (a run that writes no
    spec removes an older one there): checked before the search, not after."""
    if spec_out is None:
        return
    if spec_out.resolve() == source.resolve():
        typer.echo(f"error: --spec-out {spec_out} is the input itself: name the spec otherwise", err=True)
        raise typer.Exit(2)
    if spec_out.is_dir():
        typer.echo(f"error: --spec-out {spec_out} is a directory: give the spec file's path", err=True)
        raise typer.Exit(2)
    if not spec_out.parent.is_dir():
        typer.echo(f"error: --spec-out {spec_out}: directory {spec_out.parent} does not exist", err=True)
        raise typer.Exit(2)
    _check_writable(spec_out, "--spec-out")


def _check_writable(path: Path, flag: str) -> None:
    """A file can be written at `path` (made and removed when it is new): a folder the user may
    not write to, or /proc, is refused before minutes of work, not with a traceback after."""
    try:
        if path.exists():
            if not os.access(path, os.W_OK):
                raise PermissionError(13, "permission denied")
        else:
            path.open("x").close()
            path.unlink()
    except OSError as exc:
        raise _ir_failure(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None


def _positive_seconds(value: float | None) -> float | None:
    """--seconds: a time limit, so more than 0 (0 read as no limit, a negative one as no search)."""
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise typer.BadParameter(f"a time limit must be a number of seconds more than 0, not {value:g}; leave it out for none")
    return value


def _model_hints(path: Path, items: list[str]) -> dict[str, list[int]]:
    """--shape-hint for a model (an ONNX input also by its name), bounded as a request's."""
    from service.model_tuning.static_shapes import by_input_name
    from service.search.shapes import parse_shape_hints
    from service.tiling.request import bounded_shape_hints

    try:
        return bounded_shape_hints(parse_shape_hints(by_input_name(path, items))) or {}
    except ValueError as exc:  # ShapeHintError among them
        raise _ir_failure(exc) from None


def _sized_model_path(model: Path, given: Path | None) -> Path:
    """Where the model sized by the hints is written: `given`, else MODEL.sized.mlir|onnx here.
    Refused before IREE runs: the model itself, a directory, a missing directory, or a suffix
    that is not the model's kind (the sized model is written as the model's kind)."""
    from service.model_tuning.static_shapes import sized_suffix

    suffix = sized_suffix(model)
    out = given or Path(f"{model.name.split('.')[0]}.sized{suffix}")
    if out.resolve() == model.resolve():
        raise _ir_failure(f"--sized-model {out} is the model itself: name it otherwise")
    if out.is_dir():
        raise _ir_failure(f"--sized-model {out} is a directory: name the file the sized model is written to")
    if not out.resolve().parent.is_dir():
        raise _ir_failure(f"--sized-model {out}: {out.parent} is not a directory" if out.parent.exists() else
                          f"--sized-model {out}: its directory {out.parent} does not exist")
    if out.suffix.lower() != suffix:
        raise _ir_failure(f"--sized-model {out}: the sized model is written as {suffix[1:].upper()}, like the model; "
                          f"name it *{suffix}")
    _check_writable(out, "--sized-model")
    return out

"""What each error a client can cause looks like on the wire. Every one is a 4xx (or a 503 for
a full pool or a database not migrated yet) with `{"detail": {"error", "message", ...}}` saying what to fix. Translation only:
which errors are the client's is decided by the tiling service."""

from __future__ import annotations

import logging
import math
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DataError, DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.hardware.profiles import UnknownHardwareError
from service.ir.errors import IRError, ModuleTooLargeError
from service.ir.sandbox import IRCrashError, IRTimeoutError
from service.jobs.service import JobNotFound
from service.search.errors import SearchInputError
from service.store.migrate import DatabaseNotMigrated, schema_missing
from service.store.query import InvalidCursor
from service.tiling.errors import PoolSaturated, ReservedHardwareName, TilingFailed

log = logging.getLogger("tilesearch.api")


def error_response(status: int, error: str, message: str, headers: dict[str, str] | None = None, **extra) -> JSONResponse:
    detail = {"error": error, "message": message, **{k: v for k, v in extra.items() if v is not None}}
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _ir_error(_request: Request, exc: IRError) -> JSONResponse:
    body = exc.to_json()
    if isinstance(exc, IRTimeoutError):
        body["message"] = f"{exc}: simplify the module or split it"
    elif isinstance(exc, IRCrashError):
        body["message"] = f"the module crashed the MLIR compiler in a worker: {exc}"
    elif isinstance(exc, ModuleTooLargeError):
        body["limit"] = exc.limit
    return JSONResponse({"detail": body}, status_code=422)


def _unknown_hardware(_request: Request, exc: UnknownHardwareError) -> JSONResponse:
    return error_response(404, "UnknownHardware", str(exc), known=exc.known)


def _reserved_hardware_name(_request: Request, exc: ReservedHardwareName) -> JSONResponse:
    return error_response(409, "ReservedHardwareName", str(exc))


def _job_not_found(_request: Request, exc: JobNotFound) -> JSONResponse:
    return error_response(404, "NotFound", str(exc))


def _pool_saturated(_request: Request, exc: PoolSaturated) -> JSONResponse:
    return error_response(503, "PoolSaturated", str(exc), headers={"Retry-After": str(exc.retry_after_s)})


def _invalid_cursor(_request: Request, exc: InvalidCursor) -> JSONResponse:
    return error_response(422, "InvalidCursor", f"{exc}: pass back a next_cursor from a previous page")


def _search_input(_request: Request, exc: SearchInputError) -> JSONResponse:
    """Search parameters the module cannot use (hints, buckets, strategy)."""
    return error_response(422, "InvalidSearchParameters", str(exc))


def _tiling_failed(_request: Request, exc: TilingFailed) -> JSONResponse:
    """A worker-side bug (logged by the service): a 422 naming it, so a client never sees a 500."""
    return error_response(422, "TilingFailed", str(exc))


def _unstorable_value(_request: Request, exc: DataError) -> JSONResponse:
    # The database refused a value the client sent (PostgreSQL: a NUL character in text or JSON,
    # an integer out of range); rows are only written from request data, so this is a 4xx.
    log.info("database rejected request data: %s", exc.orig)
    return error_response(422, "UnstorableValue",
                          f"the database cannot store a value of this request: {str(exc.orig).splitlines()[0]}")


def _not_migrated(_request: Request, exc: DatabaseNotMigrated) -> JSONResponse:
    return error_response(503, "DatabaseNotMigrated", str(exc), headers={"Retry-After": "10"})


def _database_error(request: Request, exc: DBAPIError) -> JSONResponse:
    """A table or function missing is the operator's step left out, said as such; any other
    database failure stays a logged 500."""
    if schema_missing(exc):
        log.warning("%s: %s", request.url.path, str(exc.orig).splitlines()[0])
        return _not_migrated(request, DatabaseNotMigrated())
    raise exc


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """Starlette's and FastAPI's own errors carry a bare string: give them the {error, message}
    shape too. A body FastAPI cannot decode (not UTF-8) says so instead of "error parsing"."""
    if not isinstance(exc.detail, str):
        return await http_exception_handler(request, exc)
    message = exc.detail
    if exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        message = f"the request body is not valid UTF-8 JSON text ({exc.__cause__.reason} at byte {exc.__cause__.start})"
    elif exc.status_code == 400 and exc.__cause__ is not None:
        message = f"the request body could not be read as JSON: {type(exc.__cause__).__name__}"
    error = HTTPStatus(exc.status_code).phrase.replace(" ", "") if exc.status_code in HTTPStatus._value2member_map_ else "Error"
    return error_response(exc.status_code, error, message, headers=getattr(exc, "headers", None))


def _json_safe(value):
    """Python's JSON parser reads NaN, Infinity and 1e999 as floats that JSON cannot write back."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


_ECHO_CHARS = 200  # of a refused input echoed back: a 10,000-item job must not come back whole


def _echo(value):
    """A refused input as the error shows it: itself if short, else the start of its text."""
    text = str(value)
    return value if len(text) <= _ECHO_CHARS else f"{text[:_ECHO_CHARS]}... ({len(text)} characters)"


def _kept(errors: list[dict]) -> list[dict]:
    """A field that takes a name or a model (hardware: str | HardwareModel) fails both branches.
    For an object (a model was meant) its "not a string" error only hides the one that says what
    to fix; for anything else (null, a number) the model branch's "not a dictionary" hides that a
    name is what most callers send."""
    def name_error(e: dict) -> bool:
        loc = tuple(e.get("loc", ()))
        return e.get("type") == "string_type" and bool(loc) and loc[-1] == "str"

    def beside(e: dict, which) -> bool:
        loc = tuple(e.get("loc", ()))
        return any(o is not e and tuple(o.get("loc", ()))[:len(loc) - 1] == loc[:-1] and which(o) for o in errors)

    def shadowed(e: dict) -> bool:
        if name_error(e):
            return isinstance(e.get("input"), dict) and beside(e, lambda o: True)
        return e.get("type") == "model_attributes_type" and beside(e, name_error)
    return [e for e in errors if not shadowed(e)]


def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's own 422 (a list of pydantic errors, each with the input it refused, cut short),
    written even when that input is a non-finite number the client sent (`"seconds": NaN`). A
    body that is not JSON is a 400, and one not sent as JSON a 415, each saying so."""
    errors = exc.errors()
    broken = next((e for e in errors if e.get("type") == "json_invalid"), None)
    if broken is not None:
        reason = (broken.get("ctx") or {}).get("error", "invalid JSON")
        where = broken["loc"][-1] if broken.get("loc") else "?"
        return error_response(400, "InvalidJSON", f"the request body is not valid JSON: {reason} (at character {where})")
    content_type = request.headers.get("content-type", "")
    if "json" not in content_type and any(tuple(e.get("loc", ())) == ("body",) for e in errors):
        return error_response(415, "UnsupportedMediaType",
                              f"the body was sent as {content_type or 'no content type'}: send JSON with "
                              "Content-Type: application/json")
    shown = [{**e, "input": _echo(e["input"])} if "input" in e else e for e in _kept(errors)]
    return JSONResponse({"detail": _json_safe(jsonable_encoder(shown))}, status_code=422)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(DataError, _unstorable_value)
    app.add_exception_handler(DBAPIError, _database_error)
    app.add_exception_handler(DatabaseNotMigrated, _not_migrated)
    app.add_exception_handler(IRError, _ir_error)
    app.add_exception_handler(UnknownHardwareError, _unknown_hardware)
    app.add_exception_handler(JobNotFound, _job_not_found)
    app.add_exception_handler(ReservedHardwareName, _reserved_hardware_name)
    app.add_exception_handler(PoolSaturated, _pool_saturated)
    app.add_exception_handler(InvalidCursor, _invalid_cursor)
    app.add_exception_handler(SearchInputError, _search_input)
    app.add_exception_handler(TilingFailed, _tiling_failed)

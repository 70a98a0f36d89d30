"""What each error a client can cause looks like on the wire. Every one is a 4xx (or a 503 for
a full pool) with `{"detail": {"error", "message", ...}}` saying what to fix."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError

from service.hardware.profiles import UnknownHardwareError
from service.ir.errors import IRError, ModuleTooLargeError
from service.ir.sandbox import IRCrashError, IRTimeoutError
from service.store.db import session_scope
from service.store.repo import InvalidCursor
from service.tiling import PoolSaturated, known_hardware_names

log = logging.getLogger("tilesearch.api")


def error_response(status: int, error: str, message: str, headers: dict[str, str] | None = None, **extra) -> JSONResponse:
    detail = {"error": error, "message": message, **{k: v for k, v in extra.items() if v is not None}}
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


class ClientInputError(Exception):
    """A request the service cannot act on (e.g. the search rejected its parameters): 422."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def worker_failure(exc: Exception) -> ClientInputError | None:
    """An unexpected exception raised inside a sandbox worker while it worked on the client's
    module (pebble attaches the worker's traceback as the cause). Like a worker crash, it costs
    that request only: a 422 naming the failure, and an ERROR log with the remote traceback,
    since it is a tilesearch bug to fix. None for anything raised in this process."""
    from pebble.common.types import RemoteTraceback

    if not isinstance(exc.__cause__, RemoteTraceback):
        return None
    log.error("tiling task failed in a worker: %s: %s\n%s", type(exc).__name__, exc, exc.__cause__)
    return ClientInputError(
        "TilingFailed",
        f"tilesearch could not tile this module ({type(exc).__name__}: {exc}); the module is kept out of the "
        "cache and the failure is logged for a fix",
    )


def _ir_error(_request: Request, exc: IRError) -> JSONResponse:
    body = exc.to_json()
    if isinstance(exc, IRTimeoutError):
        body["message"] = f"{exc}: simplify the module or split it"
    elif isinstance(exc, IRCrashError):
        body["message"] = f"the module crashed the MLIR compiler in a worker: {exc}"
    elif isinstance(exc, ModuleTooLargeError):
        body["limit"] = exc.limit
    return JSONResponse({"detail": body}, status_code=422)


def _unknown_hardware(request: Request, exc: UnknownHardwareError) -> JSONResponse:
    with session_scope(request.app.state.sessions) as session:
        known = known_hardware_names(session)
    return error_response(404, "UnknownHardware", f"unknown hardware {exc.name!r}; known: {', '.join(known)}",
                          known=known)


def _pool_saturated(_request: Request, exc: PoolSaturated) -> JSONResponse:
    return error_response(503, "PoolSaturated", str(exc), headers={"Retry-After": str(exc.retry_after_s)})


def _invalid_cursor(_request: Request, exc: InvalidCursor) -> JSONResponse:
    return error_response(422, "InvalidCursor", f"{exc}: pass back a next_cursor from a previous page")


def _client_input(_request: Request, exc: ClientInputError) -> JSONResponse:
    return error_response(422, exc.error, exc.message)


def _unstorable_value(_request: Request, exc: DataError) -> JSONResponse:
    # The database refused a value the client sent (PostgreSQL: a NUL character in text or JSON,
    # an integer out of range); rows are only written from request data, so this is a 4xx.
    log.info("database rejected request data: %s", exc.orig)
    return error_response(422, "UnstorableValue",
                          f"the database cannot store a value of this request: {str(exc.orig).splitlines()[0]}")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(DataError, _unstorable_value)
    app.add_exception_handler(IRError, _ir_error)
    app.add_exception_handler(UnknownHardwareError, _unknown_hardware)
    app.add_exception_handler(PoolSaturated, _pool_saturated)
    app.add_exception_handler(InvalidCursor, _invalid_cursor)
    app.add_exception_handler(ClientInputError, _client_input)

"""Pure ASGI middleware: the body size limit and request metrics (no BaseHTTPMiddleware, so
streaming and background tasks behave, and the cost per request stays small)."""

from __future__ import annotations

import json
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.metrics import ApiMetrics


class BodyTooLarge(HTTPException):
    """Raised from `receive` once the streamed body passes the limit. An HTTPException, so
    FastAPI's body parsing lets it through (any other error there becomes a 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, _too_large_detail(limit))


def _too_large_detail(limit: int) -> dict:
    return {"error": "BodyTooLarge", "message": f"request body is larger than the limit of {limit} bytes"}


class BodySizeLimit:
    """413 for a body over `max_bytes`: by Content-Length before reading, and while streaming
    (chunked bodies or a lying Content-Length)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0  # malformed: the server rejects it; the streamed count still applies
                if declared > self.max_bytes:
                    await self._reject(send)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            # Read outside FastAPI's body parsing (e.g. by another middleware): answer here.
            if started:
                raise
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps({"detail": _too_large_detail(self.max_bytes)}).encode()
        await send({
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close")],
        })
        await send({"type": "http.response.body", "body": body})


class RequestMetrics:
    """Latency histogram and request counter by route template (not raw path: bounded labels)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        t0 = time.perf_counter()

        async def status_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, status_send)
        finally:
            # The router stores the matched route in the (shared) scope.
            route = scope.get("route")
            template = getattr(route, "path", None) or "<unmatched>"
            self.metrics.observe_request(scope["method"], template, status, time.perf_counter() - t0)

"""Liveness, readiness and Prometheus metrics: `async def` (or a limiter of their own), so they
answer however many requests wait on searches."""

from __future__ import annotations

import anyio.to_thread
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.api.deps import MetricsDep
from service.api.schemas import Health, Readiness
from service.store.migrate import check_ready

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process answers (no dependencies checked)."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request) -> JSONResponse:
    """Ready when the database answers and its schema is at the migrations' head."""
    ok, detail = await anyio.to_thread.run_sync(check_ready, request.app.state.engine,
                                                limiter=request.app.state.probe_limiter)
    return JSONResponse(Readiness(ready=ok, detail=detail).model_dump(), status_code=200 if ok else 503)


@router.get("/metrics", response_class=Response)
async def metrics(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

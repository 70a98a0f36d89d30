"""Dependencies: settings, one DB session per request, the tiling service, the token.

The small ones are `async def`: FastAPI runs a sync dependency in the threadpool, and these
must not wait for a thread when requests hold many."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer
from sqlalchemy.orm import Session

from service.api.dashboard.auth import is_authorised
from service.api.metrics import ApiMetrics
from service.config import Settings
from service.store.db import session_scope
from service.tiling.service import TilingService


async def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.sessions) as session:
        yield session


async def get_tiling_service(request: Request) -> TilingService:
    return request.app.state.tiling


async def get_metrics(request: Request) -> ApiMetrics:
    return request.app.state.metrics


# Declared for the OpenAPI schema (Swagger's "Authorize"); the check is `is_authorised`, the one
# the dashboard's pages use, so a bearer token and the dashboard's session cookie both work.
_bearer = HTTPBearer(auto_error=False, description="required on every /v1 request when TILESEARCH_API_TOKEN is set")


async def require_token(request: Request, _declared: Annotated[object, Depends(_bearer)]) -> None:
    """Reads and writes need `Authorization: Bearer <token>` (or the dashboard's session cookie)
    when a token is configured: stored decisions hold other users' modules."""
    if not is_authorised(request, request.app.state.settings):
        raise HTTPException(
            status_code=401,
            detail={"error": "Unauthorized",
                    "message": "this server requires 'Authorization: Bearer <token>' (TILESEARCH_API_TOKEN)"},
            headers={"WWW-Authenticate": 'Bearer realm="tilesearch"'},
        )


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
DbSession = Annotated[Session, Depends(get_db)]
TilingServiceDep = Annotated[TilingService, Depends(get_tiling_service)]
MetricsDep = Annotated[ApiMetrics, Depends(get_metrics)]
TokenAuth = Depends(require_token)

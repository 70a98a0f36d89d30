"""Dependencies: settings, one DB session per request, the tiling service, write auth."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from service.api.metrics import ApiMetrics
from service.config import Settings
from service.store.db import session_scope
from service.tiling.service import TilingService


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> Iterator[Session]:
    with session_scope(request.app.state.sessions) as session:
        yield session


def get_tiling_service(request: Request) -> TilingService:
    return request.app.state.tiling


def get_metrics(request: Request) -> ApiMetrics:
    return request.app.state.metrics


_bearer = HTTPBearer(auto_error=False, description="required on writes when TILESEARCH_API_TOKEN is set")


def require_write_token(
    settings: Annotated[Settings, Depends(get_app_settings)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Writes need `Authorization: Bearer <token>` when a token is configured; reads never do."""
    if not settings.api_token:
        return
    if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), settings.api_token.encode()):
        raise HTTPException(
            status_code=401,
            detail={"error": "Unauthorized", "message": "this server requires 'Authorization: Bearer <token>' on writes"},
            headers={"WWW-Authenticate": 'Bearer realm="tilesearch"'},
        )


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
DbSession = Annotated[Session, Depends(get_db)]
TilingServiceDep = Annotated[TilingService, Depends(get_tiling_service)]
MetricsDep = Annotated[ApiMetrics, Depends(get_metrics)]
WriteAuth = Depends(require_write_token)

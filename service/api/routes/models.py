"""/v1/models/runs: the stored whole-model runs (`tilesearch model tune`), read only. Every route
needs the bearer token when one is configured: runs carry the users' models."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session

from service.api.deps import DbSession, TokenAuth
from service.api.schemas import ErrorBody
from service.model_tuning.runs import StoredModelRun, stored_run, stored_runs
from service.store import model_runs
from service.store.query import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE

router = APIRouter(prefix="/v1/models/runs", tags=["models"], dependencies=[TokenAuth])

_CURSOR = r"^[A-Za-z0-9_=-]+$"
_ERRORS = {404: {"model": ErrorBody, "description": "unknown run, or a run that tuned nothing (no spec)"}}


class ModelRunPage(BaseModel):
    items: list[StoredModelRun]
    next_cursor: str | None


def _not_found(run_id: int) -> HTTPException:
    return HTTPException(404, {"error": "NotFound", "message": f"no model run {run_id}"})


@router.get("", response_model=ModelRunPage, responses=_ERRORS)
def list_runs(
    session: DbSession,
    fingerprint: Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$", description="sha256 of the model's text")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE,
    cursor: Annotated[str | None, Query(pattern=_CURSOR, max_length=200)] = None,
) -> ModelRunPage:
    """Runs newest first, each with its per-dispatch report and its dispatches' decisions."""
    items, next_cursor = stored_runs(session, limit=limit, cursor=cursor, fingerprint=fingerprint)
    return ModelRunPage(items=items, next_cursor=next_cursor)


def _exists(run_id: int) -> bool:
    return 0 < run_id < 2**31  # out of range cannot exist (and would overflow PostgreSQL's INTEGER)


@router.get("/{run_id}", response_model=StoredModelRun, responses=_ERRORS)
def get_run(run_id: int, session: DbSession) -> StoredModelRun:
    run = stored_run(session, run_id) if _exists(run_id) else None
    if run is None:
        raise _not_found(run_id)
    return run


def _spec(session: Session, run_id: int) -> str:
    run = model_runs.get_model_run(session, run_id) if _exists(run_id) else None
    if run is None:
        raise _not_found(run_id)
    if run.spec is None:
        raise HTTPException(404, {"error": "NoSpec", "message": f"model run {run_id} tuned no dispatch: it has no spec"})
    return run.spec


@router.get("/{run_id}/spec", response_class=PlainTextResponse, responses=_ERRORS)
def run_spec(run_id: int, session: DbSession) -> PlainTextResponse:
    """The run's IREE tuning spec (`iree-compile --iree-codegen-tuning-spec-path=FILE --mlir-disable-threading`)."""
    return PlainTextResponse(_spec(session, run_id), media_type="text/plain")

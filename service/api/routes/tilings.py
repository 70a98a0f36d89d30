"""/v1/tilings: ask for a decision, read stored ones and their trials."""

from __future__ import annotations

import re
from typing import Annotated

import anyio.to_thread
from fastapi import APIRouter, HTTPException, Query, Request

from service.api.deps import DbSession, MetricsDep, TilingServiceDep, TokenAuth
from service.api.schemas import DecisionOut, DecisionPage, DecisionSummary, ErrorBody, TilingRequest, TrialOut, TrialPage
from service.hardware.profiles import UnknownHardwareError
from service.ir.errors import IRError
from service.search.errors import SearchInputError
from service.store import decisions, searches
from service.store.query import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from service.tiling.errors import PoolSaturated, TilingFailed
from service.tiling.hardware import resolve_hardware

router = APIRouter(prefix="/v1/tilings", tags=["tilings"], dependencies=[TokenAuth])

_CURSOR = r"^[A-Za-z0-9_=-]+$"  # what the store hands out (urlsafe base64)
_HARDWARE_HASH = re.compile(r"[0-9a-f]{16}")
_ERRORS = {
    404: {"model": ErrorBody, "description": "unknown hardware or decision"},
    401: {"model": ErrorBody, "description": "a token is configured and the request does not carry it"},
    422: {"model": ErrorBody, "description": "bad MLIR (with diagnostics), too many ops, bad parameters"},
}


# `decide` blocks (on the MLIR queue, on another owner's search, on the DB): it runs on threads
# of the tiling limiter, not FastAPI's threadpool, so however many requests wait there the
# probes and reads still find a thread.
@router.post("", response_model=DecisionOut,
             responses={**_ERRORS, 503: {"model": ErrorBody, "description": "the MLIR queue is full; see Retry-After"}})
async def create_tiling(body: TilingRequest, request: Request, service: TilingServiceDep,
                        metrics: MetricsDep) -> DecisionOut:
    """The decision for a module on a hardware model: stored (hit), refined (the stored one had
    less effort than asked), or searched (warm / miss). Answers in the requester's own IR."""
    try:
        outcome = await anyio.to_thread.run_sync(service.decide, body, limiter=request.app.state.tiling_limiter)
    except (IRError, UnknownHardwareError, PoolSaturated, SearchInputError) as exc:
        metrics.tiling_errors.labels(type(exc).__name__).inc()
        raise
    except TilingFailed as exc:
        metrics.tiling_errors.labels(exc.error).inc()
        raise
    metrics.observe_tiling(outcome)
    return DecisionOut.from_outcome(outcome)


@router.get("", response_model=DecisionPage, responses=_ERRORS)
def list_tilings(
    session: DbSession,
    fingerprint: Annotated[str | None, Query(pattern=r"^[0-9a-f]{1,128}$", description="module fingerprint (sha256 hex) or a prefix of it")] = None,
    hardware: Annotated[str | None, Query(max_length=200, description="hardware name or content hash")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE,
    cursor: Annotated[str | None, Query(pattern=_CURSOR, max_length=200)] = None,
) -> DecisionPage:
    """Decisions newest first, one page; follow `next_cursor`."""
    hardware_hash = _hardware_hash(session, hardware) if hardware is not None else None
    rows, next_cursor = decisions.list_decisions(
        session, fingerprint=fingerprint, hardware_hash=hardware_hash, limit=limit, cursor=cursor
    )
    return DecisionPage(items=[DecisionSummary.from_row(r) for r in rows], next_cursor=next_cursor)


@router.get("/{decision_id}", response_model=DecisionOut, responses=_ERRORS)
def get_tiling(decision_id: int, session: DbSession) -> DecisionOut:
    return DecisionOut.from_row(_decision_or_404(session, decision_id))


@router.get("/{decision_id}/trials", response_model=TrialPage, responses=_ERRORS)
def list_trials(
    decision_id: int,
    session: DbSession,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 100,
    cursor: Annotated[str | None, Query(pattern=_CURSOR, max_length=200)] = None,
) -> TrialPage:
    """The plans a decision's search evaluated, by trial number."""
    _decision_or_404(session, decision_id)
    rows, next_cursor = searches.list_trials(session, decision_id, limit=limit, cursor=cursor)
    return TrialPage(items=[TrialOut.from_row(r) for r in rows], next_cursor=next_cursor)


def _decision_or_404(session, decision_id: int):
    # Out-of-range ids cannot exist (and would overflow PostgreSQL's INTEGER).
    row = decisions.get_decision(session, decision_id) if 0 < decision_id < 2**31 else None
    if row is None:
        raise HTTPException(404, {"error": "NotFound", "message": f"no decision {decision_id}"})
    return row


def _hardware_hash(session, hardware: str) -> str:
    """A name's content hash (stored or built-in model), or the argument itself if it is a hash."""
    try:
        return resolve_hardware(session, hardware).content_hash()
    except UnknownHardwareError:
        if _HARDWARE_HASH.fullmatch(hardware):
            return hardware
        raise

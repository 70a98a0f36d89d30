"""A model run in the store: the report and the spec, and each tuned dispatch's search stored as
an ordinary decision of its module (`POST /v1/tilings` with that dispatch is then a hit), with
the run linked to those decisions.

A dispatch's decision is claimed like a request's (single flight): when the store already has
one that tried at least as hard, or another process is making it, the run links that one and
leaves it as it is; otherwise the run's search completes it (a refinement only if better).
"""

from __future__ import annotations

import hashlib
import os
import socket
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session, sessionmaker

from service.hardware.model import HardwareModel
from service.ir.lexical import normalised_key
from service.store import decisions, model_runs
from service.store.db import session_scope
from service.store.models import ModelRun
from service.tiling.request import TilingRequest
from service.tiling.service import StoredSearch, decision_parts, store_outcome
from service.tiling.learning import record_refinement
from service.tiling.worker import analyse_request, outcome_of, refinement_measurements

from .tune import DispatchReport, DispatchSearch, ModelTuneReport

_LEASE_S = 300.0
_MAX_BUDGET = 5000  # a request's bound (TilingRequest.budget)


def model_fingerprint(text: str | bytes) -> str:
    """sha256 of the model's text as given: the same file tuned twice is the same model."""
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def _owner() -> str:
    return f"model-run:{socket.gethostname()}:{os.getpid()}"


def dispatch_decision(sessions: sessionmaker[Session], search: DispatchSearch, hardware: HardwareModel,
                      measure_top: int) -> int:
    """The id of the decision of the dispatch's module: this search's, or a stored one at least as good."""
    result = search.result
    measured = measure_top if result.measured else 0
    request = TilingRequest(module=search.module, hardware=hardware, budget=min(_MAX_BUDGET, max(1, result.evaluations)),
                            seed=result.seed, measure_top=min(measured, 16))
    analysis = analyse_request(search.module, None)
    effort = decisions.Effort(request.strategy, request.budget, max(search.seconds, 1e-3), request.measure_top)
    owner = _owner()
    with session_scope(sessions) as session:
        claim = decisions.claim_decision(session, decision_parts(analysis.fingerprint, hardware, request), owner,
                                         _LEASE_S, effort=effort)
    if not claim.owned:
        return claim.decision.id
    try:
        timings = refinement_measurements(search.refinement) if search.refinement is not None else []
        outcome = outcome_of(search.module, result, hardware, timings)
        stored = StoredSearch(search.module, analysis, hardware, claim.decision, owner, effort, source="model")
        decision = store_outcome(sessions, stored, outcome, cache="miss", warm=[], timings={"search_s": search.seconds},
                                 text_key=normalised_key(search.module))
    except BaseException as exc:
        with session_scope(sessions) as session:
            decisions.fail_decision(session, claim.decision.id, owner, f"{type(exc).__name__}: {exc}")
        raise
    return decision.id


def store_model_run(sessions: sessionmaker[Session], model_text: str | bytes, name: str, hardware: HardwareModel,
                    report: ModelTuneReport, options: dict[str, Any]) -> int:
    """Store the run with its spec and per-dispatch report, each tuned dispatch as a decision; its id."""
    spec = None
    if report.spec is not None:
        with open(report.spec, encoding="utf-8") as f:
            spec = f.read()
    links = {s.name: dispatch_decision(sessions, s, hardware, int(options.get("measure_top") or 0))
             for s in report.searches}
    if report.measured_left:  # where the model was wrong is what online learning needs most
        with session_scope(sessions) as session:
            for m in report.measured_left:
                record_refinement(session, m.module, m.refinement, hardware, source="model")
    with session_scope(sessions) as session:
        run = model_runs.save_model_run(
            session, fingerprint=model_fingerprint(model_text), name=name, hardware=hardware.name,
            hardware_hash=hardware.content_hash(), options=options,
            dispatches=[d.model_dump(mode="json") for d in report.dispatches],
            predicted_total_s=report.predicted_total_s, verified=report.verified, spec=spec,
            elapsed_s=report.elapsed_s, decisions=links)
        return run.id


class StoredDispatch(DispatchReport):
    decision_id: int | None = Field(default=None, description="a tuned dispatch: the decision of its module "
                                                              "(GET /v1/tilings/{id})")


class StoredModelRun(BaseModel):
    """A stored model run as the API and the CLI show it (the spec itself: `spec` of the run)."""

    id: int
    created_at: datetime
    name: str
    fingerprint: str = Field(description="sha256 of the model's text as given")
    hardware: str
    hardware_hash: str
    options: dict[str, Any] = Field(description="budget, seconds, seed, measure_top")
    predicted_total_s: float = Field(description="sum over tuned dispatches of weight x predicted seconds")
    verified: bool = Field(description="IREE applied the spec's config to every tuned root and nothing else")
    has_spec: bool
    elapsed_s: float
    dispatches: list[StoredDispatch]


def _stored(session: Session, run: ModelRun) -> StoredModelRun:
    links = model_runs.run_decisions(session, run.id)
    return StoredModelRun(
        id=run.id, created_at=run.created_at, name=run.name, fingerprint=run.fingerprint, hardware=run.hardware,
        hardware_hash=run.hardware_hash, options=run.options, predicted_total_s=run.predicted_total_s,
        verified=run.verified, has_spec=run.spec is not None, elapsed_s=run.elapsed_s,
        dispatches=[StoredDispatch.model_validate(d | {"decision_id": links.get(d["name"])}) for d in run.dispatches])


def stored_run(session: Session, run_id: int) -> StoredModelRun | None:
    run = model_runs.get_model_run(session, run_id)
    return None if run is None else _stored(session, run)


def stored_runs(session: Session, *, limit: int, cursor: str | None = None,
                fingerprint: str | None = None) -> tuple[list[StoredModelRun], str | None]:
    """Runs newest first, one page, and the cursor of the next."""
    rows, next_cursor = model_runs.list_model_runs(session, limit=limit, cursor=cursor, fingerprint=fingerprint)
    return [_stored(session, r) for r in rows], next_cursor

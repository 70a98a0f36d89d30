"""Model runs: a whole model tuned, stored with its report and tuning spec, and linked to the
decisions of its tuned dispatches."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import ModelRun, ModelRunDecision
from .query import FRESH, decode_cursor, encode_cursor, page_size


def save_model_run(
    session: Session,
    *,
    fingerprint: str,
    name: str,
    hardware: str,
    hardware_hash: str,
    options: dict[str, Any],
    dispatches: list[dict[str, Any]],
    predicted_total_s: float,
    verified: bool,
    spec: str | None,
    elapsed_s: float,
    decisions: Mapping[str, int | None],
) -> ModelRun:
    """Store a run and its links (tuned dispatch name -> its decision). Flushes; the caller's
    session scope commits."""
    run = ModelRun(fingerprint=fingerprint, name=name, hardware=hardware, hardware_hash=hardware_hash,
                   options=options, dispatches=dispatches, predicted_total_s=predicted_total_s, verified=verified,
                   spec=spec, elapsed_s=elapsed_s)
    session.add(run)
    session.flush()
    session.add_all(ModelRunDecision(run_id=run.id, name=n, decision_id=d) for n, d in decisions.items())
    session.flush()
    return run


def get_model_run(session: Session, run_id: int) -> ModelRun | None:
    return session.get(ModelRun, run_id, populate_existing=True)


def run_decisions(session: Session, run_id: int) -> dict[str, int | None]:
    """The run's tuned dispatches by name, each with its decision's id (None: since deleted)."""
    rows = session.execute(select(ModelRunDecision.name, ModelRunDecision.decision_id)
                           .where(ModelRunDecision.run_id == run_id).order_by(ModelRunDecision.id))
    return {name: decision_id for name, decision_id in rows}


def list_model_runs(session: Session, *, limit: int, cursor: str | None = None,
                    fingerprint: str | None = None) -> tuple[list[ModelRun], str | None]:
    """Runs newest first, one page (keyset on id); `fingerprint`: runs of one model text."""
    size = page_size(limit)
    statement = select(ModelRun).order_by(ModelRun.id.desc()).limit(size + 1)
    if fingerprint is not None:
        statement = statement.where(ModelRun.fingerprint == fingerprint)
    if cursor is not None:
        statement = statement.where(ModelRun.id < decode_cursor(cursor))
    rows = list(session.scalars(statement, execution_options=FRESH))
    return (rows[:size], encode_cursor(rows[size - 1].id)) if len(rows) > size else (rows, None)

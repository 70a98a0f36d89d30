"""Read-only queries the dashboard needs beyond the API's: filtered, sorted, numbered pages of
decisions, the modules behind them, a decision's trials in one read, counts per hardware.

The API's own listing (repo.list_decisions) pages by keyset on id, which is right for clients
walking every row; people on a web page sort by other columns and jump to page N, so these
pages use OFFSET (bounded by MAX_PAGE_SIZE rows a page).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from service.store.models import Decision, DecisionStatus, ItemState, Job, JobItem, Measurement, Module, Trial

MAX_PAGE_SIZE = 200
# A decision's search evaluates at most a few thousand plans; the charts read them all at once.
MAX_TRIALS = 5000


class DecisionSort(enum.StrEnum):
    CREATED = "created"
    PREDICTED = "predicted"
    SPEEDUP = "speedup"  # over the super-tiling baseline, both predicted
    EVALUATIONS = "evaluations"


@dataclass(frozen=True)
class DecisionFilter:
    """What the dashboard's decision list narrows by; None means "any"."""

    hardware_hash: str | None = None
    # A fingerprint prefix (hex) or the beginning of a function name the module text defines.
    module: str | None = None
    created_from: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    cache: str | None = None  # the cache outcome stored with the decision: miss / warm
    status: DecisionStatus | None = None


@dataclass(frozen=True)
class DecisionPageResult:
    rows: list[Decision]
    total: int


def _predicted_latency() -> ColumnElement[Any]:
    return Decision.predicted_cost["latency_s"].as_float()


def _speedup_vs_super_tiling() -> ColumnElement[Any]:
    # NULLIF: PostgreSQL raises on a division by zero where SQLite returns NULL.
    return Decision.baseline["latency_s"].as_float() / func.nullif(_predicted_latency(), 0.0)


def _sort_column(sort: DecisionSort) -> ColumnElement[Any]:
    return {
        DecisionSort.CREATED: Decision.id,
        DecisionSort.PREDICTED: _predicted_latency(),
        DecisionSort.SPEEDUP: _speedup_vs_super_tiling(),
        DecisionSort.EVALUATIONS: Decision.search_stats["evaluations"].as_integer(),
    }[sort]


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text.lower())


def _filter_clauses(f: DecisionFilter) -> list[ColumnElement[bool]]:
    clauses: list[ColumnElement[bool]] = []
    if f.hardware_hash:
        clauses.append(Decision.hardware_hash == f.hardware_hash)
    if f.module:
        by_name = select(Module.fingerprint).where(
            or_(Module.text.contains(f"@{f.module}", autoescape=True), Module.text.contains(f'@"{f.module}', autoescape=True))
        )
        matches = [Decision.module_fingerprint.in_(by_name)]
        if _is_hex(f.module):
            matches.append(Decision.module_fingerprint.startswith(f.module.lower(), autoescape=True))
        clauses.append(or_(*matches))
    if f.created_from is not None:
        clauses.append(Decision.created_at >= f.created_from)
    if f.created_before is not None:
        clauses.append(Decision.created_at < f.created_before)
    if f.cache:
        clauses.append(Decision.search_stats["cache"].as_string() == f.cache)
    if f.status is not None:
        clauses.append(Decision.status == f.status)
    return clauses


def page_of_decisions(
    session: Session,
    filters: DecisionFilter,
    *,
    sort: DecisionSort = DecisionSort.CREATED,
    descending: bool = True,
    page: int = 1,
    per_page: int = 50,
) -> DecisionPageResult:
    """One numbered page of decisions matching `filters`, and how many match in all.

    Rows without the sorted value (pending, failed) come last either way; id breaks ties so
    pages do not overlap.
    """
    per_page = max(1, min(per_page, MAX_PAGE_SIZE))
    page = max(1, page)
    clauses = _filter_clauses(filters)
    key = _sort_column(sort)
    order = key.desc() if descending else key.asc()
    tie = Decision.id.desc() if descending else Decision.id.asc()
    statement = (
        select(Decision)
        .where(*clauses)
        .order_by(key.is_(None), order, tie)
        .limit(per_page)
        .offset((page - 1) * per_page)
    )
    total = session.scalar(select(func.count()).select_from(Decision).where(*clauses)) or 0
    return DecisionPageResult(rows=list(session.scalars(statement)), total=int(total))


def modules_by_fingerprint(session: Session, fingerprints: Iterable[str]) -> dict[str, Module]:
    wanted = sorted(set(fingerprints))
    if not wanted:
        return {}
    return {m.fingerprint: m for m in session.scalars(select(Module).where(Module.fingerprint.in_(wanted)))}


def decisions_by_id(session: Session, ids: Iterable[int | None]) -> dict[int, Decision]:
    """The decisions a page of job items points at, in one query."""
    wanted = sorted({i for i in ids if i is not None})
    if not wanted:
        return {}
    return {d.id: d for d in session.scalars(select(Decision).where(Decision.id.in_(wanted)))}


def job_count(session: Session) -> int:
    return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def finished_items_of(session: Session, job_id: int) -> list[tuple[datetime, str]]:
    """(finished_at, state) of a job's items that ran to an end (done or failed): the jobs page's
    items-finished-over-time chart. Cancelled items did not finish their search."""
    statement = (select(JobItem.finished_at, JobItem.state)
                 .where(JobItem.job_id == job_id, JobItem.state.in_((ItemState.DONE, ItemState.FAILED)),
                        JobItem.finished_at.is_not(None))
                 .order_by(JobItem.finished_at))
    return [(at, ItemState(state).value) for at, state in session.execute(statement)]


def trials_of(session: Session, decision_id: int, *, limit: int = MAX_TRIALS) -> list[Trial]:
    """A decision's trials by number, at most `limit` (the charts plot them all)."""
    statement = select(Trial).where(Trial.decision_id == decision_id).order_by(Trial.number).limit(limit)
    return list(session.scalars(statement))


def decision_counts_by_hardware(session: Session) -> dict[str, int]:
    rows = session.execute(select(Decision.hardware_hash, func.count()).group_by(Decision.hardware_hash))
    return {hardware_hash: int(count) for hardware_hash, count in rows}


def hardware_hashes_in_use(session: Session) -> Sequence[str]:
    return sorted(decision_counts_by_hardware(session))


@dataclass(frozen=True)
class PredictedMeasured:
    """A plan timed on real hardware beside what the cost model predicted for it there."""

    plan_hash: str
    predicted_s: float
    measured_s: float
    decision_id: int | None


def predicted_and_measured(
    session: Session, hardware_hash: str, *, decision_id: int | None = None, limit: int = MAX_TRIALS
) -> list[PredictedMeasured]:
    """Successful measurements on one hardware with a prediction for the same plan on it (a
    trial of a decision made for that hardware); one pair per plan: the newest measurement.
    With `decision_id`, only that decision's trials."""
    predicted = (
        select(Trial.plan_hash, func.min(Trial.latency_s).label("predicted_s"))
        .join(Decision, Decision.id == Trial.decision_id)
        .where(Decision.hardware_hash == hardware_hash, Trial.latency_s.is_not(None), Trial.feasible.is_(True))
        .group_by(Trial.plan_hash)
    )
    if decision_id is not None:
        predicted = predicted.where(Trial.decision_id == decision_id)
    predicted_sq = predicted.subquery()
    newest = (
        select(func.max(Measurement.id))
        .where(Measurement.hardware_hash == hardware_hash, Measurement.ok.is_(True), Measurement.median_s.is_not(None))
        .group_by(Measurement.plan_hash)
    )
    statement = (
        select(Measurement.plan_hash, predicted_sq.c.predicted_s, Measurement.median_s, Measurement.decision_id)
        .join(predicted_sq, predicted_sq.c.plan_hash == Measurement.plan_hash)
        .where(Measurement.id.in_(newest))
        .order_by(Measurement.id)
        .limit(limit)
    )
    return [PredictedMeasured(plan_hash=h, predicted_s=float(p), measured_s=float(m), decision_id=d)
            for h, p, m, d in session.execute(statement)]

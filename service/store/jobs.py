"""Jobs and their items: creation, the state transitions a worker makes, and the reads the API
pages through.

A worker's transitions are compare-and-set on the item's `run_owner` (one run of one worker):
after a takeover, the run that lost the item can neither finish it nor add trials to it. Every
transition commits, because other processes (the API, other workers) must see it at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, func, select, update
from sqlalchemy.orm import Session

from service.store.models import ItemState, Job, JobItem, utcnow
from service.store.query import FRESH, decode_cursor, encode_cursor, page_size

_ITEMS = cast(Table, JobItem.__table__)
_UNFINISHED = (ItemState.QUEUED, ItemState.RUNNING)


@dataclass(frozen=True, slots=True)
class NewItem:
    name: str
    module: str
    shape_hints: dict[str, Any] | None = None
    weight: int = 1


@dataclass(frozen=True, slots=True)
class JobSummary:
    job: Job
    state: str
    counts: dict[str, int]
    trials: int
    eta_s: float | None


# ---------------------------------------------------------------------------------------------
# Creation and reads


def create_job(session: Session, *, kind: str, hardware: Any, options: dict[str, Any], queue: str,
               items: Sequence[NewItem], notes: Any = None) -> Job:
    """The job and its items, queued (flushed: ids assigned; the caller commits)."""
    job = Job(kind=kind, hardware=hardware, options=options, queue=queue, notes=notes, cancel_requested=False)
    session.add(job)
    session.flush()
    session.add_all(JobItem(job_id=job.id, position=i, name=item.name, module=item.module,
                            shape_hints=item.shape_hints, weight=item.weight, state=ItemState.QUEUED,
                            attempts=0, trials=0) for i, item in enumerate(items))
    session.flush()
    return job


def get_job(session: Session, job_id: int) -> Job | None:
    return session.scalars(select(Job).where(Job.id == job_id), execution_options=FRESH).one_or_none()


def get_item(session: Session, item_id: int) -> JobItem | None:
    return session.scalars(select(JobItem).where(JobItem.id == item_id), execution_options=FRESH).one_or_none()


def item_ids(session: Session, job_id: int, states: Sequence[ItemState] | None = None) -> list[int]:
    statement = select(JobItem.id).where(JobItem.job_id == job_id).order_by(JobItem.position)
    if states is not None:
        statement = statement.where(JobItem.state.in_(states))
    return list(session.scalars(statement))


def job_state(counts: dict[str, int], cancel_requested: bool) -> str:
    """queued | running | succeeded | failed | cancelled, from the items' states."""
    total = sum(counts.values())
    unfinished = counts.get(ItemState.QUEUED, 0) + counts.get(ItemState.RUNNING, 0)
    if unfinished:
        if cancel_requested:
            return "running"  # cancelling: running items stop within seconds
        started = total - counts.get(ItemState.QUEUED, 0)
        return "running" if started else "queued"
    if cancel_requested or counts.get(ItemState.CANCELLED, 0):
        return "cancelled"
    return "failed" if counts.get(ItemState.FAILED, 0) else "succeeded"


def summarise(session: Session, job: Job) -> JobSummary:
    rows = session.execute(
        select(JobItem.state, func.count(), func.coalesce(func.sum(JobItem.trials), 0),
               func.min(JobItem.started_at))
        .where(JobItem.job_id == job.id).group_by(JobItem.state)
    ).all()
    counts = {state.value: 0 for state in ItemState}
    trials = 0
    first_start: datetime | None = None
    for state, n, t, started in rows:
        counts[ItemState(state).value] = int(n)
        trials += int(t)
        if started is not None and (first_start is None or started < first_start):
            first_start = started
    return JobSummary(job=job, state=job_state(counts, job.cancel_requested), counts=counts, trials=trials,
                      eta_s=_eta(counts, first_start))


def _eta(counts: dict[str, int], first_start: datetime | None) -> float | None:
    """Seconds left at the rate items have finished since the first one started."""
    finished = counts[ItemState.DONE] + counts[ItemState.FAILED]
    left = counts[ItemState.QUEUED] + counts[ItemState.RUNNING]
    if not left:
        return 0.0
    if not finished or first_start is None:
        return None
    if first_start.tzinfo is None:  # SQLite aggregates come back naive (UTC)
        first_start = first_start.replace(tzinfo=utcnow().tzinfo)
    return (utcnow() - first_start).total_seconds() / finished * left


def list_jobs(session: Session, *, limit: int, cursor: str | None = None) -> tuple[list[Job], str | None]:
    """Jobs newest first, one page (keyset on id)."""
    size = page_size(limit)
    statement = select(Job).order_by(Job.id.desc()).limit(size + 1)
    if cursor is not None:
        statement = statement.where(Job.id < decode_cursor(cursor))
    rows = list(session.scalars(statement, execution_options=FRESH))
    return (rows[:size], encode_cursor(rows[size - 1].id)) if len(rows) > size else (rows, None)


def list_items(session: Session, job_id: int, *, limit: int, cursor: str | None = None,
               state: ItemState | None = None) -> tuple[list[JobItem], str | None]:
    """A job's items in submission order, one page (keyset on position)."""
    size = page_size(limit)
    statement = select(JobItem).where(JobItem.job_id == job_id).order_by(JobItem.position).limit(size + 1)
    if state is not None:
        statement = statement.where(JobItem.state == state)
    if cursor is not None:
        statement = statement.where(JobItem.position > decode_cursor(cursor))
    rows = list(session.scalars(statement, execution_options=FRESH))
    return (rows[:size], encode_cursor(rows[size - 1].position)) if len(rows) > size else (rows, None)


def done_items(session: Session, job_id: int) -> list[JobItem]:
    return list(session.scalars(select(JobItem).where(JobItem.job_id == job_id, JobItem.state == ItemState.DONE)
                                .order_by(JobItem.position), execution_options=FRESH))


# ---------------------------------------------------------------------------------------------
# The queue side


def set_queue_job_ids(session: Session, queue_job_ids: dict[int, int]) -> None:
    for item_id, queue_job_id in queue_job_ids.items():
        session.execute(update(_ITEMS).where(JobItem.id == item_id).values(queue_job_id=queue_job_id))
    session.commit()


def queued_without_queue_job(session: Session, limit: int = 500) -> list[JobItem]:
    """Queued items no queue job carries (their submitter died between commit and defer)."""
    return list(session.scalars(select(JobItem).where(JobItem.state == ItemState.QUEUED,
                                                      JobItem.queue_job_id.is_(None)).limit(limit)))


def next_queued_item(session: Session) -> int | None:
    """The oldest queued item of any job (the embedded runner's order)."""
    return session.scalars(select(JobItem.id).where(JobItem.state == ItemState.QUEUED)
                           .order_by(JobItem.id).limit(1)).first()


def requeue_running(session: Session) -> int:
    """Every running item back to queued (the embedded runner at start: its process died)."""
    result = session.execute(update(_ITEMS).where(JobItem.state == ItemState.RUNNING)
                             .values(state=ItemState.QUEUED, run_owner=None, stop=None))
    session.commit()
    return result.rowcount or 0


# ---------------------------------------------------------------------------------------------
# A worker's transitions


def start_item(session: Session, item_id: int, run_owner: str) -> JobItem | None:
    """Take the item for this run: queued, or running under a run the queue gave up on (its
    worker stopped beating). None: nothing to do (finished, cancelled, or its job cancelled)."""
    item = get_item(session, item_id)
    if item is None or item.state not in _UNFINISHED:
        return None
    job = get_job(session, item.job_id)
    if job is not None and job.cancel_requested:
        _finish(session, item_id, None, ItemState.CANCELLED, error=None)
        return None
    now = utcnow()
    taken = session.execute(
        update(_ITEMS).where(JobItem.id == item_id, JobItem.state.in_(_UNFINISHED))
        .values(state=ItemState.RUNNING, run_owner=run_owner, stop=None, attempts=JobItem.attempts + 1,
                started_at=func.coalesce(JobItem.started_at, now), heartbeat_at=now)
        .returning(_ITEMS.c.id)
    ).scalar_one_or_none()
    session.commit()
    return get_item(session, item_id) if taken is not None else None


def stop_reason(session: Session, item_id: int, run_owner: str) -> str | None:
    """Why this run must stop now: "cancel", "release", "lost" (another run holds the item), or None."""
    row = session.execute(select(JobItem.run_owner, JobItem.stop, JobItem.state).where(JobItem.id == item_id)).one_or_none()
    if row is None:
        return "lost"
    owner, stop, state = row
    if owner != run_owner or state != ItemState.RUNNING:
        return "lost"
    return stop


def note_progress(session: Session, item_id: int, run_owner: str, decision_id: int, trials: int) -> None:
    """Trials stored so far and a heartbeat, while this run holds the item. Commits."""
    session.execute(update(_ITEMS).where(JobItem.id == item_id, JobItem.run_owner == run_owner)
                    .values(decision_id=decision_id, trials=trials, heartbeat_at=utcnow()))
    session.commit()


def request_stop(session: Session, item_id: int, run_owner: str, stop: str) -> None:
    session.execute(update(_ITEMS).where(JobItem.id == item_id, JobItem.run_owner == run_owner,
                                         JobItem.state == ItemState.RUNNING).values(stop=stop))
    session.commit()


def finish_item(session: Session, item_id: int, run_owner: str, state: ItemState, *, decision_id: int | None = None,
                trials: int | None = None, cache: str | None = None, error: str | None = None) -> bool:
    """Done, failed or cancelled, if this run still holds the item. Commits."""
    values: dict[str, Any] = {}
    if decision_id is not None:
        values["decision_id"] = decision_id
    if trials is not None:
        values["trials"] = trials
    if cache is not None:
        values["cache"] = cache
    return _finish(session, item_id, run_owner, state, error=error, **values)


def release_item(session: Session, item_id: int, run_owner: str) -> bool:
    """Back to queued (the worker stops before the item is done); its trials stay. Commits."""
    released = session.execute(
        update(_ITEMS).where(JobItem.id == item_id, JobItem.run_owner == run_owner, JobItem.state == ItemState.RUNNING)
        .values(state=ItemState.QUEUED, run_owner=None, stop=None).returning(_ITEMS.c.id)
    ).scalar_one_or_none()
    session.commit()
    return released is not None


def _finish(session: Session, item_id: int, run_owner: str | None, state: ItemState, *, error: str | None,
            **values: Any) -> bool:
    where = [JobItem.id == item_id, JobItem.state.in_(_UNFINISHED)]
    if run_owner is not None:
        where.append(JobItem.run_owner == run_owner)
    done = session.execute(
        update(_ITEMS).where(*where)
        .values(state=state, error=error, run_owner=None, stop=None, finished_at=utcnow(), **values)
        .returning(_ITEMS.c.id)
    ).scalar_one_or_none()
    session.commit()
    return done is not None


# ---------------------------------------------------------------------------------------------
# What a client asks of a job


def request_cancel(session: Session, job_id: int) -> list[int]:
    """Cancel the job: queued items now, running ones asked to stop (their searches see it
    within seconds). Finished items keep their results. Returns the queue jobs of the items
    that were queued or running (for the queue to cancel or abort). Commits."""
    session.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True, updated_at=utcnow()))
    queue_jobs = [q for q in session.scalars(select(JobItem.queue_job_id).where(
        JobItem.job_id == job_id, JobItem.state.in_(_UNFINISHED))) if q is not None]
    session.execute(update(_ITEMS).where(JobItem.job_id == job_id, JobItem.state == ItemState.QUEUED)
                    .values(state=ItemState.CANCELLED, finished_at=utcnow()))
    session.execute(update(_ITEMS).where(JobItem.job_id == job_id, JobItem.state == ItemState.RUNNING)
                    .values(stop="cancel"))
    session.commit()
    return queue_jobs


def requeue_failed(session: Session, job_id: int) -> list[int]:
    """The job's failed items queued again (errors cleared); their ids. Commits."""
    ids = item_ids(session, job_id, [ItemState.FAILED])
    if ids:
        session.execute(update(_ITEMS).where(JobItem.id.in_(ids))
                        .values(state=ItemState.QUEUED, error=None, stop=None, run_owner=None, queue_job_id=None,
                                finished_at=None))
    session.commit()
    return ids


def state_counts(items: Sequence[JobItem]) -> Counter[str]:
    return Counter(item.state.value for item in items)

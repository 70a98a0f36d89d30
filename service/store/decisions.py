"""Decisions: their keys, reads, and the single-flight claim that makes one search per key.

Transactions: reads flush nothing and commit nothing. The single-flight state transitions
(``claim_decision``, ``complete_decision``, ``fail_decision``) commit, because other processes
must see them at once. They commit whatever else the session holds, so call them on a session
with no half-done work.

Single-flight across processes (API replicas, workers) goes through the ``decisions`` row of
the key::

    claim = claim_decision(session, parts, owner=worker_id, lease_s=60)
    if claim.outcome is ClaimOutcome.HIT:
        return claim.decision
    if claim.owned:            # OWNED or TAKEN_OVER: run the search within the lease
        ... complete_decision(session, claim.decision.id, worker_id, result)
                or fail_decision(session, claim.decision.id, worker_id, error)
    else:                      # BUSY: someone else runs it
        row = wait_for_decision(sessions, claim.decision.key, timeout_s)
        # done: serve it; failed, lease expired or timed out: claim again

``claim_or_wait(sessions, parts, owner, lease_s, timeout_s)`` is that claim-wait-claim loop.

Effort. The key leaves out how hard the search tried (strategy, budget, seconds): a decision
is the best plan known for its key, and its ``effort`` column records the searches behind it
(per strategy: the largest budget and time limit, and whether that search spent its whole
budget). A claim that passes an ``Effort`` is a hit only when the stored effort covers it;
otherwise the caller takes a refinement lease on the done row (``REFINE``): the row stays done
and keeps answering smaller requests while the refinement runs, and ``complete_decision``
replaces the plan (when the caller found a better one) and merges the effort.

Measurement is effort too: a search that timed its K best plans with IREE (``measure_top``)
records K, and covers a request for K or fewer measured plans, as well as any request for
predicted plans only (a measured choice is at least as good as a predicted one). A decision
chosen by prediction never covers a request that asks for measurement.

Leases are short and renewed (``renew_lease``) by the owner while it works, so a dead owner's
key is taken over within about one lease.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, and_, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.store.models import Decision, DecisionStatus, utcnow
from service.store.query import (
    DEFAULT_PAGE_SIZE,
    FRESH,
    JSONValue,
    decode_cursor,
    encode_cursor,
    page_size,
    upsert_insert,
)

# The core table, for the single-statement insert and the compare-and-set updates.
_DECISIONS = cast(Table, Decision.__table__)
FINGERPRINT_HEX_DIGITS = 64  # sha256


# ---------------------------------------------------------------------------------------------
# Keys, inputs and results


@dataclass(frozen=True, slots=True)
class DecisionKeyParts:
    """Everything a decision depends on. Any change of any part is a different decision."""

    module_fingerprint: str
    hardware_hash: str
    search_space_version: str
    cost_model_version: str
    objective: str
    shape_bucket: str
    # The MLIR provider (e.g. "iree-base-compiler==3.13.0"): a new compiler may tile differently.
    provider_version: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def decision_key(parts: DecisionKeyParts) -> str:
    """sha256 hex of the canonical JSON of the key parts."""
    canonical = json.dumps(parts.as_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Effort:
    """How hard a search tries: its strategy, budget (plans) and time limit (seconds), and how
    many of its best plans it measured with IREE (0: its choice is predicted)."""

    strategy: str
    budget: int
    seconds: float
    measure_top: int = 0


def effort_covers(stored: dict[str, Any] | None, wanted: Effort) -> bool:
    """Whether the searches recorded in ``stored`` (a decision's effort column) tried at least
    as hard as ``wanted``: same strategy, no smaller budget, and no shorter time limit unless
    that search spent its whole budget (then more time would not have changed it), and at least
    as many plans measured (none asked: any)."""
    entry = (stored or {}).get(wanted.strategy)
    if not entry:
        return False
    return (entry["budget"] >= wanted.budget and (entry.get("complete") or entry["seconds"] >= wanted.seconds)
            and entry.get("measure_top", 0) >= wanted.measure_top)


def merged_effort(stored: dict[str, Any] | None, done: Effort, complete: bool) -> dict[str, Any]:
    """The effort column after a search with effort ``done`` (complete: it spent its budget).
    Measurement is per strategy, the largest K measured (absent: none)."""
    out = dict(stored or {})
    old = out.get(done.strategy)
    if old is None:
        entry = {"budget": done.budget, "seconds": done.seconds, "complete": complete}
    else:
        entry = {
            "budget": max(old["budget"], done.budget),
            "seconds": max(old["seconds"], done.seconds),
            "complete": complete if done.budget >= old["budget"] else bool(old.get("complete")),
        }
    measure_top = max((old or {}).get("measure_top", 0), done.measure_top)
    if measure_top:
        entry["measure_top"] = measure_top
    out[done.strategy] = entry
    return out


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """What a finished search stores on its decision."""

    plan: JSONValue
    predicted_cost: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None
    transform_script: str | None = None
    tiled_module: str | None = None
    compilation_info: dict[str, Any] | None = None
    tuning_spec: str | None = None
    origin_map: dict[str, Any] | None = None
    # strategy, budget, seed, evaluations, evaluations_per_s, complete
    search_stats: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    # The normalised key of the module text the texts above were realised from (whose names and
    # constants they carry): a request for another text re-applies the plan to its own.
    realised_for: str | None = None


class ClaimOutcome(enum.StrEnum):
    HIT = "hit"  # a done decision: serve it, no search
    OWNED = "owned"  # this caller inserted the pending row: it runs the search
    TAKEN_OVER = "taken_over"  # a failed row or an expired lease, now this caller's to run
    REFINE = "refine"  # a done row whose effort is short of the request's: this caller refines it
    BUSY = "busy"  # another owner holds a live lease: wait_for_decision, then claim again


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    # The row after the claim: done (HIT), or pending with its lease (the other outcomes).
    decision: Decision

    @property
    def owned(self) -> bool:
        return self.outcome in (ClaimOutcome.OWNED, ClaimOutcome.TAKEN_OVER, ClaimOutcome.REFINE)


# ---------------------------------------------------------------------------------------------
# Decisions: reads


def get_decision(session: Session, decision_id: int) -> Decision | None:
    return session.scalars(select(Decision).where(Decision.id == decision_id), execution_options=FRESH).one_or_none()


def get_decision_by_key(session: Session, key: str) -> Decision | None:
    return session.scalars(select(Decision).where(Decision.key == key), execution_options=FRESH).one_or_none()


def _fingerprint_matches(fingerprint: str):
    """A whole sha256 matches itself; anything shorter is a prefix (`tilesearch inspect` and
    the dashboard show the first 16 and 12 hex digits)."""
    if len(fingerprint) >= FINGERPRINT_HEX_DIGITS:
        return Decision.module_fingerprint == fingerprint
    return Decision.module_fingerprint.startswith(fingerprint, autoescape=True)


def list_decisions(
    session: Session,
    *,
    fingerprint: str | None = None,
    hardware_hash: str | None = None,
    status: DecisionStatus | str | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    cursor: str | None = None,
) -> tuple[list[Decision], str | None]:
    """Decisions newest first, one page; pass the returned cursor to get the next page.

    Keyset pagination on id: stable under concurrent inserts, no OFFSET scans.
    Raises InvalidCursor for a cursor this function did not return.
    """
    size = page_size(limit)
    statement = select(Decision).order_by(Decision.id.desc()).limit(size + 1)
    if fingerprint is not None:
        statement = statement.where(_fingerprint_matches(fingerprint))
    if hardware_hash is not None:
        statement = statement.where(Decision.hardware_hash == hardware_hash)
    if status is not None:
        statement = statement.where(Decision.status == DecisionStatus(status))
    if cursor is not None:
        statement = statement.where(Decision.id < decode_cursor(cursor))
    rows = list(session.scalars(statement, execution_options=FRESH))
    if len(rows) > size:
        return rows[:size], encode_cursor(rows[size - 1].id)
    return rows, None


# ---------------------------------------------------------------------------------------------
# Decisions: single-flight


def claim_decision(
    session: Session,
    parts: DecisionKeyParts,
    owner: str,
    lease_s: float,
    *,
    effort: Effort | None = None,
    now: datetime | None = None,
) -> Claim:
    """Serve, start, take over, refine, or wait for the decision of ``parts``. Commits.

    Without ``effort`` any done decision is a hit; with it, only one whose effort covers it
    (see the module's docstring), else a REFINE claim or BUSY while another caller refines.

    Correct across threads and processes because every contended step is one atomic
    statement guarded by the database: the unique key decides who inserts the pending row
    (``INSERT ... ON CONFLICT DO NOTHING``), and a compare-and-set ``UPDATE ... WHERE`` (failed,
    or pending with an expired lease) decides who takes a row over. Leases compare with this
    host's clock: keep ``lease_s`` far above the clock skew between hosts.
    """
    if lease_s <= 0:
        raise ValueError(f"lease_s must be positive, got {lease_s}")
    now = now or utcnow()
    key = decision_key(parts)
    lease_expires_at = now + timedelta(seconds=lease_s)

    # The common case, a cache hit, is a single indexed read and no write.
    existing = get_decision_by_key(session, key)
    if existing is not None and existing.status == DecisionStatus.DONE:
        if effort is None or effort_covers(existing.effort, effort):
            return Claim(ClaimOutcome.HIT, existing)
        return _claim_refinement(session, key, owner, lease_expires_at, now, effort)

    if existing is None:
        inserted = session.execute(
            upsert_insert(session, _DECISIONS)
            .values(
                key=key,
                **parts.as_dict(),
                status=DecisionStatus.PENDING,
                lease_owner=owner,
                lease_expires_at=lease_expires_at,
                created_at=now,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["key"])
            .returning(_DECISIONS.c.id)
        ).scalar_one_or_none()
        session.commit()
        if inserted is not None:
            return Claim(ClaimOutcome.OWNED, _decision_by_id(session, inserted))

    taken = session.execute(
        update(_DECISIONS)
        .where(
            Decision.key == key,
            or_(
                Decision.status == DecisionStatus.FAILED,
                and_(
                    Decision.status == DecisionStatus.PENDING,
                    or_(Decision.lease_expires_at.is_(None), Decision.lease_expires_at <= now),
                ),
            ),
        )
        .values(
            status=DecisionStatus.PENDING,
            lease_owner=owner,
            lease_expires_at=lease_expires_at,
            error=None,
            updated_at=now,
        )
        .returning(_DECISIONS.c.id)
    ).scalar_one_or_none()
    session.commit()
    row = _decision_by_key(session, key)
    if taken is not None:
        return Claim(ClaimOutcome.TAKEN_OVER, row)
    if row.status == DecisionStatus.DONE:
        if effort is None or effort_covers(row.effort, effort):
            return Claim(ClaimOutcome.HIT, row)
        return _claim_refinement(session, key, owner, lease_expires_at, now, effort)
    return Claim(ClaimOutcome.BUSY, row)


def _claim_refinement(session: Session, key: str, owner: str, lease_expires_at: datetime, now: datetime,
                      effort: Effort) -> Claim:
    """A lease on a done row for a refinement: one refiner at a time (compare-and-set on a free
    or expired lease); the row stays done meanwhile."""
    taken = session.execute(
        update(_DECISIONS)
        .where(
            Decision.key == key,
            Decision.status == DecisionStatus.DONE,
            or_(Decision.lease_owner.is_(None), Decision.lease_expires_at.is_(None), Decision.lease_expires_at <= now),
        )
        .values(lease_owner=owner, lease_expires_at=lease_expires_at)
        .returning(_DECISIONS.c.id)
    ).scalar_one_or_none()
    session.commit()
    row = _decision_by_key(session, key)
    if taken is not None:
        return Claim(ClaimOutcome.REFINE, row)
    if row.status == DecisionStatus.DONE and effort_covers(row.effort, effort):
        return Claim(ClaimOutcome.HIT, row)
    return Claim(ClaimOutcome.BUSY, row)


def complete_decision(
    session: Session,
    decision_id: int,
    owner: str,
    result: DecisionResult | None,
    *,
    effort: dict[str, Any] | None = None,
    search_stats: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Decision | None:
    """Store the result and mark the decision done, with ``effort`` as its effort. Commits.

    ``result`` None (a refinement that found nothing better) keeps the stored plan and only
    records the effort (and ``search_stats``, which then say so). Only the lease holder can
    complete: None means the lease was taken over, and the caller should read the decision
    instead of its own result.
    """
    now = now or utcnow()
    values: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None, "updated_at": now}
    if effort is not None:
        values["effort"] = effort
    if result is None and search_stats is not None:
        values["search_stats"] = search_stats
    if result is not None:
        values |= dict(
            status=DecisionStatus.DONE,
            plan=result.plan,
            predicted_cost=result.predicted_cost,
            baseline=result.baseline,
            transform_script=result.transform_script,
            tiled_module=result.tiled_module,
            compilation_info=result.compilation_info,
            tuning_spec=result.tuning_spec,
            origin_map=result.origin_map,
            search_stats=result.search_stats,
            timings=result.timings,
            realised_for=result.realised_for,
            error=None,
        )
    holder = _held_by(decision_id, owner) if result is not None else _refining(decision_id, owner)
    completed = session.execute(
        update(_DECISIONS).where(*holder).values(**values).returning(_DECISIONS.c.id)
    ).scalar_one_or_none()
    session.commit()
    return None if completed is None else _decision_by_id(session, completed)


def fail_decision(
    session: Session,
    decision_id: int,
    owner: str,
    error: str,
    *,
    timings: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Decision | None:
    """Mark the decision failed. Commits. A failed decision is never a hit: the next claim
    takes it over and retries. A refinement's failure only releases its lease: the done row
    keeps its plan. None: the lease was lost (see ``complete_decision``)."""
    now = now or utcnow()
    released = session.execute(
        update(_DECISIONS)
        .where(Decision.id == decision_id, Decision.status == DecisionStatus.DONE, Decision.lease_owner == owner)
        .values(lease_owner=None, lease_expires_at=None)
        .returning(_DECISIONS.c.id)
    ).scalar_one_or_none()
    if released is not None:
        session.commit()
        return _decision_by_id(session, released)
    failed = session.execute(
        update(_DECISIONS)
        .where(*_held_by(decision_id, owner))
        .values(
            status=DecisionStatus.FAILED,
            error=error,
            timings=timings,
            lease_owner=None,
            lease_expires_at=None,
            updated_at=now,
        )
        .returning(_DECISIONS.c.id)
    ).scalar_one_or_none()
    session.commit()
    return None if failed is None else _decision_by_id(session, failed)


def wait_for_decision(
    sessions: sessionmaker[Session],
    key: str,
    timeout_s: float,
    *,
    effort: Effort | None = None,
    poll_s: float = 0.02,
    max_poll_s: float = 0.25,
) -> Decision | None:
    """Poll until the decision of ``key`` needs no more waiting, at most ``timeout_s``.

    Returns the row once it is done (with ``effort``: done and covering it, or done with no
    refinement running) or failed, once its lease expired (the owner died: claim it again to
    take over), or, at the timeout, as it is then. None if no decision has that key. Each poll uses a fresh short session, so it sees other commits
    (a long-lived SQLite read transaction would keep showing the old snapshot).
    """
    deadline = time.monotonic() + timeout_s
    delay = poll_s
    while True:
        with sessions() as session:
            row = get_decision_by_key(session, key)
        if row is None or row.status == DecisionStatus.FAILED:
            return row
        if row.status == DecisionStatus.DONE and (effort is None or effort_covers(row.effort, effort)):
            return row
        if row.lease_expires_at is None or row.lease_expires_at <= utcnow():
            return row
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return row
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, max_poll_s)


def claim_or_wait(
    sessions: sessionmaker[Session],
    parts: DecisionKeyParts,
    owner: str,
    lease_s: float,
    timeout_s: float,
    *,
    effort: Effort | None = None,
) -> Claim:
    """``claim_decision``, waiting out other owners: the usual entry point for a request.

    Returns a HIT, an owned claim (OWNED, TAKEN_OVER or REFINE: run the search and complete or
    fail it), or BUSY if another owner still holds a live lease after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        with sessions() as session:
            claim = claim_decision(session, parts, owner, lease_s, effort=effort)
        remaining = deadline - time.monotonic()
        if claim.outcome is not ClaimOutcome.BUSY or remaining <= 0:
            return claim
        wait_for_decision(sessions, claim.decision.key, remaining, effort=effort)


def renew_lease(session: Session, decision_id: int, owner: str, lease_s: float, *, now: datetime | None = None) -> bool:
    """Extend the lease of a pending decision its owner still holds. Commits. False: the lease
    was lost (taken over after it expired) or the decision is no longer pending."""
    now = now or utcnow()
    renewed = session.execute(
        update(_DECISIONS)
        .where(*_held_by(decision_id, owner))
        .values(lease_expires_at=now + timedelta(seconds=lease_s))
        .returning(_DECISIONS.c.id)
    ).scalar_one_or_none()
    session.commit()
    return renewed is not None


def _held_by(decision_id: int, owner: str) -> tuple[Any, ...]:
    """The caller's lease: on a pending row, or a refinement lease on a done row."""
    return (
        Decision.id == decision_id,
        Decision.status.in_([DecisionStatus.PENDING, DecisionStatus.DONE]),
        Decision.lease_owner == owner,
    )


def _refining(decision_id: int, owner: str) -> tuple[Any, ...]:
    return (Decision.id == decision_id, Decision.status == DecisionStatus.DONE, Decision.lease_owner == owner)


def _decision_by_id(session: Session, decision_id: int) -> Decision:
    return session.scalars(select(Decision).where(Decision.id == decision_id), execution_options=FRESH).one()


def _decision_by_key(session: Session, key: str) -> Decision:
    return session.scalars(select(Decision).where(Decision.key == key), execution_options=FRESH).one()

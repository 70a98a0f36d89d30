"""Typed queries over a Session: the only place that knows the store's tables.

Transactions: functions here flush but do not commit; the caller's ``session_scope`` does.
The single-flight state transitions are the exception: ``claim_decision``,
``complete_decision``, ``fail_decision`` and ``renew_lease`` commit, because other processes
must see them at once. They commit whatever else the session holds, so call them on a session
with no half-done work.

Single-flight across processes (API replicas, workers) goes through the ``decisions`` row of
the key::

    claim = claim_decision(session, parts, owner=worker_id, lease_s=60)
    if claim.outcome is ClaimOutcome.HIT:
        return claim.decision
    if claim.owned:            # OWNED or TAKEN_OVER: run the search, renew_lease meanwhile
        ... complete_decision(session, claim.decision.id, worker_id, result)
                or fail_decision(session, claim.decision.id, worker_id, error)
    else:                      # BUSY: someone else runs it
        row = wait_for_decision(sessions, claim.decision.key, timeout_s)
        # done: serve it; failed, lease expired or timed out: claim again

``claim_or_wait(sessions, parts, owner, lease_s, timeout_s)`` is that claim-wait-claim loop.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import hashlib
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, and_, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from service.store.models import (
    Decision,
    DecisionStatus,
    GroupRecord,
    HardwareModel,
    Measurement,
    Module,
    Trial,
    utcnow,
)

# Any JSON-serializable value (dicts, lists, numbers, strings, bools, None).
JSONValue = Any

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
# Bound on bind parameters per IN (...) list.
_IN_CHUNK = 500


class InvalidCursor(ValueError):
    """A pagination cursor that this store did not hand out."""


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
class DecisionResult:
    """What a finished search stores on its decision."""

    plan: JSONValue
    predicted_cost: dict[str, Any] | None = None
    baseline: dict[str, Any] | None = None
    transform_script: str | None = None
    tiled_module: str | None = None
    compilation_info: dict[str, Any] | None = None
    origin_map: dict[str, Any] | None = None
    # strategy, budget, seed, evaluations, evaluations_per_s, complete
    search_stats: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """One evaluated candidate, as the search reports it."""

    number: int
    plan: JSONValue
    plan_hash: str
    feasible: bool
    cost: dict[str, Any] | None = None
    latency_s: float | None = None
    reason: str | None = None


class ClaimOutcome(enum.StrEnum):
    HIT = "hit"  # a done decision: serve it, no search
    OWNED = "owned"  # this caller inserted the pending row: it runs the search
    TAKEN_OVER = "taken_over"  # a failed row or an expired lease, now this caller's to run
    BUSY = "busy"  # another owner holds a live lease: wait_for_decision, then claim again


@dataclass(frozen=True, slots=True)
class Claim:
    outcome: ClaimOutcome
    # The row after the claim: done (HIT), or pending with its lease (the other outcomes).
    decision: Decision

    @property
    def owned(self) -> bool:
        return self.outcome in (ClaimOutcome.OWNED, ClaimOutcome.TAKEN_OVER)


# ---------------------------------------------------------------------------------------------
# Helpers


def _insert(session: Session, table: Table) -> postgresql.Insert | sqlite.Insert:
    """A dialect INSERT that supports ON CONFLICT (both PostgreSQL and SQLite >= 3.24 do)."""
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"no upsert for dialect {dialect!r}")


def _page_size(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return min(limit, MAX_PAGE_SIZE)


def _encode_cursor(position: int) -> str:
    return base64.urlsafe_b64encode(f"v1:{position}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, position = raw.partition(":")
        if version != "v1":
            raise ValueError(version)
        return int(position)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise InvalidCursor(f"invalid cursor {cursor!r}") from exc


# Re-read rows even when the session already holds them: other processes change decisions.
_FRESH = {"populate_existing": True}

# Core table handles, for the single-statement upserts and compare-and-set updates.
_DECISIONS = cast(Table, Decision.__table__)
_TRIALS = cast(Table, Trial.__table__)
_GROUP_RECORDS = cast(Table, GroupRecord.__table__)


# ---------------------------------------------------------------------------------------------
# Modules and hardware


def upsert_module(
    session: Session, fingerprint: str, text: str, op_summary: dict[str, Any] | None = None
) -> Module:
    """Store a module by fingerprint; the first stored text wins (same structure anyway)."""
    statement = (
        _insert(session, cast(Table, Module.__table__))
        .values(fingerprint=fingerprint, text=text, op_summary=op_summary or {})
        .on_conflict_do_nothing(index_elements=["fingerprint"])
    )
    session.execute(statement)
    return session.scalars(select(Module).where(Module.fingerprint == fingerprint)).one()


def get_module(session: Session, fingerprint: str) -> Module | None:
    return session.scalars(select(Module).where(Module.fingerprint == fingerprint)).one_or_none()


def upsert_hardware(
    session: Session, hardware_hash: str, name: str, spec: dict[str, Any]
) -> HardwareModel:
    """Store a hardware model by content hash (same hash = same model)."""
    statement = (
        _insert(session, cast(Table, HardwareModel.__table__))
        .values(hash=hardware_hash, name=name, spec=spec)
        .on_conflict_do_nothing(index_elements=["hash"])
    )
    session.execute(statement)
    return session.scalars(select(HardwareModel).where(HardwareModel.hash == hardware_hash)).one()


def get_hardware(session: Session, hardware_hash: str) -> HardwareModel | None:
    statement = select(HardwareModel).where(HardwareModel.hash == hardware_hash)
    return session.scalars(statement).one_or_none()


def get_hardware_by_name(session: Session, name: str) -> HardwareModel | None:
    """The newest model stored under ``name``."""
    statement = (
        select(HardwareModel)
        .where(HardwareModel.name == name)
        .order_by(HardwareModel.id.desc())
        .limit(1)
    )
    return session.scalars(statement).first()


def list_hardware(session: Session) -> list[HardwareModel]:
    """The newest model of every name, by name."""
    newest = select(func.max(HardwareModel.id)).group_by(HardwareModel.name)
    statement = (
        select(HardwareModel).where(HardwareModel.id.in_(newest)).order_by(HardwareModel.name)
    )
    return list(session.scalars(statement))


# ---------------------------------------------------------------------------------------------
# Decisions: reads


def get_decision(session: Session, decision_id: int) -> Decision | None:
    return session.scalars(select(Decision).where(Decision.id == decision_id), execution_options=_FRESH).one_or_none()


def get_decision_by_key(session: Session, key: str) -> Decision | None:
    return session.scalars(select(Decision).where(Decision.key == key), execution_options=_FRESH).one_or_none()


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
    size = _page_size(limit)
    statement = select(Decision).order_by(Decision.id.desc()).limit(size + 1)
    if fingerprint is not None:
        statement = statement.where(Decision.module_fingerprint == fingerprint)
    if hardware_hash is not None:
        statement = statement.where(Decision.hardware_hash == hardware_hash)
    if status is not None:
        statement = statement.where(Decision.status == DecisionStatus(status))
    if cursor is not None:
        statement = statement.where(Decision.id < _decode_cursor(cursor))
    rows = list(session.scalars(statement, execution_options=_FRESH))
    if len(rows) > size:
        return rows[:size], _encode_cursor(rows[size - 1].id)
    return rows, None


# ---------------------------------------------------------------------------------------------
# Decisions: single-flight


def claim_decision(
    session: Session,
    parts: DecisionKeyParts,
    owner: str,
    lease_s: float,
    *,
    now: datetime | None = None,
) -> Claim:
    """Serve, start, take over, or wait for the decision of ``parts``. Commits.

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
        return Claim(ClaimOutcome.HIT, existing)

    if existing is None:
        inserted = session.execute(
            _insert(session, _DECISIONS)
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
        return Claim(ClaimOutcome.HIT, row)
    return Claim(ClaimOutcome.BUSY, row)


def renew_lease(
    session: Session,
    decision_id: int,
    owner: str,
    lease_s: float,
    *,
    now: datetime | None = None,
) -> bool:
    """Extend the owner's lease during a long search. Commits. False: the lease was lost."""
    now = now or utcnow()
    renewed = session.execute(
        update(_DECISIONS)
        .where(*_held_by(decision_id, owner))
        .values(lease_expires_at=now + timedelta(seconds=lease_s), updated_at=now)
        .returning(_DECISIONS.c.id)
    ).scalar_one_or_none()
    session.commit()
    return renewed is not None


def complete_decision(
    session: Session,
    decision_id: int,
    owner: str,
    result: DecisionResult,
    *,
    now: datetime | None = None,
) -> Decision | None:
    """Store the result and mark the decision done. Commits.

    Only the lease holder can complete: None means the lease was taken over (or the row is no
    longer pending), and the caller should read the decision instead of its own result.
    """
    now = now or utcnow()
    completed = session.execute(
        update(_DECISIONS)
        .where(*_held_by(decision_id, owner))
        .values(
            status=DecisionStatus.DONE,
            plan=result.plan,
            predicted_cost=result.predicted_cost,
            baseline=result.baseline,
            transform_script=result.transform_script,
            tiled_module=result.tiled_module,
            compilation_info=result.compilation_info,
            origin_map=result.origin_map,
            search_stats=result.search_stats,
            timings=result.timings,
            error=None,
            lease_owner=None,
            lease_expires_at=None,
            updated_at=now,
        )
        .returning(_DECISIONS.c.id)
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
    takes it over and retries. None: the lease was lost (see ``complete_decision``)."""
    now = now or utcnow()
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
    poll_s: float = 0.02,
    max_poll_s: float = 0.25,
) -> Decision | None:
    """Poll until the decision of ``key`` needs no more waiting, at most ``timeout_s``.

    Returns the row once it is done or failed, once its lease expired (the owner died: claim
    it again to take over), or, at the timeout, as it is then (still pending). None if no
    decision has that key. Each poll uses a fresh short session, so it sees other commits
    (a long-lived SQLite read transaction would keep showing the old snapshot).
    """
    deadline = time.monotonic() + timeout_s
    delay = poll_s
    while True:
        with sessions() as session:
            row = get_decision_by_key(session, key)
        if row is None or row.status != DecisionStatus.PENDING:
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
) -> Claim:
    """``claim_decision``, waiting out other owners: the usual entry point for a request.

    Returns a HIT, an owned claim (OWNED or TAKEN_OVER: run the search and complete or fail
    it), or BUSY if another owner still holds a live lease after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        with sessions() as session:
            claim = claim_decision(session, parts, owner, lease_s)
        remaining = deadline - time.monotonic()
        if claim.outcome is not ClaimOutcome.BUSY or remaining <= 0:
            return claim
        wait_for_decision(sessions, claim.decision.key, remaining)


def _held_by(decision_id: int, owner: str) -> tuple[Any, ...]:
    return (
        Decision.id == decision_id,
        Decision.status == DecisionStatus.PENDING,
        Decision.lease_owner == owner,
    )


def _decision_by_id(session: Session, decision_id: int) -> Decision:
    return session.scalars(select(Decision).where(Decision.id == decision_id), execution_options=_FRESH).one()


def _decision_by_key(session: Session, key: str) -> Decision:
    return session.scalars(select(Decision).where(Decision.key == key), execution_options=_FRESH).one()


# ---------------------------------------------------------------------------------------------
# Trials


def save_trials(session: Session, decision_id: int, trials: Sequence[TrialRecord]) -> int:
    """Store trials by (decision, number); a re-run's trial replaces the old one of its number."""
    if not trials:
        return 0
    table = _TRIALS
    statement = _insert(session, table)
    statement = statement.on_conflict_do_update(
        index_elements=["decision_id", "number"],
        set_={
            name: statement.excluded[name]
            for name in ("plan", "plan_hash", "cost", "latency_s", "feasible", "reason")
        },
    )
    rows = [
        {
            "decision_id": decision_id,
            "number": trial.number,
            "plan": trial.plan,
            "plan_hash": trial.plan_hash,
            "cost": trial.cost,
            "latency_s": trial.latency_s,
            "feasible": trial.feasible,
            "reason": trial.reason,
        }
        for trial in trials
    ]
    session.execute(statement, rows)
    return len(rows)


def list_trials(
    session: Session,
    decision_id: int,
    *,
    limit: int = 100,
    cursor: str | None = None,
) -> tuple[list[Trial], str | None]:
    """A decision's trials by number, one page (keyset on number)."""
    size = _page_size(limit)
    statement = (
        select(Trial)
        .where(Trial.decision_id == decision_id)
        .order_by(Trial.number)
        .limit(size + 1)
    )
    if cursor is not None:
        statement = statement.where(Trial.number > _decode_cursor(cursor))
    rows = list(session.scalars(statement))
    if len(rows) > size:
        return rows[:size], _encode_cursor(rows[size - 1].number)
    return rows, None


# ---------------------------------------------------------------------------------------------
# Group records (warm starts)


def record_group_best(
    session: Session,
    *,
    signature: str,
    hardware_hash: str,
    plan: JSONValue,
    latency_s: float,
    decision_id: int | None = None,
) -> bool:
    """Remember ``plan`` for the group if it beats the stored one (lower latency).

    One atomic upsert, so concurrent searches cannot overwrite a better plan with a worse
    one. True if this plan is now the stored best.
    """
    if not math.isfinite(latency_s) or latency_s < 0:
        raise ValueError(f"latency_s must be finite and >= 0, got {latency_s}")
    table = _GROUP_RECORDS
    now = utcnow()
    insert = _insert(session, table).values(
        signature=signature,
        hardware_hash=hardware_hash,
        plan=plan,
        latency_s=latency_s,
        decision_id=decision_id,
        created_at=now,
        updated_at=now,
    )
    # Only a strictly lower latency replaces the stored plan.
    upsert = insert.on_conflict_do_update(
        index_elements=["signature", "hardware_hash"],
        set_={
            "plan": insert.excluded.plan,
            "latency_s": insert.excluded.latency_s,
            "decision_id": insert.excluded.decision_id,
            "updated_at": insert.excluded.updated_at,
        },
        where=table.c.latency_s > insert.excluded.latency_s,
    ).returning(table.c.id)
    return session.execute(upsert).scalar_one_or_none() is not None


def best_group_plans(
    session: Session, signatures: Iterable[str], hardware_hash: str
) -> dict[str, GroupRecord]:
    """The stored best plan of each known signature on this hardware (unknown ones absent)."""
    wanted = sorted(set(signatures))
    found: dict[str, GroupRecord] = {}
    for start in range(0, len(wanted), _IN_CHUNK):
        chunk = wanted[start : start + _IN_CHUNK]
        statement = select(GroupRecord).where(
            GroupRecord.hardware_hash == hardware_hash, GroupRecord.signature.in_(chunk)
        )
        for record in session.scalars(statement, execution_options=_FRESH):
            found[record.signature] = record
    return found


# ---------------------------------------------------------------------------------------------
# Measurements


def save_measurement(
    session: Session,
    *,
    plan_hash: str,
    hardware_hash: str,
    ok: bool,
    median_s: float | None = None,
    samples: Sequence[float] = (),
    config: dict[str, Any] | None = None,
    error: str | None = None,
    iree_version: str | None = None,
    decision_id: int | None = None,
) -> Measurement:
    measurement = Measurement(
        plan_hash=plan_hash,
        hardware_hash=hardware_hash,
        ok=ok,
        median_s=median_s,
        samples=list(samples),
        config=config or {},
        error=error,
        iree_version=iree_version,
        decision_id=decision_id,
    )
    session.add(measurement)
    session.flush()
    return measurement


def list_measurements(
    session: Session, plan_hash: str, hardware_hash: str | None = None
) -> list[Measurement]:
    """Measurements of a plan, oldest first."""
    statement = select(Measurement).where(Measurement.plan_hash == plan_hash)
    if hardware_hash is not None:
        statement = statement.where(Measurement.hardware_hash == hardware_hash)
    return list(session.scalars(statement.order_by(Measurement.id)))

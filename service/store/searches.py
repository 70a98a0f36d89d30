"""What searches leave in the store: their trials, and the best plan of each tile group per
hardware (group records, the warm starts of later searches)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, func, select
from sqlalchemy.orm import Session

from service.store.models import GroupRecord, Trial, utcnow
from service.store.query import FRESH, IN_CHUNK, JSONValue, decode_cursor, encode_cursor, page_size, upsert_insert

_TRIALS = cast(Table, Trial.__table__)
_GROUP_RECORDS = cast(Table, GroupRecord.__table__)


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


# ---------------------------------------------------------------------------------------------
# Trials


def next_trial_number(session: Session, decision_id: int) -> int:
    """The number after the decision's last trial (a refinement's trials follow the earlier ones)."""
    last = session.scalar(select(func.max(Trial.number)).where(Trial.decision_id == decision_id))
    return 0 if last is None else last + 1


def save_trials(session: Session, decision_id: int, trials: Sequence[TrialRecord]) -> int:
    """Store trials by (decision, number); a re-run's trial replaces the old one of its number."""
    if not trials:
        return 0
    table = _TRIALS
    statement = upsert_insert(session, table)
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


@dataclass(frozen=True, slots=True)
class KeptTrials:
    """What an earlier, unfinished run of a decision's search left: how many trials, the number
    the next one takes, and the plan of the best (feasible first, then fastest)."""

    count: int
    next_number: int
    best_plan: JSONValue | None


def kept_trials(session: Session, decision_id: int) -> KeptTrials:
    count, last = session.execute(
        select(func.count(Trial.id), func.max(Trial.number)).where(Trial.decision_id == decision_id)
    ).one()
    best = session.scalars(
        select(Trial.plan)
        .where(Trial.decision_id == decision_id, Trial.latency_s.is_not(None))
        .order_by(Trial.feasible.desc(), Trial.latency_s, Trial.number)
        .limit(1)
    ).first()
    return KeptTrials(count=int(count or 0), next_number=0 if last is None else int(last) + 1, best_plan=best)


def list_trials(
    session: Session,
    decision_id: int,
    *,
    limit: int = 100,
    cursor: str | None = None,
) -> tuple[list[Trial], str | None]:
    """A decision's trials by number, one page (keyset on number)."""
    size = page_size(limit)
    statement = (
        select(Trial)
        .where(Trial.decision_id == decision_id)
        .order_by(Trial.number)
        .limit(size + 1)
    )
    if cursor is not None:
        statement = statement.where(Trial.number > decode_cursor(cursor))
    rows = list(session.scalars(statement))
    if len(rows) > size:
        return rows[:size], encode_cursor(rows[size - 1].number)
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
    insert = upsert_insert(session, table).values(
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
    for start in range(0, len(wanted), IN_CHUNK):
        chunk = wanted[start : start + IN_CHUNK]
        statement = select(GroupRecord).where(
            GroupRecord.hardware_hash == hardware_hash, GroupRecord.signature.in_(chunk)
        )
        for record in session.scalars(statement, execution_options=FRESH):
            found[record.signature] = record
    return found

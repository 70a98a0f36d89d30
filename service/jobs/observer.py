"""The observer a job item's search reports to, from inside its sandbox process: the trials are
stored as they come (each second: a worker killed mid-item loses at most the last second's), the
item's heartbeat and the decision's lease are renewed, and the search is stopped when the item is
cancelled, released, taken over by another run, or its worker died (also while IREE measures:
`check`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import lru_cache

from sqlalchemy import Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from service.store import decisions, jobs, searches
from service.store.db import make_engine, make_sessionmaker, session_scope
from service.hardware.model import HardwareModel
from service.tiling.contract import SearchStopped, TrialOutcome
from service.tiling.worker import warm_up as tiling_warm_up

_SYNC_EVERY_S = 0.9  # IREE's tools ask each second: each of their asks may sync


@lru_cache(maxsize=4)
def _engine(database_url: str) -> Engine:
    # No pool: a sandbox process must not hold connections between tasks; one per sync.
    return make_engine(database_url, poolclass=NullPool)


@dataclass
class ItemObserver:
    database_url: str
    item_id: int
    decision_id: int
    run_owner: str
    lease_s: float
    _parent: int | None = field(default=None, repr=False)
    _pending: list[TrialOutcome] = field(default_factory=list, repr=False)
    _synced_at: float = field(default=float("-inf"), repr=False)

    def trials(self, trials: list[TrialOutcome]) -> None:
        self._check_parent()
        self._pending.extend(trials)
        self._sync()

    def check(self) -> None:
        """While IREE measures (each second of a tool's run): stop a cancelled, released or lost
        item, or an orphan, within about a second."""
        self._check_parent()
        self._sync()

    def _sync(self) -> None:
        """Stop if asked, store the trials so far, renew the heartbeat and the lease: at most once
        a second, not per batch of trials (dozens a second; a connection is a process start on
        PostgreSQL: per batch, about 40% of a job's CPU, docs/benchmarks.md). Trials not stored
        yet are stored with the search's outcome."""
        now = time.monotonic()
        if now - self._synced_at < _SYNC_EVERY_S:
            return
        self._synced_at = now
        with _engine(self.database_url).connect() as connection, \
                session_scope(make_sessionmaker(connection)) as session:
            self._check_stop(session)
            if self._pending:
                searches.save_trials(session, self.decision_id,
                                     [searches.TrialRecord(**t.model_dump()) for t in self._pending])
                session.commit()
                self._pending.clear()
            kept = searches.kept_trials(session, self.decision_id).count
            jobs.note_progress(session, self.item_id, self.run_owner, self.decision_id, kept)
            decisions.renew_lease(session, self.decision_id, self.run_owner, self.lease_s)

    def _check_parent(self) -> None:
        parent = os.getppid()
        if self._parent is None:
            self._parent = parent
        elif parent != self._parent:  # the worker that ran this search is gone: so is its result
            raise SearchStopped("orphaned")

    def _check_stop(self, session: Session) -> None:
        reason = jobs.stop_reason(session, self.item_id, self.run_owner)
        if reason is not None:
            raise SearchStopped(reason)


def warm_up(database_url: str, hardware: HardwareModel) -> None:
    """At a worker's start, in each sandbox process: what its first item would otherwise pay for
    (the search's start-up, and the observer's imports and first connection)."""
    tiling_warm_up(hardware)
    with _engine(database_url).connect():
        pass

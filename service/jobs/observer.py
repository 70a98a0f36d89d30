"""The observer a job item's search reports to, from inside its sandbox process: each batch of
trials is stored at once (a worker killed mid-item loses none), the item's heartbeat and the
decision's lease are renewed, and the search is stopped when the item is cancelled, released,
taken over by another run, or its worker died (also while IREE measures: `check`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from functools import lru_cache

from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from service.store import decisions, jobs, searches
from service.store.db import make_engine, make_sessionmaker, session_scope
from service.tiling.contract import SearchStopped, TrialOutcome

_CHECK_EVERY_S = 0.9  # IREE's tools ask each second


@lru_cache(maxsize=4)
def _sessions(database_url: str) -> sessionmaker[Session]:
    # One short connection per batch: a sandbox process must not hold connections between tasks.
    return make_sessionmaker(make_engine(database_url, poolclass=NullPool))


@dataclass
class ItemObserver:
    database_url: str
    item_id: int
    decision_id: int
    run_owner: str
    lease_s: float
    _parent: int | None = field(default=None, repr=False)
    _checked_at: float = field(default=float("-inf"), repr=False)

    def trials(self, trials: list[TrialOutcome]) -> None:
        self._check_parent()
        with session_scope(_sessions(self.database_url)) as session:
            self._check_stop(session)
            searches.save_trials(session, self.decision_id, [searches.TrialRecord(**t.model_dump()) for t in trials])
            session.commit()
            kept = searches.kept_trials(session, self.decision_id).count
            jobs.note_progress(session, self.item_id, self.run_owner, self.decision_id, kept)
            decisions.renew_lease(session, self.decision_id, self.run_owner, self.lease_s)

    def check(self) -> None:
        """While IREE measures (each second of a tool's run): stop a cancelled, released or lost
        item, or an orphan, within about a second. At most one query a second."""
        self._check_parent()
        now = time.monotonic()
        if now - self._checked_at < _CHECK_EVERY_S:
            return
        self._checked_at = now
        with session_scope(_sessions(self.database_url)) as session:
            self._check_stop(session)

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

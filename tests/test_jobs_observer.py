"""The observer a job item's search reports to (it runs in the sandbox process): it syncs with the
store at most about once a second however many batches of trials come (each sync opens a
connection: per batch, PostgreSQL's connection start-ups cost more CPU than the search), stores
every trial it was given by the next sync, and still stops a cancelled item within a sync."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session, sessionmaker

from service.jobs import observer as observer_module
from service.jobs.observer import ItemObserver
from service.store import decisions, jobs
from service.store.db import session_scope
from service.store.models import Trial
from service.tiling.contract import SearchStopped, TrialOutcome

OWNER = "host:1:item"


def _item_and_decision(sessions: sessionmaker[Session]) -> tuple[int, int]:
    with session_scope(sessions) as session:
        job = jobs.create_job(session, kind="items", hardware="host-cpu", options={}, queue="q",
                              items=[jobs.NewItem("mm", "module")])
        session.commit()
        (item_id,) = jobs.item_ids(session, job.id)
        assert jobs.start_item(session, item_id, OWNER) is not None
        parts = decisions.DecisionKeyParts("fp", "hw", "s1", "c1", "latency", "static", "p1")
        claim = decisions.claim_decision(session, parts, OWNER, lease_s=30)
        return item_id, claim.decision.id


def _trial(number: int) -> TrialOutcome:
    return TrialOutcome(number=number, plan={"groups": []}, plan_hash=f"h{number}", feasible=True,
                        cost={"latency_s": 1e-3}, latency_s=1e-3, reason=None)


def _stored(sessions: sessionmaker[Session], decision_id: int) -> int:
    with session_scope(sessions) as session:
        return session.scalar(select(func.count()).select_from(Trial).where(Trial.decision_id == decision_id))


@pytest.fixture
def observer(sessions: sessionmaker[Session], migrated_url: str) -> tuple[ItemObserver, list[int]]:
    """The observer of a running item, and the count of connections it opened."""
    item_id, decision_id = _item_and_decision(sessions)
    watched = ItemObserver(migrated_url, item_id, decision_id, OWNER, lease_s=30)
    opened: list[int] = []
    engine = observer_module._engine(migrated_url)
    event.listen(engine, "connect", lambda *_: opened.append(1))
    yield watched, opened
    engine.dispose()
    observer_module._engine.cache_clear()


def test_many_batches_a_second_are_one_sync_and_every_trial_is_stored(observer, sessions) -> None:
    watched, opened = observer
    t0 = time.monotonic()
    number = 0
    while time.monotonic() - t0 < 2.5:  # a fast search: a batch every 10 ms
        watched.trials([_trial(number), _trial(number + 1)])
        number += 2
        time.sleep(0.01)
    assert number > 150
    assert 2 <= len(opened) <= 4  # about one a second, not one per batch (more than 100)
    stored = _stored(sessions, watched.decision_id)
    assert 0 < stored <= number
    time.sleep(1)
    watched.trials([])  # the next sync stores what waited
    assert _stored(sessions, watched.decision_id) == number
    with session_scope(sessions) as session:
        assert jobs.get_item(session, watched.item_id).trials == number


def test_a_cancel_stops_the_search_at_the_next_sync(observer, sessions) -> None:
    watched, _ = observer
    watched.trials([_trial(0)])
    with session_scope(sessions) as session:
        jobs.request_stop(session, watched.item_id, OWNER, "cancel")
    t0 = time.monotonic()
    with pytest.raises(SearchStopped, match="cancel"):
        while time.monotonic() - t0 < 5:
            watched.check()
            time.sleep(0.05)
    assert time.monotonic() - t0 < 1.5

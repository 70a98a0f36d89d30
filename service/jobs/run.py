"""The task a worker runs for one job item, whichever engine hands it the item (procrastinate on
PostgreSQL, the embedded runner on SQLite): take the item, search it through the tiling service
(an ordinary decision, in a sandbox worker), record how it ended."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.hardware.profiles import UnknownHardwareError
from service.ir.errors import IRError
from service.ir.sandbox import Sandbox
from service.search.errors import SearchInputError
from service.store import jobs, searches
from service.store.db import session_scope
from service.store.models import ItemState
from service.tiling.contract import SearchStopped
from service.tiling.errors import PoolSaturated, TilingFailed
from service.tiling.service import LongSearch, TilingRequest, TilingService

from .observer import ItemObserver

log = logging.getLogger("tilesearch.jobs")

# What makes an item fail: its own input, or a bug the tiling service names. Any other exception
# (the database gone, say) is the worker's trouble, not the item's: it propagates to the engine.
_ITEM_ERRORS = (IRError, SearchInputError, UnknownHardwareError, TilingFailed, ValueError)

StopCheck = Callable[[], str | None]  # "cancel", "release" or None: asked of the engine each second


class ItemOutcome(StrEnum):
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RELEASED = "released"  # back to the queue (the worker is stopping): retry it
    SKIPPED = "skipped"  # nothing to do: finished, cancelled, or held by another run


@dataclass
class JobRuntime:
    """One worker process's means: the store, its sandbox pool and the tiling service."""

    sessions: sessionmaker[Session]
    sandbox: Sandbox
    tiling: TilingService
    settings: Settings

    @property
    def database_url(self) -> str:
        return str(self.sessions.kw["bind"].url.render_as_string(hide_password=False))


@dataclass(frozen=True)
class ItemRun:
    item_id: int
    run_owner: str
    request: TilingRequest


def begin_item(rt: JobRuntime, item_id: int) -> ItemRun | None:
    """Take the item for a new run (None: nothing to do). A failed request build (a stored
    option no longer valid) fails the item with why."""
    run_owner = f"{rt.tiling.owner}:item{item_id}:{uuid.uuid4().hex[:6]}"
    with session_scope(rt.sessions) as session:
        item = jobs.start_item(session, item_id, run_owner)
        if item is None:
            return None
        job = jobs.get_job(session, item.job_id)
        assert job is not None  # items cascade with their job
        options = job.options
        try:
            request = TilingRequest(module=item.module, hardware=job.hardware, budget=options["budget"],
                                    seconds=options.get("seconds"), strategy=options["strategy"],
                                    seed=options["seed"], shape_hints=item.shape_hints, reuse=options["reuse"],
                                    measure_top=options.get("measure_top", 0))
        except ValueError as exc:
            jobs.finish_item(session, item_id, run_owner, ItemState.FAILED, error=f"invalid item: {exc}")
            return None
    return ItemRun(item_id, run_owner, request)


def run_item(rt: JobRuntime, item_id: int, stop_check: StopCheck = lambda: None) -> ItemOutcome:
    run = begin_item(rt, item_id)
    return ItemOutcome.SKIPPED if run is None else execute(rt, run, stop_check)


def execute(rt: JobRuntime, run: ItemRun, stop_check: StopCheck = lambda: None) -> ItemOutcome:
    """Search the item; the search stops within a batch of trials when the engine or a client
    asks (the observer reads the item's `stop` column)."""
    settings = rt.settings
    seconds = run.request.seconds
    limit = min(settings.job_item_timeout_s, seconds * 1.5 + 60) if seconds else settings.job_item_timeout_s
    long = LongSearch(
        owner=run.run_owner,
        limit_s=max(limit, settings.request_timeout_s),
        lease_s=settings.job_lease_s,
        observer=lambda decision_id: ItemObserver(rt.database_url, run.item_id, decision_id, run.run_owner,
                                                  settings.job_lease_s),
    )
    watching = threading.Event()
    watcher = threading.Thread(target=_watch, args=(rt, run, stop_check, watching), daemon=True,
                               name=f"item-{run.item_id}-watch")
    watcher.start()
    try:
        outcome = rt.tiling.decide(run.request, long)
    except SearchStopped as stop:
        return _stopped(rt, run, stop.reason)
    except PoolSaturated:
        return _stopped(rt, run, "release")
    except _ITEM_ERRORS as exc:
        log.info("job item %s failed: %s: %s", run.item_id, type(exc).__name__, exc)
        with session_scope(rt.sessions) as session:
            jobs.finish_item(session, run.item_id, run.run_owner, ItemState.FAILED, error=f"{type(exc).__name__}: {exc}")
        return ItemOutcome.FAILED
    finally:
        watching.set()
        watcher.join()
    decision = outcome.decision
    with session_scope(rt.sessions) as session:
        kept = searches.kept_trials(session, decision.id).count
        jobs.finish_item(session, run.item_id, run.run_owner, ItemState.DONE, decision_id=decision.id,
                         trials=kept, cache=outcome.cache)
    return ItemOutcome.DONE


def _stopped(rt: JobRuntime, run: ItemRun, reason: str) -> ItemOutcome:
    with session_scope(rt.sessions) as session:
        if reason == "release":
            jobs.release_item(session, run.item_id, run.run_owner)
            return ItemOutcome.RELEASED
        if reason == "cancel":
            jobs.finish_item(session, run.item_id, run.run_owner, ItemState.CANCELLED)
            return ItemOutcome.CANCELLED
    return ItemOutcome.SKIPPED  # lost to another run, or orphaned: theirs to finish


def _watch(rt: JobRuntime, run: ItemRun, stop_check: StopCheck, done: threading.Event) -> None:
    """Pass the engine's stop requests (abort, shutdown) to the item, where the search sees them."""
    while not done.wait(1.0):
        reason = stop_check()
        if reason is not None:
            with session_scope(rt.sessions) as session:
                jobs.request_stop(session, run.item_id, run.run_owner, reason)
            return

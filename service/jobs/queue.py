"""procrastinate, the queue engine on PostgreSQL: one queue job per item, workers that claim
them (SELECT ... FOR UPDATE SKIP LOCKED), LISTEN/NOTIFY wake-ups, heartbeats, abort, and a
periodic task that re-queues the jobs of workers whose heartbeat stopped (procrastinate finds
them, `get_stalled_jobs`, but leaves re-queueing them to the application).

Its schema is applied by our migration 0004. The task only runs `service.jobs.run.run_item`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import procrastinate
from procrastinate import JobContext, RetryStrategy
from procrastinate.exceptions import AlreadyEnqueued, ConnectorException, JobAborted
from procrastinate.job_context import AbortReason
from sqlalchemy.engine import make_url

from service.store import jobs
from service.store.db import session_scope
from service.store.migrate import DatabaseNotMigrated, schema_missing

from .run import ItemOutcome, JobRuntime, run_item

log = logging.getLogger("tilesearch.jobs")

RUN_ITEM = "tilesearch.run_item"
RECOVER = "tilesearch.recover"
# Items that only search run anywhere; items that measure go to their hardware's queue.
SEARCH_QUEUE = "tilesearch"
MAINTENANCE_QUEUE = "tilesearch-maintenance"


class ItemReleased(Exception):
    """The worker stopped before the item was done: procrastinate queues it again."""


def measure_queue(host_key: str) -> str:
    """The queue of items measured on one kind of CPU (service.measure.cache.host_key): only
    workers on such a host take them. By the CPU, not host-cpu's content hash: a calibration
    fitted to stored measurements changes that hash, not the CPU."""
    return f"measure-{host_key}"


def conninfo(database_url: str) -> str:
    """libpq's form of a SQLAlchemy URL (postgresql+psycopg://... -> postgresql://...)."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def make_queue_app(database_url: str, *, stalled_after_s: float = 20.0) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo(database_url)))

    # Retried by procrastinate only when released (a stopping worker); an item that fails is
    # retried when a client asks (POST /v1/jobs/{id}/retry), never behind its back.
    @app.task(name=RUN_ITEM, pass_context=True, retry=RetryStrategy(max_attempts=1000, retry_exceptions={ItemReleased}))
    def run_item_task(context: JobContext, item_id: int) -> str:
        runtime: JobRuntime = context.additional_context["runtime"]

        def stop_check() -> str | None:
            reason = context.abort_reason()
            if reason is None:
                return None
            return "release" if reason == AbortReason.SHUTDOWN else "cancel"

        outcome = run_item(runtime, item_id, stop_check)
        if outcome is ItemOutcome.RELEASED:
            raise ItemReleased(f"item {item_id} released")
        if outcome is ItemOutcome.CANCELLED:
            raise JobAborted(f"item {item_id} cancelled")
        return outcome.value

    @app.periodic(cron="* * * * * */5", periodic_id="recover")
    @app.task(name=RECOVER, queue=MAINTENANCE_QUEUE, queueing_lock=RECOVER, pass_context=True)
    async def recover(context: JobContext, timestamp: int) -> None:
        """Re-queue the jobs of dead workers, and queue items no queue job carries."""
        for job in await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=stalled_after_s):
            log.warning("re-queueing job %s (item %s): its worker stopped beating", job.id, job.task_kwargs)
            await app.job_manager.retry_job(job)
        runtime: JobRuntime = context.additional_context["runtime"]
        await asyncio.to_thread(requeue_orphans, runtime, app)

    return app


def defer_items(app: procrastinate.App, items: Iterable[tuple[int, str]]) -> dict[int, int]:
    """One queue job per (item id, queue); item ids -> queue job ids. An item that already has a
    waiting queue job (its queueing lock) keeps that one."""
    ids = {}
    for item_id, queue in items:
        try:
            ids[item_id] = app.configure_task(RUN_ITEM, queue=queue, queueing_lock=f"item-{item_id}").defer(item_id=item_id)
        except AlreadyEnqueued:
            continue
        except ConnectorException as exc:
            if schema_missing(exc):  # the items stay queued: `recover` defers them once it is there
                raise DatabaseNotMigrated("procrastinate's queue schema is missing") from exc
            raise
    return ids


def requeue_orphans(runtime: JobRuntime, app: procrastinate.App) -> None:
    """Items committed queued whose submitter died before deferring them."""
    with session_scope(runtime.sessions) as session:
        orphans = jobs.queued_without_queue_job(session)
        queues = {item.id: jobs.get_job(session, item.job_id).queue for item in orphans}  # type: ignore[union-attr]
    if orphans:
        with session_scope(runtime.sessions) as session:
            jobs.set_queue_job_ids(session, defer_items(app, queues.items()))


def abort_queue_jobs(app: procrastinate.App, queue_job_ids: Iterable[int]) -> None:
    """Cancel waiting queue jobs, ask running ones to abort."""
    for queue_job_id in queue_job_ids:
        app.job_manager.cancel_job_by_id(queue_job_id, abort=True)


def run_worker(runtime: JobRuntime, app: procrastinate.App, *, queues: list[str], concurrency: int) -> None:
    settings = runtime.settings
    app.run_worker(
        queues=queues,
        concurrency=concurrency,
        additional_context={"runtime": runtime},
        update_heartbeat_interval=settings.job_heartbeat_s,
        stalled_worker_timeout=settings.job_stalled_after_s,
        shutdown_graceful_timeout=settings.job_shutdown_grace_s,
        abort_job_polling_interval=1.0,
    )


class QueueDispatcher:
    """Submitting side on PostgreSQL: items become procrastinate jobs (the API needs no worker)."""

    def __init__(self, runtime: JobRuntime, app: procrastinate.App) -> None:
        self.runtime, self.app = runtime, app

    def enqueue(self, items: list[tuple[int, str]]) -> None:
        # Committed before deferred: if this process dies in between, `recover` defers them.
        deferred = defer_items(self.app, items)
        with session_scope(self.runtime.sessions) as session:
            jobs.set_queue_job_ids(session, deferred)

    def abort(self, queue_job_ids: list[int]) -> None:
        abort_queue_jobs(self.app, queue_job_ids)

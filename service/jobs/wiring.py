"""How a process hosts jobs: on SQLite the embedded runner runs items in this process; on
PostgreSQL items go to procrastinate and `tilesearch worker` processes run them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.hardware.model import HardwareModel
from service.hardware.profiles import HOST_CPU
from service.ir.sandbox import Sandbox
from service.store.db import make_engine, make_sessionmaker
from service.store.migrate import check_ready
from service.tiling.hardware import this_host
from service.tiling.service import TilingService

from .embedded import EmbeddedDispatcher, EmbeddedRunner
from .observer import warm_up
from .queue import MAINTENANCE_QUEUE, SEARCH_QUEUE, QueueDispatcher, make_queue_app, measure_queue, run_worker
from .run import JobRuntime
from .service import JobService

log = logging.getLogger("tilesearch.jobs")


def is_postgresql(runtime: JobRuntime) -> bool:
    return runtime.sessions.kw["bind"].dialect.name == "postgresql"


def open_jobs(sessions: sessionmaker[Session], sandbox: Sandbox, tiling: TilingService,
              settings: Settings) -> tuple[JobService, Callable[[], None]]:
    """The job service for this process and the function that closes what it started."""
    runtime = JobRuntime(sessions, sandbox, tiling, settings)
    if is_postgresql(runtime):
        app = make_queue_app(runtime.database_url, stalled_after_s=settings.job_stalled_after_s)
        app.open()
        return JobService(runtime, QueueDispatcher(runtime, app)), app.close
    runner = EmbeddedRunner(runtime)
    runner.start()
    return JobService(runtime, EmbeddedDispatcher(runner)), runner.stop


def _warm_up(runtime: JobRuntime, host: HardwareModel) -> None:
    """Each sandbox process starts its search machinery now, in the background, instead of in
    the first item's time; a failure is only logged (the item then pays as before)."""
    def failed(future: Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.warning("warming a sandbox process up failed: %s", future.exception())

    for _ in range(runtime.sandbox.workers):
        runtime.sandbox.submit(warm_up, runtime.database_url, host,
                               timeout=runtime.settings.request_timeout_s).add_done_callback(failed)


class WorkerCannotStart(Exception):
    """The worker has nothing to work with: SQLite, or a database not ready (unreachable, not
    migrated); the message says what to do."""


def serve_worker(settings: Settings, concurrency: int, queues: list[str] | None) -> None:
    """`tilesearch worker`: run items from procrastinate until SIGTERM / SIGINT (then running
    items finish within `job_shutdown_grace_s`, or are released to the queue)."""
    engine = make_engine(settings.database_url)
    if engine.dialect.name != "postgresql":
        engine.dispose()
        raise WorkerCannotStart("tilesearch worker needs PostgreSQL (DATABASE_URL=postgresql+psycopg://...); "
                                "on SQLite, `tilesearch serve` runs jobs itself")
    ready, detail = check_ready(engine)
    if not ready:  # procrastinate would fail on its first poll, with a traceback
        engine.dispose()
        raise WorkerCannotStart(detail.splitlines()[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sandbox = Sandbox(concurrency, start_method="forkserver")
    try:
        sessions = make_sessionmaker(engine)
        runtime = JobRuntime(sessions, sandbox, TilingService(sessions, sandbox, settings), settings)
        host = runtime.tiling.hardware.resolve(HOST_CPU)
        _warm_up(runtime, host)
        queues = [*(queues or [SEARCH_QUEUE, measure_queue(this_host())]), MAINTENANCE_QUEUE]
        log.info("worker: queues %s; %d at once", ", ".join(queues), concurrency)
        app = make_queue_app(runtime.database_url, stalled_after_s=settings.job_stalled_after_s)
        run_worker(runtime, app, queues=queues, concurrency=concurrency)
    finally:
        if runtime.tiling is not None:
            runtime.tiling.close()
        sandbox.close()
        engine.dispose()

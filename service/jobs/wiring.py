"""How a process hosts jobs: on SQLite the embedded runner runs items in this process; on
PostgreSQL items go to procrastinate and `tilesearch worker` processes run them."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.ir.sandbox import Sandbox
from service.store.db import make_engine, make_sessionmaker
from service.tiling.hardware import this_host
from service.tiling.service import TilingService

from .embedded import EmbeddedDispatcher, EmbeddedRunner
from .queue import MAINTENANCE_QUEUE, SEARCH_QUEUE, QueueDispatcher, make_queue_app, measure_queue, run_worker
from .run import JobRuntime
from .service import JobService


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


class NeedsPostgreSQL(Exception):
    pass


def serve_worker(settings: Settings, concurrency: int, queues: list[str] | None) -> None:
    """`tilesearch worker`: run items from procrastinate until SIGTERM / SIGINT (then running
    items finish within `job_shutdown_grace_s`, or are released to the queue)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine = make_engine(settings.database_url)
    sandbox = Sandbox(concurrency, start_method="forkserver")
    try:
        runtime = JobRuntime(make_sessionmaker(engine), sandbox, None, settings)  # type: ignore[arg-type]
        if not is_postgresql(runtime):
            raise NeedsPostgreSQL("tilesearch worker needs PostgreSQL (DATABASE_URL=postgresql+psycopg://...); "
                                  "on SQLite, `tilesearch serve` runs jobs itself")
        runtime.tiling = TilingService(runtime.sessions, sandbox, settings)
        queues = [*(queues or [SEARCH_QUEUE, measure_queue(this_host())]), MAINTENANCE_QUEUE]
        logging.getLogger("tilesearch.jobs").info("worker: queues %s; %d at once", ", ".join(queues), concurrency)
        app = make_queue_app(runtime.database_url, stalled_after_s=settings.job_stalled_after_s)
        run_worker(runtime, app, queues=queues, concurrency=concurrency)
    finally:
        if runtime.tiling is not None:
            runtime.tiling.close()
        sandbox.close()
        engine.dispose()

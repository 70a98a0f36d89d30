"""The embedded runner: `tilesearch serve` on SQLite runs job items in-process, so a job
submitted to `make run`'s server completes with no other process.

It is not a queue engine. procrastinate needs PostgreSQL; on SQLite there is one process, so
this is a thread that takes the oldest queued item (under a lock: the only contention is
between its own threads) and runs the same task a procrastinate worker runs
(`service.jobs.run.run_item`) over the same tables. Items left running by a previous process
are queued again at start. For several processes or hosts, use PostgreSQL and `tilesearch worker`.
"""

from __future__ import annotations

import logging
import threading

from service.store import jobs
from service.store.db import session_scope
from service.store.migrate import NOT_MIGRATED, schema_missing

from .run import JobRuntime, begin_item, execute

log = logging.getLogger("tilesearch.jobs")


class EmbeddedRunner:
    def __init__(self, runtime: JobRuntime, threads: int = 1) -> None:
        self.runtime = runtime
        self._threads = [threading.Thread(target=self._loop, daemon=True, name=f"jobs-embedded-{i}")
                         for i in range(threads)]
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._take = threading.Lock()
        self._recovered = False
        self._problem: str | None = None

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Running items are released (queued again, their trials kept) and the threads end."""
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                ran = self._run_next()
                self._problem = None
            except Exception as exc:  # the database is away or not migrated yet: keep the server up, retry
                problem = NOT_MIGRATED if schema_missing(exc) else f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                if problem != self._problem:  # once, not each second
                    log.warning("embedded runner: no item run (retrying each second): %s", problem)
                self._problem, ran = problem, False
            if not ran:
                self._wake.wait(1.0)
                self._wake.clear()

    def _run_next(self) -> bool:
        with self._take:
            with session_scope(self.runtime.sessions) as session:
                if not self._recovered:  # in the thread: the server starts even before `db upgrade`
                    if requeued := jobs.requeue_running(session):
                        log.info("embedded runner: %d items a previous process left running are queued again", requeued)
                    self._recovered = True
                item_id = jobs.next_queued_item(session)
            run = begin_item(self.runtime, item_id) if item_id is not None else None
        if item_id is None:
            return False
        if run is not None:
            execute(self.runtime, run, lambda: "release" if self._stopping.is_set() else None)
        return True


class EmbeddedDispatcher:
    """Submitting side on SQLite: queued rows are the queue; the runner is woken."""

    def __init__(self, runner: EmbeddedRunner) -> None:
        self.runner = runner

    def enqueue(self, items: list[tuple[int, str]]) -> None:
        self.runner.wake()

    def abort(self, queue_job_ids: list[int]) -> None:
        """Nothing to do: running items see their `stop` column (set by the cancel itself)."""

"""Jobs on PostgreSQL with real `tilesearch worker` and `tilesearch serve` processes.

Each test gets a database of its own (procrastinate's LISTEN/NOTIFY channels are per database)
migrated to head, and starts its processes as a user would, with PYTHONPATH set to this tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, func, select, text
from sqlalchemy.pool import NullPool

from service.store import migrate
from service.store.db import make_engine, make_sessionmaker
from service.store.models import Decision, ItemState, JobItem, Trial

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
TILESEARCH = [str(Path(sys.executable).with_name("tilesearch"))]  # the console script, as a user runs it
# Fast failure detection for the tests: heartbeats each second, a dead worker's jobs re-queued
# after 6 s without one, a decision lease of 10 s past the last trial.
FAST = {"TILESEARCH_JOB_HEARTBEAT_S": "1", "TILESEARCH_JOB_STALLED_AFTER_S": "6", "TILESEARCH_JOB_LEASE_S": "10",
        "TILESEARCH_JOB_SHUTDOWN_GRACE_S": "60"}


def matmul(m: int, n: int, k: int) -> str:
    return f"""func.func @mm(%a: tensor<{m}x{k}xf32>, %b: tensor<{k}x{n}xf32>, %c: tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32> {{
  %0 = linalg.matmul ins(%a, %b : tensor<{m}x{k}xf32>, tensor<{k}x{n}xf32>) outs(%c : tensor<{m}x{n}xf32>) -> tensor<{m}x{n}xf32>
  return %0 : tensor<{m}x{n}xf32>
}}"""


def slow_module() -> str:
    """A module whose search at a budget of thousands takes many seconds (trials come in batches)."""
    return (Path(os.environ.get("TILESEARCH_SHARED", ROOT.parent / "shared")) / "workloads" / "mlp_chain.mlir").read_text()


@pytest.fixture
def pg_url_empty(pg_admin_engine: Engine) -> Iterator[str]:
    """A PostgreSQL database of its own, not migrated."""
    name = f"tilesearch_jobs_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_engine.execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    yield pg_admin_engine.url.set(database=name).render_as_string(hide_password=False)
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))


@pytest.fixture
def pg_url(pg_url_empty: str) -> str:
    migrate.upgrade(pg_url_empty)
    return pg_url_empty


class Processes:
    """Processes of one test, each in its own session (its sandbox children die with it at the end)."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url, self.tmp, self.procs = url, tmp, []

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": self.url, **FAST, **extra}

    def start(self, *args: str, **env: str) -> subprocess.Popen:
        log = open(self.tmp / f"{args[0]}-{len(self.procs)}.log", "w")
        proc = subprocess.Popen([*TILESEARCH, *args], cwd=self.tmp, env=self.env(**env), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def worker(self, *args: str) -> subprocess.Popen:
        return self.start("worker", *args)

    def serve(self, port: int) -> subprocess.Popen:
        proc = self.start("serve", "--port", str(port))
        wait_for(lambda: _answers(port), 60, "the server to answer")
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


@pytest.fixture
def procs(pg_url: str, tmp_path: Path) -> Iterator[Processes]:
    p = Processes(pg_url, tmp_path)
    yield p
    p.stop_all()


@pytest.fixture
def db(pg_url: str):
    engine = make_engine(pg_url, poolclass=NullPool)
    yield make_sessionmaker(engine)
    engine.dispose()


def wait_for(condition: Callable[[], object], timeout: float, what: str, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def submit(port: int, body: dict) -> int:
    response = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", json=body, timeout=60)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def job(port: int, job_id: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/v1/jobs/{job_id}", timeout=30).json()


def finished(port: int, job_id: int) -> dict | None:
    body = job(port, job_id)
    return body if body["state"] in ("succeeded", "failed", "cancelled") else None


def items_of(db, job_id: int) -> list[JobItem]:
    with db() as session:
        return list(session.scalars(select(JobItem).where(JobItem.job_id == job_id).order_by(JobItem.position)))


def trial_numbers(db, decision_id: int) -> dict[int, str]:
    with db() as session:
        return dict(session.execute(select(Trial.number, Trial.plan_hash).where(Trial.decision_id == decision_id)).all())


def running_item(db, job_id: int, min_trials: int = 1) -> JobItem | None:
    return next((i for i in items_of(db, job_id) if i.state == ItemState.RUNNING and i.trials >= min_trials), None)


def worker_pid(item: JobItem) -> int:
    return int(item.run_owner.split(":")[1])  # the tiling service's owner: host:pid:nonce


# ---------------------------------------------------------------------------------------------


def test_three_workers_drain_a_job_every_item_once_and_a_broken_item_fails_alone(procs, db) -> None:
    for _ in range(3):
        procs.worker()
    procs.serve(8781)
    items = [{"name": f"mm{i}", "module": matmul(16 + 4 * i, 32, 24)} for i in range(30)]
    items.insert(7, {"name": "broken", "module": "func.func @x( {"})
    job_id = submit(8781, {"items": items, "hardware": "host-cpu", "budget": 10})
    body = wait_for(lambda: finished(8781, job_id), 240, "the job to finish", every=1)

    assert body["state"] == "failed"  # one item failed; the job still finished
    assert body["items"] == {"total": 31, "queued": 0, "running": 0, "done": 30, "failed": 1, "cancelled": 0}
    rows = items_of(db, job_id)
    broken = rows[7]
    assert broken.state == ItemState.FAILED and "does not parse" in broken.error and "1:14" in broken.error
    done = [r for r in rows if r.state == ItemState.DONE]
    assert all(r.attempts == 1 for r in done)  # each run exactly once
    assert len({r.decision_id for r in done}) == 30
    with db() as session:
        owners = {r.split(":")[1] for r in session.scalars(select(Decision.lease_owner)) if r}
        assert owners == set()  # no lease left behind
        assert session.scalar(select(func.count()).select_from(Decision).where(Decision.status == "done")) == 30
    # Three workers took part (each item's first run is in the worker logs).
    served = [p for p in procs.tmp.glob("worker-*.log") if "run_item" in p.read_text()]
    assert len(served) == 3
    # A finished item is an ordinary decision: the same module through REST is a hit.
    hit = httpx.post("http://127.0.0.1:8781/v1/tilings", json={"module": items[0]["module"], "hardware": "host-cpu",
                                                               "budget": 10}, timeout=60).json()
    assert hit["cache"] == "hit" and hit["id"] == done[0].decision_id


def test_kill_9_mid_item_finishes_on_another_worker_and_keeps_the_trials(procs, db) -> None:
    first = procs.worker()
    procs.serve(8782)
    job_id = submit(8782, {"items": [{"name": "slow", "module": slow_module()}], "hardware": "host-cpu",
                           "budget": 2000, "seconds": 30})
    item = wait_for(lambda: running_item(db, job_id, min_trials=20), 120, "trials of the running item")
    assert worker_pid(item) == first.pid
    os.kill(first.pid, signal.SIGKILL)  # the worker only: its sandbox children are orphaned
    time.sleep(1.5)
    kept = trial_numbers(db, item.decision_id)
    assert len(kept) >= 20
    procs.worker()
    body = wait_for(lambda: finished(8782, job_id), 240, "the job to finish on the second worker", every=1)
    assert body["state"] == "succeeded"
    (row,) = items_of(db, job_id)
    assert row.attempts == 2 and row.decision_id == item.decision_id
    after = trial_numbers(db, item.decision_id)
    # Every trial the dead worker stored is still there, unchanged; the new run numbered after them.
    assert all(after[n] == h for n, h in kept.items())
    assert len(after) > len(kept) and row.trials == len(after)


def test_cancel_stops_running_items_within_seconds_and_keeps_finished_ones(procs, db) -> None:
    procs.worker("--concurrency", "2")
    procs.serve(8783)
    items = [{"name": "quick", "module": matmul(16, 16, 16)}] + [
        {"name": f"slow{i}", "module": slow_module().replace("@", f"@s{i}_")} for i in range(4)]
    job_id = submit(8783, {"items": items, "hardware": "host-cpu", "budget": 2000, "seconds": 120})
    wait_for(lambda: running_item(db, job_id, min_trials=10), 120, "a slow item with trials")
    cancelled = httpx.post(f"http://127.0.0.1:8783/v1/jobs/{job_id}/cancel", timeout=30).json()
    assert cancelled["items"]["queued"] == 0
    time.sleep(4)
    with db() as session:
        before = session.scalar(select(func.count()).select_from(Trial))
    time.sleep(4)
    with db() as session:
        assert session.scalar(select(func.count()).select_from(Trial)) == before  # no new trials
    body = wait_for(lambda: finished(8783, job_id), 30, "the job to end")
    assert body["state"] == "cancelled"
    states = {r.name: r.state for r in items_of(db, job_id)}
    assert ItemState.RUNNING not in states.values() and ItemState.QUEUED not in states.values()
    assert states["quick"] in (ItemState.DONE, ItemState.CANCELLED)


def test_sigterm_finishes_or_releases_the_item_and_restarting_the_api_loses_nothing(procs, db) -> None:
    worker = procs.worker()
    api = procs.serve(8784)
    items = [{"name": f"mm{i}", "module": matmul(24 + 4 * i, 48, 32)} for i in range(6)]
    items.insert(0, {"name": "slow", "module": slow_module()})
    job_id = submit(8784, {"items": items, "hardware": "host-cpu", "budget": 2000, "seconds": 10})
    wait_for(lambda: running_item(db, job_id, min_trials=5), 120, "the first item running")
    # The API goes away mid-job and comes back: the job lives in the database and the queue.
    os.killpg(api.pid, signal.SIGKILL)
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=90)  # it stops after finishing (or releasing) its item; a hang fails here
    states = {r.name: r.state for r in items_of(db, job_id)}
    assert states["slow"] in (ItemState.DONE, ItemState.QUEUED)  # finished, or released: never stuck running
    procs.serve(8785)
    procs.worker()
    body = wait_for(lambda: finished(8785, job_id), 240, "the job to finish after the restarts", every=1)
    assert body["state"] == "succeeded" and body["items"]["done"] == 7


def _descendant_depths(root: int) -> dict[int, int]:
    """Live descendants of `root` and how many generations below it each is."""
    parents = {}
    for p in Path("/proc").iterdir():
        try:
            stat = (p / "stat").read_text() if p.name.isdigit() else ""
        except OSError:
            continue
        if stat and stat.rsplit(")", 1)[1].split()[0] != "Z":
            parents[int(p.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    depths = {}
    for pid in parents:
        depth, up = 0, pid
        while up in parents and up != root and depth < 20:
            up, depth = parents[up], depth + 1
        if up == root and pid != root:
            depths[pid] = depth
    return depths


def test_an_idle_worker_has_started_its_search_and_evaluation_processes(procs) -> None:
    # worker -> forkserver -> sandbox process -> forkserver -> evaluation process: started at the
    # worker's start (and IREE's host probe compiled), not in the first item's time.
    worker = procs.worker()
    wait_for(lambda: max(_descendant_depths(worker.pid).values(), default=0) >= 4, 60,
             "the worker's evaluation process, with no item submitted")

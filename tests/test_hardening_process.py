"""Issue #22 with real `tilesearch serve` processes: a SIGKILLed owner leaves no MLIR workers
behind and its key is taken over within seconds by another server; probes and reads answer
while 50 requests wait on one search."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from _shared import workload

TILESEARCH = str(Path(sys.executable).with_name("tilesearch"))
MATMUL = workload("matmul_1024")
LEASE_S = 3.0
# A search that runs for its whole time limit.
LONG_SEARCH = {"module": MATMUL, "hardware": "host-cpu", "budget": 5000, "seconds": 8}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([TILESEARCH, "serve", "--port", str(port), "--log-level", "warning"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert proc.poll() is None, "serve exited"
        try:
            if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "serve did not become ready in 90 s"
        time.sleep(0.3)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=30)


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def _descendants(pid: int) -> set[int]:
    children, found, todo = _children(), set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
           "TILESEARCH_HARDWARE_DIR": str(tmp_path / "hardware"), "TILESEARCH_POOL_WORKERS": "1",
           "TILESEARCH_LEASE_S": str(LEASE_S)}
    subprocess.run([TILESEARCH, "db", "upgrade"], env=env, check=True, capture_output=True)
    yield env


def _decision_row(url: str) -> dict | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            row = conn.execute(text("SELECT status, lease_owner FROM decisions ORDER BY id LIMIT 1")).mappings().first()
            return dict(row) if row else None
    finally:
        engine.dispose()


def _post_in_background(base: str, body: dict, results: list) -> threading.Thread:
    def post() -> None:
        try:
            results.append(httpx.post(f"{base}/v1/tilings", json=body, timeout=180))
        except httpx.HTTPError as exc:
            results.append(exc)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread


def test_sigkilled_owner_leaves_no_workers_and_its_key_is_taken_over(env: dict[str, str]) -> None:
    first, first_base = _start(env)
    second, second_base = _start(env)
    try:
        lost: list = []
        _post_in_background(first_base, LONG_SEARCH, lost)
        deadline = time.monotonic() + 30
        while (row := _decision_row(env["DATABASE_URL"])) is None or row["status"] != "pending":
            assert time.monotonic() < deadline, "the first server never claimed the decision"
            time.sleep(0.1)
        assert f":{first.pid}:" in row["lease_owner"]
        # Past one lease the owner still holds it: the heartbeat renews it while the search runs.
        time.sleep(LEASE_S + 1)
        assert f":{first.pid}:" in _decision_row(env["DATABASE_URL"])["lease_owner"]
        workers = _descendants(first.pid)
        assert workers, "the first server runs MLIR worker processes"

        answered: list = []
        waiter = _post_in_background(second_base, LONG_SEARCH, answered)
        time.sleep(0.5)  # the second server's request now waits on the first's lease
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed_at = time.monotonic()

        while any(_alive(pid) for pid in workers):
            assert time.monotonic() - killed_at < 5, f"orphaned workers: {[p for p in workers if _alive(p)]}"
            time.sleep(0.1)

        while f":{second.pid}:" not in (_decision_row(env["DATABASE_URL"])["lease_owner"] or ""):
            assert time.monotonic() - killed_at < LEASE_S + 5, "the second server did not take the key over"
            time.sleep(0.1)
        waiter.join(timeout=120)
        assert answered and isinstance(answered[0], httpx.Response), answered
        assert answered[0].status_code == 200 and answered[0].json()["status"] == "done"
    finally:
        _stop(first)
        _stop(second)


def test_probes_and_reads_answer_while_50_requests_wait_on_one_search(env: dict[str, str]) -> None:
    server, base = _start(env)
    try:
        results: list = []
        threads = [_post_in_background(base, LONG_SEARCH, results)]
        time.sleep(0.5)
        threads += [_post_in_background(base, LONG_SEARCH, results) for _ in range(50)]
        time.sleep(1.5)  # all 51 are in: one searching, fifty waiting for it
        assert len(results) == 0
        slowest = 0.0
        with httpx.Client(base_url=base, timeout=30) as client:
            for _ in range(5):
                for path in ("/healthz", "/readyz", "/metrics", "/v1/tilings", "/v1/hardware"):
                    t0 = time.perf_counter()
                    assert client.get(path).status_code == 200, path
                    slowest = max(slowest, time.perf_counter() - t0)
        assert len(results) == 0, "the search ended before the probes were measured"
        assert slowest < 1.0, f"a probe or read took {slowest:.2f} s behind waiting requests"
        for thread in threads:
            thread.join(timeout=120)
        assert [getattr(r, "status_code", r) for r in results] == [200] * 51
    finally:
        _stop(server)

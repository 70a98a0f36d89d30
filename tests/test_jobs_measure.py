"""Job items that measure (measure_top), run by a real `tilesearch worker` on PostgreSQL: the
measured item completes with its measurements stored, and cancelling it while IREE compiles and
times its plans stops it within seconds (the IREE tool is killed, not waited for).

host-cpu is conftest's pinned reference host (AVX-512), and IREE compiles for this CPU: these
tests need an AVX-512 CPU, as tests/test_measure_top.py does."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from service.store.models import ItemState, Measurement
from test_jobs_workers import db, finished, items_of, pg_url, pg_url_empty, procs, submit, wait_for  # noqa: F401
from _shared import MATMUL_64X96X80, needs_avx512

pytestmark = [pytest.mark.postgres, pytest.mark.slow, needs_avx512]


def _stat(pid: int) -> tuple[str, int] | None:
    """(command name, parent pid) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return None if state == "Z" else (comm, int(ppid))


def iree_tools_under(ancestor: int) -> list[int]:
    """Live IREE tool processes descending from `ancestor` (a worker: its sandbox runs them)."""
    procs = {int(p.name): s for p in Path("/proc").iterdir() if p.name.isdigit() and (s := _stat(int(p.name)))}
    found = []
    for pid, (comm, ppid) in procs.items():
        if not comm.startswith("iree-"):
            continue
        while ppid > 1 and ppid != ancestor:
            ppid = procs.get(ppid, ("", 0))[1]
        if ppid == ancestor:
            found.append(pid)
    return found


def _measurements(db, decision_id: int) -> list[Measurement]:
    with db() as session:
        return list(session.scalars(select(Measurement).where(Measurement.decision_id == decision_id)))


def test_a_measuring_item_completes_on_a_worker_with_its_measurements_stored(procs, db) -> None:
    procs.worker()
    procs.serve(8786)
    job_id = submit(8786, {"items": [{"name": "mm", "module": MATMUL_64X96X80}], "hardware": "host-cpu", "budget": 8,
                           "measure_top": 2})
    body = wait_for(lambda: finished(8786, job_id), 300, "the measured item to finish", every=1)
    assert body["state"] == "succeeded", body
    (item,) = items_of(db, job_id)
    rows = _measurements(db, item.decision_id)
    assert sorted(r.config["role"] for r in rows) == ["candidate", "candidate", "default"]
    assert all(r.ok and r.median_s > 0 for r in rows)
    decision = httpx.get(f"http://127.0.0.1:8786/v1/tilings/{item.decision_id}", timeout=30).json()
    assert decision["search_stats"]["chosen_by"] == "measured"


def test_cancel_while_iree_measures_stops_the_item_within_seconds(procs, db) -> None:
    worker = procs.worker()
    procs.serve(8787)
    job_id = submit(8787, {"items": [{"name": "mm", "module": MATMUL_64X96X80}], "hardware": "host-cpu", "budget": 8,
                           "measure_top": 4})
    wait_for(lambda: iree_tools_under(worker.pid), 300, "IREE to compile or time the item's plans", every=0.1)
    t0 = time.monotonic()
    cancelled = httpx.post(f"http://127.0.0.1:8787/v1/jobs/{job_id}/cancel", timeout=30)
    assert cancelled.status_code == 200
    # Measuring 4 plans and IREE's default takes far longer than this here (5 compiles, 25 timed runs).
    wait_for(lambda: items_of(db, job_id)[0].state == ItemState.CANCELLED, 6, "the item to be cancelled", every=0.1)
    assert iree_tools_under(worker.pid) == []  # the running tool was killed, not left to finish
    stopped_after = time.monotonic() - t0
    body = wait_for(lambda: finished(8787, job_id), 10, "the job to end")
    assert body["state"] == "cancelled"
    (item,) = items_of(db, job_id)
    assert _measurements(db, item.decision_id) == []  # nothing half-measured stored
    assert stopped_after < 6
    # The worker is free again: the next item runs.
    again = submit(8787, {"items": [{"name": "quick", "module": MATMUL_64X96X80.replace("@mm", "@mm2")}],
                          "hardware": "host-cpu", "budget": 4})
    assert wait_for(lambda: finished(8787, again), 120, "the next job")["state"] == "succeeded"

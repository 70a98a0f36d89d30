"""The embedded default: `tilesearch serve` on SQLite runs a job with no other process."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from _shared import needs_avx512
from test_jobs_workers import TILESEARCH, Processes, matmul, slow_module, wait_for

pytestmark = pytest.mark.slow
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@needs_avx512  # real IREE on this CPU against the pinned AVX-512 profile's configs
def test_embedded_server_completes_a_job_end_to_end(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tilesearch.db'}"
    procs = Processes(url, tmp_path)
    try:
        subprocess.run([*TILESEARCH, "db", "upgrade"], env=procs.env(), check=True, capture_output=True, timeout=120)
        procs.start("serve", "--port", "8795", TILESEARCH_API_TOKEN=TOKEN)
        wait_for(lambda: _up(8795), 60, "the server")
        base = "http://127.0.0.1:8795"
        # Shapes whose searches beat IREE's default by prediction at this budget (on small or square
        # ones the guard leaves IREE its own config, and the merged spec would have no matcher for them).
        shapes = [(100, 100, 100), (100, 100, 36), (44, 100, 100)]
        items = [{"name": f"mm{i}", "module": matmul(m, n, k)} for i, (m, n, k) in enumerate(shapes)]
        items.append({"name": "broken", "module": "func.func @x( {"})
        body = {"items": items, "hardware": "host-cpu", "budget": 10}
        assert httpx.post(f"{base}/v1/jobs", json=body).status_code == 401  # writes need the token
        accepted = httpx.post(f"{base}/v1/jobs", json=body, headers=AUTH)
        assert accepted.status_code == 202 and accepted.json()["state"] == "queued"
        job_id = accepted.json()["id"]
        assert httpx.get(f"{base}/v1/jobs/{job_id}").status_code == 401  # so do reads: they carry the modules
        done = wait_for(lambda: _finished(base, job_id), 120, "the job to finish")
        assert done["state"] == "failed"
        assert done["items"] == {"total": 4, "queued": 0, "running": 0, "done": 3, "failed": 1, "cancelled": 0}
        broken = next(i for i in done["items_detail"] if i["name"] == "broken")
        assert "does not parse" in broken["error"]
        # `job watch` says which items failed and why, not only how many (a helper's trial)
        watch = subprocess.run([*TILESEARCH, "job", "watch", str(job_id), "--server", base, "--token", TOKEN],
                               capture_output=True, text=True, timeout=60)
        assert watch.returncode == 1 and f"failed: broken: {broken['error']}" in watch.stderr
        spec = httpx.get(f"{base}/v1/jobs/{job_id}/spec", headers=AUTH)
        assert spec.status_code == 200 and spec.text.count("transform.iree.match.contraction") == 3
        hit = httpx.post(f"{base}/v1/tilings", headers=AUTH, timeout=60,
                         json={"module": items[1]["module"], "hardware": "host-cpu", "budget": 10}).json()
        assert hit["cache"] == "hit"
        assert httpx.get(f"{base}/v1/jobs/999", headers=AUTH).status_code == 404
        bad = httpx.post(f"{base}/v1/jobs", headers=AUTH, json={"hardware": "host-cpu"})
        assert bad.status_code == 422 and "exactly one" in bad.text

        # Small matmuls whose decisions keep IREE's own config: the finished job needs no spec,
        # and says why per item; `job spec` is a note and exit 0, and an older file is removed.
        small = [{"name": f"small{i}", "module": matmul(m, n, k)} for i, (m, n, k) in enumerate([(24, 32, 24), (32, 32, 32)])]
        kept_id = httpx.post(f"{base}/v1/jobs", json={"items": small, "hardware": "host-cpu", "budget": 10},
                             headers=AUTH).json()["id"]
        assert wait_for(lambda: _finished(base, kept_id), 120, "the second job to finish")["state"] == "succeeded"
        none = httpx.get(f"{base}/v1/jobs/{kept_id}/spec", headers=AUTH)
        assert none.status_code == 404 and none.json()["detail"]["error"] == "NoSpec"
        assert none.json()["detail"]["message"].count("IREE's default predicted as fast") == 2
        stale = tmp_path / "job_spec.mlir"
        stale.write_text("// an older spec")
        cli = subprocess.run([*TILESEARCH, "job", "spec", str(kept_id), "-o", str(stale), "--server", base,
                              "--token", TOKEN], capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0, cli.stderr
        assert not stale.exists() and "note: no tuning spec written to" in cli.stderr

        # A finished job keeps the state it ended in (cancel turned a succeeded job "cancelled").
        again = httpx.post(f"{base}/v1/jobs/{kept_id}/cancel", headers=AUTH)
        assert again.status_code == 409 and again.json()["detail"]["error"] == "JobFinished"
        assert httpx.get(f"{base}/v1/jobs/{kept_id}", headers=AUTH).json()["state"] == "succeeded"
        # Fields as strict as a tiling request's, and measure_top for another machine refused at submit.
        for field, value in (("budget", "5"), ("budget", 1.0), ("budget", True), ("seed", 2.0), ("measure_top", False)):
            lax = httpx.post(f"{base}/v1/jobs", headers=AUTH, json={"items": small, "hardware": "host-cpu", field: value})
            assert lax.status_code == 422, (field, value, lax.text)
        elsewhere = httpx.post(f"{base}/v1/jobs", headers=AUTH,
                               json={"items": small, "hardware": "gpu-h100", "measure_top": 2})
        assert elsewhere.status_code == 422 and "measure_top times plans with IREE" in elsewhere.text
        # A GPU job's items have no spec, and neither has the job (it merged #iree_cpu configs from their plans).
        gpu_id = httpx.post(f"{base}/v1/jobs", headers=AUTH, json={"items": small[:1], "hardware": "gpu-h100",
                                                                     "budget": 4}).json()["id"]
        assert wait_for(lambda: _finished(base, gpu_id), 120, "the GPU job to finish")["state"] == "succeeded"
        gpu_spec = httpx.get(f"{base}/v1/jobs/{gpu_id}/spec", headers=AUTH)
        assert gpu_spec.status_code == 404 and "gpu-h100, which is not a CPU profile" in gpu_spec.text
        # Cancelled before any item finished: no spec, and none to wait for (it said 409 NoSpecYet).
        slow = [{"name": "slow", "module": slow_module()}]
        slow_id = httpx.post(f"{base}/v1/jobs", headers=AUTH, json={"items": slow, "hardware": "host-cpu",
                                                                      "budget": 2000, "seconds": 120}).json()["id"]
        assert httpx.post(f"{base}/v1/jobs/{slow_id}/cancel", headers=AUTH).status_code == 200
        assert wait_for(lambda: _finished(base, slow_id), 60, "the cancelled job to end")["state"] == "cancelled"
        never = httpx.get(f"{base}/v1/jobs/{slow_id}/spec", headers=AUTH)
        assert never.status_code == 404 and "cancelled before any item finished" in never.json()["detail"]["message"]
    finally:
        procs.stop_all()


def test_embedded_server_restarted_mid_item_requeues_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tilesearch.db'}"
    procs = Processes(url, tmp_path)
    try:
        subprocess.run([*TILESEARCH, "db", "upgrade"], env=procs.env(), check=True, capture_output=True, timeout=120)
        server = procs.start("serve", "--port", "8796")
        wait_for(lambda: _up(8796), 60, "the server")
        base = "http://127.0.0.1:8796"
        job_id = httpx.post(f"{base}/v1/jobs", json={"items": [{"name": "slow", "module": slow_module()}],
                                                    "hardware": "host-cpu", "budget": 300, "seconds": 30}).json()["id"]
        wait_for(lambda: httpx.get(f"{base}/v1/jobs/{job_id}").json()["trials"] > 0, 60, "trials")
        server.send_signal(signal.SIGKILL)
        server.wait()
        procs.start("serve", "--port", "8797")
        wait_for(lambda: _up(8797), 60, "the restarted server")
        done = wait_for(lambda: _finished("http://127.0.0.1:8797", job_id), 120, "the job to finish")
        assert done["state"] == "succeeded" and done["items_detail"][0]["attempts"] == 2
    finally:
        procs.stop_all()


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _finished(base: str, job_id: int) -> dict | None:
    body = httpx.get(f"{base}/v1/jobs/{job_id}", headers=AUTH, timeout=30).json()
    return body if body["state"] in ("succeeded", "failed", "cancelled") else None

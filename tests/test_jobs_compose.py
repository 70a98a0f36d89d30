"""docker-compose.yml: its services are what the README says, and their commands, run as local
processes against the test PostgreSQL (docker is not needed), serve and run a job."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from test_jobs_workers import ROOT, TILESEARCH, Processes, finished, matmul, pg_url_empty, submit, wait_for  # noqa: F401 (fixture)

COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_services() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"postgres", "migrate", "api", "worker"}
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["migrate"]["restart"] == "no"  # one shot
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "ports" not in services["worker"]  # workers scale: nothing to bind


def _local(command: list[str], **replace: str) -> list[str]:
    assert command[0] == "tilesearch"
    return [replace.get(arg, arg) for arg in command[1:]]


@pytest.mark.postgres
@pytest.mark.slow
def test_compose_commands_run_as_local_processes(pg_url_empty: str, tmp_path: Path) -> None:
    services = COMPOSE["services"]
    procs = Processes(pg_url_empty, tmp_path)
    try:
        migrate = subprocess.run([*TILESEARCH, *_local(services["migrate"]["command"])], env=procs.env(),
                                 capture_output=True, text=True, timeout=120)
        assert migrate.returncode == 0, migrate.stderr
        procs.start(*_local(services["api"]["command"], **{"0.0.0.0": "127.0.0.1", "8000": "8791"}))
        wait_for(lambda: _ready(8791), 60, "the api's readiness")
        procs.start(*_local(services["worker"]["command"]))
        procs.start(*_local(services["worker"]["command"]))  # --scale worker=2
        items = [{"name": f"mm{i}", "module": matmul(16 + 8 * i, 32, 16)} for i in range(4)]
        job_id = submit(8791, {"items": items, "hardware": "host-cpu", "budget": 8})
        body = wait_for(lambda: finished(8791, job_id), 120, "the job to finish", every=1)
        assert body["state"] == "succeeded"
    finally:
        procs.stop_all()


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False

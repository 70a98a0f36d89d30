"""A database left unmigrated is the operator's missing step, and says so: the API answers 503
"database not migrated: run `tilesearch db upgrade`" (never a 500), on SQLite and PostgreSQL,
whether none of the schema is there or only procrastinate's queue is missing; `tilesearch
worker` refuses to start with the same words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.pool import NullPool

from service.api.app import create_app
from service.config import Settings
from service.store import migrate
from service.store.db import make_engine

ROOT = Path(__file__).resolve().parents[1]
TILESEARCH = str(Path(sys.executable).with_name("tilesearch"))
JOB = {"items": [{"name": "mm", "module": "func.func @f() {\n  return\n}"}], "hardware": "host-cpu", "budget": 2}
NOT_MIGRATED = "database not migrated: run `tilesearch db upgrade`"


def _post_job(url: str) -> tuple[int, dict, int]:
    """POST /v1/jobs's status and body, and GET /v1/jobs's status."""
    with TestClient(create_app(Settings(database_url=url, pool_workers=1)), raise_server_exceptions=False) as client:
        answer = client.post("/v1/jobs", json=JOB)
        return answer.status_code, answer.json(), client.get("/v1/jobs").status_code


def test_a_job_on_a_database_never_migrated_is_a_503_saying_what_to_run(database_url: str) -> None:
    status, body, listed = _post_job(database_url)
    assert status == listed == 503
    assert body["detail"] == {"error": "DatabaseNotMigrated", "message": NOT_MIGRATED}


def test_a_job_on_a_database_migrated_before_jobs_existed_is_a_503_too(database_url: str) -> None:
    migrate.upgrade(database_url, "0003_tuning_spec")
    status, body, listed = _post_job(database_url)
    assert status == listed == 503 and body["detail"]["message"] == NOT_MIGRATED


@pytest.mark.postgres
def test_a_job_when_only_procrastinates_queue_schema_is_missing_is_a_503(pg_admin_engine) -> None:
    schema = "test_noqueue_" + os.urandom(4).hex()
    with pg_admin_engine.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = pg_admin_engine.url.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False)
    try:
        migrate.upgrade(url)
        engine = make_engine(url, poolclass=NullPool)
        with engine.begin() as connection:
            connection.execute(text("DROP FUNCTION procrastinate_defer_jobs_v1"))
        engine.dispose()
        status, body, listed = _post_job(url)
        assert status == 503 and listed == 200
        assert body["detail"]["message"] == f"{NOT_MIGRATED} (procrastinate's queue schema is missing)"
    finally:
        with pg_admin_engine.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


def test_a_worker_refuses_to_start_on_a_database_not_migrated(database_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": database_url}
    proc = subprocess.run([TILESEARCH, "worker"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    if database_url.startswith("sqlite"):
        assert "needs PostgreSQL" in lines[0]
    else:
        assert lines[0].startswith(f"error: {NOT_MIGRATED} (database at revision none, code at ")

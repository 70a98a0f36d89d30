"""Migrations on SQLite and PostgreSQL: up, all the way down, up again; models == migrations."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.pool import NullPool
from typer.testing import CliRunner

from service.cli import app
from service.config import Settings, get_settings
from service.store import migrate
from service.store.db import (
    default_engine,
    dispose_default_engines,
    make_engine,
    sqlite_file_path,
)
from service.store.migrate import check_ready
from service.store.models import Base

TABLES = {"modules", "hardware_models", "decisions", "trials", "group_records"}


def tables_of(url: str) -> set[str]:
    engine = make_engine(url, poolclass=NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_up_down_up(database_url: str) -> None:
    (head,) = migrate.head_revisions()
    engine = make_engine(database_url, poolclass=NullPool)
    try:
        assert migrate.current(database_url) is None
        ready, detail = check_ready(engine)
        assert not ready and detail.startswith("database not migrated: run `tilesearch db upgrade` (database at revision none")

        migrate.upgrade(database_url)
        assert migrate.current(database_url) == head
        assert TABLES <= tables_of(database_url)
        assert check_ready(engine) == (True, f"ok (revision {head})")

        migrate.downgrade(database_url, "base")
        assert migrate.current(database_url) is None
        assert tables_of(database_url) - {"alembic_version"} == set()

        migrate.upgrade(database_url)
        assert migrate.current(database_url) == head
        assert TABLES <= tables_of(database_url)
    finally:
        engine.dispose()


def test_decisions_stored_before_the_cost_model_version_read_unrecorded(database_url: str) -> None:
    migrate.upgrade(database_url, "0001_initial")
    engine = make_engine(database_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO decisions (key, module_fingerprint, hardware_hash, search_space_version, objective, "
                "shape_bucket, provider_version, status, created_at, updated_at) VALUES ('k', 'fp', 'hw', 'space', "
                "'latency', 'static', 'iree', 'done', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"))
        migrate.upgrade(database_url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT cost_model_version FROM decisions WHERE key = 'k'")).scalar_one() == "unrecorded"
        migrate.downgrade(database_url, "0001_initial")
        assert "cost_model_version" not in {c["name"] for c in inspect(engine).get_columns("decisions")}
    finally:
        engine.dispose()


def test_hardware_rows_decisions_recorded_stop_shadowing_their_profile(database_url: str) -> None:
    """0006: rows under a built-in profile's name were recorded by decisions (not custom); rows
    under other names were stored by users and still shadow (custom)."""
    migrate.upgrade(database_url, "0005_decision_effort")
    engine = make_engine(database_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for h, name in (("h1", "host-cpu"), ("h2", "my-npu"), ("h3", "gpu-h100")):
                conn.execute(text("INSERT INTO hardware_models (hash, name, spec, created_at) "
                                  "VALUES (:h, :n, '{}', CURRENT_TIMESTAMP)"), {"h": h, "n": name})
        migrate.upgrade(database_url)
        with engine.connect() as conn:
            rows = dict(conn.execute(text("SELECT hash, custom FROM hardware_models")).all())
        assert {h: bool(c) for h, c in rows.items()} == {"h1": False, "h2": True, "h3": False}
    finally:
        engine.dispose()


def ours(obj, name, type_, reflected, compare_to) -> bool:
    """procrastinate's tables (applied from its SQL by migration 0004) are not our models."""
    table = obj if type_ == "table" else getattr(obj, "table", None)
    return not (getattr(table, "name", name) or "").startswith("procrastinate_")


def test_models_match_migrations(migrated_url: str) -> None:
    engine = make_engine(migrated_url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True, "include_object": ours})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_check_ready_unreachable() -> None:
    engine = make_engine(
        "postgresql+psycopg://nobody:x@127.0.0.1:1/none",
        poolclass=NullPool,
        connect_args={"connect_timeout": 1},
    )
    ready, detail = check_ready(engine)
    assert not ready and detail.startswith("database unreachable")


def test_cli_db_commands(database_url: str) -> None:
    runner = CliRunner()
    (head,) = migrate.head_revisions()

    result = runner.invoke(app, ["db", "current", "--url", database_url])
    assert result.exit_code == 1 and "base (empty)" in result.output

    result = runner.invoke(app, ["db", "upgrade", "--url", database_url])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["db", "current", "--url", database_url])
    assert result.exit_code == 0 and f"{head} (head)" in result.output

    result = runner.invoke(app, ["db", "downgrade", "base", "--url", database_url])
    assert result.exit_code == 0, result.output
    assert migrate.current(database_url) is None


def test_settings_database_url_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TILESEARCH_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    assert Settings().database_url == "sqlite:///var/tilesearch.db"
    monkeypatch.setenv("DATABASE_URL", "postgresql+psycopg://a@h/db")
    assert Settings().database_url == "postgresql+psycopg://a@h/db"
    monkeypatch.setenv("TILESEARCH_DATABASE_URL", "sqlite:///x.db")
    assert Settings().database_url == "sqlite:///x.db"
    monkeypatch.setenv("TILESEARCH_MAX_OPS", "7")
    assert Settings().max_ops == 7
    assert Settings().max_body_bytes == 8 * 1024 * 1024


def test_default_sqlite_file_is_created_under_working_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TILESEARCH_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    get_settings.cache_clear()
    try:
        migrate.upgrade()  # the default URL, relative to the working directory
        assert (tmp_path / "var" / "tilesearch.db").is_file()
        assert sqlite_file_path(get_settings().database_url) == Path("var/tilesearch.db")
        assert check_ready(default_engine())[0]
    finally:
        dispose_default_engines()
        get_settings.cache_clear()

"""Shared fixtures. Database ones run a test on SQLite and on PostgreSQL:

- ``database_url``: an empty database of its own (SQLite temp file, or a fresh PostgreSQL
  schema dropped afterwards), not migrated;
- ``migrated_url``: the same, migrated to head; ``engine`` / ``sessions`` on top of it.

PostgreSQL: ``TILESEARCH_TEST_PG_URL`` (default below; ``make test`` starts the server). If it
is unreachable those tests fail, unless ``TILESEARCH_SKIP_PG=1`` turns that into a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from _shared import reference_host

from service.config import Settings
from service.hardware.model import HardwareModel
from service.hardware.profiles import get_profile, save_profile
from service.ir.sandbox import Sandbox
from service.store import migrate
from service.store.db import make_engine, make_sessionmaker, normalize_url
from service.tiling.service import TilingService

DEFAULT_TEST_PG_URL = "postgresql+psycopg://postgres:postgres@127.0.0.1:5432/tilesearch_test"


@pytest.fixture(autouse=True, scope="session")
def _isolated_hardware_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Built-in profiles only, with `host-cpu` pinned to the reference host: a calibrated profile
    in ./var/hardware must not change results, and neither must the caches or vector width of
    the machine CI happens to run on (detection itself is tested on the real host and on fake
    sysfs trees). Set before any sandbox worker starts, so workers inherit it too."""
    previous = os.environ.get("TILESEARCH_HARDWARE_DIR")
    directory = tmp_path_factory.mktemp("hardware")
    save_profile(reference_host(), directory)
    os.environ["TILESEARCH_HARDWARE_DIR"] = str(directory)
    yield
    if previous is None:
        os.environ.pop("TILESEARCH_HARDWARE_DIR", None)
    else:
        os.environ["TILESEARCH_HARDWARE_DIR"] = previous


@pytest.fixture(scope="module")
def host() -> HardwareModel:
    """The `host-cpu` profile (pinned to the reference host above), for the search tests."""
    return get_profile("host-cpu")


@pytest.fixture(scope="session")
def pg_admin_engine() -> Iterator[Engine]:
    url = os.environ.get("TILESEARCH_TEST_PG_URL", DEFAULT_TEST_PG_URL)
    engine = make_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        engine.dispose()
        shown = normalize_url(url).render_as_string(hide_password=True)
        message = (
            f"PostgreSQL unreachable at {shown}: {type(exc).__name__}: {exc}\n"
            "Run `make test` (scripts/ensure-postgres.sh starts it), point "
            "TILESEARCH_TEST_PG_URL at a server, or set TILESEARCH_SKIP_PG=1 to skip these tests."
        )
        if os.environ.get("TILESEARCH_SKIP_PG") == "1":
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db') / 'tilesearch.db'}"
        return
    admin: Engine = request.getfixturevalue("pg_admin_engine")
    schema = f"test_{uuid.uuid4().hex[:12]}"
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    # Everything the URL opens (app, Alembic, its version table) lives in that schema.
    url = admin.url.update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


@pytest.fixture
def migrated_url(database_url: str) -> str:
    migrate.upgrade(database_url)
    return database_url


@pytest.fixture
def engine(migrated_url: str) -> Iterator[Engine]:
    # Room for the concurrency tests' threads, each with its own connection.
    engine = make_engine(migrated_url, pool_size=25, max_overflow=5)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_sessionmaker(engine)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    """Two MLIR worker processes for the tiling-service tests of one module."""
    with Sandbox(workers=2) as sb:
        yield sb


@pytest.fixture
def service(sessions: sessionmaker[Session], migrated_url: str, sandbox: Sandbox) -> TilingService:
    """A TilingService on the migrated test database (SQLite or PostgreSQL)."""
    return TilingService(sessions, sandbox, Settings(database_url=migrated_url, request_timeout_s=60))


"""Engines and sessions for the store: SQLite (default, one file, WAL) or PostgreSQL (psycopg 3).

One session per request or job: ``with session_scope(sessions) as session: ...`` commits on
success and rolls back on any exception.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from service.config import get_settings

# How long a SQLite writer waits for another writer's lock before failing ("database is locked").
SQLITE_BUSY_TIMEOUT_MS = 10_000


def normalize_url(url: str | URL) -> URL:
    """Parse ``url``; a bare ``postgresql://`` or ``postgres://`` selects psycopg 3."""
    if isinstance(url, str) and url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def sqlite_file_path(url: str | URL) -> Path | None:
    """The database file of a SQLite URL, or None (in-memory or not SQLite)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL: readers never block the writer, which the cache-hit path depends on.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # Durable enough under WAL (a power loss can lose the last commits, never corrupt).
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def make_engine(url: str | URL, **engine_kwargs: Any) -> Engine:
    """An engine for ``url``; extra keyword arguments go to ``sqlalchemy.create_engine``."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = sqlite_file_path(parsed)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        connect_args = dict(engine_kwargs.pop("connect_args", {}))
        # Connections move between threads through the pool; each is used by one at a time.
        connect_args.setdefault("check_same_thread", False)
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
        engine = create_engine(parsed, connect_args=connect_args, **engine_kwargs)
        event.listen(engine, "connect", _on_sqlite_connect)
        return engine
    if backend == "postgresql":
        engine_kwargs.setdefault("pool_pre_ping", True)
        return create_engine(parsed, **engine_kwargs)
    raise ValueError(f"unsupported database URL {parsed.render_as_string(hide_password=True)!r}: "
                     "use sqlite:///path or postgresql+psycopg://...")


def make_sessionmaker(engine: Engine | Connection) -> sessionmaker[Session]:
    # Rows returned by the repository are read after the session closes (serialization):
    # keep their loaded attributes instead of expiring them on commit.
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(sessions: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit if the block succeeds, roll back if it raises."""
    session = sessions()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


# One engine (one pool) per URL per process, shared by every request and job.
_default_engines: dict[str, tuple[Engine, sessionmaker[Session]]] = {}
_default_engines_lock = threading.Lock()


def _defaults_for(url: str) -> tuple[Engine, sessionmaker[Session]]:
    with _default_engines_lock:
        if url not in _default_engines:
            engine = make_engine(url)
            _default_engines[url] = (engine, make_sessionmaker(engine))
        return _default_engines[url]


def default_engine() -> Engine:
    """The process-wide engine for ``Settings.database_url``."""
    return _defaults_for(get_settings().database_url)[0]


def default_sessionmaker() -> sessionmaker[Session]:
    """Sessions on ``default_engine()``."""
    return _defaults_for(get_settings().database_url)[1]


def dispose_default_engines() -> None:
    """Close and forget the default engines (process shutdown, or after a settings change)."""
    with _default_engines_lock:
        engines = [engine for engine, _ in _default_engines.values()]
        _default_engines.clear()
    for engine in engines:
        engine.dispose()

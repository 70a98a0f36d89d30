"""Schema migrations through Alembic's command API (no subprocess), for the CLI and tests, and
the readiness check (database answers, schema at the migrations' head). The scripts live in
``migrations/`` at the repository root. Depends on ``db``, never the other way round.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from service.config import get_settings
from service.store.db import make_engine, normalize_url, sqlite_file_path

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"

NOT_MIGRATED = "database not migrated: run `tilesearch db upgrade`"
# PostgreSQL's "undefined" errors: a table, function (procrastinate's), column or schema the
# code expects is not there. SQLite has no codes: its messages say the same.
_UNDEFINED_SQLSTATES = frozenset({"42P01", "42883", "42703", "3F000"})
_SQLITE_UNDEFINED = ("no such table", "no such column", "no such function")


class DatabaseNotMigrated(Exception):
    """The database lacks the schema this code needs (never migrated, or behind the code)."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(NOT_MIGRATED + (f" ({detail})" if detail else ""))


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic config for our scripts; ``url=None`` means ``Settings.database_url``."""
    # No ini file: programmatic runs must not reconfigure the host process's logging.
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # Through attributes, not set_main_option: that one %-interpolates (URL-escaped passwords).
        config.attributes["url"] = normalize_url(url).render_as_string(hide_password=False)
    return config


def upgrade(url: str | URL | None = None, rev: str = "head") -> None:
    command.upgrade(alembic_config(url), rev)


def downgrade(url: str | URL | None, rev: str) -> None:
    """Downgrade to ``rev`` (a revision id, ``-1``, or ``base`` to drop every table)."""
    command.downgrade(alembic_config(url), rev)


@lru_cache(maxsize=1)
def head_revisions() -> frozenset[str]:
    """The latest revision(s) in ``migrations/`` (read once: readiness checks call this often)."""
    return frozenset(ScriptDirectory.from_config(alembic_config()).get_heads())


def current_revisions(connection: Connection) -> frozenset[str]:
    """The revisions the database on ``connection`` is at (empty: never migrated)."""
    return frozenset(MigrationContext.configure(connection).get_current_heads())


def current(url: str | URL | None = None) -> str | None:
    """The database's revision, or None for an empty (never migrated) database."""
    if url is None:
        url = get_settings().database_url
    engine = make_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            revisions = current_revisions(connection)
    finally:
        engine.dispose()
    if len(revisions) > 1:
        raise RuntimeError(f"database has several heads: {sorted(revisions)}")
    return next(iter(revisions), None)


def check_ready(engine: Engine) -> tuple[bool, str]:
    """Whether the database answers and its schema is at the migrations' head, and why not."""
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
            current = current_revisions(connection)
    except Exception as exc:  # any driver error means "not ready", with its message
        return False, f"database unreachable: {type(exc).__name__}: {exc}".strip()
    heads = head_revisions()
    if current != heads:
        have = ", ".join(sorted(current)) or "none"
        want = ", ".join(sorted(heads))
        return False, str(DatabaseNotMigrated(f"database at revision {have}, code at {want}"))
    return True, f"ok (revision {', '.join(sorted(heads))})"


def ready_engine(url: str | URL | None = None) -> tuple[Engine | None, str]:
    """An engine on the database when its schema is at head, else None and why. Creates no
    SQLite file where there is none (a command that only might store must not leave one)."""
    if url is None:
        url = get_settings().database_url
    path = sqlite_file_path(url)
    if path is not None and not path.exists():
        return None, f"no database at {path} (`tilesearch db upgrade` creates it)"
    engine = make_engine(url, poolclass=NullPool)
    ready, detail = check_ready(engine)
    if not ready:
        engine.dispose()
        return None, detail
    return engine, detail


def schema_missing(exc: BaseException) -> bool:
    """Whether a database error (SQLAlchemy's, the driver's, or a wrapper's such as
    procrastinate's, through its causes) means a table, column or function of our schema is
    missing: the database was not migrated to this code's head."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if getattr(e, "sqlstate", None) in _UNDEFINED_SQLSTATES:
            return True
        if type(e).__module__ == "sqlite3" and str(e).startswith(_SQLITE_UNDEFINED):
            return True
        todo += [getattr(e, "orig", None), e.__cause__, e.__context__]
    return False

"""Alembic environment: one code path for the CLI (`tilesearch db`), `alembic`, and tests.

The database comes from (first wins): a connection handed over in
``config.attributes["connection"]``, ``-x url=...``, ``config.attributes["url"]`` (set by
service.store.migrate), the config's ``sqlalchemy.url``, then ``Settings.database_url``.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, text
from sqlalchemy.pool import NullPool

from service.config import get_settings
from service.store.db import make_engine, normalize_url
from service.store.models import Base

config = context.config

# Only the `alembic` command configures logging from the ini; programmatic runs keep the host's.
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata

# Arbitrary but fixed: the PostgreSQL advisory lock that serializes migration runs.
MIGRATION_LOCK_KEY = 0x7111E5EA


def database_url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        url = config.attributes.get("url")
    if not url:
        url = config.get_main_option("sqlalchemy.url")
    if not url:
        url = get_settings().database_url
    return url


def configure_and_run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Concurrent upgrades (several replicas starting) run one after the other; the
            # later ones then find the schema at head. (SQLite: one host, `make run` migrates once.)
            lock = text("SELECT pg_advisory_xact_lock(:key)")
            connection.execute(lock, {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit SQL to stdout instead of running it (``alembic upgrade head --sql``)."""
    url = normalize_url(database_url())
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.get_backend_name() == "sqlite",
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given: Connection | None = config.attributes.get("connection")
    if given is not None:
        configure_and_run(given)
        return
    engine = make_engine(database_url(), poolclass=NullPool)
    try:
        with engine.connect() as connection:
            configure_and_run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

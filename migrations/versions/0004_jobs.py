"""Batch jobs: the jobs and job_items tables, and (PostgreSQL only) procrastinate's queue schema.

procrastinate ships its schema as one plain SQL file and no Alembic support; it is read from the
installed package here (pinned in pyproject.toml: a new procrastinate version comes with its own
SQL migration files, applied by a new migration of ours). SQLite has no procrastinate: the
embedded runner (service.jobs.embedded) drives the same task over the same tables.

Revision ID: 0004_jobs
Revises: 0003_tuning_spec
Create Date: 2026-11-25

"""

from collections.abc import Sequence
from importlib import resources

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004_jobs"
down_revision: str | Sequence[str] | None = "0003_tuning_spec"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model types: a migration must not change when the models do.
JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)

_PROCRASTINATE_TABLES = ("procrastinate_events", "procrastinate_periodic_defers", "procrastinate_jobs",
                         "procrastinate_workers")
_PROCRASTINATE_TYPES = ("procrastinate_job_to_defer_v1", "procrastinate_job_event_type", "procrastinate_job_status")


def _procrastinate_schema() -> str:
    return (resources.files("procrastinate.sql") / "schema.sql").read_text(encoding="utf-8")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("hardware", JSON, nullable=False),
        sa.Column("options", JSON, nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("notes", JSON, nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    op.create_table(
        "job_items",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("module", sa.Text(), nullable=False),
        sa.Column("shape_hints", JSON, nullable=True),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("run_owner", sa.String(200), nullable=True),
        sa.Column("stop", sa.String(16), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("queue_job_id", sa.Integer(), nullable=True),
        sa.Column("decision_id", sa.Integer(), nullable=True),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("cache", sa.String(16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", TIMESTAMP, nullable=True),
        sa.Column("finished_at", TIMESTAMP, nullable=True),
        sa.Column("heartbeat_at", TIMESTAMP, nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.CheckConstraint("state IN ('queued', 'running', 'done', 'failed', 'cancelled')",
                           name=op.f("ck_job_items_state")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_items_job_id_jobs"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"], name=op.f("fk_job_items_decision_id_decisions"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_items")),
        sa.UniqueConstraint("job_id", "position", name=op.f("uq_job_items_job_id_position")),
    )
    op.create_index(op.f("ix_job_items_job_id"), "job_items", ["job_id"])
    op.create_index("ix_job_items_state_id", "job_items", ["state", "id"])
    if op.get_bind().dialect.name == "postgresql":
        # The file is SQL as psql takes it; the driver reads '%' as a placeholder, so it is doubled
        # (as procrastinate's own SchemaManager does).
        op.get_bind().exec_driver_sql(_procrastinate_schema().replace("%", "%%"))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        bind = op.get_bind()
        bind.exec_driver_sql(f"DROP TABLE IF EXISTS {', '.join(_PROCRASTINATE_TABLES)} CASCADE")
        bind.exec_driver_sql(
            "DO $$ DECLARE f record; BEGIN "
            "FOR f IN SELECT oid::regprocedure AS signature FROM pg_proc WHERE proname LIKE 'procrastinate\\_%%' LOOP "
            "EXECUTE 'DROP FUNCTION ' || f.signature || ' CASCADE'; END LOOP; END $$")
        bind.exec_driver_sql(f"DROP TYPE IF EXISTS {', '.join(_PROCRASTINATE_TYPES)} CASCADE")
    op.drop_index("ix_job_items_state_id", table_name="job_items")
    op.drop_index(op.f("ix_job_items_job_id"), table_name="job_items")
    op.drop_table("job_items")
    op.drop_table("jobs")

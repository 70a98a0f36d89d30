"""Model runs: a whole model tuned, its per-dispatch report and tuning spec, and the decisions
of its tuned dispatches.

Revision ID: 0007_model_runs
Revises: 0006_measurement_samples
Create Date: 2026-11-25

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007_model_runs"
down_revision: str | Sequence[str] | None = "0006_measurement_samples"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "model_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(80), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("hardware", sa.String(200), nullable=False),
        sa.Column("hardware_hash", sa.String(80), nullable=False),
        sa.Column("options", JSON, nullable=False),
        sa.Column("dispatches", JSON, nullable=False),
        sa.Column("predicted_total_s", sa.Float(), nullable=False),
        sa.Column("verified", sa.Boolean(), nullable=False),
        sa.Column("spec", sa.Text(), nullable=True),
        sa.Column("elapsed_s", sa.Float(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_runs")),
    )
    op.create_index("ix_model_runs_fingerprint_id", "model_runs", ["fingerprint", "id"])
    op.create_table(
        "model_run_decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(300), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["model_runs.id"], name=op.f("fk_model_run_decisions_run_id_model_runs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["decision_id"], ["decisions.id"],
                                name=op.f("fk_model_run_decisions_decision_id_decisions"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_run_decisions")),
        sa.UniqueConstraint("run_id", "name", name=op.f("uq_model_run_decisions_run_id_name")),
    )
    op.create_index(op.f("ix_model_run_decisions_run_id"), "model_run_decisions", ["run_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_model_run_decisions_run_id"), table_name="model_run_decisions")
    op.drop_table("model_run_decisions")
    op.drop_index("ix_model_runs_fingerprint_id", table_name="model_runs")
    op.drop_table("model_runs")

"""Drop the measurements table: nothing wrote or read it (measurements are cached per machine
by service.measure.cache, not in the store).

Revision ID: 0003_drop_measurements
Revises: 0002_cost_model_version
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003_drop_measurements"
down_revision: str | Sequence[str] | None = "0002_cost_model_version"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model types, as in 0001_initial.
JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
HASH = sa.String(80)


def upgrade() -> None:
    op.drop_table("measurements")  # its indexes go with it


def downgrade() -> None:
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=True),
        sa.Column("plan_hash", HASH, nullable=False),
        sa.Column("hardware_hash", HASH, nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("median_s", sa.Float(), nullable=True),
        sa.Column("samples", JSON, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("iree_version", sa.String(100), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name=op.f("fk_measurements_decision_id_decisions"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measurements")),
    )
    op.create_index(op.f("ix_measurements_decision_id"), "measurements", ["decision_id"])
    op.create_index("ix_measurements_plan_hardware", "measurements", ["plan_hash", "hardware_hash"])

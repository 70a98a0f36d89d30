"""Initial store: modules, hardware models, decisions, trials, group records, measurements.

Revision ID: 0001_initial
Revises:
Create Date: 2025-11-21

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "0001_initial"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the model types: a migration must not change when the models do.
JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
TIMESTAMP = sa.DateTime(timezone=True)
HASH = sa.String(80)


def upgrade() -> None:
    op.create_table(
        "modules",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", HASH, nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("op_summary", JSON, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_modules")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_modules_fingerprint")),
    )
    op.create_table(
        "hardware_models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hash", HASH, nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hardware_models")),
        sa.UniqueConstraint("hash", name=op.f("uq_hardware_models_hash")),
    )
    op.create_index(op.f("ix_hardware_models_name"), "hardware_models", ["name"])
    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", HASH, nullable=False),
        sa.Column("module_fingerprint", HASH, nullable=False),
        sa.Column("hardware_hash", HASH, nullable=False),
        sa.Column("search_space_version", sa.String(64), nullable=False),
        sa.Column("objective", sa.String(64), nullable=False),
        sa.Column("shape_bucket", sa.String(200), nullable=False),
        sa.Column("provider_version", sa.String(100), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("plan", JSON, nullable=True),
        sa.Column("predicted_cost", JSON, nullable=True),
        sa.Column("baseline", JSON, nullable=True),
        sa.Column("transform_script", sa.Text(), nullable=True),
        sa.Column("tiled_module", sa.Text(), nullable=True),
        sa.Column("compilation_info", JSON, nullable=True),
        sa.Column("origin_map", JSON, nullable=True),
        sa.Column("search_stats", JSON, nullable=True),
        sa.Column("timings", JSON, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        sa.Column("lease_expires_at", TIMESTAMP, nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'done', 'failed')", name=op.f("ck_decisions_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_decisions")),
        sa.UniqueConstraint("key", name=op.f("uq_decisions_key")),
    )
    op.create_index("ix_decisions_fingerprint_id", "decisions", ["module_fingerprint", "id"])
    op.create_index("ix_decisions_hardware_id", "decisions", ["hardware_hash", "id"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("plan", JSON, nullable=False),
        sa.Column("plan_hash", HASH, nullable=False),
        sa.Column("cost", JSON, nullable=True),
        sa.Column("latency_s", sa.Float(), nullable=True),
        sa.Column("feasible", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name=op.f("fk_trials_decision_id_decisions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trials")),
        sa.UniqueConstraint("decision_id", "number", name=op.f("uq_trials_decision_id_number")),
    )
    op.create_index(op.f("ix_trials_plan_hash"), "trials", ["plan_hash"])
    op.create_table(
        "group_records",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("signature", HASH, nullable=False),
        sa.Column("hardware_hash", HASH, nullable=False),
        sa.Column("plan", JSON, nullable=False),
        sa.Column("latency_s", sa.Float(), nullable=False),
        sa.Column("decision_id", sa.Integer(), nullable=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("updated_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["decision_id"],
            ["decisions.id"],
            name=op.f("fk_group_records_decision_id_decisions"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_group_records")),
        sa.UniqueConstraint(
            "signature", "hardware_hash", name=op.f("uq_group_records_signature_hardware_hash")
        ),
    )
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
    op.create_index(
        "ix_measurements_plan_hardware", "measurements", ["plan_hash", "hardware_hash"]
    )


def downgrade() -> None:
    # Children before parents (foreign keys).
    op.drop_table("measurements")
    op.drop_table("group_records")
    op.drop_table("trials")
    op.drop_table("decisions")
    op.drop_table("hardware_models")
    op.drop_table("modules")

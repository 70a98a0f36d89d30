"""Measurements carry what it takes to predict them again (plan, module, host, shape hints, CPU
time per thread and the paired IREE default's), fitted calibrations are stored per host and
version, and hardware rows say whether a user stored them under their name.

`hardware_models.custom`: until now every row shadowed the profile of its name, including the
rows recorded only because a decision used the model, so `host-cpu` stuck to whatever it first
was. Existing rows under a built-in profile's name are taken as recorded (not custom), the
others as custom; a built-in name a user had overridden must be stored again (POST /v1/hardware).
Measurements from before carry no plan, module nor host: they are not learnt from.

Revision ID: 0006_measurement_samples
Revises: 0005_decision_effort
Create Date: 2026-11-27

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006_measurement_samples"
down_revision: str | Sequence[str] | None = "0005_decision_effort"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
# The built-in profiles' names when this migration was written (service.hardware.profiles).
BUILTIN_NAMES = ("host-cpu", "npu-sram-256k", "gpu-h100")


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("host_key", sa.String(100), nullable=True))
        batch.add_column(sa.Column("module_fingerprint", sa.String(80), nullable=True))
        batch.add_column(sa.Column("plan", JSON, nullable=True))
        batch.add_column(sa.Column("shape_hints", JSON, nullable=True))
        batch.add_column(sa.Column("cpu_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("default_cpu_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("is_default", sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column("source", sa.String(16), nullable=True))
        batch.create_index("ix_measurements_host_id", ["host_key", "id"])
    with op.batch_alter_table("hardware_models") as batch:
        batch.add_column(sa.Column("custom", sa.Boolean(), server_default=sa.false(), nullable=False))
    hardware = sa.table("hardware_models", sa.column("name", sa.String), sa.column("custom", sa.Boolean))
    op.execute(hardware.update().where(hardware.c.name.not_in(BUILTIN_NAMES)).values(custom=True))
    op.create_table(
        "calibrations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("host_key", sa.String(100), nullable=False),
        sa.Column("hardware_name", sa.String(200), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("base_hash", sa.String(80), nullable=False),
        sa.Column("profile_hash", sa.String(80), nullable=False),
        sa.Column("profile", JSON, nullable=False),
        sa.Column("n_measurements", sa.Integer(), nullable=False),
        sa.Column("n_modules", sa.Integer(), nullable=False),
        sa.Column("last_measurement_id", sa.Integer(), nullable=False),
        sa.Column("scores", JSON, nullable=False),
        sa.Column("used", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_calibrations")),
        sa.UniqueConstraint("host_key", "hardware_name", "version",
                            name=op.f("uq_calibrations_host_key_hardware_name_version")),
    )


def downgrade() -> None:
    op.drop_table("calibrations")
    with op.batch_alter_table("hardware_models") as batch:
        batch.drop_column("custom")
    with op.batch_alter_table("measurements") as batch:
        batch.drop_index("ix_measurements_host_id")
        for column in ("source", "is_default", "default_cpu_s", "cpu_s", "shape_hints", "plan",
                       "module_fingerprint", "host_key"):
            batch.drop_column(column)

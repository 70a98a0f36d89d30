"""Decisions keep the IREE tuning spec of their plan (contraction matchers with the configs).

Revision ID: 0003_tuning_spec
Revises: 0002_cost_model_version
Create Date: 2026-11-24

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_tuning_spec"
down_revision: str | Sequence[str] | None = "0002_cost_model_version"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("tuning_spec", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("tuning_spec")

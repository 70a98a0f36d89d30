"""Decisions record the cost model version they were chosen under (part of the decision key).

Decisions stored before carry "unrecorded": their keys were computed without the part, so no
new request matches them and they are searched again under the current model.

Revision ID: 0002_cost_model_version
Revises: 0001_initial
Create Date: 2026-11-24

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_cost_model_version"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("cost_model_version", sa.String(64), nullable=False, server_default="unrecorded"))
    with op.batch_alter_table("decisions") as batch:
        batch.alter_column("cost_model_version", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("cost_model_version")

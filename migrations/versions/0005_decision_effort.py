"""Decisions record the effort of the searches behind them (a request asking for more refines
the decision) and which module text their texts were realised from.

Rows from before carry no effort: the next request for them refines once and records it.

Revision ID: 0005_decision_effort
Revises: 0004_jobs
Create Date: 2026-11-25

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005_decision_effort"
down_revision: str | Sequence[str] | None = "0004_jobs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("effort", JSON, nullable=True))
        batch.add_column(sa.Column("realised_for", sa.String(80), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_column("realised_for")
        batch.drop_column("effort")

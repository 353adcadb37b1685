"""Functions stored by value, for jobs whose function a worker cannot import (a script's ``__main__``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "function_code",
        sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiment.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("target", sa.Text, primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("code", sa.LargeBinary, nullable=False),
        sa.Column("stored_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("function_code")

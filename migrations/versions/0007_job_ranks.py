"""A job's ranks: how many processes run it together (a gang), 1 for a job of one process.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ADD COLUMN on both engines: a batch copy of the table on SQLite would rebuild the claim
    # index without its descending priority.
    op.add_column("job", sa.Column("ranks", sa.Integer(), nullable=False, server_default=sa.text("1")))


def downgrade() -> None:
    op.drop_column("job", "ranks")  # plain, as added: a batch copy would cascade to curves and events

"""The code and environment a job ran: a ``code`` column on each job (its record, JSON), and the
texts several jobs share (a working tree's diff, an environment's package list) kept once each in
``code_text``, keyed by the digest of their content.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ADD and DROP COLUMN on both engines: a batch copy of the table on SQLite would rebuild the
    # claim index without its descending priority, and dropping the old table would cascade to the
    # jobs' curves and events.
    op.add_column("job", sa.Column("code", sa.Text().with_variant(postgresql.JSONB(), "postgresql")))
    op.create_table(
        "code_text",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("stored_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("code_text")
    op.drop_column("job", "code")

"""Successive-halving searches: their rules, and the rung and configuration of each of their jobs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "search",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiment.id", ondelete="CASCADE"), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("experiment_id", "key", name="uq_search_experiment_key"),
    )
    op.create_table(
        "search_job",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("job.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("search_id", sa.Integer, sa.ForeignKey("search.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("rung", sa.Integer, nullable=False),
        sa.Column("config", sa.String(64), nullable=False),
    )
    op.create_index("ix_search_job_rung", "search_job", ["search_id", "rung"])


def downgrade() -> None:
    op.drop_index("ix_search_job_rung", table_name="search_job")
    op.drop_table("search_job")
    op.drop_table("search")

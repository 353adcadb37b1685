"""A learning-curve point may be NaN: ``job_metric.value`` NULL stands for NaN on both engines.

SQLite turns a NaN REAL into NULL, which the old NOT NULL refused, and PostgreSQL's NaN sorts above
every number; one spelling on both keeps the metric queries alike. Infinities are stored as such.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_metric") as batch:
        batch.alter_column("value", existing_type=sa.Float, nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM job_metric WHERE value IS NULL")
    with op.batch_alter_table("job_metric") as batch:
        batch.alter_column("value", existing_type=sa.Float, nullable=False)

"""The devices a job's last run was given (CUDA_VISIBLE_DEVICES), shown by list and show.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.add_column(sa.Column("gpus", sa.String(255)))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch:
        batch.drop_column("gpus")

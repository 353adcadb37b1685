"""The first schema: experiments, jobs, dependencies, events and metrics.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "experiment",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "job",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("experiment_id", sa.Integer, sa.ForeignKey("experiment.id", ondelete="CASCADE"), nullable=False),
        sa.Column("phase", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("kind", sa.String(8), nullable=False, server_default=sa.text("'fn'")),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("params", sa.Text, nullable=False),
        sa.Column("params_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("priority", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("queue_order", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("max_attempts", sa.Integer, nullable=False, server_default=sa.text("3")),
        sa.Column("lease", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("resume", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("stop_requested", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("results", sa.Text),
        sa.Column("host", sa.String(255)),
        sa.Column("pid", sa.Integer),
        sa.Column("pid_started_at", sa.Float),
        sa.Column("backend", sa.String(16)),
        sa.Column("backend_id", sa.String(64)),
        sa.Column("log_path", sa.Text),
        sa.Column("workdir", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("queued_at", sa.Float),
        sa.Column("started_at", sa.Float),
        sa.Column("heartbeat_at", sa.Float),
        sa.Column("finished_at", sa.Float),
        sa.Column("error", sa.Text),
        sa.Column("exit_code", sa.Integer),
        sa.UniqueConstraint("experiment_id", "params_hash", name="uq_job_experiment_hash"),
    )
    op.create_index("ix_job_claim", "job", ["experiment_id", "status", sa.text("priority DESC"), "queue_order", "id"])
    op.create_table(
        "job_dep",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("job.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("depends_on", sa.Integer, sa.ForeignKey("job.id", ondelete="CASCADE"), primary_key=True),
    )
    op.create_index("ix_job_dep_parent", "job_dep", ["depends_on"])
    op.create_table(
        "job_event",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("job.id", ondelete="CASCADE"), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("from_status", sa.String(16)),
        sa.Column("to_status", sa.String(16)),
        sa.Column("attempt", sa.Integer),
        sa.Column("why", sa.Text, nullable=False),
        sa.Column("source", sa.String(255)),
        sa.Column("data", sa.Text),
    )
    op.create_index("ix_job_event_job", "job_event", ["job_id", "id"])
    op.create_table(
        "job_metric",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("job.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
    )
    op.create_index("ix_job_metric_job", "job_metric", ["job_id", "name", "step"])


def downgrade() -> None:
    for name in ("job_metric", "job_event", "job_dep", "job", "experiment"):
        op.drop_table(name)

"""Indexes that let a page of jobs, a count and a job's events be read without scanning the experiment.

``ix_job_list`` (experiment, id): the first page of ``jobman list``. ``ix_job_status`` (experiment,
status, id): a page of one status, in id order. ``ix_job_phase`` (experiment, phase, status, id): a page
of one phase (one range per status), and the counts per phase and status, read from the index alone.
``ix_job_event_crash`` (to_status, id): the monitor's latest crashes. On PostgreSQL, ``ix_job_params``
(GIN, jsonb_path_ops) answers a parameter filter (``params @> '{"lr": 0.1}'``); SQLite has no such
index for JSON text, and reads jobs in id order until the page is full.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_job_list", "job", ["experiment_id", "id"])
    op.create_index("ix_job_status", "job", ["experiment_id", "status", "id"])
    op.create_index("ix_job_phase", "job", ["experiment_id", "phase", "status", "id"])
    op.create_index("ix_job_event_crash", "job_event", ["to_status", "id"])
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE INDEX ix_job_params ON job USING gin (params jsonb_path_ops)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_job_params")
    op.drop_index("ix_job_event_crash", "job_event")
    op.drop_index("ix_job_phase", "job")
    op.drop_index("ix_job_status", "job")
    op.drop_index("ix_job_list", "job")

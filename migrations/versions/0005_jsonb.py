"""PostgreSQL: parameters and results as jsonb (queryable with ->>, @>), fractional priorities.

SQLite keeps JSON as text (its json_extract reads it) and already stores a fractional
priority as is, so this revision changes nothing there. Views over ``job`` (``jobman
sqlview``) are dropped for the change and made again from their own definitions on the
way up; on the way down they are dropped (their jsonb operators would not apply to text):
make them again with ``jobman sqlview``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_VIEWS_ON_JOB = """
SELECT DISTINCT v.oid::regclass::text, pg_get_viewdef(v.oid)
FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid JOIN pg_class v ON v.oid = r.ev_class
WHERE d.refobjid = 'job'::regclass AND v.relkind = 'v'
"""


def _retype(columns: list[tuple[str, sa.types.TypeEngine, str]], keep_views: bool) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    views = bind.exec_driver_sql(_VIEWS_ON_JOB).all()
    for name, _ in views:
        op.execute(f"DROP VIEW {name}")
    for column, type_, using in columns:
        op.alter_column("job", column, type_=type_, postgresql_using=using)
    for name, definition in views if keep_views else ():
        op.execute(f"CREATE VIEW {name} AS {definition}")


def upgrade() -> None:
    _retype(
        [
            ("params", postgresql.JSONB(), "params::jsonb"),
            ("results", postgresql.JSONB(), "results::jsonb"),
            ("priority", sa.Float(), "priority::double precision"),
        ],
        keep_views=True,
    )


def downgrade() -> None:
    _retype(
        [
            ("params", sa.Text(), "params::text"),
            ("results", sa.Text(), "results::text"),
            ("priority", sa.Integer(), "round(priority)::integer"),
        ],
        keep_views=False,
    )

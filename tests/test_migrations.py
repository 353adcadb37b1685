"""The migrations build exactly the declared schema, and a database at another revision is refused clearly."""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from conftest import PG_ADMIN_URL, need_service

from jobman.jobdb.engine import head_revision, known_revisions, make_engine
from jobman.jobdb.engine import upgrade as db_upgrade
from jobman.jobdb.errors import SchemaError
from jobman.jobdb.schema import PARAMS_INDEX, VERSION_TABLE, metadata
from jobman.jobdb.store import Store
from jobman.jobdb.url import parse_db


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request, tmp_path):
    """A database URL with nothing in it, on each engine."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    import psycopg

    admin = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    name = f"jobman_mig_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # noqa: BLE001
        need_service(f"PostgreSQL is not reachable at {admin}: {exc}".splitlines()[0])
    yield f"{admin.rsplit('/', 1)[0]}/{name}"
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def sa_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def differences(url: str) -> list:
    engine = sa.create_engine(sa_url(url))
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "compare_server_default": True,
                    "version_table": VERSION_TABLE,
                    # The PostgreSQL-only parameter index is DDL, not metadata (test_migration_indexes checks it).
                    "include_name": lambda name, kind, parent: (
                        not (kind == "table" and name == VERSION_TABLE)
                        and not (kind == "index" and name == PARAMS_INDEX)
                    ),
                },
            )
            return compare_metadata(ctx, metadata)
    finally:
        engine.dispose()


def index_sql(url: str, name: str) -> str:
    engine = sa.create_engine(sa_url(url))
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                q = "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = :n"
            else:
                q = "SELECT indexdef FROM pg_indexes WHERE indexname = :n"
            return conn.execute(sa.text(q), {"n": name}).scalar() or ""
    finally:
        engine.dispose()


def execute(url: str, *statements: str) -> None:
    engine = sa.create_engine(sa_url(url))
    try:
        with engine.begin() as conn:
            for s in statements:
                conn.execute(sa.text(s))
    finally:
        engine.dispose()


def upgrade(url: str) -> tuple[str | None, str]:
    """``jobman db upgrade`` in this process (the subprocess form is tested once per engine below)."""
    engine = make_engine(parse_db(url))
    try:
        return db_upgrade(engine)
    finally:
        engine.dispose()


def test_upgrade_builds_exactly_the_declared_schema(fresh_url, jobman):
    r = jobman("db", "upgrade", fresh_url)
    assert r.code == 0, r.err
    assert f"to {head_revision()}" in r.out
    assert differences(fresh_url) == []
    # The claim index keeps its column order and its descending priority (reflection may not show DESC).
    ddl = " ".join(index_sql(fresh_url, "ix_job_claim").replace('"', "").split()).lower()
    assert "(experiment_id, status, priority desc, queue_order, id)" in ddl, ddl
    assert upgrade(fresh_url) == (head_revision(), head_revision())  # again: nothing to do


def test_the_comparison_sees_a_drifted_schema(fresh_url):
    upgrade(fresh_url)
    execute(fresh_url, "DROP INDEX ix_job_metric_job", "ALTER TABLE job_event ADD COLUMN extra INTEGER")
    found = {(d[0], d[1].name if d[0].endswith("_index") else f"{d[2]}.{d[3].name}") for d in differences(fresh_url)}
    assert found == {("add_index", "ix_job_metric_job"), ("remove_column", "job_event.extra")}, found


def test_a_fresh_database_is_created_by_the_first_schedule(fresh_url):
    s = Store.open(fresh_url + "?table=first")
    try:
        with s.engine.connect() as conn:
            rev = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
        assert rev == head_revision() and rev in known_revisions()
    finally:
        s.dispose()
    assert differences(fresh_url) == []  # the declared tables, made at once, are what the migrations build
    ddl = " ".join(index_sql(fresh_url, "ix_job_claim").replace('"', "").split()).lower()
    assert "(experiment_id, status, priority desc, queue_order, id)" in ddl, ddl
    assert upgrade(fresh_url) == (head_revision(), head_revision())  # and alembic agrees it is at head


def one_sentence_error(r) -> str:
    assert r.code != 0
    assert "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1, r.err
    return r.err


def test_a_newer_schema_is_refused_naming_the_problem(fresh_url, jobman):
    upgrade(fresh_url)
    execute(fresh_url, f"UPDATE {VERSION_TABLE} SET version_num = 'ffff9999'")
    for attempt in (
        lambda: Store.open(fresh_url + "?table=x"),
        lambda: Store.open(fresh_url + "?table=x", create=False),
        lambda: upgrade(fresh_url),
    ):
        with pytest.raises(SchemaError, match="revision ffff9999.*made by a newer jobman, so upgrade jobman"):
            attempt()
    err = one_sentence_error(jobman("db", "upgrade", fresh_url))
    assert "ffff9999" in err and "newer jobman" in err, err


def test_an_unstamped_database_names_jobman_db_upgrade(fresh_url, jobman):
    # What a downgrade to base leaves behind: the version table, empty, and none of jobman's tables.
    upgrade(fresh_url)
    execute(
        fresh_url, f"DELETE FROM {VERSION_TABLE}", *[f"DROP TABLE {t.name}" for t in reversed(metadata.sorted_tables)]
    )
    err = one_sentence_error(jobman("list", fresh_url + "?table=x"))
    assert "jobman db upgrade" in err, err
    with pytest.raises(SchemaError, match="jobman db upgrade"):
        Store.open(fresh_url + "?table=x", create=False)
    assert upgrade(fresh_url) == (None, head_revision())
    assert differences(fresh_url) == []


def test_a_foreign_job_table_is_refused(fresh_url):
    execute(fresh_url, "CREATE TABLE job (id INTEGER PRIMARY KEY, name TEXT)")
    with pytest.raises(SchemaError, match="'job' table that jobman did not make"):
        Store.open(fresh_url + "?table=x")


def test_the_head_revision_constant_is_the_newest_migration() -> None:
    from jobman.jobdb.engine import head_revision
    from jobman.jobdb.schema import HEAD_REVISION

    assert HEAD_REVISION == head_revision()

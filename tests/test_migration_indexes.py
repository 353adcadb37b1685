"""Revision 0006 upgrades a database made by revision 0005 (the one before), with jobs in it: the
read indexes are built over the rows already there, nothing is lost, and it downgrades back."""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import command
from test_migrations import differences, fresh_url  # noqa: F401 - a fixture

from jobman.jobdb.engine import alembic_config, make_engine
from jobman.jobdb.schema import HEAD_REVISION, PARAMS_INDEX, VERSION_TABLE
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, params_hash
from jobman.jobdb.sweep import JobSpec
from jobman.jobdb.url import parse_db

PARAMS = [{"lr": lr, "nhid": n} for lr in (0.1, 0.01) for n in (10, 20)]
NEW_INDEXES = {"ix_job_list", "ix_job_status", "ix_job_phase", "ix_job_event_crash"}


def make_at_previous(url: str) -> None:
    """The schema of revision 0005, and jobs written as that revision's jobman wrote them."""
    engine = make_engine(parse_db(url))
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0005")
        with engine.begin() as conn:
            exp = conn.execute(
                sa.text("INSERT INTO experiment (name, created_at) VALUES ('old', 1) RETURNING id")
            ).scalar_one()
            for i, params in enumerate(PARAMS):
                conn.execute(
                    sa.text(
                        "INSERT INTO job (experiment_id, phase, target, params, params_hash, status, created_at) "
                        "VALUES (:e, :ph, 'pkg.mod:train', :p, :h, :s, 1)"
                    ),
                    {
                        "e": exp,
                        "ph": i % 2,
                        "p": json.dumps(params, sort_keys=True),
                        "h": params_hash(i % 2, "fn", "pkg.mod:train", params),
                        "s": ("DONE", "QUEUED")[i // 2],
                    },
                )
    finally:
        engine.dispose()


def index_names(url: str) -> set[str]:
    engine = make_engine(parse_db(url))
    try:
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            names = {i["name"] for t in ("job", "job_event") for i in insp.get_indexes(t)}
            if conn.dialect.name == "postgresql":  # the GIN index, made by DDL
                names |= set(
                    conn.execute(sa.text("SELECT indexname FROM pg_indexes WHERE tablename = 'job'")).scalars()
                )
            return names
    finally:
        engine.dispose()


def test_0006_upgrades_a_0005_database_with_data(fresh_url, jobman):  # noqa: F811
    make_at_previous(fresh_url)
    assert not NEW_INDEXES & index_names(fresh_url)
    r = jobman("db", "upgrade", fresh_url)
    assert r.code == 0 and f"from 0005 to {HEAD_REVISION}" in r.out, r.out + r.err
    assert differences(fresh_url) == []  # exactly the declared schema
    names = index_names(fresh_url)
    assert NEW_INDEXES <= names
    assert (PARAMS_INDEX in names) == fresh_url.startswith("postgresql")
    store = Store.open(fresh_url + "?table=old")
    try:
        jobs = store.jobs()
        assert [j.params for j in jobs] == PARAMS
        assert [j.id for j in store.jobs(status=[Status.QUEUED], limit=1)] == [jobs[2].id]
        assert [j.id for j in store.jobs(phase=1)] == [jobs[1].id, jobs[3].id]
        assert [j.id for j in store.jobs(params={"lr": 0.01, "nhid": 20})] == [jobs[3].id]
        assert store.counts() == {(0, "DONE"): 1, (1, "DONE"): 1, (0, "QUEUED"): 1, (1, "QUEUED"): 1}
        # Same identities: the old jobs again add nothing.
        assert store.schedule([JobSpec(i % 2, "fn", "pkg.mod:train", p, None) for i, p in enumerate(PARAMS)]).added == 0
        with store.engine.connect() as conn:
            assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar() == HEAD_REVISION
    finally:
        store.dispose()


def test_0006_downgrades_to_0005(fresh_url):  # noqa: F811
    make_at_previous(fresh_url)
    engine = make_engine(parse_db(fresh_url))
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0006")
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0005")
    finally:
        engine.dispose()
    names = index_names(fresh_url)
    assert not (NEW_INDEXES | {PARAMS_INDEX}) & names and "ix_job_claim" in names

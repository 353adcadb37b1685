"""Revision 0005 upgrades a database made by revision 0004 (the one before), with jobs, results and a view in it:
PostgreSQL gets jsonb parameters and results and fractional priorities; nothing is lost."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from alembic import command
from test_migrations import differences, fresh_url  # noqa: F401 - a fixture

from jobman.jobdb.engine import alembic_config, make_engine
from jobman.jobdb.schema import HEAD_REVISION, VERSION_TABLE
from jobman.jobdb.store import Store, params_hash
from jobman.jobdb.sweep import JobSpec
from jobman.jobdb.url import parse_db
from jobman.jobdb.views import create_view

PARAMS = [{"hyper.lr": 0.1, "hyper.nhid": 10, "name": "a"}, {"hyper.lr": 0.01, "hyper.nhid": 20, "name": "b'c"}]
RESULTS = [{"valid_error": 0.25, "curve": [1, 2.5]}, None]


def make_at_previous(url: str) -> None:
    """The schema of revision 0004, and two jobs written as that revision's jobman wrote them."""
    engine = make_engine(parse_db(url))
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0004")
        with engine.begin() as conn:
            exp = conn.execute(
                sa.text("INSERT INTO experiment (name, created_at) VALUES ('old', 1) RETURNING id")
            ).scalar_one()
            for i, (params, results) in enumerate(zip(PARAMS, RESULTS)):
                conn.execute(
                    sa.text(
                        "INSERT INTO job (experiment_id, target, params, params_hash, status, priority, created_at, "
                        "results) VALUES (:e, 'pkg.mod:train', :p, :h, :s, :prio, 1, :r)"
                    ),
                    {
                        "e": exp,
                        "p": json.dumps(params, sort_keys=True),
                        "h": params_hash(0, "fn", "pkg.mod:train", params),
                        "s": "DONE" if results else "QUEUED",
                        "prio": 3 - i,
                        "r": json.dumps(results, sort_keys=True) if results else None,
                    },
                )
        create_view(engine, "old", "old_view")  # a view over the text columns
    finally:
        engine.dispose()


def test_0005_upgrades_a_0004_database_with_data(fresh_url, jobman):  # noqa: F811
    make_at_previous(fresh_url)
    r = jobman("list", fresh_url + "?table=old")
    assert r.code != 0 and "jobman db upgrade" in r.err, r.err
    r = jobman("db", "upgrade", fresh_url)
    assert r.code == 0 and f"from 0004 to {HEAD_REVISION}" in r.out, r.out + r.err
    assert differences(fresh_url) == []  # exactly the declared schema, jsonb included on PostgreSQL
    store = Store.open(fresh_url + "?table=old")
    try:
        jobs = store.jobs()
        assert [j.params for j in jobs] == PARAMS and [j.results for j in jobs] == RESULTS
        assert [j.priority for j in jobs] == [3, 2]
        # Same identity as before: the old sweep again adds nothing; a fractional priority is kept.
        assert store.schedule([JobSpec(0, "fn", "pkg.mod:train", p, None) for p in PARAMS]).added == 0
        new = store.schedule([JobSpec(0, "fn", "pkg.mod:train", {"hyper": {"lr": 0.5}}, None)], priority=1.5)
        assert store.job(new.job_ids[0]).priority == 1.5
        with store.engine.connect() as conn:
            view = conn.execute(sa.text("SELECT id, hyper_lr, name, validerror FROM old_view ORDER BY id")).all()
            view = [
                tuple(float(x) if hasattr(x, "as_integer_ratio") and not isinstance(x, int) else x for x in v)
                for v in view
            ]  # PostgreSQL's numeric comes as Decimal
            assert view[:2] == [(jobs[0].id, 0.1, "a", 0.25), (jobs[1].id, 0.01, "b'c", None)]
            if store.engine.dialect.name == "postgresql":
                types = dict(
                    conn.execute(
                        sa.text(
                            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'job' "
                            "AND column_name IN ('params', 'results', 'priority')"
                        )
                    ).all()
                )
                assert types == {"params": "jsonb", "results": "jsonb", "priority": "double precision"}
                lr = conn.execute(
                    sa.text("SELECT params->>'hyper.lr' FROM job WHERE params @> '{\"name\": \"a\"}'")
                ).scalar_one()
                assert lr == "0.1"
            rev = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
            assert rev == HEAD_REVISION  # and on through the revisions after it
    finally:
        store.dispose()


@pytest.mark.parametrize("fresh_url", ["postgresql"], indirect=True)  # SQLite's 0005 changes nothing to undo
def test_0005_downgrades_back_to_text(fresh_url):  # noqa: F811
    make_at_previous(fresh_url)
    engine = make_engine(parse_db(fresh_url))
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0005")
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0004")
        with engine.connect() as conn:
            assert (
                conn.execute(
                    sa.text(
                        "SELECT data_type FROM information_schema.columns WHERE table_name = 'job' "
                        "AND column_name = 'params'"
                    )
                ).scalar()
                == "text"
            )
            first = conn.execute(sa.text("SELECT params FROM job ORDER BY id")).scalars().first()
            assert json.loads(first) == PARAMS[0]
    finally:
        engine.dispose()

"""Revision 0008 lets a learning-curve point be NaN (``job_metric.value`` NULL) on a database made by
revision 0007, with its curves in it; and goes back down, leaving out the NaN points 0007 cannot hold."""

from __future__ import annotations

import math

import sqlalchemy as sa
from alembic import command
from test_migrations import differences, fresh_url  # noqa: F401 - a fixture

from jobman.jobdb.engine import alembic_config, head_revision, make_engine
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import expand, parse_sweep
from jobman.jobdb.url import parse_db


def test_0008_keeps_the_curves_of_a_0007_database_and_then_takes_nan(fresh_url, jobman):  # noqa: F811
    engine = make_engine(parse_db(fresh_url))
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "0007")
        with engine.begin() as conn:
            exp = conn.execute(
                sa.text("INSERT INTO experiment (name, created_at) VALUES ('old', 1) RETURNING id")
            ).scalar_one()
            job = conn.execute(
                sa.text(
                    "INSERT INTO job (experiment_id, phase, target, params, params_hash, status, created_at) "
                    "VALUES (:e, 0, 'pkg.mod:train', '{}', 'h', 'DONE', 1) RETURNING id"
                ),
                {"e": exp},
            ).scalar_one()
            conn.execute(
                sa.text("INSERT INTO job_metric (job_id, step, name, value, at) VALUES (:j, 1, 'loss', 0.5, 1)"),
                {"j": job},
            )
    finally:
        engine.dispose()
    r = jobman("db", "upgrade", fresh_url)
    assert r.code == 0 and f"to {head_revision()}" in r.out, r.out + r.err
    assert differences(fresh_url) == []  # exactly the declared schema
    store = Store.open(fresh_url + "?table=old")
    try:
        assert store.metrics([job]) == [(job, 1, "loss", 0.5)]
        store.schedule(expand(parse_sweep(["m:f", "x=1"])))
        claimed = store.claim(WorkerInfo.here())
        assert claimed is not None
        store.log_metrics(claimed.job.id, claimed.lease, [(1, "loss", math.nan), (2, "loss", math.inf)])
        [(_, _, _, nan), (_, _, _, inf)] = store.metrics([claimed.job.id])
        assert math.isnan(nan) and inf == math.inf
    finally:
        store.dispose()
    engine = make_engine(parse_db(fresh_url))
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), "0007")
        with engine.connect() as conn:
            values = conn.execute(sa.text("SELECT value FROM job_metric ORDER BY id")).scalars().all()
    finally:
        engine.dispose()
    assert values == [0.5, math.inf]

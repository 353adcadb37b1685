"""The claim and the monitor's scan read the index ix_job_claim on both engines, never the whole table.

A later change to those statements, or to the index, that turns them into table scans or
sorts fails here instead of slowing every worker down on a large database.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from jobman.jobdb.schema import job as t_job
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import expand, parse_sweep

N = 3000


def plan(store: Store, stmt: sa.Select, conn: sa.Connection) -> str:
    sql = str(stmt.compile(dialect=store.engine.dialect, compile_kwargs={"literal_binds": True}))
    prefix = "EXPLAIN QUERY PLAN " if store.engine.dialect.name == "sqlite" else "EXPLAIN "
    # A fresh text each time: SQLite keeps prepared EXPLAINs, whose plan outlives a schema change.
    rows = conn.exec_driver_sql(f"{prefix}{sql} /* {uuid.uuid4().hex} */").all()
    return "\n".join(str(r[-1]) for r in rows)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def busy_store(request, tmp_path_factory):
    """An experiment in mid-sweep beside another experiment: most jobs DONE, a few RUNNING, the rest QUEUED."""
    name = f"plans_{uuid.uuid4().hex[:6]}"
    if request.param == "sqlite":
        base = f"sqlite:///{tmp_path_factory.mktemp('plans') / 'plans.db'}"
    else:
        base = request.getfixturevalue("pg_database")
    other = Store.open(f"{base}?table={name}_other")
    # Two phases: job_dep holds rows, as in a real database, for the claim's and finish's lookups.
    other.schedule(expand(parse_sweep(["pkg.mod:fn", "y={{%s}}" % ",".join(map(str, range(N // 3))), "--", "z=1"])))
    other.dispose()
    store = Store.open(f"{base}?table={name}")
    store.schedule(expand(parse_sweep(["pkg.mod:fn", "x={{%s}}" % ",".join(map(str, range(N)))])))
    exp = store.jobs(limit=1)[0].experiment_id
    with store.engine.begin() as conn:
        conn.execute(sa.update(t_job).where(t_job.c.experiment_id == exp, t_job.c.id % 10 != 0)
                     .values(status="DONE"))
    for _ in range(5):
        store.claim(WorkerInfo(host="h", pid=1))
    with store.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE")
        conn.commit()
    yield store
    store.dispose()


def assert_uses_claim_index(text: str, dialect: str, *, ordered: bool) -> None:
    if dialect == "sqlite":
        assert "USING INDEX ix_job_claim" in text or "USING COVERING INDEX ix_job_claim" in text, text
        assert "SCAN job" not in text, text
        if ordered:  # the index gives the order: no sort of the matching rows
            assert "TEMP B-TREE" not in text, text
    else:
        assert "ix_job_claim" in text and "Seq Scan" not in text, text
        if ordered:
            assert "Sort" not in text, text


def test_the_claim_pick_reads_the_claim_index_in_order(busy_store):
    stmt = busy_store.claim_query()
    with busy_store.engine.connect() as conn:
        text = plan(busy_store, stmt, conn)
    assert_uses_claim_index(text, busy_store.engine.dialect.name, ordered=True)
    if busy_store.engine.dialect.name == "postgresql":
        assert "LockRows" in text  # FOR UPDATE SKIP LOCKED is part of the pick


def explain_prepared(store: Store, prepared, **values) -> str:
    """The plan of a hot-path statement exactly as the store runs it, with its bound values."""
    args = prepared.args({**prepared.defaults, **values})
    prefix = "EXPLAIN QUERY PLAN " if store.engine.dialect.name == "sqlite" else "EXPLAIN "
    with store.engine.connect() as conn:
        cursor = conn.connection.dbapi_connection.cursor()
        cursor.execute(f"{prefix}{prepared.sql} /* {uuid.uuid4().hex} */", args)
        text = "\n".join(str(r[-1]) for r in cursor.fetchall())
        cursor.close()
        conn.rollback()
    return text


def test_the_claim_update_as_run_reads_the_claim_index(busy_store):
    """The whole claim, as the store's prepared statement runs it (UPDATE ... WHERE id = (pick)),
    including its lookup of the claimed job's parents in job_dep."""
    exp = busy_store.jobs(limit=1)[0].experiment_id
    text = explain_prepared(busy_store, busy_store.hot.claim, exp=exp, host="h", pid=1, pid_started_at=None,
                            backend="local", backend_id=None, log_path=None, now=0.0, root=None)
    assert "job_dep" in text, text
    assert_uses_claim_index(text, busy_store.engine.dialect.name, ordered=True)


def test_the_finish_looks_dependents_up_by_index(busy_store):
    """Marking a job DONE asks whether it has dependents: an index lookup of job_dep, not a scan."""
    job = busy_store.jobs(limit=1)[0]
    text = explain_prepared(busy_store, busy_store.hot.finish_done, id=job.id, lease=1, now=0.0, results=None,
                            exit_code=None)
    if busy_store.engine.dialect.name == "sqlite":
        assert "ix_job_dep_parent" in text and "SCAN" not in text, text
    else:
        assert "ix_job_dep_parent" in text and "Seq Scan" not in text, text


def test_the_running_scan_reads_the_claim_index(busy_store):
    stmt = busy_store.running_query()
    with busy_store.engine.connect() as conn:
        text = plan(busy_store, stmt, conn)
    assert_uses_claim_index(text, busy_store.engine.dialect.name, ordered=False)
    assert len(busy_store.running()) >= 5


def test_the_queries_are_the_ones_the_store_runs(busy_store):
    # The statements under test pick what claim() takes and list what running() returns.
    with busy_store.engine.connect() as conn:
        next_id = conn.execute(busy_store.claim_query()).scalar()
        running = sorted(r.id for r in conn.execute(busy_store.running_query()))
    assert sorted(j.id for j in busy_store.running()) == running
    assert busy_store.claim(WorkerInfo(host="h", pid=2)).job.id == next_id


def test_without_the_index_the_check_fails(busy_store):
    """The plan check can fail: drop the index inside a transaction that is rolled back."""
    stmt = busy_store.claim_query()
    with busy_store.engine.connect() as conn:
        with conn.begin() as tx:
            conn.exec_driver_sql("DROP INDEX ix_job_claim")
            text = plan(busy_store, stmt, conn)
            tx.rollback()
        with pytest.raises(AssertionError):
            assert_uses_claim_index(text, busy_store.engine.dialect.name, ordered=True)
        assert "ix_job_claim" in plan(busy_store, stmt, conn)


def test_a_page_of_the_dashboards_job_table_reads_an_index_not_every_row(busy_store):
    """The first page, by id, whole or of some statuses: read in id order and stopped at the page's end.

    Neither sorts the experiment's jobs first (a temporary B-tree, a Sort node over a table scan);
    SQLite may walk the table in id order, which stops after the page's rows.
    """
    from jobman.jobdb.browse import page_query

    exp = busy_store.jobs(limit=1)[0].experiment_id
    dialect = busy_store.engine.dialect.name
    with busy_store.engine.connect() as conn:
        first = plan(busy_store, page_query(exp), conn)
        running = plan(busy_store, page_query(exp, status=[Status.RUNNING, Status.QUEUED]), conn)
    for text in (first, running):
        if dialect == "sqlite":
            assert "TEMP B-TREE" not in text, text
        else:
            assert not ("Sort" in text and "Seq Scan" in text), text
            assert "Limit" in text.splitlines()[0], text


def test_a_report_reads_only_its_experiments_jobs_through_an_index(busy_store):
    """Every statement a report runs on ``job`` (keys, scopes, the grouping) finds the experiment's
    rows by an index: a small experiment beside thousands of other jobs costs its own rows only."""
    from jobman.jobdb import report
    from jobman.jobdb.sweep import JobSpec

    import dataclasses

    small = Store(dataclasses.replace(busy_store.target, experiment=f"{busy_store.experiment}_small"))
    ids = small.schedule([JobSpec(0, "fn", "pkg.mod:fn", {"lr": i % 5, "seed": i // 5}, None) for i in range(40)]).job_ids
    with small.engine.begin() as conn:
        conn.execute(sa.update(t_job).where(t_job.c.id.in_(ids)).values(status="DONE", results='{"valid_error": 0.5}'))
        conn.exec_driver_sql("ANALYZE")
    ran: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # noqa: ANN001
        ran.append((statement, parameters))

    sa.event.listen(small.engine, "before_cursor_execute", capture)
    try:
        rep = report.from_store(small, "valid_error")
    finally:
        sa.event.remove(small.engine, "before_cursor_execute", capture)
    assert rep.best is not None and rep.configurations == 5
    reads = [(s.split(" AS ", 1)[1] if s.startswith("CREATE TEMP TABLE") else s, p) for s, p in ran
             if "FROM job" in s and "experiment_id" in s and not s.startswith("SELECT experiment.")]
    assert len(reads) >= 4, ran  # the sample, the scopes, the result keys, the grouping
    dialect = small.engine.dialect.name
    with small.engine.connect() as conn:
        for statement, params in reads:
            prefix = "EXPLAIN QUERY PLAN " if dialect == "sqlite" else "EXPLAIN "
            text = "\n".join(str(r[-1]) for r in conn.exec_driver_sql(prefix + statement, params).all())
            if dialect == "sqlite":
                assert "SEARCH job USING" in text and "SCAN job" not in text, (statement, text)
            else:
                assert "Seq Scan on job" not in text and "ix_job" in text, (statement, text)
    small.dispose()

"""The claim and the monitor's scan read the index ix_job_claim on both engines, never the whole table.

A later change to those statements, or to the index, that turns them into table scans or
sorts fails here instead of slowing every worker down on a large database.
"""

from __future__ import annotations

import json
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
    other.schedule(expand(parse_sweep(["pkg.mod:fn", "y={{" + ",".join(map(str, range(N // 3))) + "}}", "--", "z=1"])))
    other.dispose()
    store = Store.open(f"{base}?table={name}")
    store.schedule(expand(parse_sweep(["pkg.mod:fn", "x={{" + ",".join(map(str, range(N))) + "}}"])))
    exp = store.jobs(limit=1)[0].experiment_id
    with store.engine.begin() as conn:
        conn.execute(sa.update(t_job).where(t_job.c.experiment_id == exp, t_job.c.id % 10 != 0).values(status="DONE"))
    for _ in range(5):
        store.claim(WorkerInfo(host="h", pid=1))
    with store.engine.connect() as conn:
        conn.exec_driver_sql("ANALYZE")
        conn.commit()
    yield store
    store.dispose()


def assert_uses_claim_index(
    text: str, dialect: str, *, ordered: bool, names: tuple[str, ...] = ("ix_job_claim",)
) -> None:
    if dialect == "sqlite":
        assert any(f"USING INDEX {n}" in text or f"USING COVERING INDEX {n}" in text for n in names), text
        assert "SCAN job" not in text, text
        if ordered:  # the index gives the order: no sort of the matching rows
            assert "TEMP B-TREE" not in text, text
    else:
        assert any(n in text for n in names) and "Seq Scan" not in text, text
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
    """The plan of a hot-path statement exactly as the store runs it, with its bound values. On
    PostgreSQL with sequential scans priced out, as :func:`explain` does: an empty table (search_job,
    here) is scanned whatever its indexes."""
    args = prepared.args({**prepared.defaults, **values})
    prefix = "EXPLAIN QUERY PLAN " if store.engine.dialect.name == "sqlite" else "EXPLAIN "
    with store.engine.connect() as conn:
        cursor = conn.connection.dbapi_connection.cursor()
        if store.engine.dialect.name == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"{prefix}{prepared.sql} /* {uuid.uuid4().hex} */", args)
        text = "\n".join(str(r[-1]) for r in cursor.fetchall())
        cursor.close()
        conn.rollback()
    return text


def test_the_claim_pick_that_skips_unimportable_targets_reads_the_claim_index_in_order(busy_store):
    """A worker that leaves some targets' jobs QUEUED filters them on the way, still in index order."""
    stmt = busy_store.claim_query(frozenset({"nosuch:kw", "other:fn"}))
    with busy_store.engine.connect() as conn:
        text = plan(busy_store, stmt, conn)
        first = conn.execute(stmt).scalar()
    assert_uses_claim_index(text, busy_store.engine.dialect.name, ordered=True)
    assert first is not None
    target = busy_store.job(first).target
    with busy_store.engine.connect() as conn:  # the experiment's one target skipped: nothing to take
        assert conn.execute(busy_store.claim_query(frozenset({target}))).scalar() is None


def test_the_claim_update_as_run_reads_the_claim_index(busy_store):
    """The whole claim, as the store's prepared statement runs it (UPDATE ... WHERE id = (pick)),
    including its lookup of the claimed job's parents in job_dep."""
    exp = busy_store.jobs(limit=1)[0].experiment_id
    text = explain_prepared(
        busy_store,
        busy_store.hot.claim,
        exp=exp,
        host="h",
        pid=1,
        pid_started_at=None,
        backend="local",
        backend_id=None,
        log_path=None,
        now=0.0,
        root=None,
    )
    assert "job_dep" in text, text
    assert_uses_claim_index(text, busy_store.engine.dialect.name, ordered=True)


def test_the_finish_looks_dependents_up_by_index(busy_store):
    """Marking a job DONE asks whether it has dependents: an index lookup of job_dep, not a scan."""
    job = busy_store.jobs(limit=1)[0]
    text = explain_prepared(
        busy_store, busy_store.hot.finish_done, id=job.id, lease=1, now=0.0, results=None, exit_code=None
    )
    if busy_store.engine.dialect.name == "sqlite":
        assert "ix_job_dep_parent" in text and "SCAN" not in text, text
    else:
        assert "ix_job_dep_parent" in text and "Seq Scan" not in text, text


def test_the_running_scan_reads_the_claim_index(busy_store):
    stmt = busy_store.running_query()
    with busy_store.engine.connect() as conn:
        text = plan(busy_store, stmt, conn)
    # The status range of either index: (experiment, status) leads both.
    assert_uses_claim_index(
        text, busy_store.engine.dialect.name, ordered=False, names=("ix_job_claim", "ix_job_status")
    )
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
    from jobman.jobdb.dashboard import page_query

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
    import dataclasses

    from jobman.jobdb import report
    from jobman.jobdb.sweep import JobSpec

    small = Store(dataclasses.replace(busy_store.target, experiment=f"{busy_store.experiment}_small"))
    specs = [JobSpec(0, "fn", "pkg.mod:fn", {"lr": i % 5, "seed": i // 5}, None) for i in range(40)]
    ids = small.schedule(specs).job_ids
    with small.engine.begin() as conn:
        conn.execute(sa.update(t_job).where(t_job.c.id.in_(ids)).values(status="DONE", results='{"valid_error": 0.5}'))
        conn.exec_driver_sql("ANALYZE")
    ran: list[tuple[str, dict]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        ran.append((statement, parameters))

    sa.event.listen(small.engine, "before_cursor_execute", capture)
    try:
        rep = report.from_store(small, "valid_error")
    finally:
        sa.event.remove(small.engine, "before_cursor_execute", capture)
    assert rep.best is not None and rep.configurations == 5
    reads = [
        (s.split(" AS ", 1)[1] if s.startswith("CREATE TEMP TABLE") else s, p)
        for s, p in ran
        if "FROM job" in s and "experiment_id" in s and not s.startswith("SELECT experiment.")
    ]
    assert len(reads) >= 4, ran  # the sampled parameters, the two sampled results, the grouping
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


# -- the read paths of list, show, the monitor and a cascade, as the store runs them ------------------


def statements_of(store: Store, verb) -> list[tuple[str, object]]:
    """Every SELECT ``verb()`` sends to the database, with its parameters, as the driver got them."""
    seen: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and not executemany:
            seen.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        verb()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    return seen


def explain(store: Store, statement: str, parameters: object) -> str:
    """The plan of one statement. On PostgreSQL with sequential scans priced out, as on a table of a
    million rows: a table of a few thousand is scanned whatever its indexes, and the question here is
    whether an index serves the statement (without one, the plan still scans)."""
    prefix = "EXPLAIN QUERY PLAN " if store.engine.dialect.name == "sqlite" else "EXPLAIN "
    with store.engine.connect() as conn:
        cursor = conn.connection.dbapi_connection.cursor()
        if store.engine.dialect.name == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"{prefix}{statement} /* {uuid.uuid4().hex} */", parameters)
        text = "\n".join(str(r[-1]) for r in cursor.fetchall())
        cursor.close()
        conn.rollback()
    return text


def assert_indexed(text: str, dialect: str, *, ordered: bool = True) -> None:
    """No table scan of job or job_event; with ``ordered``, no sort of the matching rows either."""
    if dialect == "sqlite":
        scans = [line for line in text.splitlines() if line.strip().startswith("SCAN")]
        assert not scans, text
        if ordered:
            assert "TEMP B-TREE" not in text, text
    else:
        assert "Seq Scan" not in text, text
        if ordered:  # a Sort under the Limit would sort every match
            assert "Sort" not in text, text


def plans_of(store: Store, verb) -> list[str]:
    found = statements_of(store, verb)
    assert found, "the verb ran no query"
    return [explain(store, s, p) for s, p in found if "FROM job" in s or "FROM job_event" in s]


@pytest.mark.parametrize(
    "name, verb",
    [
        ("first page", lambda s: s.jobs(limit=50)),
        ("one status", lambda s: s.jobs(status=[Status.QUEUED], limit=50)),
        ("two statuses", lambda s: s.jobs(status=[Status.QUEUED, Status.RUNNING], limit=50)),
        ("one phase", lambda s: s.jobs(phase=0, limit=50)),
        ("phase and status", lambda s: s.jobs(phase=0, status=[Status.DONE, Status.QUEUED], limit=50)),
    ],
)
def test_a_page_of_jobman_list_reads_an_index_in_id_order(busy_store, name, verb):
    dialect = busy_store.engine.dialect.name
    found = statements_of(busy_store, lambda: verb(busy_store))
    plans = [explain(busy_store, s, p) for s, p in found if "FROM job" in s]
    for (statement, _), text in zip([f for f in found if "FROM job" in f[0]], plans):
        # The page's own dependencies (a few rows by job_dep's key) may be sorted; the page may not.
        assert_indexed(text, dialect, ordered="FROM job_dep" not in statement)
    names = {
        "first page": "ix_job_list",
        "one status": "ix_job_status",
        "two statuses": "ix_job_status",
        "one phase": "ix_job_phase",
        "phase and status": "ix_job_phase",
    }
    if dialect == "sqlite":  # PostgreSQL may take the primary key in id order, stopped by the limit
        assert any(names[name] in t for t in plans), plans


def test_a_parameter_filter_reads_the_parameter_index_on_postgresql(busy_store):
    """PostgreSQL answers ``params @> ...`` from ix_job_params; SQLite reads in id order, stopped at the page."""
    dialect = busy_store.engine.dialect.name
    jobs = busy_store.jobs(params={"x": 17}, limit=5)
    assert [j.params["x"] for j in jobs] == [17]
    plans = plans_of(busy_store, lambda: busy_store.jobs(params={"x": 17}, limit=5))
    if dialect == "postgresql":
        assert any("ix_job_params" in t for t in plans), plans
    else:
        assert any("ix_job_list" in t for t in plans), plans


def test_show_reads_one_job_its_links_and_its_events_by_index(busy_store):
    job = busy_store.jobs(limit=1)[0]
    dialect = busy_store.engine.dialect.name

    def show() -> None:
        busy_store.job(job.id)
        busy_store.children(job.id)
        busy_store.events(job.id)
        busy_store.rungs([job.id])

    for text in plans_of(busy_store, show):
        assert_indexed(text, dialect)


def test_the_counts_and_the_monitors_latest_crashes_read_indexes(busy_store):
    dialect = busy_store.engine.dialect.name
    for text in plans_of(busy_store, busy_store.counts):
        assert_indexed(text, dialect, ordered=False)
        if dialect == "sqlite":
            assert "COVERING INDEX ix_job_phase" in text, text
    for text in plans_of(busy_store, lambda: busy_store.recent_events(to_status=[Status.CRASHED], limit=5)):
        assert_indexed(text, dialect, ordered=False)


def test_a_cascade_finds_the_descendants_by_index(busy_store):
    """The recursive walk of a reset --cascade follows ix_job_dep_parent, never a scan of job_dep."""
    from jobman.jobdb import graph

    parent = busy_store.jobs(limit=1)[0].id
    with busy_store.engine.connect() as conn:
        found = statements_of(busy_store, lambda: graph.descendants(conn, [parent]))
    assert found
    for statement, params in found:
        text = explain(busy_store, statement, params)
        if busy_store.engine.dialect.name == "sqlite":
            assert "ix_job_dep_parent" in text and "SCAN job_dep" not in text, text
        else:
            assert "ix_job_dep_parent" in text and "Seq Scan" not in text, text


def test_the_json_of_a_report_sorts_its_configurations_once(busy_store, monkeypatch):
    """The json reads every configuration ranked; on PostgreSQL the jsonb is made text after the sort,
    in a query around it whose ORDER BY the planner knows is met: one sort either way."""
    import dataclasses
    import re

    from jobman.jobdb import report
    from jobman.jobdb.report import queries
    from jobman.jobdb.sweep import JobSpec

    small = Store(dataclasses.replace(busy_store.target, experiment=f"{busy_store.experiment}_json"))
    ids = small.schedule([JobSpec(0, "fn", "pkg.mod:fn", {"lr": i}, None) for i in range(50)]).job_ids
    with small.engine.begin() as conn:
        for i in ids:
            conn.execute(
                sa.update(t_job)
                .where(t_job.c.id == i)
                .values(status="DONE", results=f'{{"valid_error": {(i * 7919) % 50 / 50}}}')
            )
    pg = small.engine.dialect.name == "postgresql"
    plans: list[str] = []
    real = queries.ranked_batches

    def explained(conn, sql, section, columns, mode, allow_incomplete):
        for cls in section.classes(allow_incomplete):
            query = queries.ranked_query(sql, section, columns, mode, allow_incomplete, ids=False, cls=cls)
            rows = (
                conn.execution_options(stream_results=False)
                .execute(sa.text(("EXPLAIN " if pg else "EXPLAIN QUERY PLAN ") + query), sql.binds)
                .all()
            )
            plans.append("\n".join(str(r[-1]) for r in rows))
        yield from real(conn, sql, section, columns, mode, allow_incomplete)

    monkeypatch.setattr(queries, "ranked_batches", explained)
    with report.open_report(small, "valid_error", keep=1) as rep:
        rows = [json.loads(text) for text in rep.iter_json()]
    assert [r["rank"] for r in rows] == list(range(1, 51)) and plans
    means = [r["mean"] for r in rows]
    assert means == sorted(means)
    for text in plans:
        if pg:
            assert len(re.findall(r"(?:^|->)\s*Sort\s+\(", text, re.M)) == 1, text
        else:
            assert text.count("USE TEMP B-TREE FOR ORDER BY") == 1, text
    small.dispose()

"""Exactly-once claiming under contention: many real processes drain one experiment on each engine."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobman.jobdb.schema import job_event as t_event
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import expand, parse_sweep

WORKERS = 8
JOBS = 400

# Each worker connects, waits for the starting gun so that all contend at once, then claims and
# finishes until nothing is left. It reports what it ran, and any error, as one JSON line.
WORKER = r"""
import json, os, sys, time, traceback
from jobman.jobdb.store import Store, WorkerInfo
url, go, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
ran, errors = [], []
store = Store.open(url, create=False)
store.jobs(limit=1)  # connected and ready: says so, then waits for the gun
me = WorkerInfo(host="worker%d" % index, pid=os.getpid())
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
try:
    claimed = store.claim(me)
    while claimed is not None:
        ran.append(claimed.job.id)
        time.sleep(0.002)  # the job runs a moment: every worker gets to contend
        results = {"by": index, "x": claimed.job.params["x"]}
        if index % 2:  # half claim on their own, half with the record of their last job, as a worker does
            store.finish(claimed.job.id, claimed.lease, "DONE", results=results)
            claimed = store.claim(me)
        else:
            _, claimed = store.finish_and_claim(claimed.job.id, claimed.lease, "DONE", me, results=results)
except Exception:
    errors.append(traceback.format_exc())
print(json.dumps({"ran": ran, "errors": errors}))
"""


def test_many_processes_claim_every_job_exactly_once(db_url, tmp_path):
    store = Store.open(db_url)
    ids = store.schedule(expand(parse_sweep(["pkg.mod:fn", "x={{" + ",".join(map(str, range(JOBS))) + "}}"]))).job_ids
    assert len(ids) == JOBS
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, db_url, str(go), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(WORKERS)
    ]
    try:
        for p in procs:  # every worker connected before the gun: they contend from the first claim
            assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.poll() is not None else ""
        go.touch()
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    reports = []
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err
        assert "locked" not in err.lower() and "Traceback" not in err, err
        report = json.loads(out.strip().splitlines()[-1])
        assert report["errors"] == [], report["errors"]
        reports.append(report)

    ran = Counter(i for r in reports for i in r["ran"])
    assert sorted(ran) == sorted(ids), "every job ran"
    assert max(ran.values()) == 1, [i for i, n in ran.items() if n > 1]
    assert sum(1 for r in reports if r["ran"]) >= 2, "the work was shared"

    jobs = store.jobs()
    assert Counter(j.status for j in jobs) == {Status.DONE: JOBS}
    assert all(j.attempt == 1 and j.lease == 1 for j in jobs)
    by_job = {j.id: j for j in jobs}
    for index, r in enumerate(reports):
        assert all(by_job[i].results["by"] == index and by_job[i].host == f"worker{index}" for i in r["ran"])
    with store.engine.connect() as conn:
        claims = conn.execute(
            sa.select(t_event.c.job_id, sa.func.count())
            .where(t_event.c.job_id.in_(ids), t_event.c.to_status == "RUNNING")
            .group_by(t_event.c.job_id)
        ).all()
    assert len(claims) == JOBS and {n for _, n in claims} == {1}
    assert store.running() == []
    store.dispose()


# Another process takes SQLite's write lock, says so, and keeps it until told to stop (a file appears).
HOLD_LOCK = r"""
import os, sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
print("held", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
con.execute("COMMIT")
"""


def _hold_write_lock(db: Path, release: Path) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(db), str(release)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def _busy_timeout(store: Store) -> int:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql("PRAGMA busy_timeout").scalar()


def test_a_sqlite_writer_waits_for_another_process_s_write_lock_then_writes(tmp_path):
    from jobman.jobdb import engine as db_engine

    db = tmp_path / "jobs.db"
    store = Store.open(f"sqlite:///{db}?table=t")
    release = tmp_path / "release"
    holder = _hold_write_lock(db, release)
    began, begun, wrote, failed = [], threading.Event(), threading.Event(), []

    def write(c):
        began.append(c.connection.dbapi_connection.in_transaction)
        c.exec_driver_sql("CREATE TABLE probe (x)")
        wrote.set()

    def writer():
        try:
            with store.engine.connect() as conn:  # one try, no retry above it: the wait is the BEGIN's own
                driver = conn.connection.dbapi_connection
                # SQLite calls this as a statement starts: a BEGIN seen is a BEGIN tried, however late
                # this thread got to run.
                driver.set_trace_callback(lambda sql: sql.lstrip().upper().startswith("BEGIN") and begun.set())
                try:
                    db_engine.in_write_transaction(conn, write)
                finally:
                    driver.set_trace_callback(None)
        except BaseException as exc:  # noqa: BLE001 - whatever the thread meets, the test re-raises
            failed.append(exc)
            wrote.set()

    thread = threading.Thread(target=writer, daemon=True)
    try:
        thread.start()
        assert begun.wait(30) or failed, "the writer never tried to begin its transaction"
        # Seen from here while the other process still holds the lock: the writer has tried to begin,
        # and a second later it is still waiting, neither written nor given up.
        assert not wrote.wait(1.0), f"the writer did not wait for the lock: {failed or began}"
        assert thread.is_alive() and began == [] and failed == []
        assert holder.poll() is None, "the lock was let go before the writer was seen waiting"
        release.touch()
        thread.join(timeout=30)
        assert not thread.is_alive() and failed == [], failed
        assert began == [True]  # written inside the transaction begun once the lock was free
        assert holder.wait(timeout=5) == 0
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM probe").scalar() == 0
        assert _busy_timeout(store) == 60_000  # the connection's own timeout is back for every other statement
    finally:
        release.touch()
        holder.wait(timeout=10)
        thread.join(timeout=70)
        store.dispose()


def test_a_sqlite_writer_gives_up_on_a_lock_held_past_the_busy_timeout(tmp_path, monkeypatch):
    from jobman.jobdb import engine as db_engine

    db = tmp_path / "jobs.db"
    store = Store.open(f"sqlite:///{db}?table=t")
    release = tmp_path / "release"
    holder = _hold_write_lock(db, release)
    monkeypatch.setattr(db_engine, "SQLITE_BUSY_TIMEOUT_S", 0.3)
    try:
        with store.engine.connect() as conn:
            with pytest.raises(sa.exc.OperationalError, match="database is locked"):
                db_engine.in_write_transaction(conn, lambda c: c.exec_driver_sql("SELECT 1").scalar())
            assert not conn.connection.dbapi_connection.in_transaction
        assert holder.poll() is None  # still holding: the writer gave up, it was not let in
    finally:
        release.touch()
        holder.wait(timeout=10)
        store.dispose()

"""Writes killed half-way: SIGKILL in the middle of a 100,000-job (and, marked slow, a 1,000,000-job)
schedule and of a 10,000-job cascade.

A process is killed only once it is provably inside its transaction: for a schedule, once SQLite's WAL
has grown by megabytes of uncommitted rows, or once PostgreSQL shows its INSERT running (if the write
finished before the kill landed, the test tries again, sooner); a reset is held before its commit and
never let go, and is killed once it has begun writing or once it has written everything, its
transaction seen open by the database. Afterwards all or none of the write is there (none, for the
reset), and the database is consistent and usable.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from jobman.jobdb.schema import job as t_job
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec, expand, parse_sweep

BIG = ["a={{" + ",".join(map(str, range(100))) + "}}", "b={{" + ",".join(map(str, range(1000))) + "}}"]
BIG_COUNT = 100_000
WAL_INSIDE = 4 << 20  # bytes of WAL that only the big insert's uncommitted rows can account for
# A million jobs are inserted a chunk at a time in one transaction: killed deep inside, after a
# hundred megabytes of WAL (SQLite) or seconds of inserting (PostgreSQL), nothing may be left.
HUGE = ["a={{" + ",".join(map(str, range(1000))) + "}}", "b={{" + ",".join(map(str, range(1000))) + "}}"]
# Seconds between seeing the insert under way and the kill, per try: SQLite's WAL is at 100 MB some
# way into the million; PostgreSQL's INSERT shows from the first chunk, so the kill waits to land deep.
SIZES = [
    pytest.param(
        BIG, BIG_COUNT, WAL_INSIDE, {"sqlite": (0.5, 0.1, 0.0, 0.0, 0.0), "postgresql": (0.5, 0.1, 0.0)}, id="100k"
    ),
    pytest.param(
        HUGE,
        1_000_000,
        100 << 20,
        {"sqlite": (0.5, 0.1, 0.0, 0.0), "postgresql": (8.0, 3.0, 0.5, 0.0)},
        id="1M",
        marks=pytest.mark.slow,
    ),
]


def _pg_dsn(url: str) -> tuple[str, str]:
    """A libpq URL without the experiment, and the database name."""
    base = url.split("?", 1)[0]
    return base, base.rsplit("/", 1)[1]


def _pg_backends(url: str, *, query_like: str | None = None, in_transaction: bool = False) -> list[int]:
    """Server pids of jobman's connections to this database matching the condition."""
    dsn, name = _pg_dsn(url)
    sql = (
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = 'jobman' "
        "AND pid <> pg_backend_pid()"
    )
    args: list = [name]
    if query_like is not None:
        sql += " AND state = 'active' AND query LIKE %s"
        args.append(query_like)
    if in_transaction:
        sql += " AND xact_start IS NOT NULL"
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute(sql, args).fetchall()]


def _wait_backends_gone(url: str, pids: list[int], timeout: float = 60) -> None:
    """The server has noticed the dead client and rolled its transaction back."""
    dsn, _ = _pg_dsn(url)
    deadline = time.time() + timeout
    while time.time() < deadline:
        with psycopg.connect(dsn, autocommit=True) as conn:
            alive = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]).fetchone()[0]
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"server backends {pids} outlived their killed client by {timeout} s")


def _sqlite_path(url: str) -> str:
    return url.split("?", 1)[0][len("sqlite:///") :]


def _sqlite_checks(url: str) -> None:
    with sqlite3.connect(_sqlite_path(url)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def _new_url(db_url: str, engine_name: str, tmp_path: Path, attempt: int) -> str:
    """A fresh experiment (SQLite: a fresh file too) for each try."""
    name = f"kill{attempt}_{uuid.uuid4().hex[:6]}"
    if engine_name == "sqlite":
        return f"sqlite:///{tmp_path / f'kill{attempt}.db'}?table={name}"
    return f"{db_url.split('?', 1)[0]}?table={name}"


# -- a 100,000-job schedule, killed ------------------------------------------------------------


def _count(url: str) -> int:
    """The jobs of the experiment named in ``url``."""
    store = Store.open(url)
    try:
        with store.engine.connect() as conn:
            return conn.execute(
                sa.text("SELECT count(*) FROM job JOIN experiment e ON e.id = job.experiment_id WHERE e.name = :n"),
                {"n": store.experiment},
            ).scalar()
    finally:
        store.dispose()


def _inside_schedule(url: str, engine_name: str, wal_inside: int = WAL_INSIDE) -> list[int] | bool:
    if engine_name == "sqlite":
        wal = Path(_sqlite_path(url) + "-wal")
        return wal.exists() and wal.stat().st_size > wal_inside
    return _pg_backends(url, query_like="INSERT INTO job %")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("sweep, count, wal_inside, delays", SIZES)
def test_a_schedule_killed_mid_insert_leaves_all_or_nothing(
    db_url, engine_name, tmp_path, sweep, count, wal_inside, delays
):
    for attempt, extra_delay in enumerate(delays[engine_name]):
        url = _new_url(db_url, engine_name, tmp_path, attempt)
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobman.cli.main", "sqlschedule", url, "--no-check", "pkg.mod:train", *sweep],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        backends: list[int] = []
        deadline = time.time() + 600
        while proc.poll() is None and time.time() < deadline:
            inside = _inside_schedule(url, engine_name, wal_inside)
            if inside:
                backends = inside if isinstance(inside, list) else []
                time.sleep(extra_delay)
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        code = proc.wait(timeout=60)
        if code == -signal.SIGKILL:
            # Killed after its commit (all there)? Then it did not land inside the transaction, whatever
            # the WAL's size said (a WAL keeps its size after a commit): that try proves nothing, sooner.
            if engine_name == "postgresql":
                _wait_backends_gone(url, backends)
            if _count(url) != count:
                break
            continue
        assert code == 0, f"sqlschedule exited {code} before it could be killed"
    else:
        pytest.fail(f"the {count:,}-job schedule always finished before SIGKILL reached it")

    if engine_name == "postgresql":
        _wait_backends_gone(url, backends)
    else:
        _sqlite_checks(url)
    store = Store.open(url)  # the database opens and the experiment can be written again
    try:
        engine = store.engine
        with engine.connect() as conn:
            exp = conn.execute(sa.text("SELECT id FROM experiment WHERE name = :n"), {"n": store.experiment}).scalar()
            jobs = conn.execute(sa.text("SELECT count(*) FROM job WHERE experiment_id = :e"), {"e": exp}).scalar()
        assert jobs == 0, f"{jobs} of the {count} jobs survived the kill"
        assert (exp is None) == (jobs == 0), "the experiment is made in the same transaction as its jobs"
        added = store.schedule(expand(parse_sweep(["pkg.mod:train", "a=-1", "b={{1,2}}"]))).added
        assert added == 2
        with engine.connect() as conn:
            after = conn.execute(
                sa.text("SELECT count(*) FROM job JOIN experiment e ON e.id = experiment_id WHERE e.name = :n"),
                {"n": store.experiment},
            ).scalar()
        assert after == jobs + 2
        print(f"{engine_name}: killed on try {attempt + 1}; {jobs} jobs present afterwards")
    finally:
        store.dispose()


# -- a reset cascading over 10,000 descendants, killed -------------------------------------------

# The reset runs until it has written everything, then stops before its commit and waits there: the
# test never lets it commit, so a kill anywhere after its first write lands inside its transaction.
# Seen through SQLAlchemy's own events, so any way the store comes to write and commit is covered; a
# reset that commits some other way prints "done" and fails the test rather than passing it.
RESET = r"""
import os, sys
import sqlalchemy as sa
from jobman.jobdb.store import Store
store = Store.open(sys.argv[1], create=False)
root = int(sys.argv[2])
store.jobs(ids=[root], with_deps=False)  # connected and ready
wrote = []


@sa.event.listens_for(store.engine, "before_cursor_execute")
def writing(conn, cursor, statement, parameters, context, executemany):
    if not wrote and statement.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE")):
        wrote.append(statement)
        print("writing", flush=True)


@sa.event.listens_for(store.engine, "commit")
def committing(conn):
    if wrote:  # the commit of the transaction that wrote, not of a read before it
        print("committing", flush=True)
        sys.stdin.readline()  # never answered: the test kills this process first
        os._exit(3)


print("go", flush=True)
store.reset([root], cascade=True, why="reset under test")
print("done", flush=True)
"""


def _big_tree(url: str) -> tuple[Store, int, list[int]]:
    """A root with 100 children and 9,900 grandchildren, all DONE with results."""
    store = Store.open(url)
    specs = [JobSpec(0, "fn", "pkg.mod:train", {"r": 0}, None)]
    specs += [JobSpec(1, "fn", "pkg.mod:train", {"r": 0, "c": c}, 0) for c in range(100)]
    specs += [JobSpec(2, "fn", "pkg.mod:train", {"r": 0, "c": c, "g": g}, 1 + c) for c in range(100) for g in range(99)]
    ids = store.schedule(specs).job_ids
    assert len(ids) == 10_001
    exp = store.job(ids[0]).experiment_id
    with store.engine.begin() as conn:  # what 10,001 finished runs leave, without running them
        conn.execute(
            sa.update(t_job)
            .where(t_job.c.experiment_id == exp)
            .values(status=Status.DONE.value, results='{"acc": 1}', attempt=1, finished_at=time.time())
        )
    return store, ids[0], ids


def _inside_reset(url: str, engine_name: str) -> list[int] | bool:
    if engine_name == "postgresql":
        return _pg_backends(url, in_transaction=True)
    probe = sqlite3.connect(_sqlite_path(url), timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:  # another process holds the write lock: the reset's transaction
        return "locked" in str(exc)
    finally:
        probe.close()


def assert_graph_consistent(store: Store) -> None:
    """QUEUED exactly when every dependency is DONE; WAITING only with a dependency not DONE."""
    jobs = {j.id: j for j in store.jobs()}
    for j in jobs.values():
        parents = [jobs[p].status for p in j.depends_on]
        if j.status is Status.QUEUED:
            assert all(s is Status.DONE for s in parents), f"job {j.id} QUEUED under {parents}"
        if j.status is Status.WAITING:
            assert any(s is not Status.DONE for s in parents), f"job {j.id} WAITING under DONE parents"


@pytest.mark.timeout(400)
@pytest.mark.parametrize("when", ["writing", "committing"])
def test_a_cascading_reset_killed_half_way_is_all_or_nothing(db_url, engine_name, tmp_path, when):
    """Killed once its first row is written (half way through 10,001), or once every row is written and
    its commit is about to be sent: either way inside its transaction, so none of the reset is kept."""
    url = _new_url(db_url, engine_name, tmp_path, 0)
    store, root, ids = _big_tree(url)
    proc = subprocess.Popen(
        [sys.executable, "-c", RESET, url, str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "go", proc.stderr.read()
        seen = ["go"]
        while seen[-1] != when:
            line = proc.stdout.readline().strip()
            assert line in ("writing", "committing"), f"the reset went {seen + [line]}: {proc.stderr.read()}"
            seen.append(line)
        inside = _inside_reset(url, engine_name)  # and the database shows its transaction open
        assert inside, f"no transaction of the reset is open at {when!r}"
        backends = inside if isinstance(inside, list) else []
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, err)
    assert "done" not in out
    store.dispose()

    if engine_name == "postgresql":
        _wait_backends_gone(url, backends)
    else:
        _sqlite_checks(url)
    store.dispose()
    store = Store.open(url, create=False)
    try:
        jobs = store.jobs()
        statuses = {j.id: j.status for j in jobs}
        untouched = all(s is Status.DONE for s in statuses.values()) and all(j.results == {"acc": 1} for j in jobs)
        reset = (
            statuses[root] is Status.QUEUED
            and all(s is Status.WAITING for i, s in statuses.items() if i != root)
            and all(j.results is None for j in jobs)
        )
        assert untouched or not reset, "a reset killed before its commit was kept"
        assert untouched, f"a half-done reset: {sorted(set(statuses.values()))}"
        logged = sum(
            1 for i in (root, ids[1], ids[-1]) for e in store.events(i) if e.why.startswith("reset under test")
        )
        assert logged == 0, "the event log tells the same story as the jobs"
        assert_graph_consistent(store)
        # And the graph still moves: reset again, to the end this time.
        store.reset([root], why="reset after the kill")
        assert store.job(root).status is Status.QUEUED and store.job(ids[-1]).status is Status.WAITING
        assert_graph_consistent(store)
        print(
            f"{engine_name}: killed at {when!r}{' (it had reached its commit)' if 'committing' in out else ''}; "
            "none of the reset was kept"
        )
    finally:
        store.dispose()

"""How many PostgreSQL connections a worker holds: one at most, and none while a long job runs.

Counted on the server (``pg_stat_activity``, by the ``jobman-worker`` application name and the
test's own database) while a real ``jobman worker`` runs real jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

EXPERIMENT = """
import time
import uuid

def sleep(state, channel):
    if state.get("marker"):
        open(state["marker"], "w").close()
    time.sleep(state["seconds"])
    return {"slept": state["seconds"]}
"""


class ConnectionCounter:
    """Samples, every 20 ms from another thread, how many worker connections the server has to ``url``'s database."""

    def __init__(self, url: str) -> None:
        self.url = url.split("?")[0]
        self.database = self.url.rsplit("/", 1)[1]
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                (n,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = 'jobman-worker'",
                    (self.database,),
                ).fetchone()
                self.samples.append((time.monotonic(), n))
                time.sleep(0.02)

    def __enter__(self) -> ConnectionCounter:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def between(self, start: float, end: float) -> list[int]:
        return [n for t, n in self.samples if start <= t <= end]


@pytest.fixture
def setup(own_pg_database: str, tmp_path: Path):
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "conn_exp.py").write_text(EXPERIMENT)
    url = f"{own_pg_database}?table=conns"
    store = Store.open(url)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)}
    yield url, store, env, tmp_path
    store.dispose()


def schedule(store: Store, *params: dict) -> list[int]:
    specs = [JobSpec(phase=0, kind="fn", target="conn_exp:sleep", params=p, parent=None) for p in params]
    return store.schedule(specs).job_ids


def worker(url: str, env: dict, tmp_path: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "jobman.cli.main", "worker", url, "--exproot", str(tmp_path / "runs"), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_worker_holds_no_connection_while_a_long_job_runs_and_its_heartbeats_still_land(setup):
    url, store, env, tmp_path = setup
    marker = tmp_path / "started"
    [job_id] = schedule(store, {"seconds": 7, "marker": str(marker)})
    with ConnectionCounter(url) as counter:
        proc = worker(url, env, tmp_path, "--heartbeat", "1")
        deadline = time.time() + 60
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.02)
        assert marker.exists(), "the job never started"
        started = time.monotonic()
        time.sleep(1)
        beat_before = store.job(job_id).heartbeat_at
        time.sleep(4)
        beat_after = store.job(job_id).heartbeat_at
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    during = counter.between(started + 2.5, started + 5)  # past the 2 s a job keeps the connection
    assert during and max(during) <= 1, "a worker held more than one connection"
    assert sum(n == 0 for n in during) >= 0.8 * len(during), f"the worker kept a connection while its job ran: {during}"
    assert beat_after > beat_before, "heartbeats stopped landing once the connection was let go"
    assert max(n for _t, n in counter.samples) <= 1
    assert store.job(job_id).status is Status.DONE


def test_a_worker_running_tiny_jobs_back_to_back_keeps_one_connection(setup):
    url, store, env, tmp_path = setup
    schedule(store, *({"seconds": 0.01, "i": i} for i in range(60)))
    with ConnectionCounter(url) as counter:
        proc = worker(url, env, tmp_path)
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    counts = [n for _t, n in counter.samples]
    assert max(counts) == 1, f"worker connections seen: {sorted(set(counts))}"
    assert {j.status for j in store.jobs()} == {Status.DONE}


def test_a_worker_waiting_for_another_workers_job_holds_no_connection(setup):
    url, store, env, tmp_path = setup
    marker = tmp_path / "started"
    store.schedule(
        [
            JobSpec(
                phase=0, kind="fn", target="conn_exp:sleep", params={"seconds": 7, "marker": str(marker)}, parent=None
            ),
            JobSpec(phase=1, kind="fn", target="conn_exp:sleep", params={"seconds": 0.01, "after": 1}, parent=0),
        ]
    )
    with ConnectionCounter(url) as counter:
        procs = [worker(url, env, tmp_path, "--heartbeat", "30") for _ in range(2)]
        deadline = time.time() + 60
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.02)
        assert marker.exists(), "the job never started"
        started = time.monotonic()
        for proc in procs:
            _out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
    during = counter.between(started + 3, started + 6)  # one worker's job runs on, the other waits for it
    assert during and sum(n == 0 for n in during) >= 0.9 * len(during), f"connections held while waiting: {during}"
    assert {j.status for j in store.jobs()} == {Status.DONE}


def test_a_schema_named_in_the_url_holds_everything_done_through_pgbouncer(pgbouncer, pg_database, tmp_path):
    """PgBouncer 1.18 refuses the ``options`` startup parameter, and in transaction pooling mode hands each
    transaction to whichever server connection is free: ``?schema=`` is set in every transaction. Two
    experiments in two schemas run at once through one PgBouncer, each finding only its own tables."""
    tag = uuid.uuid4().hex[:6]
    schemas, experiment = [f"pgb_a_{tag}", f"pgb_b_{tag}"], f"schemas_{tag}"
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "conn_exp.py").write_text(EXPERIMENT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)}

    def jobman(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "jobman.cli.main", *argv], env=env, capture_output=True, text=True)

    def url(schema: str) -> str:
        return f"{pgbouncer}?schema={schema}&table={experiment}"

    with psycopg.connect(pg_database, autocommit=True) as admin:
        for schema in schemas:
            admin.execute(f"CREATE SCHEMA {schema}")
    try:
        for n, schema in enumerate(schemas, start=2):  # 2 jobs in the first schema, 3 in the second
            r = jobman("db", "upgrade", url(schema))
            assert r.returncode == 0 and "upgraded from nothing" in r.stdout, r.stderr
            values = ",".join(str(0.01 * (i + 1)) for i in range(n))
            r = jobman("sqlschedule", url(schema), "conn_exp:sleep", f"seconds={{{{{values}}}}}")
            assert r.returncode == 0 and f"added {n} jobs" in r.stdout, r.stderr
        workers = [
            subprocess.Popen(
                [sys.executable, "-m", "jobman.cli.main", "worker", url(s), "--exproot", str(tmp_path / s)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for s in schemas
        ]
        for proc in workers:
            _out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and "Traceback" not in err, err
        for n, schema in enumerate(schemas, start=2):
            r = jobman("list", url(schema), "--format", "json")
            assert r.returncode == 0, r.stderr
            assert [j["status"] for j in json.loads(r.stdout)] == ["DONE"] * n, r.stdout
        with psycopg.connect(pg_database) as direct:  # on the server itself: each schema holds its own
            for n, schema in enumerate(schemas, start=2):
                rows = direct.execute(
                    f"SELECT j.status, count(*) FROM {schema}.job j JOIN {schema}.experiment e "
                    "ON e.id = j.experiment_id WHERE e.name = %s GROUP BY j.status",
                    (experiment,),
                ).fetchall()
                assert rows == [("DONE", n)], (schema, rows)
            public = direct.execute("SELECT to_regclass('public.experiment')").fetchone()[0]
            if public is not None:
                found = direct.execute("SELECT count(*) FROM public.experiment WHERE name = %s", (experiment,))
                assert found.fetchone()[0] == 0, "a transaction missed its schema and wrote to public"
    finally:
        with psycopg.connect(pg_database, autocommit=True) as admin:
            for schema in schemas:
                admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_a_worker_waiting_for_others_connects_once_a_look(setup):
    """Each look of a waiting worker (a claim, then what is left to wait for) is one connection, opened
    and closed: a hundred idle workers at the end of a sweep cost the server a hundred connects a second,
    not two hundred. Counted by the server (``pg_stat_database.sessions``, counted as sessions end)."""
    from jobman.jobdb.store import WorkerInfo

    url, store, env, tmp_path = setup
    [job_id] = schedule(store, {"seconds": 1})
    assert store.claim(WorkerInfo.here()) is not None  # another worker's job, RUNNING all along
    store.dispose()
    database = url.split("?")[0].rsplit("/", 1)[1]
    log = tmp_path / "worker.log"

    def looks() -> int:
        return log.read_text().count("nothing ready")

    with psycopg.connect(url.split("?")[0], autocommit=True) as conn, open(log, "w") as out:

        def sessions() -> int:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            query = "SELECT sessions FROM pg_stat_database WHERE datname = %s"
            return conn.execute(query, (database,)).fetchone()[0]

        argv = ["worker", url, "--exproot", str(tmp_path / "runs"), "--verbose"]
        proc = subprocess.Popen([sys.executable, "-m", "jobman.cli.main", *argv], env=env, stdout=out, stderr=out)
        try:
            deadline = time.time() + 60
            while looks() < 6 and time.time() < deadline:  # past its start-up's connections: a look a second
                time.sleep(0.05)
            assert looks() >= 6, "the worker never waited: " + log.read_text()[-2000:]
            time.sleep(1.5)  # the server counts a session as it ends
            before, looks_before = sessions(), looks()
            time.sleep(8)
            after, window = sessions(), looks() - looks_before
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()[-2000:]
    assert window >= 5, log.read_text()[-2000:]
    # looks at the window's edges may count on either side: two more connects at most, against two a look
    assert after - before <= window + 2, f"{after - before} connects for {window} looks"
    store = Store.open(url)
    assert store.job(job_id).status is Status.RUNNING
    store.dispose()


TURN = """
import os, sys, time
from jobman.jobdb.connections import ConnectionTurns

open(sys.argv[2] + "." + str(os.getpid()), "w").close()  # ready
while not os.path.exists(sys.argv[2]):  # all ask at once
    time.sleep(0.01)
with ConnectionTurns(sys.argv[1]).held():
    began = time.monotonic()
    time.sleep(1.0)
    print(began, time.monotonic())
"""


def peak_at_once(server: str, processes: int, tmp_path: Path) -> int:
    """The most of ``processes`` processes, all wanting a turn at ``server`` at once, that held one together."""
    go = tmp_path / f"go-{uuid.uuid4().hex}"
    procs = [
        subprocess.Popen([sys.executable, "-c", TURN, server, str(go)], stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    deadline = time.time() + 60
    while len(list(tmp_path.glob(go.name + ".*"))) < processes and time.time() < deadline:
        time.sleep(0.01)
    go.touch()
    spans = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        spans.append(tuple(float(v) for v in out.split()))
    assert len(spans) == processes  # every one had its turn in the end
    edges = sorted([(b, 1) for b, _e in spans] + [(e, -1) for _b, e in spans], key=lambda x: (x[0], x[1]))
    at_once = peak = 0
    for _t, step in edges:
        at_once += step
        peak = max(peak, at_once)
    return peak


def test_a_machines_workers_take_turns_at_connecting_as_many_at_once_as_the_server_has_room_for(
    tmp_path: Path,
):
    """Each attempt takes a server slot while it lives, refused or not: processes wanting to connect to one
    server at once are let through two at a time while nothing is known of it or it is full, and as
    many as half the free slots the last attempt found when it has room (a PgBouncer's server)."""
    from jobman.jobdb.connections import FEWEST_TURNS, ConnectionTurns

    unknown = f"turns-{uuid.uuid4().hex}:5432"
    assert peak_at_once(unknown, 6, tmp_path) == FEWEST_TURNS
    full = f"turns-{uuid.uuid4().hex}:5432"
    ConnectionTurns(full).found(-2)
    assert peak_at_once(full, 6, tmp_path) == FEWEST_TURNS
    roomy = f"turns-{uuid.uuid4().hex}:5432"
    ConnectionTurns(roomy).found(8)
    assert peak_at_once(roomy, 6, tmp_path) == 4
    ConnectionTurns(roomy).found(60)
    assert peak_at_once(roomy, 6, tmp_path) == 6

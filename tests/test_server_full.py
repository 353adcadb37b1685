"""More workers than a PostgreSQL server has connection slots: waited for, said once, never an outage,
and the server's last slots left to others.

A private server (``initdb`` into a temporary directory, ``pg_ctl`` on a free port) with a low
``max_connections``; the workers connect as an ordinary role, and connections like an
administrator's ``psql`` (a superuser's, and another ordinary role's) are tried throughout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from conftest import need_service
from test_faults import PG_BIN, PrivatePostgres

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

# 3 kept for superusers, 3 spared for the lab (JOBMAN_PG_SPARE's default) and 3 more for the looks of the
# workers waiting for a slot: 21 connections kept by jobman, whose 110 workers want one each, at once as a
# Slurm array's would
MAX_CONNECTIONS = 30
WORKERS = 110
JOBS = 660  # of 1 s: about 30 s on the 21 slots, while the monitor is run
OUTLIVED_S = 30  # the workers' exit after the last job's end; a livelock is the outage wait, minutes

EXPERIMENT = """
import os, time

def nap(state, channel):
    time.sleep(1.0)
    with open(os.environ["JM_TRACE"], "a") as fh:
        fh.write(f"{state['i']} {time.time()}\\n")
    return {"i": state["i"]}
"""


@pytest.fixture
def small_server():
    if not (PG_BIN / "initdb").exists():
        need_service(f"no PostgreSQL server binaries in {PG_BIN}")
    server = PrivatePostgres()
    try:
        server.init()
        with open(server.data / "postgresql.conf", "a") as conf:
            conf.write(f"max_connections = {MAX_CONNECTIONS}\n")
        server.start()
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE ROLE lab LOGIN")
            conn.execute("CREATE DATABASE lab OWNER lab")
            conn.execute("CREATE ROLE colleague LOGIN")
    except (subprocess.CalledProcessError, OSError, psycopg.Error) as exc:
        server.teardown()
        need_service(f"cannot start a private PostgreSQL server: {getattr(exc, 'stderr', exc)}")
    try:
        yield server
    finally:
        server.teardown()


class Probe:
    """Connects every 100 ms from another thread, as a psql would."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.tries = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tries += 1
            try:
                with psycopg.connect(self.url, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
            except psycopg.Error as exc:
                self.failures.append(str(exc).splitlines()[0])
            time.sleep(0.1)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_more_workers_than_connection_slots_run_every_job_once_and_the_dispatcher_says_so_once(
    small_server, tmp_path: Path
):
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "full_exp.py").write_text(EXPERIMENT)
    trace = tmp_path / "trace.txt"
    trace.touch()
    url = f"postgresql://lab@127.0.0.1:{small_server.port}/lab?table=full"
    store = Store.open(url)
    store.schedule(
        [JobSpec(phase=0, kind="fn", target="full_exp:nap", params={"i": i}, parent=None) for i in range(JOBS)]
    )
    store.dispose()
    env = {
        **os.environ,
        "JM_TRACE": str(trace),
        "PYTHONPATH": os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p),
    }
    colleague = f"postgresql://colleague@127.0.0.1:{small_server.port}/lab"
    admin_url = f"postgresql://postgres@127.0.0.1:{small_server.port}/lab?table=full"
    with Probe(small_server.url) as probe, Probe(colleague) as other:
        began = time.monotonic()
        dispatch = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobman.cli.main",
                "dispatch",
                url,
                "-j",
                str(WORKERS),
                "--exproot",
                str(tmp_path / "runs"),
                "--no-progress",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        while len(trace.read_text().splitlines()) < 20 and dispatch.poll() is None:
            time.sleep(0.05)
        # an administrator's monitor (a superuser, who has the reserved slots) while the workers wait for slots
        monitor = subprocess.run(
            [sys.executable, "-m", "jobman.cli.main", "monitor", admin_url, "--once"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        _out, err = dispatch.communicate(timeout=600)
        took = time.monotonic() - began
        ended = time.time()
    proc = subprocess.CompletedProcess(dispatch.args, dispatch.returncode, _out, err)
    assert monitor.returncode == 0, monitor.stderr
    assert "no connection to spare" in monitor.stdout + monitor.stderr, monitor.stdout
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    said = [line for line in proc.stderr.splitlines() if "no connection to spare" in line]
    assert len(said) == 1, proc.stderr
    assert "jobman" in said[0] and "PgBouncer" in said[0] and "max_connections" in said[0]
    lines = [line.split() for line in trace.read_text().splitlines()]
    runs = Counter(i for i, _end in lines)
    assert runs == Counter({str(i): 1 for i in range(JOBS)}), "a job ran twice, or not at all"
    outlived = ended - max(float(end) for _i, end in lines)
    store = Store.open(url)
    try:
        assert {j.status for j in store.jobs()} == {Status.DONE}
    finally:
        store.dispose()
    assert probe.tries > 10 and probe.failures == [], probe.failures[:3]
    # an ordinary role of the lab finds the slots jobman leaves (all but the instants a worker's
    # connection exists before it sees it is one too many)
    assert other.tries > 10 and len(other.failures) <= 0.1 * other.tries, (other.tries, other.failures[:3])
    # no livelock: the workers (and their dispatch) end with the work, not after the outage wait
    assert outlived < OUTLIVED_S, f"the dispatch ended {outlived:.0f} s after the last job (all of it {took:.0f} s)"

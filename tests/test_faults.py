"""Faults in what jobman stands on: a PostgreSQL server restarted or stopped under a running
dispatch, a full disk, a read-only database, a dispatch killed outright.

The outage tests start a PostgreSQL server of their own (``initdb`` into a temporary directory,
``pg_ctl`` on a free port) and stop and restart that one; it is torn down even when a test fails.
The disk tests mount a small tmpfs (they need root) and unmount it in the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa

from conftest import need_service
from jobman.jobdb.schema import job_event as t_event
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

PG_BIN = Path("/usr/lib/postgresql/15/bin")
MODULE = "jm_faults_exp"
EXPERIMENTS = textwrap.dedent('''
    import os
    import time


    def short(state, channel):
        time.sleep(state.pause)
        state.out = state.i * 2


    def fill(state, channel):
        """Take every free byte of the disk that holds the database."""
        fd = os.open(os.path.join(state.where, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\\0" * size)
            except OSError:
                pass
        os.close(fd)


    def forever(state, channel):
        while not channel.should_stop():
            time.sleep(0.05)
        return channel.INCOMPLETE
''')


# -- a private PostgreSQL server ------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """A PostgreSQL cluster of this test alone, run as the ``postgres`` user when started as root."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="jobman-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            self.dir.chmod(0o700)

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(PG_BIN / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=120)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.dir / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def teardown(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_pg():
    if not (PG_BIN / "initdb").exists():
        need_service(f"no PostgreSQL server binaries in {PG_BIN}")
    server = PrivatePostgres()
    try:
        server.init()
        server.start()
    except (subprocess.CalledProcessError, OSError) as exc:
        server.teardown()
        need_service(f"cannot start a private PostgreSQL server: {getattr(exc, 'stderr', exc)}")
    try:
        yield server
    finally:
        server.teardown()


@pytest.fixture
def mods(tmp_path: Path) -> dict[str, str]:
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / f"{MODULE}.py").write_text(EXPERIMENTS)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)}


def start_dispatch(url: str, runs: Path, env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen:
    with open(log, "wb") as fh:  # to a file: a full pipe would stall the dispatcher
        return subprocess.Popen([sys.executable, "-m", "jobman.cli.main", "dispatch", url, "-j", "2",
                                 "--exproot", str(runs), "--heartbeat", "0.5", "--grace", "5", "--no-progress",
                                 *extra], env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT)


def processes_naming(text: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``text`` (the experiment's URL or workdir)."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and (text in " ".join(p.info["cmdline"] or ())
                                                       or text in (p.info["cwd"] or "")):
                out.append(p)
        except psutil.Error:
            pass
    return out


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def claims_and_dones(store: Store) -> tuple[Counter, Counter]:
    with store.engine.connect() as conn:
        events = conn.execute(sa.select(t_event.c.job_id, t_event.c.to_status)).all()
    return (Counter(e.job_id for e in events if e.to_status == Status.RUNNING.value),
            Counter(e.job_id for e in events if e.to_status == Status.DONE.value))


# -- database outages ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dispatch_rides_out_a_postgres_restart_and_a_20_s_stop(private_pg, mods, tmp_path: Path):
    url = f"{private_pg.url}?table=outage"
    store = Store.open(url)
    jobs = 300
    store.schedule([JobSpec(0, "fn", f"{MODULE}:short", {"i": i, "pause": 0.1}, None) for i in range(jobs)])
    done = lambda: store.counts().get((0, "DONE"), 0)  # noqa: E731
    runs, log = tmp_path / "runs", tmp_path / "dispatch.log"
    proc = start_dispatch(url, runs, mods, log)
    try:
        wait_until(lambda: done() >= 20, 120, "the first jobs")
        store.dispose()
        private_pg.stop("fast")  # a restart: every connection is cut
        private_pg.start()
        wait_until(lambda: done() >= 80, 120, "jobs after the restart")
        stopped_at = done()
        store.dispose()
        private_pg.stop("fast")
        time.sleep(20)
        assert proc.poll() is None, log.read_text()[-3000:]
        private_pg.start()
        assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=90)
    text = log.read_text()
    assert f"{jobs} DONE" in text, text[-3000:]
    assert stopped_at < jobs, "the sweep ended before the outage: it tested nothing"
    assert "trying again" in text and "the database is back" in text, text[-3000:]
    worker_logs = "".join(p.read_text() for p in (runs / "outage" / "_workers").glob("*.log"))
    assert "Traceback" not in text + worker_logs, (text + worker_logs)[-3000:]
    assert Counter(j.status for j in store.jobs()) == {Status.DONE: jobs}
    assert {j.attempt for j in store.jobs()} == {1}, "an outage cost a job an attempt"
    claims, dones = claims_and_dones(store)
    assert dones == Counter({j.id: 1 for j in store.jobs()}), "a job was recorded DONE twice, or never"
    assert processes_naming(str(runs)) == [] and processes_naming(url) == [], "a process outlived the dispatch"
    store.dispose()


def test_a_worker_gives_up_after_the_outage_wait_and_says_why_in_one_line(private_pg, mods, tmp_path: Path):
    url = f"{private_pg.url}?table=gone"
    store = Store.open(url)
    store.schedule([JobSpec(0, "fn", f"{MODULE}:short", {"i": 0, "pause": 2.0}, None)])
    store.dispose()
    worker = subprocess.Popen([sys.executable, "-m", "jobman.cli.main", "worker", url, "--exproot",
                               str(tmp_path / "r"), "--outage-wait", "3", "--heartbeat", "0.5"],
                              env={**os.environ, **mods}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (tmp_path / "r" / "gone" / "1").exists(), 30, "the job to start")
        private_pg.stop("fast")
        _out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 1, err
    assert err.strip().splitlines()[-1].startswith("jobman: ") and "gave up recording job 1 after" in err, err
    assert "Traceback" not in err
    # a server that is away when a command starts is an error at once, in one sentence
    r = subprocess.run([sys.executable, "-m", "jobman.cli.main", "worker", url], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "the server is unreachable" in r.stderr and "Traceback" not in r.stderr, r.stderr


# -- full disk, read-only database: bounded respawn --------------------------------------------------
@pytest.fixture
def small_disk():
    if os.geteuid() != 0:
        need_service("mounting a tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="jobman-disk-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        where.rmdir()
        need_service(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def _dispatch_that_must_give_up(url: str, tmp_path: Path, mods: dict[str, str]) -> tuple[int, str, int, float]:
    runs, log = tmp_path / "runs", tmp_path / "dispatch.log"
    began = time.monotonic()
    proc = start_dispatch(url, runs, mods, log)
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - began
    starts = len(list((runs / "faults" / "_workers").glob("worker-*.log")))
    assert processes_naming(url) == [], "a worker outlived its dispatch"
    return code, log.read_text(), starts, elapsed


def test_dispatch_on_a_full_disk_stops_with_the_cause_after_a_few_worker_starts(small_disk, mods, tmp_path, jobman):
    url = f"sqlite:///{small_disk / 'jobs.db'}?table=faults"
    store = Store.open(url)
    store.schedule([JobSpec(0, "fn", f"{MODULE}:fill", {"i": i, "where": str(small_disk)}, None) for i in range(10)])
    store.dispose()
    code, text, starts, elapsed = _dispatch_that_must_give_up(url, tmp_path, mods)
    assert code == 1, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("jobman: ") and "workers in a row failed" in last and "the disk is full" in last, (
        text, [j.error for j in Store.open(url).jobs()][:2])
    assert "Traceback" not in text
    assert 2 <= starts <= 8, f"{starts} workers were started"
    assert elapsed < 90
    (small_disk / "filler").unlink()  # space is back: the jobs of the failed workers are found at once
    r = jobman("monitor", url, "--once", "--relaunch")
    assert r.code == 0, r.err
    store = Store.open(url)
    jobs = store.jobs()
    assert Status.RUNNING not in {j.status for j in jobs}
    assert max(j.attempt for j in jobs) <= 1, [(j.id, j.status, j.attempt) for j in jobs]
    store.dispose()


def test_dispatch_on_a_read_only_database_stops_with_the_cause(small_disk, mods, tmp_path):
    url = f"sqlite:///{small_disk / 'jobs.db'}?table=faults"
    store = Store.open(url)
    store.schedule([JobSpec(0, "fn", f"{MODULE}:short", {"i": i, "pause": 0.01}, None) for i in range(20)])
    store.dispose()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    code, text, starts, elapsed = _dispatch_that_must_give_up(url, tmp_path, mods)
    assert code == 1, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("jobman: ") and "read-only" in last, text[-3000:]
    assert "Traceback" not in text
    assert starts <= 8, f"{starts} workers were started"  # the dispatch itself cannot open it: none
    assert elapsed < 90
    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    store = Store.open(url)
    assert {j.status for j in store.jobs()} == {Status.QUEUED}
    store.dispose()


# -- no worker outlives its dispatcher ---------------------------------------------------------------
def test_workers_of_a_killed_dispatch_stop_and_put_their_jobs_back(mods, tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=faults"
    store = Store.open(url)
    store.schedule([JobSpec(0, "fn", f"{MODULE}:forever", {"i": i}, None) for i in range(3)])
    runs = tmp_path / "runs"
    proc = start_dispatch(url, runs, mods, tmp_path / "dispatch.log")
    try:
        wait_until(lambda: len(store.running()) == 2, 60, "two running jobs")
        workers = [p for p in processes_naming(url) if p.pid != proc.pid]
        assert workers
        proc.kill()  # SIGKILL: no chance to stop anything itself
        proc.wait()
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert alive == [], "a worker outlived its dispatch"
    finally:
        for p in processes_naming(url):
            p.kill()
    jobs = store.jobs()
    assert {j.status for j in jobs} == {Status.QUEUED}, [(j.id, j.status) for j in jobs]
    assert processes_naming(str(runs)) == []
    store.dispose()


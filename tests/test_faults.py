"""Faults in what jobman stands on: a PostgreSQL server restarted or stopped under a running
dispatch, a full disk, a read-only database, a dispatch killed outright.

The outage tests start a PostgreSQL server of their own (``initdb`` into a temporary directory,
``pg_ctl`` on a free port) and stop and restart that one; it is torn down even when a test fails.
The disk tests mount a small tmpfs (they need root) and unmount it in the end.
"""

from __future__ import annotations

import contextlib
import json
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
from conftest import need_kernel, need_service

from jobman.jobdb.schema import job as t_job
from jobman.jobdb.schema import job_event as t_event
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
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
        """Take every free byte of the disk that holds the database, once (``flag`` says it was done)."""
        if os.path.exists(state.flag):
            return
        open(state.flag, "w").close()
        fd = os.open(os.path.join(state.where, "filler"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\\0" * size)
            except OSError:
                pass
        os.close(fd)


    def spawner(state, channel):
        """Leave processes behind: in the job's session, in a session of their own, and orphaned."""
        import subprocess
        subprocess.Popen(["sleep", state.mark])
        subprocess.Popen(["sleep", state.mark], start_new_session=True)
        subprocess.Popen(["sh", "-c", f"setsid sleep {state.mark} & exit 0"]).wait()
        time.sleep(state.pause)


    def hog(state, channel):
        """Take memory, 10 MiB at a time, until the OOM killer ends it."""
        held = []
        while True:
            held.append(b"\\1" * (10 << 20))


    def raises_memory_error(state, channel):
        raise MemoryError()


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
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off"
        )
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
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobman.cli.main",
                "dispatch",
                url,
                "-j",
                "2",
                "--exproot",
                str(runs),
                "--heartbeat",
                "0.5",
                "--grace",
                "5",
                "--no-progress",
                *extra,
            ],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )


def processes_naming(text: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``text`` (the experiment's URL or workdir)."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and (
                text in " ".join(p.info["cmdline"] or ()) or text in (p.info["cwd"] or "")
            ):
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
    return (
        Counter(e.job_id for e in events if e.to_status == Status.RUNNING.value),
        Counter(e.job_id for e in events if e.to_status == Status.DONE.value),
    )


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
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobman.cli.main",
            "worker",
            url,
            "--exproot",
            str(tmp_path / "r"),
            "--outage-wait",
            "3",
            "--heartbeat",
            "0.5",
        ],
        env={**os.environ, **mods},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
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
    r = subprocess.run(
        [sys.executable, "-m", "jobman.cli.main", "worker", url], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and "the server is unreachable" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # the server is back: the job its worker could not record is put back, and no attempt was spent on it
    private_pg.start()
    r = subprocess.run(
        [sys.executable, "-m", "jobman.cli.main", "monitor", url, "--once"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "put back 1 interrupted by the database" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "jobman.cli.main", "worker", url, "--exproot", str(tmp_path / "r"), "--no-wait"],
        env={**os.environ, **mods},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    store = Store.open(url)
    [job] = store.jobs()
    assert (job.status, job.attempt, job.results["out"]) == (Status.DONE, 1, 0), (job.status, job.attempt, job.error)
    assert Status.CRASHED.value not in {e.to_status for e in store.events(job.id)}
    store.dispose()


def test_a_worker_with_nothing_to_claim_exits_at_once_when_the_server_goes_away(private_pg, mods, tmp_path: Path):
    """While another worker's job runs, a worker with nothing to claim waits for what it may unlock; the
    server stopped, that worker exits at once (it holds nothing), and the busy one waits the outage out."""
    url = f"{private_pg.url}?table=idle"
    store = Store.open(url)
    store.schedule([JobSpec(0, "fn", f"{MODULE}:short", {"i": 0, "pause": 12.0}, None)])
    store.dispose()
    runs = tmp_path / "r"

    def worker(name: str) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{name}.log"
        with open(log, "w") as fh:
            argv = [sys.executable, "-m", "jobman.cli.main", "worker", url, "--exproot", str(runs), "--verbose"]
            return subprocess.Popen(argv, env={**os.environ, **mods}, stdout=fh, stderr=fh), log

    busy, busy_log = worker("busy")
    idle = None
    try:
        wait_until(lambda: (runs / "idle" / "1").exists(), 60, "the job to start")
        idle, idle_log = worker("idle")
        wait_until(lambda: "nothing ready" in idle_log.read_text(), 60, "the second worker to find nothing ready")
        private_pg.stop("fast")
        stopped = time.monotonic()
        assert idle.wait(timeout=30) == 0, idle_log.read_text()
        idle_took = time.monotonic() - stopped
        assert busy.poll() is None, busy_log.read_text()  # its job still runs: it waits the outage out
        private_pg.start()
        assert busy.wait(timeout=90) == 0, busy_log.read_text()
    finally:
        for proc in (busy, idle):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    said = idle_log.read_text()
    assert idle_took < 8, f"the worker with nothing to claim took {idle_took:.1f} s to exit:\n{said[-2000:]}"
    assert "database server is unreachable" in said and "this worker exits" in said, said[-2000:]
    assert "worker ran 0 job(s)" in said and "Traceback" not in said, said[-2000:]
    store = Store.open(url)
    [job] = store.jobs()
    assert (job.status, job.attempt) == (Status.DONE, 1), (job.status, job.attempt, job.error)
    claims, dones = claims_and_dones(store)
    assert claims == Counter({job.id: 1}) and dones == Counter({job.id: 1})
    store.dispose()


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
    flag = str(tmp_path / "filled")
    store.schedule(
        [JobSpec(0, "fn", f"{MODULE}:fill", {"i": i, "where": str(small_disk), "flag": flag}, None) for i in range(10)]
    )
    store.dispose()
    code, text, starts, elapsed = _dispatch_that_must_give_up(url, tmp_path, mods)
    assert code == 1, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("jobman: ") and "workers in a row failed" in last and "the disk is full" in last, (
        text,
        [j.error for j in Store.open(url).jobs()][:2],
    )
    assert "Traceback" not in text
    assert 2 <= starts <= 8, f"{starts} workers were started"
    assert elapsed < 90
    assert processes_naming(str(tmp_path / "runs")) == [], "a job process outlived its dispatch"
    # The jobs whose end could not be written are still RUNNING (nothing can be written), each marked
    # in its workdir as interrupted by the database.
    store = Store.open(url)
    stuck = [j for j in store.jobs() if j.status == Status.RUNNING]
    assert stuck and all(list(Path(j.workdir).glob(".jobman-interrupted-*")) for j in stuck), stuck
    store.dispose()
    (small_disk / "filler").unlink()  # space is back: the monitor puts them back, no attempt spent
    r = jobman("monitor", url, "--once", "--relaunch")
    assert r.code == 0, r.err
    store = Store.open(url)
    assert {j.status for j in store.jobs()} == {Status.QUEUED}, [(j.id, j.status, j.error) for j in store.jobs()]
    for job in stuck:
        assert "put back without spending an attempt" in store.events(job.id)[-1].why, store.events(job.id)
    r = jobman("worker", url, "--exproot", str(tmp_path / "runs"), "--no-wait", env=mods)
    assert r.code == 0, r.err
    jobs = store.jobs()
    assert {(j.status, j.attempt) for j in jobs} == {(Status.DONE, 1)}, [(j.id, j.status, j.attempt) for j in jobs]
    assert not any(e.to_status == Status.CRASHED.value for j in jobs for e in store.events(j.id))
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
    workers: list[psutil.Process] = []
    try:
        wait_until(lambda: len(store.running()) == 2, 60, "two running jobs")
        workers = [psutil.Process(j.pid) for j in store.running()]  # forked by the dispatch's zygote
        assert len(workers) == 2
        proc.kill()  # SIGKILL: no chance to stop anything itself
        proc.wait()
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert alive == [], "a worker outlived its dispatch"
    finally:
        for p in processes_naming(url) + [w for w in workers if w.is_running()]:
            p.kill()
    jobs = store.jobs()
    assert {j.status for j in jobs} == {Status.QUEUED}, [(j.id, j.status) for j in jobs]
    assert processes_naming(str(runs)) == []
    store.dispose()


# -- a job's processes die with it -------------------------------------------------------------------
def sleepers(mark: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if (p.info["cmdline"] or [])[-1:] == [mark] and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def spawning_jobs(mark: str, pause: float) -> list[JobSpec]:
    leave = f"sleep {mark} & setsid sleep {mark} & sh -c 'setsid sleep {mark} &'"
    return [JobSpec(0, "fn", f"{MODULE}:spawner", {"mark": mark, "pause": pause, "i": i}, None) for i in range(2)] + [
        JobSpec(0, "cmd", f'sh -c "{leave}; sleep {pause}"', {}, None)
    ]


@pytest.mark.parametrize("jobs_per_process", [1, 3])
def test_what_a_job_starts_dies_with_it_in_any_session(mods, tmp_path: Path, jobman, jobs_per_process):
    mark = str(900000 + 10 * os.getpid() + jobs_per_process)
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=faults"
    store = Store.open(url)
    store.schedule(spawning_jobs(mark, 0.3))
    try:
        r = jobman(
            "worker",
            url,
            "--exproot",
            str(tmp_path / "runs"),
            "--no-wait",
            "--jobs-per-process",
            str(jobs_per_process),
            env=mods,
        )
        assert r.code == 0, r.err
        assert Counter(j.status for j in store.jobs()) == {Status.DONE: 3}, [j.error for j in store.jobs()]
        assert sleepers(mark) == [], "a process a job started outlived it"
    finally:
        for p in sleepers(mark):
            p.kill()
    store.dispose()


@contextlib.contextmanager
def cgroups_of_this_test(tmp_path: Path):
    """A cgroup of this test alone in each hierarchy job cgroups may use, and a ``preexec_fn`` that moves
    a process into them: any fork server starting on this host ends what dead workers left in its own
    tree, so the workers of other tests running meanwhile must not find this test's dead worker's."""
    from jobman.dispatch import cgroup

    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _num, controllers, path = line.split(":", 2)
        for key in controllers.split(",") if controllers else ["2"]:
            own[key] = path
    mounts = cgroup._mount_points()
    made = []
    for key in ("2", "pids"):
        if key in mounts and key in own:
            where = mounts[key] / own[key].strip("/") / f"jobman-test-{os.getpid()}-{tmp_path.name}"
            try:
                where.mkdir()
                made.append(where)
            except OSError:
                pass

    def enter() -> None:
        for where in made:
            with open(where / "cgroup.procs", "w") as fh:
                fh.write(str(os.getpid()))

    try:
        yield enter
    finally:
        for where in made:  # whatever a failed test left in them goes with them
            cgroup.kill_cgroup(where)


@contextlib.contextmanager
def spawner_worker(
    url: str, kind: str, mark: str, mods: dict[str, str], tmp_path: Path, max_attempts: int = 3, enter=None
):
    """A worker (in a session of its own; in the cgroups ``enter`` moves it to) running one job that left
    three sleepers behind: the store, the job's id and the worker; whatever is left of them is killed in
    the end."""
    store = Store.open(url)
    spec = spawning_jobs(mark, 60)[0 if kind == "fn" else 2]
    [job_id] = store.schedule([spec], max_attempts=max_attempts).job_ids
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobman.cli.main", "worker", url, "--exproot", str(tmp_path / "runs"), "--no-wait"],
        env={**os.environ, **mods},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=enter,
    )
    try:
        wait_until(lambda: len(sleepers(mark)) == 3, 60, "the job's three sleepers")
        yield store, job_id, worker
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for p in sleepers(mark):
            p.kill()
        store.dispose()


def _crashed_and_relaunched(store: Store, job_id: int, url: str, jobman) -> None:
    """As for any worker killed: the monitor finds it gone, and the job is queued again."""
    r = jobman("monitor", url, "--once", "--relaunch")
    assert r.code == 0, r.err
    job = store.job(job_id)
    assert job.status == Status.QUEUED, (job.status, job.error)
    events = store.events(job_id)
    assert any(e.to_status == Status.CRASHED.value and "is gone" in (e.why or "") for e in events), events


KILLED = [
    "worker",
    "worker and fork server",
    "worker and fork server, v1 cgroup",
    "worker and fork server, then another worker",
]


@pytest.mark.parametrize("kind", ["fn", "cmd"])
@pytest.mark.parametrize("killed", KILLED)
def test_what_a_job_starts_dies_with_its_killed_worker(mods, tmp_path: Path, jobman, kind, killed, monkeypatch):
    """The worker alone SIGKILLed: its fork server kills the job's processes in every session. The
    worker and its fork server at once: nobody is left to act, what the job started waits in the job's
    cgroup, and the monitor that finds the worker gone kills it."""
    from jobman.dispatch import cgroup

    alone = killed == "worker"
    if "v1" in killed:
        monkeypatch.setenv("JOBMAN_JOB_CGROUP", "v1")
        monkeypatch.setattr(cgroup, "_base", False)
    if not alone and cgroup.job_cgroup_base() is None:
        where = "the v1 pids controller" if "v1" in killed else "cgroup v2 or the v1 pids controller"
        need_kernel(
            f"no cgroup can be made for a job here (none writable in {where})",
            "v1 pids" if "v1" in killed else "job cgroup",
        )
    mark = str(800000 + 100 * os.getpid() + 10 * KILLED.index(killed) + (kind == "cmd"))
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=faults"
    with (
        cgroups_of_this_test(tmp_path) as enter,
        spawner_worker(url, kind, mark, mods, tmp_path, enter=enter) as (store, job_id, worker),
    ):
        if alone:
            worker.kill()
        else:
            os.killpg(worker.pid, signal.SIGKILL)  # the job's process has a group of its own: spared
        worker.wait()
        if alone:
            wait_until(lambda: sleepers(mark) == [], 10, "the job's processes to die with its worker")
        else:
            time.sleep(0.5)
            assert len(sleepers(mark)) == 3  # orphaned, but in the job's cgroup
        if "another worker" in killed:  # its fork server, starting, ends what dead workers left
            other = f"sqlite:///{tmp_path / 'other.db'}?table=other"
            Store.open(other).schedule([JobSpec(0, "fn", f"{MODULE}:short", {"i": 0, "pause": 0}, None)])
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "jobman.cli.main",
                    "worker",
                    other,
                    "--exproot",
                    str(tmp_path / "other"),
                    "--no-wait",
                ],
                env={**os.environ, **mods},
                capture_output=True,
                text=True,
                timeout=300,
                preexec_fn=enter,
            )
            assert r.returncode == 0, r.stderr
            assert sleepers(mark) == [], "what the job left outlived the start of another fork server"
        _crashed_and_relaunched(store, job_id, url, jobman)
        wait_until(lambda: sleepers(mark) == [], 10, "the monitor to kill what the job left")


@pytest.mark.parametrize("kind", ["fn", "cmd"])
def test_what_a_job_starts_dies_when_the_fork_server_dies_under_it(mods, tmp_path: Path, kind):
    """The fork server SIGKILLed: the job's process dies with it, and its worker, a subreaper, kills
    what the job started and records the job CRASHED."""
    mark = str(600000 + 10 * os.getpid() + (kind == "cmd"))
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=faults"
    with spawner_worker(url, kind, mark, mods, tmp_path, max_attempts=1) as (store, job_id, worker):
        [server] = [
            p for p in psutil.Process(worker.pid).children() if "forkserver import serve" in " ".join(p.cmdline())
        ]
        server.kill()
        assert worker.wait(timeout=60) == 0
        assert sleepers(mark) == [], "a process the job started outlived its fork server"
        job = store.job(job_id)
        assert job.status == Status.CRASHED and "fork server died" in job.error, (job.status, job.error)


# -- causes are named ---------------------------------------------------------------------------------
@pytest.fixture
def memory_limited_cgroup():
    """A memory cgroup of 200 MiB without swap, below this process's own; where none can be made, a
    failure under CI unless the kernel has no memory controller."""
    from jobman.dispatch.oom import memory_cgroup

    found = memory_cgroup()
    if found is None:
        need_kernel("this machine has no memory cgroup this test can read", "memory cgroup")
    parent, version = found
    where = parent / f"jobman-oom-{os.getpid()}"
    try:
        where.mkdir()
    except OSError as exc:
        need_kernel(f"cannot make a memory cgroup under {parent}: {exc}", "memory cgroup")
    try:
        limit = str(200 << 20)
        try:
            if version == 1:
                (where / "memory.limit_in_bytes").write_text(limit)
                if (where / "memory.memsw.limit_in_bytes").exists():
                    (where / "memory.memsw.limit_in_bytes").write_text(limit)
            else:
                (where / "memory.max").write_text(limit)
                if (where / "memory.swap.max").exists():
                    (where / "memory.swap.max").write_text("0")
        except OSError as exc:
            need_kernel(f"cannot limit the memory of a cgroup here: {exc}", "memory cgroup")
        yield where
    finally:
        for _ in range(50):
            try:
                where.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_an_oom_kill_is_named_out_of_memory(memory_limited_cgroup, mods, tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=faults"
    store = Store.open(url)
    [job_id] = store.schedule([JobSpec(0, "fn", f"{MODULE}:hog", {}, None)], max_attempts=1).job_ids
    procs = str(memory_limited_cgroup / "cgroup.procs")

    def join_cgroup() -> None:
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))

    r = subprocess.run(
        [sys.executable, "-m", "jobman.cli.main", "worker", url, "--exproot", str(tmp_path / "runs"), "--no-wait"],
        env={**os.environ, **mods},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=join_cgroup,
    )
    assert r.returncode == 0, r.stderr
    job = store.job(job_id)
    assert job.status == Status.CRASHED, (job.status, job.error)
    assert "killed by SIGKILL (out of memory" in job.error, job.error
    store.dispose()


def test_a_function_job_that_raised_shows_no_exit_code_0(mods, tmp_path: Path, jobman):
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=faults"
    store = Store.open(url)
    [job_id] = store.schedule([JobSpec(0, "fn", f"{MODULE}:raises_memory_error", {}, None)]).job_ids
    r = jobman("worker", url, "--exproot", str(tmp_path / "runs"), "--no-wait", env=mods)
    assert r.code == 0, r.err
    job = store.job(job_id)
    assert job.status == Status.FAILED and "MemoryError" in job.error and job.exit_code is None
    shown = jobman("show", url, str(job_id))
    assert "MemoryError" in shown.out and "exit code 0" not in shown.out, shown.out
    store.dispose()


# -- clock skew ---------------------------------------------------------------------------------------
def test_clock_skew_in_the_database_both_ways(store, db_url, jobman):
    """A heartbeat ten years ahead is no sign of life; one an hour behind does not make a live worker
    on this host dead: it is left alone, and the scan says why."""
    store.schedule([JobSpec(0, "fn", f"{MODULE}:short", {"i": i, "pause": 0}, None) for i in range(2)])
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        ahead = store.claim(WorkerInfo(host="elsewhere.example", pid=4242, pid_started_at=1.0))
        behind = store.claim(WorkerInfo.here(pid=sleeper.pid))
        now = time.time()
        with store.engine.begin() as conn:
            conn.execute(sa.update(t_job).where(t_job.c.id == ahead.job.id).values(heartbeat_at=now + 10 * 365 * 86400))
            conn.execute(
                sa.update(t_job)
                .where(t_job.c.id == behind.job.id)
                .values(heartbeat_at=now - 3600, started_at=now - 3600)
            )
        r = jobman("monitor", db_url, "--once", "--format", "json")
        assert r.code == 0, r.err
        scan = json.loads(r.out)["scan"]
        crashed = {f["job_id"]: f["reason"] for f in scan["crashed"]}
        assert list(crashed) == [ahead.job.id], scan
        assert "in the future (clock skew" in crashed[ahead.job.id], crashed
        assert [
            n
            for n in scan["notes"]
            if n.startswith(f"job {behind.job.id}: no heartbeat for 3,6")
            and "alive on this host, so it is left alone" in n
        ], scan
        assert store.job(behind.job.id).status == Status.RUNNING
        sleeper.kill()
        sleeper.wait()
        r = jobman("monitor", db_url, "--once", "--format", "json", "--no-relaunch")
        [found] = json.loads(r.out)["scan"]["crashed"]  # its worker gone: now it is declared
        assert found["job_id"] == behind.job.id and found["sign"] == "process"
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


def test_a_worker_with_its_clock_ten_years_ahead_stamps_the_servers_time(store, monkeypatch):
    """Claims, heartbeats and finishes carry the database server's time, not the worker's."""
    store.schedule([JobSpec(0, "fn", f"{MODULE}:short", {"i": i, "pause": 0}, None) for i in range(2)])
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 10 * 365 * 86400)  # this host's clock, set wrong
    claimed = store.claim(WorkerInfo.here())
    assert store.heartbeat(claimed.job.id, claimed.lease) is False
    store.finish(claimed.job.id, claimed.lease, "DONE", results={"ok": 1})
    other = store.claim(WorkerInfo.here())
    store.heartbeat(other.job.id, other.lease)
    monkeypatch.undo()
    done, running = store.job(claimed.job.id), store.job(other.job.id)
    for stamp in (done.started_at, done.heartbeat_at, done.finished_at, running.started_at, running.heartbeat_at):
        assert abs(stamp - time.time()) < 60, (stamp, time.time())
    assert abs(store.server_time() - time.time()) < 5

"""``--jobs-per-process K``: a job process runs up to K function jobs in turn, with real processes.

What is kept when a process is reused: a crash (SIGKILL, segfault, ``os._exit``) takes down
only the job that was running, recorded with its reason, and a fresh process takes the next
job; a stopped worker leaves nothing RUNNING and no job process behind. What is given up, and
tested here so that it stays documented: a job sees the global state the jobs before it in the
same process left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import experiment_module, need_kernel, signal_once_started, sqlite_only

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

engine_name = pytest.fixture(sqlite_only, name="engine_name")

MODULE = "jm_reuse_exp"

EXPERIMENTS = textwrap.dedent('''
    import ctypes
    import os
    import time
    from pathlib import Path

    RAN_HERE = []  # the jobs this process ran, left behind for the next one


    def ok(state, channel):
        RAN_HERE.append(channel.job_id)
        state.pid = os.getpid()
        state.ran_here = list(RAN_HERE)
        state.env_mark = os.environ.get("JM_LEFT_BEHIND")


    def lineage(state, channel):
        """The job's worker (its fork server's parent), what started that worker, and the fork server's name."""
        import psutil
        server = psutil.Process(os.getppid())
        worker = server.parent()
        state.server = [server.name(), server.cmdline() == worker.cmdline()]
        state.worker = worker.pid
        state.started_by = worker.parent().cmdline()
        time.sleep(0.5)


    def leaves_state(state, channel):
        RAN_HERE.append(channel.job_id)
        os.environ["JM_LEFT_BEHIND"] = f"job {channel.job_id}"
        state.pid = os.getpid()


    def sigkill(state, channel):
        RAN_HERE.append(channel.job_id)
        os.kill(os.getpid(), 9)


    def segfault(state, channel):
        RAN_HERE.append(channel.job_id)
        ctypes.string_at(0)


    def exit5(state, channel):
        RAN_HERE.append(channel.job_id)
        os._exit(5)


    def leaves_daemon(state, channel):
        """Leaves a process running in a session of its own (a double fork), then ends."""
        mark = Path(os.environ["JM_STARTED"], f"daemon-{channel.job_id}")
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                mark.write_text(str(os.getpid()))
                time.sleep(120)
            os._exit(0)
        os.wait()
        while not mark.exists():
            time.sleep(0.01)
        state.pid = os.getpid()
        state.cgroup, state.members = own_cgroup()


    def alone_in_its_cgroup(state, channel):
        state.pid = os.getpid()
        state.cgroup, state.members = own_cgroup()


    def own_cgroup():
        """The job cgroup this process is in, and the pids in it."""
        from jobman.dispatch import cgroup
        mounts = cgroup._mount_points()
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _num, controllers, path = line.split(":", 2)
            key = "2" if controllers == "" else "pids" if "pids" in controllers.split(",") else None
            if "/jobman/" in path and key in mounts:
                where = mounts[key] / path.lstrip("/")
                return str(where), cgroup.members(where)
        return None, []


    def until_stopped(state, channel):
        RAN_HERE.append(channel.job_id)
        Path(os.environ["JM_STARTED"], str(channel.job_id)).write_text(str(os.getpid()))
        while not channel.should_stop():
            time.sleep(0.02)
        state.pid = os.getpid()
        state.stop_reason = channel.stop_reason
        channel.save()
        return channel.INCOMPLETE
''')


@pytest.fixture
def exp(tmp_path: Path):
    pythonpath = experiment_module(tmp_path, MODULE, EXPERIMENTS)
    started = tmp_path / "started"
    started.mkdir()
    return type(
        "Exp",
        (),
        {"env": {"PYTHONPATH": pythonpath, "JM_STARTED": str(started)}, "runs": tmp_path / "runs", "started": started},
    )


def schedule(store: Store, *names: str, max_attempts: int = 1, first: int = 0) -> list[int]:
    specs = [
        JobSpec(phase=0, kind="fn", target=f"{MODULE}:{name}", params={"i": i}, parent=None)
        for i, name in enumerate(names, start=first)
    ]
    return store.schedule(specs, max_attempts=max_attempts).job_ids


def worker_argv(url: str, exp, k: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "jobman.cli.main",
        "worker",
        url,
        "--exproot",
        str(exp.runs),
        "--heartbeat",
        "0.2",
        "--grace",
        "5",
        "--jobs-per-process",
        str(k),
    ]


def run_worker(url: str, exp, k: int) -> str:
    r = subprocess.run(
        worker_argv(url, exp, k), env={**os.environ, **exp.env}, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.stderr


def test_k_jobs_run_in_one_process_and_the_next_k_in_a_fresh_one(db_url, store, exp):
    ids = schedule(store, *["ok"] * 5)
    run_worker(db_url, exp, 2)
    jobs = [store.job(i) for i in ids]
    assert all(j.status is Status.DONE for j in jobs)
    pids = [j.results["pid"] for j in jobs]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
    assert len(set(pids)) == 3
    assert pids[0] not in (os.getpid(),)
    # what a job sees of the jobs before it in its process
    assert [j.results["ran_here"] for j in jobs] == [[ids[0]], ids[0:2], [ids[2]], ids[2:4], [ids[4]]]


def test_a_crash_in_a_reused_process_takes_down_only_its_job(db_url, store, exp):
    ids = schedule(store, "ok", "ok", "sigkill", "ok", "segfault", "ok", "exit5", "ok")
    run_worker(db_url, exp, 100)
    jobs = {i: store.job(i) for i in ids}
    a, b, killed, c, segv, d, exited, e = (jobs[i] for i in ids)
    assert killed.status is Status.CRASHED and "killed by SIGKILL" in killed.error
    assert segv.status is Status.CRASHED and "killed by SIGSEGV" in segv.error
    assert any("SIGSEGV" in ev.why for ev in store.events(segv.id))
    assert exited.status is Status.FAILED and exited.exit_code == 5
    assert all(j.status is Status.DONE for j in (a, b, c, d, e))
    # the jobs before a crash shared a process; after it, a fresh process took the next job
    assert a.results["pid"] == b.results["pid"]
    pids = [j.results["pid"] for j in (a, c, d, e)]
    assert len(set(pids)) == 4
    assert [j.results["ran_here"] for j in (a, b, c, d, e)] == [[a.id], [a.id, b.id], [c.id], [d.id], [e.id]]


def test_what_a_job_sees_of_the_global_state_left_by_the_one_before(db_url, store, exp):
    """The trade-off of reuse, documented in docs/guarantees.md: module globals and os.environ persist."""
    left, after = schedule(store, "leaves_state", "ok")
    run_worker(db_url, exp, 2)
    assert store.job(after).results["env_mark"] == f"job {left}"
    assert store.job(after).results["ran_here"] == [left, after]
    assert store.job(after).results["pid"] == store.job(left).results["pid"]

    # in the default mode, a fresh process each: nothing is left behind
    left2, after2 = schedule(store, "leaves_state", "ok", first=2)
    run_worker(db_url, exp, 1)
    assert store.job(after2).results["env_mark"] is None
    assert store.job(after2).results["ran_here"] == [after2]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_stopping_a_worker_in_a_reused_process_leaves_nothing_running(db_url, store, exp, how):
    first, stopped, never = schedule(store, "ok", "until_stopped", "ok", max_attempts=3)
    code, err = signal_once_started(
        worker_argv(db_url, exp, 10), {**os.environ, **exp.env}, exp.started / str(stopped), how
    )
    assert code == 0, err
    job = store.job(stopped)
    assert job.status is Status.QUEUED and job.attempt == 1
    assert job.results["stop_reason"] == "received SIGTERM"
    assert job.results["pid"] == store.job(first).results["pid"]  # it was the second job of its process
    assert store.job(never).status is Status.QUEUED
    assert [j.id for j in store.jobs(status=[Status.RUNNING])] == []
    with pytest.raises(ProcessLookupError):  # the reused job process went with its worker
        os.kill(job.results["pid"], 0)


def test_dispatch_forks_its_workers_from_one_warm_interpreter(jobman, db_url, store, exp):
    ids = schedule(store, *["lineage"] * 4)
    r = jobman("dispatch", db_url, "-j", "2", "--exproot", str(exp.runs), "--no-progress", env=exp.env, timeout=180)
    assert r.code == 0, r.err
    jobs = [store.job(i) for i in ids]
    assert all(j.status is Status.DONE for j in jobs)
    assert {j.results["worker"] for j in jobs} == {j.pid for j in jobs}  # the worker is what the job row says
    assert len({j.pid for j in jobs}) == 2
    assert all("jobman.dispatch.backends.zygote" in j.results["started_by"] for j in jobs)
    # each worker's fork server is a fork of the worker (its command line), not a new interpreter
    assert all(j.results["server"] == ["jobman-forksrv", True] for j in jobs), [j.results["server"] for j in jobs]


def test_fresh_jobs_share_a_cgroup_in_turn_and_none_inherits_what_the_one_before_left(db_url, store, exp):
    """In the default mode the jobs of a fork server enter one cgroup in turn instead of each making its
    own: what a job leaves there (a daemon in a session of its own) is killed when it ends, and the next
    job finds itself alone in it."""
    from jobman.dispatch.cgroup import job_cgroup_base

    if job_cgroup_base() is None:
        need_kernel(
            "no cgroup can be made for a job here (none writable in cgroup v2 or the v1 pids controller)", "job cgroup"
        )
    first, second = schedule(store, "leaves_daemon", "alone_in_its_cgroup")
    run_worker(db_url, exp, 1)
    a, b = store.job(first), store.job(second)
    assert a.status is Status.DONE and b.status is Status.DONE, (a.error, b.error)
    daemon = int((exp.started / f"daemon-{first}").read_text())
    assert a.results["cgroup"] is not None and a.results["cgroup"] == b.results["cgroup"]
    assert sorted(a.results["members"]) == sorted([a.results["pid"], daemon])
    assert b.results["members"] == [b.results["pid"]]  # the daemon was killed before the next job entered
    with pytest.raises(ProcessLookupError):
        os.kill(daemon, 0)


def test_a_local_dispatch_that_fails_at_once_leaves_no_zygote_behind(tmp_path, monkeypatch):
    """The zygote is started as soon as the command line reads as a local dispatch, before the database
    is opened: a dispatch that then fails stops it."""
    import psutil

    from jobman.cli.main import main
    from jobman.dispatch.backends import zygote

    started = []
    real_start = zygote.Zygote._start

    def start(self):
        real_start(self)
        started.append(self.proc.pid)

    monkeypatch.setattr(zygote.Zygote, "_start", start)
    assert main(["dispatch", f"sqlite:///{tmp_path / 'none.db'}?table=t", "-j", "2", "--no-progress"]) == 1
    assert len(started) == 1
    assert psutil.Process().children(recursive=True) == []
    assert main(["dispatch", "--backend", "slurm", "--help"]) == 0
    assert main(["dispatch", f"sqlite:///{tmp_path / 'none.db'}?table=t", "--backend", "slurm"]) != 0
    assert len(started) == 1  # none for a Slurm dispatch

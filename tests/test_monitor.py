"""The monitor on real SQLite and PostgreSQL, with real workers that are really killed.

Detection by pid (a SIGKILLed ``jobman worker``), by heartbeat (``heartbeat_at`` moved back in
the database instead of sleeping) and by backend allocation; a slow job that heartbeats is never
touched; relaunch within the attempt limit, then BLOCKED dependents; a relaunched job resumes
from its checkpoint; a stale finish is refused after a relaunch, and a finish racing the
monitor's crash wins cleanly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa

from jobman.dispatch.backends.base import AllocationState
from jobman.dispatch.monitor import Monitor, MonitorOptions, process_gone
from jobman.jobdb.errors import LeaseLost
from jobman.jobdb.schema import job as t_job
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec

S = Status
HOST = socket.gethostname()
ELSEWHERE = WorkerInfo(host="node-elsewhere", pid=4242, pid_started_at=1.0)
MODULE = "jm_monitor_exp"
EXPERIMENTS = '''
    """Experiment functions the monitor tests run in real workers."""
    import os
    import signal
    import time
    from pathlib import Path


    def sleepy(state, channel):
        """Sleep ``seconds``, then finish: a slow job whose worker heartbeats."""
        time.sleep(state.seconds)
        state.slept = state.seconds
        return channel.COMPLETE


    def count(state, channel):
        """Count to ``total``, checkpointing every step; ``starts`` records where each attempt began."""
        step = state.get("step", 0)
        state.starts = list(state.get("starts", [])) + [step]
        channel.save()
        while step < state.total:
            time.sleep(state.pause)
            step += 1
            state.step = step
            channel.save()
        return channel.COMPLETE


    def until_stopped(state, channel):
        """Run until should_stop(); with ``ignore_term`` ignore SIGTERM, so only a kill ends it."""
        if state.get("ignore_term"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        Path(state.marker).write_text("started")
        while not channel.should_stop():
            time.sleep(0.05)
        Path(state.marker).write_text(f"stopping: {channel.stop_reason}")
        return channel.INCOMPLETE
'''


@dataclass
class Lab:
    """The experiment module on disk and how to start real workers on it."""

    root: Path
    url: str

    @property
    def env(self) -> dict[str, str]:
        path = os.pathsep.join(p for p in (str(self.root), os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, "PYTHONPATH": path}

    def start_worker(self, *extra: str) -> subprocess.Popen:
        log = open(self.root / f"worker-{time.monotonic_ns()}.log", "wb")
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobman.cli.main",
                "worker",
                self.url,
                "--exproot",
                str(self.root / "runs"),
                "--heartbeat",
                "0.2",
                "--grace",
                "1",
                "--max-jobs",
                "1",
                *extra,
            ],
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture
def lab(tmp_path: Path, db_url: str) -> Lab:
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(EXPERIMENTS))
    return Lab(tmp_path, db_url)


def one(store: Store, target: str, params: dict, *, max_attempts: int = 3, children: int = 0) -> list[int]:
    """Schedule one job of ``jm_monitor_exp`` (and ``children`` phase-1 jobs after it); return their ids."""
    specs = [JobSpec(0, "fn", f"{MODULE}:{target}", params, None)]
    specs += [JobSpec(1, "fn", f"{MODULE}:{target}", {**params, "child": i}, 0) for i in range(children)]
    return store.schedule(specs, max_attempts=max_attempts).job_ids


def wait_for(predicate, timeout: float = 30.0, what: str = "the condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def kill_worker(proc: subprocess.Popen) -> None:
    """SIGKILL a worker, reap it, and see its job's process go too (it dies with its parent)."""
    family = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"the job's process outlived its worker: {alive}"


def age_heartbeat(store: Store, job_id: int, seconds: float) -> None:
    """Make a job's last heartbeat ``seconds`` older, instead of sleeping."""
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(t_job)
            .where(t_job.c.id == job_id)
            .values(heartbeat_at=t_job.c.heartbeat_at - seconds, started_at=t_job.c.started_at - seconds)
        )


def changes(store: Store, job_id: int) -> list[tuple[str | None, str | None, str]]:
    return [(e.from_status, e.to_status, e.why) for e in store.events(job_id) if e.to_status is not None]


# -- detection ---------------------------------------------------------------------------------


def test_a_worker_killed_by_sigkill_is_found_by_pid_crashed_and_relaunched(lab, store, jobman):
    [job_id] = one(store, "sleepy", {"seconds": 60})
    worker = lab.start_worker()
    wait_for(lambda: store.job(job_id).status is S.RUNNING, what="the job to start")
    assert store.job(job_id).host == HOST and store.job(job_id).pid == worker.pid
    kill_worker(worker)

    # a grace of ten minutes: what finds it is the pid, at once
    r = jobman("monitor", lab.url, "--once", "--format", "json", "--heartbeat-grace", "600")
    assert r.code == 0, r.err
    seen = json.loads(r.out)
    scan = seen["scan"]
    [found] = scan["crashed"]
    assert (found["job_id"], found["sign"], found["status"]) == (job_id, "process", "QUEUED")
    assert f"worker process {worker.pid} on {HOST} is gone" in found["reason"]
    assert scan["relaunched"] == [job_id]

    job = store.job(job_id)
    assert job.status is S.QUEUED and job.attempt == 1
    assert "is gone" in job.error
    assert changes(store, job_id)[-2:] == [
        ("RUNNING", "CRASHED", found["reason"]),
        ("CRASHED", "QUEUED", f"relaunch after crash ({found['reason']}), attempt 1 of 3"),
    ]
    assert [(c["job_id"], c["why"]) for c in seen["recent_crashes"]] == [(job_id, found["reason"])]
    assert seen["totals"] == {"QUEUED": 1} and seen["running"] == []


def test_a_lost_heartbeat_is_crashed_and_a_fresh_one_is_not(store):
    lost, alive = one(store, "sleepy", {"seconds": 1}) + one(store, "sleepy", {"seconds": 2})
    for _ in range(2):
        store.claim(ELSEWHERE)  # on another host: only the heartbeat can tell
    age_heartbeat(store, lost, 120)
    age_heartbeat(store, alive, 30)

    report = Monitor(store, MonitorOptions(heartbeat_grace=60, relaunch=False)).scan()

    assert report.checked == 2
    [found] = report.crashed
    assert (found.job_id, found.sign, found.status) == (lost, "heartbeat", "CRASHED")
    assert re.match(r"no heartbeat for 12[0-2] s \(grace 60 s\)", found.reason), found.reason  # a loaded host is slow
    assert store.job(lost).status is S.CRASHED and store.job(alive).status is S.RUNNING
    json.dumps(report.to_dict())  # the report is JSON-able as it is


def test_a_slow_job_whose_worker_heartbeats_is_never_touched(lab, store):
    [job_id] = one(store, "sleepy", {"seconds": 1.6})
    worker = lab.start_worker()
    watcher = Monitor(store, MonitorOptions(heartbeat_grace=1.0))  # shorter than the job, longer than a beat
    wait_for(lambda: store.job(job_id).status is S.RUNNING, what="the job to start")
    scans = 0
    while store.job(job_id).status is S.RUNNING:
        report = watcher.scan()
        assert report.crashed == [] and report.errors == [], report.line()
        scans += 1
        time.sleep(0.2)
    assert worker.wait(timeout=30) == 0
    assert scans >= 4
    assert store.job(job_id).status is S.DONE
    assert [to for _f, to, _w in changes(store, job_id)] == ["RUNNING", "DONE"]


def test_a_reused_pid_is_not_taken_for_the_worker(store):
    me = psutil.Process()
    [real, reused] = one(store, "sleepy", {"seconds": 1}) + one(store, "sleepy", {"seconds": 2})
    store.claim(WorkerInfo(host=HOST, pid=me.pid, pid_started_at=me.create_time()))
    store.claim(WorkerInfo(host=HOST, pid=me.pid, pid_started_at=me.create_time() - 3600))

    report = Monitor(store, MonitorOptions(relaunch=False)).scan()

    assert [(f.job_id, f.sign) for f in report.crashed] == [(reused, "process")]
    assert "belongs to a process started later" in report.crashed[0].reason
    assert store.job(real).status is S.RUNNING


def test_a_job_its_dead_worker_marked_as_interrupted_by_the_database_is_put_back_without_an_attempt(store, tmp_path):
    from jobman.dispatch.interrupted import mark_interrupted

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    me = psutil.Process()
    [marked, plain] = one(store, "sleepy", {"seconds": 1}) + one(store, "sleepy", {"seconds": 2})
    first = store.claim(WorkerInfo(host=HOST, pid=gone.pid, pid_started_at=me.create_time()), str(tmp_path))
    store.claim(WorkerInfo(host=HOST, pid=gone.pid, pid_started_at=me.create_time()), str(tmp_path))
    assert first.job.id == marked
    Path(first.job.workdir).mkdir(parents=True)
    assert mark_interrupted(first.job.workdir, first.lease, "its worker could not record its end: the disk is full")

    dry = Monitor(store, MonitorOptions(dry_run=True)).scan()
    assert dry.put_back == [marked] and [f.job_id for f in dry.crashed] == [plain]
    assert "would put back 1" in dry.line() and store.job(marked).status is S.RUNNING

    report = Monitor(store, MonitorOptions()).scan()
    assert report.put_back == [marked] and [f.job_id for f in report.crashed] == [plain]
    job = store.job(marked)
    assert job.status is S.QUEUED and job.resume, job
    last = store.events(marked)[-1]
    assert "the disk is full" in last.why and "without spending an attempt" in last.why
    assert not list(Path(first.job.workdir).glob(".jobman-interrupted-*"))  # the mark is gone with it
    assert store.claim(WorkerInfo.here()).job.attempt == first.job.attempt  # resumed: the same attempt
    assert store.job(plain).status is S.QUEUED and store.events(plain)[-2].to_status == S.CRASHED.value


def test_process_gone_tells_exited_zombies_from_live_processes():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(child.pid).create_time()
    job = _running(pid=child.pid, pid_started_at=started)
    wait_for(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, what="a zombie")
    assert "has exited" in process_gone(job)
    child.wait()
    assert "is gone" in process_gone(job)
    assert process_gone(_running(pid=os.getpid(), pid_started_at=psutil.Process().create_time())) is None


class FakeSlurm:
    """A backend that answers from a table, and counts how often it was asked."""

    name = "slurm"

    def __init__(self, states: dict[str, AllocationState] | None = None, fail: bool = False) -> None:
        self.states = states or {}
        self.fail = fail
        self.asked: list[list[str]] = []

    def allocation_states(self, ids):
        self.asked.append(list(ids))
        if self.fail:
            raise RuntimeError("squeue: cannot reach the controller")
        return {i: self.states[i] for i in ids if i in self.states}


def test_an_ended_allocation_is_crashed_with_the_backends_reason_and_unknown_is_not_success(store):
    ids = [one(store, "sleepy", {"seconds": k})[0] for k in range(3)]
    for bid in ("100_0", "100_1", "101"):
        store.claim(WorkerInfo(host="node7", pid=77, pid_started_at=1.0, backend="slurm", backend_id=bid))
    slurm = FakeSlurm(
        {
            "100_0": AllocationState("100_0", True, "RUNNING"),
            "100_1": AllocationState("100_1", False, "NODE_FAIL", "Slurm job 100_1 ended NODE_FAIL."),
            "101": AllocationState("101", False, "UNKNOWN", "Slurm does not know job 101 (any more)."),
        }
    )

    report = Monitor(store, MonitorOptions(relaunch=False), backends={"slurm": slurm}).scan()

    assert slurm.asked == [["100_0", "100_1", "101"]]  # one question for every Slurm job
    assert [(f.job_id, f.sign, f.reason) for f in report.crashed] == [
        (ids[1], "allocation", "Slurm job 100_1 ended NODE_FAIL."),
        (ids[2], "allocation", "Slurm does not know job 101 (any more)."),
    ]
    assert store.job(ids[0]).status is S.RUNNING


def test_a_backend_that_cannot_answer_is_reported_and_nothing_is_crashed_for_it(store, monkeypatch):
    [job_id] = one(store, "sleepy", {"seconds": 1})
    store.claim(WorkerInfo(host="node7", pid=77, pid_started_at=1.0, backend="slurm", backend_id="55"))
    from jobman.dispatch.backends import slurm as slurm_module

    asked = []

    def broken(self, ids):
        asked.append(list(ids))
        raise slurm_module.BackendError("squeue was not found on PATH: is Slurm installed on this host?")

    monkeypatch.setattr(slurm_module.SlurmBackend, "allocation_states", broken)
    watcher = Monitor(store)  # no slurm backend given: one is made when a Slurm job is seen
    report = watcher.scan()
    assert isinstance(watcher.backends["slurm"], slurm_module.SlurmBackend) and asked == [["55"]]
    assert report.crashed == [] and "squeue was not found" in report.errors[0]
    assert store.job(job_id).status is S.RUNNING


def test_dry_run_finds_but_changes_nothing(store):
    [job_id] = one(store, "sleepy", {"seconds": 1})
    store.claim(ELSEWHERE)
    age_heartbeat(store, job_id, 600)
    report = Monitor(store, MonitorOptions(dry_run=True)).scan()
    assert [f.job_id for f in report.crashed] == [job_id] and report.crashed[0].status is None
    assert store.job(job_id).status is S.RUNNING


# -- relaunch, limits, checkpoints, leases -------------------------------------------------------------


def test_relaunch_within_max_attempts_then_crashed_for_good_with_blocked_dependents(store):
    root, child = one(store, "sleepy", {"seconds": 1}, max_attempts=2, children=1)
    watcher = Monitor(store, MonitorOptions(heartbeat_grace=60))
    for attempt, expected in ((1, S.QUEUED), (2, S.CRASHED)):
        claimed = store.claim(ELSEWHERE)
        assert (claimed.job.id, claimed.job.attempt) == (root, attempt)
        age_heartbeat(store, root, 300)
        report = watcher.scan()
        assert report.crashed[0].status == expected.value
        assert store.job(child).status is (S.WAITING if expected is S.QUEUED else S.BLOCKED)
    assert store.claim(ELSEWHERE) is None
    assert changes(store, child)[-1] == ("WAITING", "BLOCKED", f"job {root} is CRASHED")

    # a larger limit given to the monitor relaunches it, and releases its dependents
    report = Monitor(store, MonitorOptions(max_attempts=3)).scan()
    assert report.relaunched == [root]
    assert store.job(root).status is S.QUEUED and store.job(root).attempt == 2
    assert store.job(child).status is S.WAITING


def test_failed_jobs_are_relaunched_only_when_asked(store):
    [job_id] = one(store, "sleepy", {"seconds": 1})
    c = store.claim(ELSEWHERE)
    store.finish(job_id, c.lease, "FAILED", error="ValueError: bad lr")
    assert Monitor(store).scan().relaunched == []
    assert store.job(job_id).status is S.FAILED
    assert Monitor(store, MonitorOptions(include_failed=True)).scan().relaunched == [job_id]
    assert store.job(job_id).status is S.QUEUED


def test_a_relaunched_job_resumes_from_its_checkpoint(lab, store):
    [job_id] = one(store, "count", {"total": 15, "pause": 0.05})
    worker = lab.start_worker()
    wait_for(lambda: (store.job(job_id).results or {}).get("step", 0) >= 5, what="five steps")
    kill_worker(worker)
    saved = store.job(job_id).results["step"]

    report = Monitor(store).scan()
    assert [(f.job_id, f.sign) for f in report.crashed] == [(job_id, "process")]
    assert report.relaunched == [job_id]
    assert store.job(job_id).results["step"] == saved  # the checkpoint is kept

    assert lab.start_worker().wait(timeout=60) == 0
    job = store.job(job_id)
    assert job.status is S.DONE and job.attempt == 2
    assert job.results["step"] == 15
    first, second = job.results["starts"]
    assert first == 0 and second >= saved >= 5, job.results["starts"]


def test_a_stale_finish_is_refused_after_a_relaunch(store):
    [job_id] = one(store, "sleepy", {"seconds": 1})
    old = store.claim(ELSEWHERE)
    age_heartbeat(store, job_id, 600)
    assert Monitor(store).scan().relaunched == [job_id]
    new = store.claim(ELSEWHERE)
    assert new.lease > old.lease

    with pytest.raises(LeaseLost):
        store.finish(job_id, old.lease, "DONE", results={"from": "the old worker"})
    with pytest.raises(LeaseLost):
        store.heartbeat(job_id, old.lease)
    assert store.finish(job_id, new.lease, "DONE", results={"from": "the new worker"}) is S.DONE
    assert store.job(job_id).results == {"from": "the new worker"}
    assert any("refused a stale finish" in e.why for e in store.events(job_id))


def test_a_finish_racing_the_monitors_crash_is_not_overwritten(db_url, store):
    """The worker records FAILED while the monitor declares the job crashed: exactly one of them wins."""
    [job_id] = one(store, "sleepy", {"seconds": 1})
    claimed = store.claim(ELSEWHERE)
    worker_side, monitor_side = Store.open(db_url), Store.open(db_url)

    worker_inside, monitor_started = threading.Event(), threading.Event()

    def held_update(conn, cursor, statement, params, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE JOB"):
            worker_inside.set()  # the worker read the row as its own; the monitor comes in now
            assert monitor_started.wait(30), "the monitor never started its crash"

    def monitor_connects(dbapi_connection, connection_record, connection_proxy):
        monitor_started.set()  # its write transaction begins next (on SQLite, waiting for the worker's lock)

    sa.event.listen(worker_side.engine, "before_cursor_execute", held_update)
    sa.event.listen(monitor_side.engine, "checkout", monitor_connects)
    finished = {}
    t = threading.Thread(
        target=lambda: finished.update(status=worker_side.finish(job_id, claimed.lease, "FAILED", error="boom"))
    )
    t.start()
    assert worker_inside.wait(30), "the worker never reached its update"
    crashed = monitor_side.crash_many([(job_id, claimed.lease, "found dead")], relaunch=True)
    t.join()
    worker_side.dispose()
    monitor_side.dispose()

    assert finished["status"] is S.FAILED and crashed == {}
    assert store.job(job_id).status is S.FAILED
    assert [to for _f, to, _w in changes(store, job_id)] == ["RUNNING", "FAILED"]


# -- scale -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_scan_of_100000_jobs_with_10000_running_is_fast(store):
    specs = [JobSpec(0, "fn", f"{MODULE}:sleepy", {"i": i}, None) for i in range(100_000)]
    store.schedule(specs)
    now = time.time()
    ids = sorted(store.select_ids())  # this experiment's only: other tests share the database
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(t_job)
            .where(t_job.c.id.between(ids[0], ids[9_999]))
            .values(
                status="RUNNING",
                attempt=1,
                lease=1,
                host="node-elsewhere",
                pid=1,
                backend="local",
                started_at=now,
                heartbeat_at=now,
            )
        )
        conn.execute(
            sa.update(t_job)
            .where(t_job.c.id.between(ids[0], ids[9_999]), t_job.c.id % 10 == 0)
            .values(heartbeat_at=now - 3600)
        )
    watcher = Monitor(store, MonitorOptions(heartbeat_grace=60))
    report = watcher.scan()  # its speed is measured in bench/graph.py, not asserted here
    assert report.checked == 10_000 and len(report.crashed) == 1_000
    assert len(report.relaunched) == 1_000
    assert watcher.scan().crashed == []  # the relaunched jobs are QUEUED: the next scan finds nothing


def _running(**fields):
    from jobman.jobdb.store import RunningJob

    base = dict(
        id=1,
        phase=0,
        lease=1,
        attempt=1,
        max_attempts=3,
        host=HOST,
        pid=None,
        pid_started_at=None,
        backend="local",
        backend_id=None,
        started_at=time.time(),
        heartbeat_at=time.time(),
        stop_requested=False,
    )
    return RunningJob(**{**base, **fields})


# -- the command ---------------------------------------------------------------------------------------


def test_monitor_once_prints_counts_running_jobs_and_recent_crashes(store, db_url, capsys):
    from jobman.cli.main import main

    lost, alive = one(store, "sleepy", {"seconds": 1}, children=1)[:1] + one(store, "sleepy", {"seconds": 2})
    store.claim(ELSEWHERE)
    store.claim(ELSEWHERE)
    age_heartbeat(store, lost, 90)
    assert main(["monitor", db_url, "--once", "--no-relaunch", "--heartbeat-grace", "60"]) == 0
    shown = capsys.readouterr().out
    for words in (
        "phase",
        "CRASHED",
        "running (1)",
        "node-elsewhere:4242",
        "recent crashes",
        "no heartbeat for 9",
        "declared 1 crashed",
    ):
        assert words in shown, (words, shown)
    assert re.search(r"no heartbeat for 9[0-2] s", shown), shown  # a second or two more on a loaded host
    assert store.job(lost).status is S.CRASHED and store.job(alive).status is S.RUNNING


def test_watching_prints_one_json_line_per_scan_until_interrupted(lab, store):
    one(store, "sleepy", {"seconds": 1})
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobman.cli.main", "monitor", lab.url, "--format", "json", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [json.loads(proc.stdout.readline()) for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and "monitor stopped" in stderr
    assert [line["totals"] for line in lines] == [{"QUEUED": 1}] * 2
    assert lines[1]["scan"]["at"] > lines[0]["scan"]["at"]

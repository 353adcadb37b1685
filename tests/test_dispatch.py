"""``jobman dispatch`` with the local backend: real worker processes, phases, failures, Ctrl-C.

Each run of a job appends ``job_id attempt`` to a trace file, so the tests can
prove every job ran exactly once across concurrent workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from jobman.jobdb.status import Status
from jobman.jobdb.sweep import expand, parse_sweep

MODULE = "jm_dispatch_exp"

EXPERIMENTS = textwrap.dedent("""
    import os
    import time
    from pathlib import Path


    def _trace(channel):
        with open(os.environ["JM_TRACE"], "a") as fh:
            fh.write(f"{channel.job_id} {channel.attempt} {os.getppid()}\\n")


    def pretrain(state, channel):
        _trace(channel)
        time.sleep(0.05)
        if state.lr < 0:
            raise ValueError("a negative learning rate")
        (channel.workdir / "w.txt").write_text(str(state.lr * 10))
        state.w = state.lr * 10


    def finetune(state, channel):
        _trace(channel)
        time.sleep(0.05)
        [parent] = channel.parents
        state.from_parent = float((parent.workdir / "w.txt").read_text())
        state.score = state.from_parent + state.epochs


    def until_stopped(state, channel):
        _trace(channel)
        Path(os.environ["JM_STARTED"], str(channel.job_id)).touch()
        steps = 0
        while not channel.should_stop():
            steps += 1
            time.sleep(0.02)
        state.steps = steps
        channel.save()
        return channel.INCOMPLETE
""")


@pytest.fixture
def exp(tmp_path: Path, jobs_per_process: int):
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / f"{MODULE}.py").write_text(EXPERIMENTS)
    trace = tmp_path / "trace.txt"
    trace.touch()
    started = tmp_path / "started"
    started.mkdir()
    pythonpath = os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)
    env = {
        "PYTHONPATH": pythonpath,
        "JM_TRACE": str(trace),
        "JM_STARTED": str(started),
        "JOBMAN_JOBS_PER_PROCESS": str(jobs_per_process),
    }
    return type("Exp", (), {"trace": trace, "env": env, "runs": tmp_path / "runs", "started": started})


def dispatch_args(url: str, exp, *extra: str) -> list[str]:
    return [
        "dispatch",
        url,
        "-j",
        "2",
        "--exproot",
        str(exp.runs),
        "--heartbeat",
        "0.2",
        "--grace",
        "2",
        "--no-progress",
        *extra,
    ]


def schedule(store, *tokens: str) -> None:
    """The sweep ``jobman sqlschedule`` would make of these arguments."""
    store.schedule(expand(parse_sweep(list(tokens))))


def traced(exp) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in line.split()[:2]) for line in exp.trace.read_text().splitlines()]


def ran_other_than_once(store, runs: Counter, exp) -> str:
    """What to know when a job ran twice or not at all: its runs, its event log (a put-back and why), and
    the workers' logs, so that one failure under load names its cause."""
    jobs = {j.id for j in store.jobs()}
    odd = sorted(i for i in jobs if sum(n for (j, _a), n in runs.items() if j == i) != 1)
    lines = [f"a job ran twice, or not at all: runs {sorted(runs.items())}"]
    for job_id in odd:
        lines += [
            f"job {job_id}: {e.from_status} -> {e.to_status} attempt {e.attempt}: {e.why}" for e in store.events(job_id)
        ]
    for log in sorted((exp.runs / store.experiment / "_workers").glob("worker-*.log")):
        lines += [f"--- {log.name}", log.read_text()[-3000:]]
    return "\n".join(lines)


@pytest.mark.pgbouncer
def test_dispatch_runs_a_two_phase_sweep_with_every_job_done_exactly_once(jobman, db_url, store, exp):
    schedule(store, f"{MODULE}:pretrain", "lr={{0.1,0.2,0.3}}", "--", f"{MODULE}:finetune", "epochs={{1,2,3}}")
    r = jobman(*dispatch_args(db_url, exp), env=exp.env, timeout=180)
    assert r.code == 0, r.err
    assert "12 DONE" in r.err
    assert "no connection to spare" not in r.err  # a server with room (or SQLite) is not said to be full

    jobs = store.jobs()
    assert len(jobs) == 12 and {j.status for j in jobs} == {Status.DONE}
    runs = Counter(traced(exp))
    assert runs == Counter({(j.id, 1): 1 for j in jobs}), ran_other_than_once(store, runs, exp)
    for job in jobs:
        if job.phase == 1:
            parent = next(p for p in jobs if p.id == job.depends_on[0])
            assert job.results["score"] == pytest.approx(parent.params["lr"] * 10 + job.params["epochs"])
        claims = [e for e in store.events(job.id) if e.to_status == "RUNNING"]
        assert len(claims) == 1
    # the workers ran as children of dispatch, with logs of their own
    assert {j.backend for j in jobs} == {"local"}
    logs = list((exp.runs / store.experiment / "_workers").glob("worker-*.log"))
    assert 1 <= len(logs) <= 2 * 2  # two at a time, topped up at most once when phase 1 unlocks


def test_dispatch_exits_1_and_names_blocked_jobs_when_a_parent_fails(jobman, db_url, store, exp):
    schedule(store, f"{MODULE}:pretrain", "lr={{-1.0,0.5}}", "--", f"{MODULE}:finetune", "epochs={{1,2}}")
    r = jobman(*dispatch_args(db_url, exp), env=exp.env, timeout=180)
    assert r.code == 1, r.err
    assert "BLOCKED" in r.err and "2 job(s) are BLOCKED by a failed dependency" in r.err
    assert "Traceback" not in r.err
    by_status = Counter(j.status for j in store.jobs())
    assert by_status == {Status.DONE: 3, Status.FAILED: 1, Status.BLOCKED: 2}
    failed = store.jobs(status=[Status.FAILED])[0]
    assert "a negative learning rate" in failed.error
    blocked_runs = {j.id for j in store.jobs(status=[Status.BLOCKED])} & {i for i, _a in traced(exp)}
    assert not blocked_runs


def test_ctrl_c_stops_dispatch_and_leaves_nothing_running(db_url, store, exp):
    schedule(store, f"{MODULE}:until_stopped", "i={{1,2,3}}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobman.cli.main", *dispatch_args(db_url, exp)],
        env={**os.environ, **exp.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 90
        while len(list(exp.started.iterdir())) < 2 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert len(list(exp.started.iterdir())) == 2, "two jobs never ran at once"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:  # the test failed: its workers (sessions of their own) go too
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err

    jobs = store.jobs()
    assert not [j.id for j in jobs if j.status is Status.RUNNING]
    interrupted = [j for j in jobs if j.results]
    assert len(interrupted) == 2
    for job in interrupted:
        assert job.status is Status.QUEUED and job.attempt == 1 and job.results["steps"] > 0
    # the workers are gone with the dispatcher
    for pid in {int(line.split()[2]) for line in exp.trace.read_text().splitlines()}:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

"""The worker with real processes on real databases: sweeps, outcomes, crashes, limits, stops.

Every experiment function lives in a module written under ``tmp_path`` and put on
the worker's PYTHONPATH. Each run appends ``job_id attempt`` to a trace file
(``$JM_TRACE``), so the tests can tell how often, and in which order, jobs ran.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import signal_once_started

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

MODULE = "jm_worker_exp"

EXPERIMENTS = textwrap.dedent('''
    """Experiment functions the worker tests run."""
    import os
    import time
    from pathlib import Path


    def _trace(channel, note=""):
        with open(os.environ["JM_TRACE"], "a") as fh:
            fh.write(f"{channel.job_id} {channel.attempt}{note}\\n")


    def _wait_for_stop(state, channel):
        """Count steps until asked to stop; the marker file tells the test the job is running."""
        marker = os.environ.get("JM_STARTED")
        if marker:
            Path(marker).write_text(str(os.getpid()))
        steps = state.get("steps", 0)
        t0 = time.time()
        while not channel.should_stop():
            steps += 1
            time.sleep(0.02)
            if time.time() - t0 > 60:
                raise RuntimeError("never asked to stop")
        return steps


    def pretrain(state, channel):
        _trace(channel)
        (channel.workdir / "weights.txt").write_text(f"weights of lr={state.lr}")
        for step in range(3):
            channel.log(step, loss=state.lr / (step + 1))
        state.w = state.lr * 10
        state.pid = os.getpid()
        return channel.COMPLETE


    def finetune(state, channel):
        _trace(channel)
        [parent] = channel.parents
        state.parent_id = parent.job_id
        state.parent_w = parent.results["w"]
        state.parent_file = (parent.workdir / "weights.txt").read_text()
        state.in_workdir = os.getcwd() == str(channel.workdir)
        state.pid = os.getpid()


    def keywords(x, y=2):
        return {"total": x + y}


    def keywords_and_channel(x, channel):
        _trace(channel)
        return {"double": 2 * x, "workdir": str(channel.workdir), "job": channel.job_id}


    def boom(state, channel):
        _trace(channel)
        raise ValueError(f"boom number {state.n}")


    def exit3(state, channel):
        _trace(channel)
        os._exit(3)


    def bad_return(state, channel):
        return 42


    def nan_result(state, channel):
        _trace(channel)
        for step, loss in enumerate([1.0, float("nan"), float("inf"), 0.5]):
            channel.log(step, loss=loss)
        return {"loss": float("nan")}


    def leaks_a_process(state, channel):
        """Forks a process that outlives the job (and holds every descriptor the job had)."""
        _trace(channel)
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        Path(os.environ["JM_LEAKED"]).write_text(str(pid))
        state.leaked = pid


    def ok(state, channel):
        _trace(channel)
        state.fine = True


    def sigkill_always(state, channel):
        _trace(channel)
        os.kill(os.getpid(), 9)


    def kills_its_fork_server(state, channel):
        """Attempt 1 checkpoints, then SIGKILLs the process that forked it (and so dies with it)."""
        _trace(channel)
        if channel.attempt > 1:
            state.resumed_from = state.progress
            return channel.COMPLETE
        state.progress = 7
        channel.save()
        os.kill(os.getppid(), 9)
        time.sleep(30)


    def checkpoint_then_sigkill(state, channel):
        """Attempt 1 checkpoints and dies; the relaunch resumes from the checkpoint."""
        _trace(channel)
        if "progress" in state:
            state.resumed_from = state.progress
            state.resumed_attempt = channel.attempt
            return channel.COMPLETE
        state.progress = 42
        channel.save()
        os.kill(os.getpid(), 9)


    def until_stopped(state, channel):
        """Runs until should_stop(), then checkpoints and asks to be resumed."""
        _trace(channel)
        if state.get("resumable") and "steps" in state:
            state.resumed = True
            return channel.COMPLETE
        state.steps = _wait_for_stop(state, channel)
        state.stop_reason = channel.stop_reason
        channel.save()
        return channel.INCOMPLETE


    def stops_its_worker(state, channel):
        """SIGTERMs its worker (its fork server's parent), then finishes anyway."""
        import psutil
        _trace(channel)
        os.kill(psutil.Process(os.getppid()).ppid(), 15)
        time.sleep(0.5)
        state.finished = True


    def ignores_stop(state, channel):
        _trace(channel)
        time.sleep(120)


    def three_rounds(state, channel):
        """INCOMPLETE twice, then COMPLETE: each round resumes the state saved by the one before."""
        _trace(channel)
        state.rounds = state.get("rounds", 0) + 1
        state.seen = state.get("seen", []) + [state.rounds]
        channel.log(state.rounds, rounds=state.rounds)
        channel.save()
        return channel.INCOMPLETE if state.rounds < 3 else channel.COMPLETE


    def resume_here(state, channel):
        """For jobman cmdline: counts the runs in the same workdir."""
        state.runs = state.get("runs", 0) + 1
        state.cwd_files = sorted(os.listdir(channel.workdir))
        return channel.INCOMPLETE if state.runs < 2 else channel.COMPLETE
''')

FAST = ("--heartbeat", "0.2", "--grace", "2")


@pytest.fixture
def exp(tmp_path: Path, jobs_per_process: int):
    """The experiment module on disk, the trace file, and the environment a worker needs."""
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / f"{MODULE}.py").write_text(EXPERIMENTS)
    trace = tmp_path / "trace.txt"
    trace.touch()
    pythonpath = os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": pythonpath, "JM_TRACE": str(trace), "JOBMAN_JOBS_PER_PROCESS": str(jobs_per_process)}
    return type(
        "Exp",
        (),
        {"dir": moddir, "trace": trace, "env": env, "runs": tmp_path / "runs", "jobs_per_process": jobs_per_process},
    )


def fn(name: str) -> str:
    return f"{MODULE}:{name}"


def schedule(store: Store, *jobs: tuple[str, dict], max_attempts: int = 3) -> list[int]:
    """Schedule root function jobs (target name, params) and return their ids in order."""
    specs = [JobSpec(phase=0, kind="fn", target=fn(name), params=params, parent=None) for name, params in jobs]
    return store.schedule(specs, max_attempts=max_attempts).job_ids


def traced(exp) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in line.split()[:2]) for line in exp.trace.read_text().splitlines()]


def run_worker(jobman, url: str, exp, *extra: str, env: dict | None = None):
    result = jobman(
        "worker", url, "--exproot", str(exp.runs), *FAST, *extra, env={**exp.env, **(env or {})}, timeout=120
    )
    assert result.code == 0, result.err
    return result


def whys(store: Store, job_id: int) -> list[str]:
    return [e.why for e in store.events(job_id)]


def assert_nothing_running(store: Store) -> None:
    running = [j.id for j in store.jobs(status=[Status.RUNNING])]
    assert running == [], f"jobs left RUNNING: {running}"


# -- sweeps and the experiment API -------------------------------------------------------------


@pytest.mark.pgbouncer
def test_two_phase_sweep_children_read_their_parents_results_and_workdirs(jobman, db_url, store, exp):
    r = jobman(
        "sqlschedule", db_url, fn("pretrain"), "lr={{0.1,0.2}}", "--", fn("finetune"), "epochs={{1,2}}", env=exp.env
    )
    assert r.code == 0, r.err
    worker = run_worker(jobman, db_url, exp)
    assert "ran 6 job(s)" in worker.err

    jobs = {j.id: j for j in store.jobs()}
    assert {j.status for j in jobs.values()} == {Status.DONE}
    assert sorted(traced(exp)) == sorted((i, 1) for i in jobs)  # each job ran once
    parents = [j for j in jobs.values() if j.phase == 0]
    children = [j for j in jobs.values() if j.phase == 1]
    assert len(parents) == 2 and len(children) == 4
    for child in children:
        [parent_id] = child.depends_on
        parent = jobs[parent_id]
        assert child.results["parent_id"] == parent_id
        assert child.results["parent_w"] == pytest.approx(parent.params["lr"] * 10)
        assert child.results["parent_file"] == f"weights of lr={parent.params['lr']}"
        assert child.results["in_workdir"] is True
        assert Path(child.workdir) == exp.runs.resolve() / store.experiment / str(child.id)
        assert (Path(child.workdir) / "stdout.txt").exists()
    # each job ran in a process of its own (or, reused, in turns of up to K jobs), none in the worker
    pids = [jobs[job_id].results["pid"] for job_id, _attempt in traced(exp)]
    k = exp.jobs_per_process
    assert len(set(pids)) == -(-6 // k)
    assert all(len(set(pids[i : i + k])) == 1 for i in range(0, 6, k))
    # the learning curves are in job_metric
    curves = store.metrics([p.id for p in parents])
    assert sorted((job_id, step) for job_id, step, name, _v in curves if name == "loss") == sorted(
        (p.id, s) for p in parents for s in range(3)
    )
    for job_id, step, _name, value in curves:
        assert value == pytest.approx(jobs[job_id].params["lr"] / (step + 1))


def test_state_channel_and_keyword_functions(jobman, db_url, store, exp):
    a, b, c = schedule(
        store,
        ("keywords", {"x": 1}),
        ("keywords", {"x": 5, "y": 10, "unused": "z"}),
        ("keywords_and_channel", {"x": 21}),
    )
    run_worker(jobman, db_url, exp)
    jobs = {j.id: j for j in store.jobs()}
    assert jobs[a].status is Status.DONE and jobs[a].results == {"total": 3}
    # A parameter the function cannot take fails its job by name: it never runs on the defaults.
    assert jobs[b].status is Status.FAILED and jobs[b].error == "unused: keywords() takes x, y"
    assert jobs[c].status is Status.DONE
    assert jobs[c].results == {"double": 42, "workdir": jobs[c].workdir, "job": c}


def test_failures_stay_in_their_job_and_the_worker_goes_on(jobman, db_url, store, exp):
    raising, exiting, bad, fine = schedule(store, ("boom", {"n": 7}), ("exit3", {}), ("bad_return", {}), ("ok", {}))
    worker = run_worker(jobman, db_url, exp)
    assert "ran 4 job(s)" in worker.err
    jobs = {j.id: j for j in store.jobs()}

    assert jobs[raising].status is Status.FAILED
    assert "Traceback" in jobs[raising].error and "ValueError: boom number 7" in jobs[raising].error
    assert any("boom number 7" in w for w in whys(store, raising))

    assert jobs[exiting].status is Status.FAILED
    assert jobs[exiting].exit_code == 3
    assert "exited with code 3" in jobs[exiting].error

    assert jobs[bad].status is Status.FAILED and "returned 42" in jobs[bad].error

    assert jobs[fine].status is Status.DONE and jobs[fine].results == {"fine": True}
    # FAILED is the job's own doing: never relaunched by itself
    assert sorted(traced(exp)) == [(raising, 1), (exiting, 1), (fine, 1)]
    assert_nothing_running(store)


def test_a_nan_result_is_kept_and_the_worker_goes_on(jobman, db_url, store, exp):
    nan, fine = schedule(store, ("nan_result", {}), ("ok", {}))
    run_worker(jobman, db_url, exp)
    job = store.job(nan)
    assert job.status is Status.DONE, job.error
    assert job.results is not None and math.isnan(job.results["loss"])
    # every point of its learning curve is kept, the diverged ones as NaN and infinity
    curve = [(step, v) for _j, step, _n, v in store.metrics([nan])]
    assert [step for step, _v in curve] == [0, 1, 2, 3]
    assert curve[0] == (0, 1.0) and math.isnan(curve[1][1]) and curve[2] == (2, math.inf) and curve[3] == (3, 0.5)
    assert store.job(fine).status is Status.DONE
    assert_nothing_running(store)


def test_a_process_leaked_by_a_job_does_not_hold_up_its_worker(jobman, db_url, store, exp, tmp_path):
    leaked_file = tmp_path / "leaked"
    leaky, fine = schedule(store, ("leaks_a_process", {}), ("ok", {}))
    started = time.time()
    try:
        run_worker(jobman, db_url, exp, env={"JM_LEAKED": str(leaked_file)})
        took = time.time() - started
    finally:
        if leaked_file.exists():
            try:
                os.kill(int(leaked_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert took < 45, f"the worker waited {took:.0f} s for a process the job left behind"
    assert store.job(leaky).status is Status.DONE
    assert store.job(fine).status is Status.DONE


def test_a_stop_that_comes_as_the_job_starts_still_reaches_should_stop(store, exp, monkeypatch):
    """SIGTERM sent the moment the job is forked waits for the job's handler, so the job checkpoints."""
    from jobman.dispatch.runner import RunLimits, Runner
    from jobman.jobdb.store import WorkerInfo

    monkeypatch.syspath_prepend(str(exp.dir))
    monkeypatch.setenv("JM_TRACE", str(exp.trace))
    [job_id] = schedule(store, ("until_stopped", {}))
    claimed = store.claim(WorkerInfo.here(), str(exp.runs))
    runner = Runner(
        store,
        RunLimits(timeout=None, heartbeat_interval=0.001, grace=20.0, jobs_per_process=exp.jobs_per_process),
        stopping=lambda: True,
    )
    started = time.time()
    assert runner.run(claimed) == "QUEUED"
    assert time.time() - started < 15  # not the grace period: the job stopped when asked
    job = store.job(job_id)
    assert job.results["stop_reason"] == "received SIGTERM"
    assert job.attempt == 1 and any("worker was stopped" in w for w in whys(store, job_id))


def test_the_worker_sleeps_while_a_job_past_its_time_limit_is_given_its_grace(store, exp, monkeypatch):
    from jobman.dispatch.runner import RunLimits, Runner
    from jobman.jobdb.store import WorkerInfo

    monkeypatch.syspath_prepend(str(exp.dir))
    monkeypatch.setenv("JM_TRACE", str(exp.trace))
    [job_id] = schedule(store, ("ignores_stop", {}))
    claimed = store.claim(WorkerInfo.here(), str(exp.runs))
    runner = Runner(
        store, RunLimits(timeout=0.2, heartbeat_interval=0.2, grace=2.0, jobs_per_process=exp.jobs_per_process)
    )
    cpu, wall = time.process_time(), time.time()
    assert runner.run(claimed) == "FAILED"
    cpu, wall = time.process_time() - cpu, time.time() - wall
    assert wall >= 2.0  # the grace period was given
    assert cpu < 0.3, f"the worker used {cpu:.2f} s of CPU to wait {wall:.1f} s"
    assert "time limit of 0.2 s exceeded" in store.job(job_id).error


@pytest.mark.pgbouncer
def test_a_job_killed_by_a_signal_is_crashed_and_relaunched_within_max_attempts(jobman, db_url, store, exp):
    [phoenix] = schedule(store, ("checkpoint_then_sigkill", {}))
    [doomed] = schedule(store, ("sigkill_always", {}), max_attempts=2)

    # one job: its first attempt checkpoints, then is killed
    run_worker(jobman, db_url, exp, "--max-jobs", "1")
    job = store.job(phoenix)
    assert job.status is Status.QUEUED and job.attempt == 1
    assert job.results == {"progress": 42}  # the checkpoint is in the database
    assert any("killed by SIGKILL" in w for w in whys(store, phoenix))
    assert any(w.startswith("relaunch after crash") for w in whys(store, phoenix))

    run_worker(jobman, db_url, exp)
    jobs = {j.id: j for j in store.jobs()}
    assert jobs[phoenix].status is Status.DONE and jobs[phoenix].attempt == 2
    assert jobs[phoenix].results == {"progress": 42, "resumed_from": 42, "resumed_attempt": 2}
    assert jobs[doomed].status is Status.CRASHED and jobs[doomed].attempt == 2
    assert "killed by SIGKILL" in jobs[doomed].error
    assert traced(exp) == [(phoenix, 1), (phoenix, 2), (doomed, 1), (doomed, 2)]
    crashes = [e for e in store.events(doomed) if e.to_status == "CRASHED"]
    assert [e.attempt for e in crashes] == [1, 2]
    assert all("SIGKILL" in e.why for e in crashes)
    assert sum(w.startswith("relaunch after crash") for w in whys(store, doomed)) == 1  # not past max_attempts
    assert_nothing_running(store)


def test_a_job_whose_fork_server_dies_is_crashed_and_the_worker_goes_on_with_a_new_server(jobman, db_url, store, exp):
    victim, after = schedule(store, ("kills_its_fork_server", {}), ("ok", {}))
    result = run_worker(jobman, db_url, exp)
    jobs = {j.id: j for j in store.jobs()}
    assert jobs[victim].status is Status.DONE and jobs[victim].attempt == 2, whys(store, victim)
    assert jobs[victim].results == {"progress": 7, "resumed_from": 7}  # the checkpoint outlived the crash
    assert any("fork server died" in w for w in whys(store, victim))
    assert jobs[after].status is Status.DONE
    assert sorted(traced(exp)) == sorted([(victim, 1), (after, 1), (victim, 2)])
    assert "Traceback" not in result.err
    assert_nothing_running(store)


def test_time_limit_fails_the_job_and_keeps_its_checkpoint(jobman, db_url, store, exp):
    polite, stubborn = schedule(store, ("until_stopped", {}), ("ignores_stop", {}))
    started = time.time()
    run_worker(jobman, db_url, exp, "--timeout", "1", "--grace", "1")
    assert time.time() - started < 60
    jobs = {j.id: j for j in store.jobs()}

    assert jobs[polite].status is Status.FAILED
    assert "time limit of 1 s exceeded" in jobs[polite].error
    assert jobs[polite].results["steps"] > 0  # the checkpoint it made when told to stop is kept
    assert jobs[polite].results["stop_reason"] in ("wall-time limit reached", "received SIGTERM")

    assert jobs[stubborn].status is Status.FAILED  # killed after the grace period: still its own doing
    assert "time limit of 1 s exceeded" in jobs[stubborn].error
    assert any("time limit" in w for w in whys(store, stubborn))
    assert sorted(traced(exp)) == [(polite, 1), (stubborn, 1)]


def test_incomplete_is_requeued_first_in_line_and_resumes_its_state(jobman, db_url, store, exp):
    rounds, other = schedule(store, ("three_rounds", {}), ("ok", {}))
    run_worker(jobman, db_url, exp)
    jobs = {j.id: j for j in store.jobs()}
    assert jobs[rounds].status is Status.DONE
    assert jobs[rounds].results == {"rounds": 3, "seen": [1, 2, 3]}
    assert jobs[rounds].attempt == 1  # INCOMPLETE continues the same attempt
    # re-queued first in line: the other job waited until the three rounds were done
    assert traced(exp) == [(rounds, 1), (rounds, 1), (rounds, 1), (other, 1)]
    moves = [(e.from_status, e.to_status) for e in store.events(rounds) if e.to_status]
    assert moves.count(("RUNNING", "QUEUED")) == 2 and moves[-1] == ("RUNNING", "DONE")
    assert [(s, v) for _j, s, _n, v in store.metrics([rounds])] == [(1, 1.0), (2, 2.0), (3, 3.0)]


@pytest.mark.pgbouncer
def test_sigterm_puts_the_running_job_back_and_the_worker_exits_cleanly(db_url, store, exp, tmp_path):
    [job_id] = schedule(store, ("until_stopped", {"resumable": True}))
    marker = tmp_path / "started"
    env = {**os.environ, **exp.env, "JM_STARTED": str(marker)}
    code, err = signal_once_started(
        [sys.executable, "-m", "jobman.cli.main", "worker", db_url, "--exproot", str(exp.runs), *FAST], env, marker
    )
    assert code == 0, err
    job = store.job(job_id)
    assert job.status is Status.QUEUED
    assert job.attempt == 1
    assert job.results["steps"] > 0 and job.results["stop_reason"] == "received SIGTERM"
    assert any("worker was stopped" in w or "stopping worker" in w for w in whys(store, job_id))
    assert_nothing_running(store)

    # the next worker resumes it, and the interrupted run did not cost an attempt
    job_pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(job_pid, 0)
    r = subprocess.run(
        [sys.executable, "-m", "jobman.cli.main", "worker", db_url, "--exproot", str(exp.runs), *FAST],
        env={**os.environ, **exp.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    job = store.job(job_id)
    assert job.status is Status.DONE and job.attempt == 1 and job.results["resumed"] is True
    assert traced(exp) == [(job_id, 1), (job_id, 1)]


def test_a_job_claimed_by_the_record_of_the_last_one_is_put_back_when_the_worker_stops(jobman, db_url, store, exp):
    """The transaction that records a job claims the next; a worker stopped meanwhile must not keep it."""
    first, second = schedule(store, ("stops_its_worker", {}), ("ok", {}))
    run_worker(jobman, db_url, exp)
    assert traced(exp) == [(first, 1)]
    assert store.job(first).status is Status.DONE
    job = store.job(second)
    assert job.status is Status.QUEUED and job.attempt == 1
    assert whys(store, second)[-1] == "its worker was stopped before starting it; put back"
    assert_nothing_running(store)
    run_worker(jobman, db_url, exp)
    job = store.job(second)
    assert job.status is Status.DONE and job.attempt == 1  # being put back cost no attempt
    assert traced(exp) == [(first, 1), (second, 1)]


def test_jobman_sql_runs_exactly_n_jobs(jobman, db_url, store, exp):
    ids = schedule(store, *[("ok", {"i": i}) for i in range(4)])
    r = jobman("sql", "-n", "2", db_url, str(exp.runs), env=exp.env, timeout=120)
    assert r.code == 0, r.err
    assert sorted(traced(exp)) == [(ids[0], 1), (ids[1], 1)]
    statuses = [store.job(i).status for i in ids]
    assert statuses == [Status.DONE, Status.DONE, Status.QUEUED, Status.QUEUED]
    assert store.events(ids[2]) == []  # never claimed, not even to be put back
    assert Path(store.job(ids[0]).workdir).parent == exp.runs.resolve() / store.experiment


def test_cmdline_runs_in_a_directory_and_resumes(jobman, exp, tmp_path):
    workdir = tmp_path / "one_run"
    first = jobman("cmdline", fn("resume_here"), "lr=0.5", "name=abc", "--workdir", str(workdir), env=exp.env)
    assert first.code == 75  # INCOMPLETE: not done yet, as a command job says it
    assert json.loads(first.out)["status"] == "INCOMPLETE"
    assert json.loads((workdir / "state.json").read_text())["runs"] == 1

    second = jobman(
        "cmdline", fn("resume_here"), "lr=0.5", "name=abc", "--workdir", str(workdir), "--resume", env=exp.env
    )
    assert second.code == 0, second.err
    report = json.loads(second.out)
    assert report["status"] == "DONE"
    assert report["results"]["runs"] == 2  # resumed from the first run's state
    assert "state.json" in report["results"]["cwd_files"]

    failed = jobman("cmdline", fn("boom"), "n=1", "--workdir", str(tmp_path / "boom"), env=exp.env)
    assert failed.code == 1 and json.loads(failed.out)["status"] == "FAILED"

    missing = jobman("cmdline", f"{MODULE}:no_such_fn", "--workdir", str(workdir), env=exp.env)
    assert missing.code == 2 and "no attribute" in missing.err and "Traceback" not in missing.err


def test_cmdline_starts_afresh_unless_asked_and_never_resumes_another_run(jobman, exp, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    runs = [jobman("cmdline", fn("resume_here"), "lr=0.1", cwd=here, env=exp.env) for _ in range(2)]
    assert [r.code for r in runs] == [75, 75]  # INCOMPLETE both times: the second did not resume the first
    dirs = sorted(p for p in here.iterdir() if p.name.startswith("jobman_"))
    assert len(dirs) == 2 and [json.loads(r.out)["workdir"] for r in runs] != [str(dirs[0])] * 2

    workdir = tmp_path / "run"
    first = jobman("cmdline", fn("resume_here"), "lr=0.1", "--workdir", str(workdir), env=exp.env)
    assert first.code == 75, first.err
    before = (workdir / "state.json").read_text()
    cases = [
        (["lr=0.1"], "add --resume"),
        (["lr=0.5", "--resume"], "lr was 0.1, now 0.5"),
        (["lr=0.1", "extra=1", "--resume"], "extra was unset, now 1"),
    ]
    for extra, words in cases:
        r = jobman("cmdline", fn("resume_here"), *extra, "--workdir", str(workdir), env=exp.env)
        lines = [line for line in r.err.splitlines() if line.startswith("jobman: ")]
        assert r.code == 2 and len(lines) == 1 and words in lines[0] and "Traceback" not in r.err, r.err
    other = jobman("cmdline", fn("ok"), "lr=0.1", "--workdir", str(workdir), "--resume", env=exp.env)
    assert other.code == 2 and "holds a run of" in other.err, other.err
    assert (workdir / "state.json").read_text() == before  # nothing ran
    resumed = jobman("cmdline", fn("resume_here"), "lr=0.1", "--workdir", str(workdir), "--resume", env=exp.env)
    assert resumed.code == 0 and json.loads(resumed.out)["results"]["runs"] == 2, resumed.err


def test_jobman_sql_exits_1_when_a_job_it_ran_failed_and_show_gives_no_exit_code(jobman, db_url, store, exp):
    [failing] = schedule(store, ("boom", {"n": 1}))
    r = jobman("sql", "-n", "1", db_url, str(exp.runs), env=exp.env, timeout=120)
    assert r.code == 1 and "1 FAILED" in r.err, r.err
    job = store.job(failing)
    assert job.status is Status.FAILED and job.exit_code is None  # the function raised: no exit code to tell
    shown = jobman("show", db_url, str(failing), env=exp.env)
    assert shown.code == 0 and "exit code" not in shown.out and "boom number 1" in shown.out, shown.out

    [fine] = schedule(store, ("ok", {}))
    r = jobman("sql", "-n", "1", db_url, str(exp.runs), env=exp.env, timeout=120)
    assert r.code == 0 and store.job(fine).status is Status.DONE, r.err


def test_two_workers_of_a_dispatch_fail_one_job_of_a_target_that_cannot_be_imported(store, exp, monkeypatch, tmp_path):
    """Both workers claimed a job of the broken target before either tried it: the first fails its
    job, the second puts its own back without spending an attempt, and both then claim past it."""
    from jobman.dispatch.runner import RunLimits, Runner
    from jobman.dispatch.unimportable import VARIABLE
    from jobman.jobdb.store import WorkerInfo

    monkeypatch.syspath_prepend(str(exp.dir))
    monkeypatch.setenv("JM_TRACE", str(exp.trace))
    monkeypatch.setenv(VARIABLE, str(tmp_path / "unimportable.jsonl"))  # what a local dispatch sets
    specs = [JobSpec(0, "fn", "jm_nosuch_module:fn", {"x": i}, None) for i in range(3)]
    broken = store.schedule(specs).job_ids
    [good] = schedule(store, ("pretrain", {"x": 1}))
    limits = RunLimits(timeout=None, heartbeat_interval=0.2, jobs_per_process=exp.jobs_per_process)
    first, second = Runner(store, limits), Runner(store, limits)
    claimed = [store.claim(WorkerInfo(host="h", pid=pid), str(exp.runs)) for pid in (1, 2)]
    assert [c.job.id for c in claimed] == broken[:2]
    assert first.run(claimed[0]) == "FAILED"
    assert second.run(claimed[1]) == "QUEUED"
    assert first.cannot_import is not None and second.cannot_import is None
    assert "cannot import module 'jm_nosuch_module'" in first.cannot_import
    put_back = store.job(broken[1])
    assert put_back.status is Status.QUEUED and any("cannot be imported here" in w for w in whys(store, broken[1]))
    skip = second.unimportable.known()
    assert skip == {"jm_nosuch_module:fn"}
    nxt = store.claim(WorkerInfo(host="h", pid=2), str(exp.runs), skip=skip)
    assert nxt is not None and nxt.job.id == good
    assert store.claim(WorkerInfo(host="h", pid=2), str(exp.runs), skip=skip) is None
    assert store.outstanding(skip)["QUEUED"] == 0 and store.outstanding()["QUEUED"] == 2
    first.close()
    second.close()

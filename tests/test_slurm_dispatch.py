"""``jobman dispatch --backend slurm`` against the real one-node Slurm, with PostgreSQL as the database.

The experiment functions live in a module written under the test's tmp_path and
put on PYTHONPATH; sbatch hands the submitting environment to the Slurm jobs, so
the workers on the "node" import it too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest
from slurm_cluster import SlurmCluster
from test_bad_input_more import password_server  # noqa: F401 - a fixture: a server that checks passwords

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import expand, parse_sweep

EXPERIMENTS = '''
import os, signal, time
from pathlib import Path

def pretrain(state, channel):
    time.sleep(0.5)
    (channel.workdir / "weights.txt").write_text(str(state.x * 10))
    state.pre = state.x * 10
    state.slurm_job = os.environ.get("SLURM_JOB_ID")

def finetune(state, channel):
    (parent,) = channel.parents
    state.from_parent = int((parent.workdir / "weights.txt").read_text())
    state.total = parent.results["pre"] + 1

def stubborn(state, channel):
    """First attempt: runs on, deaf to SIGTERM (until Slurm's SIGKILL). Later: quick."""
    if channel.attempt == 1:
        Path(state.marker).write_text("running")
        time.sleep(300)
    state.finished_on_attempt = channel.attempt

def _worker_pid():
    """The job's parent is its worker's fork server; the worker is the server's parent."""
    with open(f"/proc/{os.getppid()}/stat") as fh:
        return int(fh.read().rpartition(")")[2].split()[1])

def killer(state, channel):
    """First attempt: SIGKILL this job's own process, or the worker running it."""
    if channel.attempt == 1:
        os.kill(os.getpid() if state.victim == "self" else _worker_pid(), signal.SIGKILL)
        time.sleep(30)
    state.finished_on_attempt = channel.attempt

def worker_argv(state, channel):
    """Whether the command line of this job's worker (readable by every user of the node) holds a secret."""
    with open(f"/proc/{_worker_pid()}/cmdline", "rb") as fh:
        argv = fh.read().decode(errors="replace")
    secrets = [s for s in os.environ.get("JM_SECRETS", "").split("\\n") if s]
    state.argv_has_password = any(s in argv for s in secrets)
    state.argv_names_database = "postgresql://" in argv

def probe(state, channel):
    """What Slurm granted the job this runs in."""
    time.sleep(1)
    state.slurm_job = os.environ.get("SLURM_JOB_ID")
    state.cpus = int(os.environ.get("SLURM_CPUS_PER_TASK") or 0)

def where_and_threads(state, channel):
    """The process the job ran in, its thread settings, and the devices Slurm gave it."""
    state.pid = os.getpid()
    state.omp = os.environ.get("OMP_NUM_THREADS")
    state.openblas = os.environ.get("OPENBLAS_NUM_THREADS")
    state.cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
    state.slurm_job = os.environ.get("SLURM_JOB_ID")

def resumable(state, channel):
    """``steps`` one-second steps, checkpointed; stops early (INCOMPLETE) when asked to."""
    state.starts = list(state.get("starts", [])) + [state.get("done", 0)]
    channel.save()
    while state.get("done", 0) < state.steps:
        if channel.should_stop():
            return channel.INCOMPLETE
        time.sleep(1)
        state.done = state.get("done", 0) + 1
        channel.save()
'''


# -- helpers ----------------------------------------------------------------------


@pytest.fixture
def exp(tmp_path: Path, pg_database: str, jobman):
    experiment = Experiment(tmp_path, f"{pg_database}?table=slurm_{uuid.uuid4().hex[:8]}", jobman)
    yield experiment
    experiment.store.dispose()
    if os.environ.get("SLURM_CONF") and shutil.which("scancel"):  # nothing of this test may go on running
        subprocess.run(["scancel", f"--name=jobman-{experiment.store.experiment}"], capture_output=True)


class Experiment:
    """One experiment in PostgreSQL, its functions on PYTHONPATH, its runs under tmp_path."""

    def __init__(self, root: Path, url: str, jobman: Callable) -> None:
        self.root = root
        self.url = url
        (root / "lib").mkdir()
        (root / "lib" / "slurm_jobs.py").write_text(EXPERIMENTS)
        self.env = {"PYTHONPATH": os.pathsep.join([str(root / "lib"), os.environ.get("PYTHONPATH", "")])}
        self.exproot = root / "runs"
        self._jobman = jobman
        self.store = Store.open(url, create=True)

    def __call__(self, *args: str, **kwargs):
        return self._jobman(*args, cwd=self.root, env={**self.env, **kwargs.pop("env", {})}, **kwargs)

    def schedule(self, *sweep: str, max_attempts: int = 3) -> None:
        """What ``jobman sqlschedule URL SWEEP...`` does, without a process of its own."""
        self.store.schedule(expand(parse_sweep(list(sweep))), max_attempts=max_attempts)

    def dispatch(self, *options: str, **kwargs):
        return self("dispatch", self.url, "--backend", "slurm", "--exproot", str(self.exproot), *options, **kwargs)

    def popen_dispatch(self, *options: str) -> subprocess.Popen:
        """A dispatch --follow running in the background (stdout and stderr to files under root)."""
        out = open(self.root / "dispatch.out", "w")
        err = open(self.root / "dispatch.err", "w")
        argv = [
            sys.executable,
            "-m",
            "jobman.cli.main",
            "dispatch",
            self.url,
            "--backend",
            "slurm",
            "--exproot",
            str(self.exproot),
            "--follow",
            *options,
        ]
        return subprocess.Popen(argv, cwd=self.root, env={**os.environ, **self.env}, stdout=out, stderr=err)

    def dispatch_err(self) -> str:
        return (self.root / "dispatch.err").read_text()

    def jobs(self):
        return self.store.jobs()

    def wait_until(self, predicate: Callable[[], object], timeout: float, what: str) -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.25)
        states = ", ".join(f"{j.id}:{j.status.value}" for j in self.jobs())
        raise AssertionError(f"{what} not within {timeout:.0f} s (jobs: {states})")

    def wait_all_done(self, timeout: float) -> None:
        self.wait_until(lambda: all(j.status is Status.DONE for j in self.jobs()), timeout, "all jobs DONE")

    def whys(self, job_id: int) -> list[str]:
        return [f"{e.from_status}->{e.to_status}: {e.why}" for e in self.store.events(job_id)]


def finish(proc: subprocess.Popen, timeout: float, exp: Experiment) -> int:
    """Wait for a dispatch --follow; past ``timeout``, stop it and cancel its Slurm jobs, and fail."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        subprocess.run(["scancel", f"--name=jobman-{exp.store.experiment}"], check=False)
        raise AssertionError(f"dispatch --follow did not end within {timeout:.0f} s: {exp.dispatch_err()}") from None


def scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(word.partition("=")[::2] for word in out.split())


# -- pull workers ---------------------------------------------------------------------


@pytest.mark.slurm
def test_a_two_phase_sweep_runs_on_a_worker_array_children_after_parents(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    exp.schedule("slurm_jobs:pretrain", "x={{1,2,3}}", "--", "slurm_jobs:finetune")
    proc = exp.popen_dispatch("-j", "4", "--heartbeat", "1")
    assert finish(proc, 120, exp) == 0, exp.dispatch_err()
    assert "6 DONE" in exp.dispatch_err()

    jobs = {j.id: j for j in exp.jobs()}
    assert len(jobs) == 6 and all(j.status is Status.DONE for j in jobs.values())
    for job in jobs.values():
        assert job.backend == "slurm" and re.fullmatch(r"\d+_\d+", job.backend_id), job.backend_id
        log = Path(job.log_path)
        assert log == exp.exproot / exp.store.experiment / "_slurm" / f"{job.backend_id}.out"
        assert f"running job {job.id}" in log.read_text()  # stdout and stderr of the worker, one file
        if job.phase == 1:
            (parent,) = [jobs[p] for p in job.depends_on]
            assert job.started_at >= parent.finished_at
            assert job.results["from_parent"] == parent.params["x"] * 10 == job.results["total"] - 1
    # Only as many workers as there were ready jobs: one array of 3 tasks for the 3 roots.
    arrays = {j.backend_id.split("_")[0] for j in jobs.values()}
    assert len(arrays) == 1 and {int(j.backend_id.split("_")[1]) for j in jobs.values()} <= {0, 1, 2}

    shown = exp("show", exp.url, str(min(jobs)), env={"COLUMNS": "400"})
    assert f"output    {jobs[min(jobs)].log_path}" in shown.out


@pytest.mark.slurm
def test_a_database_password_reaches_the_workers_but_not_their_command_lines(
    slurm_cluster: SlurmCluster,
    password_server,  # noqa: F811
    tmp_path: Path,
    jobman,
) -> None:
    server = password_server
    role, database = f"jm_sl_{uuid.uuid4().hex[:8]}", f"jm_sl_{uuid.uuid4().hex[:8]}"
    secret = "S1urm:p@ss/" + uuid.uuid4().hex[:6]
    server.admin(f"CREATE ROLE {role} LOGIN PASSWORD '{secret}'", f"CREATE DATABASE {database} OWNER {role}")
    exp = Experiment(tmp_path, server.url(role, secret, database) + "?table=sec", jobman)
    forms = [secret, quote(secret, safe=""), quote(secret)]
    exp.env["JM_SECRETS"] = "\n".join(forms)
    try:
        exp.schedule("slurm_jobs:worker_argv", "n={{1,2}}")
        proc = exp.popen_dispatch("-j", "2", "--heartbeat", "1")
        assert finish(proc, 120, exp) == 0, exp.dispatch_err()
        jobs = exp.jobs()
        assert len(jobs) == 2 and all(j.status is Status.DONE and j.backend == "slurm" for j in jobs)
        for j in jobs:
            assert j.results["argv_names_database"] and not j.results["argv_has_password"], j.results
        scripts = list((exp.exproot / exp.store.experiment / "_slurm").glob("*.sh"))
        assert scripts and all(p.stat().st_mode & 0o777 == 0o600 for p in scripts)
        logs = "".join(p.read_text() for p in (exp.exproot / exp.store.experiment / "_slurm").glob("*.out"))
        assert not any(form in logs + exp.dispatch_err() for form in forms)
    finally:
        exp.store.dispose()
        subprocess.run(["scancel", f"--name=jobman-{exp.store.experiment}"], capture_output=True)


@pytest.mark.slurm
def test_detach_submits_one_array_prints_its_id_and_returns(slurm_cluster: SlurmCluster, exp: Experiment) -> None:
    exp.schedule("slurm_jobs:pretrain", "x={{1,2,3}}")
    result = exp.dispatch("-j", "2", "--array-parallelism", "1", "--sbatch", "--job-name=detached", "--requeue")
    assert result.code == 0, result.err
    array_id = result.out.strip()
    assert array_id.isdigit()
    assert "jobman monitor" in result.err and array_id in result.err
    task = scontrol(f"{array_id}_0")
    assert (task["JobName"], task["ArrayTaskThrottle"], task["Requeue"]) == ("detached", "1", "1")
    tasks = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-j", array_id, "-o", "%i"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(tasks) == [f"{array_id}_0", f"{array_id}_1"]  # -j 2 of 3 ready jobs
    exp.wait_all_done(60)
    assert {j.backend_id.split("_")[0] for j in exp.jobs()} == {array_id}

    again = exp.dispatch()
    assert again.code == 0 and again.out == "" and "nothing was submitted" in again.err


@pytest.mark.slurm
def test_a_scancelled_worker_is_found_by_the_monitor_and_its_job_relaunched(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    marker = exp.root / "started"
    exp.schedule("slurm_jobs:stubborn", f"marker={marker}")
    proc = exp.popen_dispatch("-j", "1", "--heartbeat", "1", "--grace", "60")
    exp.wait_until(marker.exists, 60, "the job started")
    (job,) = exp.jobs()
    assert job.status is Status.RUNNING and job.backend == "slurm"
    subprocess.run(["scancel", job.backend_id], check=True)  # SIGTERM; SIGKILL after KillWait (5 s)
    assert finish(proc, 120, exp) == 0, exp.dispatch_err()

    (job,) = exp.jobs()
    assert job.status is Status.DONE and job.results["finished_on_attempt"] == 2
    crash = [w for w in exp.whys(job.id) if w.startswith("RUNNING->CRASHED")]
    assert len(crash) == 1 and "CANCELLED" in crash[0], exp.whys(job.id)


@pytest.mark.slurm
def test_a_job_that_sigkills_its_process_or_its_worker_is_crashed_with_the_reason_and_relaunched(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    exp.schedule("slurm_jobs:killer", "victim={{self,worker}}")
    proc = exp.popen_dispatch("-j", "2", "--heartbeat", "1")
    assert finish(proc, 120, exp) == 0, exp.dispatch_err()

    jobs = {j.params["victim"]: j for j in exp.jobs()}
    for job in jobs.values():
        assert job.status is Status.DONE and job.results["finished_on_attempt"] == 2, exp.whys(job.id)
        assert job.backend == "slurm" and re.fullmatch(r"\d+_\d+", job.backend_id)
    (own,) = [w for w in exp.whys(jobs["self"].id) if w.startswith("RUNNING->CRASHED")]
    assert "SIGKILL" in own  # the worker saw its job's process killed
    (worker,) = [w for w in exp.whys(jobs["worker"].id) if w.startswith("RUNNING->CRASHED")]
    assert re.search(r"Slurm job \d+_\d+ ended FAILED", worker) and "signal 9" in worker, worker


@pytest.mark.slurm
@pytest.mark.slow
def test_a_worker_at_its_time_limit_requeues_its_job_which_resumes_from_its_checkpoint(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    # --time=1 and the default --signal=B:TERM@60: Slurm's warning comes at its first
    # time check (~20 s in), long before the kill at ~85 s.
    exp.schedule("slurm_jobs:resumable", "steps=40")
    proc = exp.popen_dispatch("-j", "1", "--heartbeat", "1", "--sbatch", "--time=1")
    assert finish(proc, 240, exp) == 0, exp.dispatch_err()

    (job,) = exp.jobs()
    assert job.status is Status.DONE and job.results["done"] == 40
    starts = job.results["starts"]
    assert len(starts) >= 2 and starts[0] == 0 and starts[1] > 0  # resumed from the checkpoint
    whys = exp.whys(job.id)
    assert any("RUNNING->QUEUED" in w and "put back to resume" in w for w in whys), whys
    assert job.attempt == 1 and not any("CRASHED" in w for w in whys)  # no attempt counted
    assert len({e.why.split("(slurm ")[-1] for e in exp.store.events(job.id) if "claimed" in e.why}) >= 2


@pytest.mark.slurm
def test_pull_workers_on_slurm_reuse_job_processes_and_set_the_threads_of_each_job(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    exp.schedule("slurm_jobs:where_and_threads", "n={{1,2,3,4,5,6}}")
    proc = exp.popen_dispatch("-j", "1", "--heartbeat", "1", "--jobs-per-process", "3", "--threads-per-job", "2")
    assert finish(proc, 120, exp) == 0, exp.dispatch_err()

    jobs = sorted(exp.jobs(), key=lambda j: j.id)
    assert all(j.status is Status.DONE and j.backend == "slurm" for j in jobs)
    assert {(j.results["omp"], j.results["openblas"]) for j in jobs} == {("2", "2")}
    # One worker: its first three jobs in one process, the next three in a fresh one.
    pids = [j.results["pid"] for j in jobs]
    assert len(set(pids[:3])) == 1 and len(set(pids[3:])) == 1 and pids[0] != pids[3], pids


@pytest.mark.slurm
def test_gpus_come_from_slurms_gres_which_sets_each_jobs_cuda_visible_devices(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    exp.schedule("slurm_jobs:where_and_threads", "n={{1,2,3,4}}")
    proc = exp.popen_dispatch("-j", "2", "--heartbeat", "1", "--sbatch", "--gres=gpu:1")
    assert finish(proc, 120, exp) == 0, exp.dispatch_err()
    jobs = exp.jobs()
    assert all(j.status is Status.DONE for j in jobs)
    by_task: dict[str, set[str]] = {}
    for job in jobs:
        by_task.setdefault(job.backend_id, set()).add(job.results["cuda"])
    # Each worker's jobs see the one device Slurm gave its task, and only that one.
    assert all(len(seen) == 1 and seen <= {"0", "1"} for seen in by_task.values()), by_task

    exp.schedule("slurm_jobs:where_and_threads", "n=9", "resources=--gres=gpu:2")
    proc = exp.popen_dispatch("--one-job-per-task", "--heartbeat", "1")
    assert finish(proc, 120, exp) == 0, exp.dispatch_err()
    [both] = [j for j in exp.jobs() if j.params["n"] == 9]
    assert both.status is Status.DONE and both.results["cuda"] == "0,1"

    refused = exp.dispatch("--gpus", "0,1")
    assert refused.code == 2 and "--gpus is for the local backend" in refused.err and "Traceback" not in refused.err


# -- one Slurm job per jobman job ----------------------------------------------------------


@pytest.mark.slurm
def test_one_job_per_task_sets_the_threads_of_each_job_and_refuses_jobs_per_process(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    exp.schedule("slurm_jobs:where_and_threads", "n={{1,2}}")
    refused = exp.dispatch("--one-job-per-task", "--jobs-per-process", "5")
    assert refused.code == 2 and "Traceback" not in refused.err
    assert refused.err.strip() == (
        "jobman: --jobs-per-process is for pull workers: with --one-job-per-task each Slurm job runs one job"
    ), refused.err
    assert all(j.status is Status.QUEUED and j.backend_id is None for j in exp.jobs())  # nothing submitted

    proc = exp.popen_dispatch("--one-job-per-task", "--threads-per-job", "3", "--heartbeat", "1")
    assert finish(proc, 120, exp) == 0, exp.dispatch_err()
    jobs = exp.jobs()
    assert all(j.status is Status.DONE for j in jobs)
    assert {(j.results["omp"], j.results["openblas"]) for j in jobs} == {("3", "3")}
    assert len({j.results["slurm_job"] for j in jobs}) == 2


@pytest.mark.slurm
def test_one_job_per_task_gives_each_job_its_own_resources_and_submits_children_when_queued(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    exp.schedule("slurm_jobs:probe", "n=1", "resources=--cpus-per-task=2 --mem=64M")
    exp.schedule("slurm_jobs:probe", "n=2", "--", "slurm_jobs:probe")
    proc = exp.popen_dispatch(
        "--one-job-per-task", "--sbatch", "--mem=32M", "--sbatch-phase", "1=--cpus-per-task=3", "--heartbeat", "1"
    )
    assert finish(proc, 120, exp) == 0, exp.dispatch_err()

    own, plain, child = sorted(exp.jobs(), key=lambda j: (j.phase, j.params["n"]))
    assert own.params["n"] == 1 and plain.params["n"] == 2 and child.depends_on == [plain.id]
    # --sbatch, then --sbatch-phase, then the job's own resources: each Slurm job got its own.
    wanted = {own.id: ("2", "64M", 2), plain.id: ("1", "32M", 0), child.id: ("3", "32M", 3)}
    for job in (own, plain, child):
        assert job.status is Status.DONE and job.backend == "slurm" and job.backend_id.isdigit()
        assert job.results["slurm_job"] == job.backend_id
        assert job.log_path == str(exp.exproot / exp.store.experiment / "_slurm" / f"{job.backend_id}.out")
        granted = scontrol(job.backend_id)
        assert (granted["NumCPUs"], granted["MinMemoryNode"], job.results["cpus"]) == wanted[job.id], granted
    assert len({own.backend_id, plain.backend_id, child.backend_id}) == 3
    assert child.started_at >= plain.finished_at
    submitted = [e.at for e in exp.store.events(child.id) if e.why.startswith("submitted as slurm job")]
    assert len(submitted) == 1 and submitted[0] >= plain.finished_at  # not before its parent was DONE


@pytest.mark.slurm
def test_one_job_per_task_never_submits_a_job_twice_and_resubmits_one_whose_slurm_job_never_started(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    exp.schedule("slurm_jobs:probe", "n={{1,2}}", "--", "slurm_jobs:pretrain", "x=1")
    first = exp.dispatch("--one-job-per-task", "--sbatch", "--hold")
    assert first.code == 0, first.err
    held = dict(line.split("\tjob ") for line in first.out.splitlines())
    assert len(held) == 2 and "2 job(s) still WAITING" in first.err
    assert exp.dispatch("--one-job-per-task").out == ""  # both wait for their Slurm job: nothing new

    slurm_a, slurm_b = held
    job_a = int(held[slurm_a])
    subprocess.run(["scancel", slurm_a], check=True)
    slurm_cluster.wait_state(slurm_a)
    third = exp.dispatch("--one-job-per-task", "--no-requeue")
    assert third.code == 0, third.err
    (line,) = third.out.splitlines()
    slurm_new, resubmitted = line.split("\tjob ")
    assert int(resubmitted) == job_a and slurm_new not in held and scontrol(slurm_new)["Requeue"] == "0"
    whys = exp.whys(job_a)
    assert any(f"Slurm job {slurm_a} ended CANCELLED" in w and "before it started" in w for w in whys), whys
    exp.wait_until(lambda: exp.store.job(job_a).status is Status.DONE, 60, f"job {job_a} DONE")
    assert exp.store.job(job_a).attempt == 2  # the Slurm job that never started cost one attempt

    subprocess.run(["scontrol", "release", slurm_b], check=True)
    exp.wait_until(lambda: exp.store.job(int(held[slurm_b])).status is Status.DONE, 60, "the held job DONE")
    assert exp.store.job(int(held[slurm_b])).backend_id == slurm_b


def test_run_job_runs_only_the_job_assigned_to_its_slurm_job(exp: Experiment) -> None:
    exp.schedule("slurm_jobs:probe", "n={{1,2}}")
    a, b = (j.id for j in exp.jobs())
    assert exp.store.assign(a, "slurm", "424242")
    env = {"SLURM_JOB_ID": "777", "JOBMAN_WORKER_LOG": "/nowhere.out"}
    other = exp("run-job", exp.url, str(a), "--exproot", str(exp.exproot), env=env)
    assert other.code == 0 and "waits for slurm job 424242" in other.err
    unassigned = exp("run-job", exp.url, str(b), "--assignment-wait", "0.5", env=env)
    assert unassigned.code == 0 and "was not assigned to Slurm job 777" in unassigned.err
    assert {j.status for j in exp.jobs()} == {Status.QUEUED}


# -- what is refused ---------------------------------------------------------------------


@pytest.mark.slurm
def test_sqlite_is_refused_without_allow_sqlite(slurm_cluster: SlurmCluster, tmp_path: Path, jobman) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=t"
    assert jobman("sqlschedule", url, "jobman.models.mlp:train", "--no-check", cwd=tmp_path).code == 0
    refused = jobman("dispatch", url, "--backend", "slurm", cwd=tmp_path)
    assert refused.code == 2 and refused.out == ""
    assert refused.err.strip().startswith("jobman: Slurm jobs on other nodes cannot share a SQLite file")
    assert "PostgreSQL" in refused.err and "--allow-sqlite" in refused.err and len(refused.err.splitlines()) == 1
    accepted = jobman(
        "dispatch",
        url,
        "--backend",
        "slurm",
        "--allow-sqlite",
        "--sbatch",
        "--hold",
        "--exproot",
        str(tmp_path / "runs"),
        cwd=tmp_path,
    )
    assert accepted.code == 0 and accepted.out.strip().isdigit(), accepted.err
    subprocess.run(["scancel", accepted.out.strip()], check=True)


@pytest.mark.slurm
@pytest.mark.parametrize(
    "mode, options, message",
    [
        ((), "--no-such-option", "sbatch refused the job: unrecognized option '--no-such-option'"),
        ((), "--partition=nowhere", "sbatch refused the job: Batch job submission failed: Invalid partition name"),
        (("--one-job-per-task",), "--partition=nowhere", "sbatch refused the job: Batch job submission failed"),
        (("--one-job-per-task",), "--comment='unbalanced", "cannot be parsed: No closing quotation"),
    ],
)
def test_a_bad_sbatch_option_is_one_sentence_and_a_failure(
    slurm_cluster: SlurmCluster, exp: Experiment, mode: tuple, options: str, message: str
) -> None:
    exp.schedule("slurm_jobs:pretrain", "x=1")
    result = exp.dispatch(*mode, "--sbatch", options)
    assert result.code == 1 and result.out == ""
    assert result.err.startswith("jobman: ") and message in result.err and len(result.err.splitlines()) == 1
    (job,) = exp.jobs()
    assert job.status is Status.QUEUED and not job.awaiting_allocation


@pytest.mark.slurm
def test_a_missing_sbatch_is_one_sentence(exp: Experiment) -> None:
    exp.schedule("slurm_jobs:pretrain", "x=1")
    result = exp.dispatch(env={"PATH": str(exp.root)})
    assert result.code == 1
    assert result.err.strip() == "jobman: sbatch was not found on PATH: is Slurm installed on this host?"


def test_slurm_options_are_refused_with_the_local_backend(tmp_path: Path, jobman) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=t"
    result = jobman("dispatch", url, "--sbatch", "--mem=1G", cwd=tmp_path)
    assert result.code == 2 and "--sbatch is for --backend slurm" in result.err


# -- the pieces -----------------------------------------------------------------------------


def test_resources_become_sbatch_options() -> None:
    from jobman.dispatch.slurm_dispatch import parse_phase_options, resources_options
    from jobman.jobdb.errors import UsageError

    assert resources_options("--mem=4G  --comment='a b'") == ["--mem=4G", "--comment=a b"]
    assert resources_options(["--mem=4G", "--gres=gpu:1"]) == ["--mem=4G", "--gres=gpu:1"]
    assert resources_options({"mem": "4G", "cpus-per-task": 2, "exclusive": True, "x": False}) == [
        "--mem=4G",
        "--cpus-per-task=2",
        "--exclusive",
    ]
    assert resources_options(None) == []
    with pytest.raises(UsageError, match="resources"):
        resources_options(4)
    assert parse_phase_options(["1=--mem=4G --gres=gpu:1", "0=-c 2", "1=--time=5"]) == {
        1: ["--mem=4G", "--gres=gpu:1", "--time=5"],
        0: ["-c", "2"],
    }
    with pytest.raises(UsageError, match="PHASE=OPTIONS"):
        parse_phase_options(["--mem=4G"])


def test_the_command_each_slurm_job_runs_is_one_run_job_accepts(store: Store, db_url: str, tmp_path: Path, jobman):
    """Every limit of a dispatch, --outage-wait included, is passed on as an option ``run-job`` takes."""
    from jobman.dispatch.backends.base import WorkerSpec
    from jobman.dispatch.machine import JobProcesses
    from jobman.dispatch.slurm_dispatch import JobPerTaskDispatcher, JobPerTaskOptions
    from jobman.dispatch.worker_settings import WorkerSettings

    (tmp_path / "onejob.py").write_text("def f(state, channel):\n    state.y = state.x + 1\n")
    out = jobman("sqlschedule", db_url, "onejob:f", "x=1", cwd=tmp_path)
    assert out.code == 0, out.err
    settings = WorkerSettings(
        str(tmp_path / "runs"), timeout=60, outage_wait=30, processes=JobProcesses(threads_per_job=1), verbose=True
    )
    dispatcher = JobPerTaskDispatcher(store, None, WorkerSpec(db_url, settings), JobPerTaskOptions())  # type: ignore[arg-type]
    [job] = store.jobs()
    argv = dispatcher.argv(job)
    assert "--outage-wait" in argv
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    ran = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr  # outside Slurm, run-job runs a QUEUED job at once
    done = store.job(job.id)
    assert done.status is Status.DONE and done.results == {"y": 2}


def test_assign_claim_job_and_release(store: Store) -> None:
    store.schedule(expand(parse_sweep(["m:f", "x={{1,2}}"])), max_attempts=2)
    a, b = (j.id for j in store.jobs())
    here = WorkerInfo.here(backend="slurm", backend_id="11")
    assert store.assign(a, "slurm", "10", "/logs/10.out")
    assert not store.assign(a, "slurm", "12")  # already waits for Slurm job 10
    job = store.job(a)
    assert job.awaiting_allocation and (job.backend_id, job.log_path) == ("10", "/logs/10.out")
    assert store.claim_job(a, here, assigned_to="11") is None  # not this allocation's job
    assert store.release(a, "99", "gone") is None  # not the allocation it waits for

    assert store.release(a, "10", "Slurm job 10 ended CANCELLED before it started job") is Status.QUEUED
    job = store.job(a)
    assert (job.status, job.attempt, job.awaiting_allocation) == (Status.QUEUED, 1, False)
    assert store.assign(a, "slurm", "11")
    claimed = store.claim_job(a, here, "/runs", assigned_to="11")
    assert claimed is not None and claimed.job.status is Status.RUNNING and claimed.job.attempt == 2
    assert claimed.job.workdir == f"/runs/{a}" and not store.job(a).awaiting_allocation
    assert store.claim_job(a, here, assigned_to="11") is None  # RUNNING now
    assert not store.assign(a, "slurm", "13")

    assert store.assign(b, "slurm", "20")
    assert store.release(b, "20", "first") is Status.QUEUED
    assert store.assign(b, "slurm", "21")
    assert store.release(b, "21", "second") is Status.CRASHED  # its max_attempts (2) are spent
    assert store.job(b).attempt == 2 and store.job(b).error == "second"
    assert store.claim_job(b, WorkerInfo.here()) is None


# -- jobs of several ranks -----------------------------------------------------------------

GANG_JOBS = '''
import json, os, time

def ranks(state, channel):
    """Each rank writes what it sees; every rank waits for the others (they run together)."""
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_ID")
    seen = {"rank": channel.rank, "pid": os.getpid(), "env": {k: os.environ.get(k) for k in keys}}
    (channel.workdir / f"seen-{channel.rank}.json").write_text(json.dumps(seen))
    end = time.time() + 60
    while not all((channel.workdir / f"seen-{r}.json").exists() for r in range(channel.world_size)):
        assert time.time() < end, "the ranks never all ran"
        time.sleep(0.05)
    if state.mode == "raise" and channel.rank == 2:
        raise ValueError("rank 2 cannot go on")
    if state.mode == "kill" and channel.attempt == 1:
        if channel.rank == 1:
            os.kill(os.getpid(), 9)
        time.sleep(120)  # the others: ended by the gang long before this
    if state.mode == "ps":  # the ranks srun started are one MPI world
        import numpy as np
        from jobman import ps

        ps.init()
        table = ps.MatrixTableHandler(3, 2)
        table.add(np.full((1, 2), channel.rank + 1.0), row_ids=[channel.rank])
        table.add(np.ones((3, 2)))
        ps.barrier()
        state.total = table.get().tolist()
        state.workers, state.worker_id = ps.num_workers(), ps.worker_id()
        ps.shutdown()
    state.rank_seen = channel.rank
'''


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_of_three_ranks_gets_three_tasks_srun_starts_them_as_one_mpi_world(
    slurm_cluster: SlurmCluster, exp: Experiment
) -> None:
    (exp.root / "lib" / "gang_jobs.py").write_text(GANG_JOBS)
    exp.store.schedule(expand(parse_sweep(["gang_jobs:ranks", "mode={{plain,raise,ps,kill}}"])), ranks=3)
    refused = exp.dispatch()
    assert refused.code == 2 and "Traceback" not in refused.err
    assert "ranks: on Slurm, jobs of several ranks run with --one-job-per-task" in refused.err, refused.err

    proc = exp.popen_dispatch("--one-job-per-task", "--heartbeat", "1")
    assert finish(proc, 240, exp) == 1, exp.dispatch_err()  # one job FAILED
    assert "3 DONE, 1 FAILED" in exp.dispatch_err()
    jobs = {j.params["mode"]: j for j in exp.jobs()}
    killed = jobs["kill"]  # a rank SIGKILLed: CRASHED naming it, relaunched, every rank again, DONE
    assert killed.status is Status.DONE and killed.attempt == 2, killed.error
    crash = [e.why for e in exp.store.events(killed.id) if e.to_status == "CRASHED"]
    assert len(crash) == 1 and "rank 1 of 3 was killed by SIGKILL" in crash[0], crash
    plain, raised, with_ps = jobs["plain"], jobs["raise"], jobs["ps"]
    assert plain.status is Status.DONE and plain.results["rank_seen"] == 0, plain.error
    assert scontrol(plain.backend_id)["NumTasks"] == "3"
    seen = [json.loads((Path(plain.workdir) / f"seen-{r}.json").read_text()) for r in range(3)]
    port = seen[0]["env"]["MASTER_PORT"]
    for rank, s in enumerate(seen):
        env = s["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
            str(rank),
            "3",
            str(rank),
            "3",
        )
        assert env["MASTER_PORT"] == port and env["MASTER_ADDR"] == socket.gethostname()
        assert env["SLURM_JOB_ID"] == plain.backend_id
    assert [s["env"]["SLURM_PROCID"] for s in seen] == ["0", "1", "2"]  # srun's tasks, rank R its task R
    assert seen[0]["env"]["SLURM_STEP_ID"] == seen[1]["env"]["SLURM_STEP_ID"] == seen[2]["env"]["SLURM_STEP_ID"]
    assert with_ps.status is Status.DONE, with_ps.error
    assert with_ps.results["total"] == [[4.0, 4.0], [5.0, 5.0], [6.0, 6.0]]  # every rank's adds, in one world
    assert (with_ps.results["workers"], with_ps.results["worker_id"]) == (3, 0)
    assert raised.status is Status.FAILED and raised.error.startswith("rank 2 of 3 raised:\n"), raised.error
    assert "ValueError: rank 2 cannot go on" in raised.error

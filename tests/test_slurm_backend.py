"""The Slurm backend against the real one-node cluster: submission, states, errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster

from jobman.dispatch.backends import slurm
from jobman.dispatch.backends.base import BackendError, WorkerSpec
from jobman.dispatch.backends.slurm import SlurmBackend
from jobman.dispatch.worker_settings import WorkerSettings

pytestmark = pytest.mark.slurm

PRINT_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


def wait_ended(backend: SlurmBackend, ids: list[str], timeout: float = 30.0) -> None:
    """Poll the backend until none of ``ids`` is alive."""
    deadline = time.monotonic() + timeout
    while any(state.alive for state in backend.allocation_states(ids).values()):
        assert time.monotonic() < deadline, f"Slurm jobs {ids} still alive after {timeout:.0f} s."
        time.sleep(0.1)


def squeue_field(job_id: str, field: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job_id, "-O", f"{field}:|"], capture_output=True, text=True, check=True
    )
    return out.stdout.rstrip("\n").rstrip("|")


def test_submit_job_passes_argv_unaltered(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    args = ["a b", "it's", '"quoted"', "$HOME", "*", "", "back\\slash"]
    backend = SlurmBackend(log_dir=tmp_path)
    job = backend.submit_job([sys.executable, "-c", PRINT_ARGV, *args])
    wait_ended(backend, [job])
    assert backend.allocation_states([job])[job].state == "COMPLETED"
    out, err = backend.log_paths(job)
    assert json.loads(out.read_text()) == args
    assert err.read_text() == ""
    assert (tmp_path / f"{job}.sh").read_text().startswith("#!/bin/sh\n")


def test_sbatch_options_with_spaces_and_quotes_arrive_unaltered(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    user_string = '--comment=\'a b "c" $HOME\' --job-name="my job\'s"'
    backend = SlurmBackend(sbatch_options=user_string, log_dir=tmp_path)
    assert backend.sbatch_options == ['--comment=a b "c" $HOME', "--job-name=my job's"]
    first = backend.submit_job(["true"])
    second = backend.submit_job(["true"], ["--comment=x  'y' z"])
    assert squeue_field(first, "Comment") == 'a b "c" $HOME'
    assert squeue_field(first, "Name") == "my job's"
    assert squeue_field(second, "Comment") == "x  'y' z"


def test_start_workers_submits_one_array_with_slurm_ids_in_the_environment(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    assert SlurmBackend().worker_command == (sys.executable, "-m", "jobman.cli.main", "worker")
    show_env = (
        "import json, os, sys; print(json.dumps([os.environ[k] for k in"
        " ('SLURM_JOB_ID', 'SLURM_ARRAY_JOB_ID', 'SLURM_ARRAY_TASK_ID')] + sys.argv[1:]))"
    )
    stand_in = [sys.executable, "-c", show_env]
    backend = SlurmBackend(log_dir=tmp_path, array_parallelism=2, worker_command=stand_in)
    spec = WorkerSpec("sqlite:///runs.db?table=mlp", WorkerSettings(max_jobs=1))
    ids = backend.start_workers(spec, 3)
    array_id = ids[0].split("_")[0]
    assert ids == [f"{array_id}_{task}" for task in range(3)]
    assert slurm_cluster.job(ids[0])["ArrayTaskThrottle"] == "2"
    wait_ended(backend, ids)
    assert backend.running_workers() == 0
    for task, backend_id in enumerate(ids):
        job_id, array_job, array_task, *argv = json.loads(backend.log_paths(backend_id)[0].read_text())
        assert (array_job, array_task, argv) == (array_id, str(task), spec.argv())
        assert argv[0] == spec.db_url and argv[argv.index("--max-jobs") + 1] == "1"
        assert job_id.isdigit()


def test_allocation_states_of_a_mix_in_one_squeue_call(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = SlurmBackend(log_dir=tmp_path)
    jobs = {
        "running": backend.submit_job(["sleep", "60"]),
        "completed": backend.submit_job(["true"]),
        "cancelled": backend.submit_job(["sh", "-c", f"touch {tmp_path / 'started'}; exec sleep 60"]),
        "failed": backend.submit_job(["sh", "-c", "exit 3"]),
        "killed": backend.submit_job(["sh", "-c", "kill -9 $$"]),
    }
    slurm_cluster.wait_state(jobs["cancelled"], frozenset({"RUNNING"}))
    deadline = time.monotonic() + 60  # RUNNING comes before the script starts; scancel then kills with 9
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    subprocess.run(["scancel", jobs["cancelled"]], check=True)
    for name in ("completed", "cancelled", "failed", "killed"):
        slurm_cluster.wait_state(jobs[name])
    slurm_cluster.wait_state(jobs["running"], frozenset({"RUNNING"}))

    calls: list[str] = []
    real_run = slurm._run
    monkeypatch.setattr(slurm, "_run", lambda argv: calls.append(argv[0]) or real_run(argv))
    asked = [*jobs.values(), "999999", "not-an-id"]
    states = backend.allocation_states(asked)
    assert calls == ["squeue", "sacct"]  # sacct only for the ids squeue does not know
    backend.allocation_states(asked)
    assert calls == ["squeue", "sacct", "squeue"]  # no accounting here: sacct is not asked again

    summary = {name: (states[job].alive, states[job].state) for name, job in jobs.items()}
    assert summary == {
        "running": (True, "RUNNING"),
        "completed": (False, "COMPLETED"),
        "cancelled": (False, "CANCELLED"),
        "failed": (False, "FAILED"),
        "killed": (False, "FAILED"),
    }
    assert "exit code 0" in states[jobs["completed"]].reason
    assert "signal 15" in states[jobs["cancelled"]].reason
    assert "exit code 3" in states[jobs["failed"]].reason
    assert "signal 9" in states[jobs["killed"]].reason
    for unknown in ("999999", "not-an-id"):
        assert (states[unknown].alive, states[unknown].state) == (False, "UNKNOWN")

    backend.stop_workers()
    assert slurm_cluster.wait_state(jobs["running"], timeout=15) == "CANCELLED"
    assert backend.running_workers() == 0


def test_an_sbatch_error_is_a_backend_error(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    backend = SlurmBackend(sbatch_options=["--partition=no-such-partition"], log_dir=tmp_path)
    with pytest.raises(BackendError, match="sbatch refused the job: .*Invalid partition") as caught:
        backend.submit_job(["true"])
    assert "\n" not in str(caught.value)
    assert list(tmp_path.glob("*.sh")) == []
    assert backend.submitted == []


def test_a_missing_sbatch_is_a_backend_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendError, match="sbatch was not found on PATH"):
        SlurmBackend(log_dir=tmp_path).start_workers(WorkerSpec("sqlite:///x.db"), 2)


def test_unbalanced_quotes_in_sbatch_options_are_a_backend_error() -> None:
    with pytest.raises(BackendError, match="cannot be parsed"):
        SlurmBackend(sbatch_options="--comment='oops")


def test_ids_squeue_has_forgotten_are_read_from_sacct(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accounting is off on the test cluster, so sacct's answer is canned here (its -P format)."""

    def fake_run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "squeue":
            error = "slurm_load_jobs error: Invalid job id specified\n"
            return subprocess.CompletedProcess(argv, 1, "", error)
        assert argv[:4] == ["sacct", "-X", "-P", "-n"]
        return subprocess.CompletedProcess(argv, 0, "7_1|9|TIMEOUT|0:15\n8|8|CANCELLED by 0|0:15\n", "")

    monkeypatch.setattr(slurm, "_run", fake_run)
    states = SlurmBackend().allocation_states(["7_1", "9", "8", "10"])
    assert {job: (s.alive, s.state) for job, s in states.items()} == {
        "7_1": (False, "TIMEOUT"),
        "9": (False, "TIMEOUT"),
        "8": (False, "CANCELLED"),
        "10": (False, "UNKNOWN"),
    }
    assert states["7_1"].reason == "Slurm job 7_1 ended TIMEOUT (killed by signal 15)."
    assert states["9"].reason == states["7_1"].reason  # the same job, asked about by its own id

"""The test cluster itself: a real slurmctld + slurmd run jobs and report how they ended."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm


def test_client_commands_find_the_cluster_through_slurm_conf(slurm_cluster: SlurmCluster) -> None:
    assert os.environ["SLURM_CONF"] == str(slurm_cluster.conf_path)
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %c %T"], capture_output=True, text=True, check=True)
    node, cpus, state = out.stdout.split()
    assert (node, cpus) == (slurm_cluster.node, str(slurm_cluster.cpus))
    assert state in ("idle", "mixed", "allocated")
    # What the client commands read is the test cluster's file, whatever /etc/slurm holds on this host.
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    conf_lines = [
        line.split("=", 1)[1].strip() for line in config.splitlines() if line.split("=", 1)[0].strip() == "SLURM_CONF"
    ]
    assert conf_lines == [str(slurm_cluster.conf_path)], conf_lines


def test_up_again_reuses_the_running_cluster(slurm_cluster: SlurmCluster) -> None:
    assert SlurmCluster().up() is False


def test_a_job_completes_and_writes_its_output(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("#!/bin/sh\necho hello\n", directory=tmp_path)
    assert slurm_cluster.wait_state(job) == "COMPLETED"
    assert (tmp_path / f"{job}.out").read_text() == "hello\n"
    assert slurm_cluster.job(job)["ExitCode"] == "0:0"


def test_an_array_gives_one_record_per_task(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("#!/bin/sh\necho $SLURM_ARRAY_TASK_ID\n", "--array=0-3", directory=tmp_path)
    assert [slurm_cluster.wait_state(f"{job}_{task}") for task in range(4)] == ["COMPLETED"] * 4
    out = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%i"], capture_output=True, text=True, check=True
    )
    assert sorted(out.stdout.split()) == [f"{job}_{task}" for task in range(4)]


def test_scancel_gives_cancelled(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("#!/bin/sh\nsleep 60\n", directory=tmp_path)
    slurm_cluster.wait_state(job, frozenset({"RUNNING"}))
    subprocess.run(["scancel", job], check=True)
    assert slurm_cluster.wait_state(job, timeout=15) == "CANCELLED"


def test_exit_1_gives_failed(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("#!/bin/sh\nexit 1\n", directory=tmp_path)
    assert slurm_cluster.wait_state(job) == "FAILED"
    assert slurm_cluster.job(job)["ExitCode"] == "1:0"


def test_a_job_that_sigkills_itself_fails(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("#!/bin/sh\nkill -9 $$\n", directory=tmp_path)
    assert slurm_cluster.wait_state(job) == "FAILED"
    assert slurm_cluster.job(job)["ExitCode"] == "0:9"

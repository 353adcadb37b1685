"""GPUs and threads of local jobs: ``--gpus``, ``--gpus-per-job``, ``--threads-per-job``.

There is no GPU here: the tests give explicit device lists, or put a fake ``nvidia-smi``
(a real executable script) first on PATH for ``--gpus all``. Every job records the
``CUDA_VISIBLE_DEVICES`` it saw and when it ran, so the tests can check that jobs running
at the same time never shared a device.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import experiment_module, sqlite_only

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

engine_name = pytest.fixture(sqlite_only, name="engine_name")

MODULE = "jm_gpu_exp"

EXPERIMENTS = textwrap.dedent("""
    import os
    import time

    from jobman.dispatch.machine import THREAD_VARIABLES


    def on_gpu(state, channel):
        state.started = time.time()
        time.sleep(state.get("seconds", 0.3))
        state.ended = time.time()
        state.cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
        state.threads = {name: os.environ.get(name) for name in THREAD_VARIABLES}


    def sigkill(state, channel):
        os.kill(os.getpid(), 9)
""")

FAKE_SMI = textwrap.dedent("""\
    #!/bin/sh
    [ "$1" = "-L" ] || exit 9
    echo "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-11111111-2222-3333-4444-555555555555)"
    echo "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-66666666-7777-8888-9999-000000000000)"
""")


@pytest.fixture
def exp(tmp_path: Path):
    pythonpath = experiment_module(tmp_path, MODULE, EXPERIMENTS)
    bare = tmp_path / "bin"  # a PATH without nvidia-smi
    bare.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES" and not k.endswith("_THREADS")}
    env.update(
        {
            "PYTHONPATH": pythonpath,
            "JOBMAN_GPU_LOCKS": str(tmp_path / "locks"),
            "PATH": f"{bare}{os.pathsep}{os.path.dirname(sys.executable)}",
        }
    )
    return type("Exp", (), {"env": env, "runs": tmp_path / "runs", "bin": bare})


def schedule(store: Store, *jobs: tuple[str, dict]) -> list[int]:
    specs = [
        JobSpec(phase=0, kind="fn", target=f"{MODULE}:{name}", params=params, parent=None) for name, params in jobs
    ]
    return store.schedule(specs, max_attempts=1).job_ids


def run(jobman, exp, *args: str):
    return jobman(*args, "--exproot", str(exp.runs), "--heartbeat", "0.2", "--grace", "2", env=exp.env, timeout=180)


def assert_no_device_shared(jobs) -> None:
    """Jobs whose runs overlapped in time held disjoint devices."""
    for a in jobs:
        for b in jobs:
            if a.id < b.id and a.results["started"] < b.results["ended"] and b.results["started"] < a.results["ended"]:
                shared = set(a.results["cuda"].split(",")) & set(b.results["cuda"].split(","))
                assert not shared, f"jobs {a.id} and {b.id} ran at once on GPU {shared}"


def test_each_job_sees_its_own_gpu_recorded_on_the_job(jobman, db_url, store, exp):
    ids = schedule(store, *[("on_gpu", {"i": i}) for i in range(8)])
    r = run(jobman, exp, "dispatch", db_url, "--gpus", "0,1,2,3", "--no-progress")
    assert r.code == 0, r.err
    jobs = [store.job(i) for i in ids]
    assert all(j.status is Status.DONE for j in jobs)
    for j in jobs:
        assert j.results["cuda"] in {"0", "1", "2", "3"}  # exactly one device, never more than asked
        assert j.gpus == j.results["cuda"]  # recorded on the job
        assert f"on GPU {j.gpus}" in [e.why for e in store.events(j.id)]
    assert_no_device_shared(jobs)
    assert len({j.results["cuda"] for j in jobs}) > 1  # four workers: the devices were spread

    listing = jobman("list", db_url)
    assert listing.code == 0 and "gpu" in listing.out.splitlines()[0]
    shown = jobman("show", db_url, str(ids[0]))
    assert f"GPU {jobs[0].gpus}" in shown.out and f"on GPU {jobs[0].gpus}" in shown.out
    as_json = json.loads(jobman("show", db_url, str(ids[0]), "--format", "json").out)
    assert as_json["gpus"] == jobs[0].gpus


def test_gpus_all_takes_what_nvidia_smi_lists_two_per_job(jobman, db_url, store, exp):
    smi = exp.bin / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    ids = schedule(store, *[("on_gpu", {"i": i, "seconds": 0.1}) for i in range(3)])
    r = run(jobman, exp, "dispatch", db_url, "--gpus", "all", "--gpus-per-job", "2", "--no-progress")
    assert r.code == 0, r.err
    assert [store.job(i).results["cuda"] for i in ids] == ["0,1"] * 3


def test_cuda_visible_devices_is_what_all_means_when_set(jobman, db_url, store, exp):
    [job_id] = schedule(store, ("on_gpu", {"seconds": 0}))
    exp.env["CUDA_VISIBLE_DEVICES"] = "5,6"
    r = run(jobman, exp, "worker", db_url, "--gpus", "all", "--gpus-per-job", "2")
    assert r.code == 0, r.err
    assert store.job(job_id).results["cuda"] == "5,6"


def test_gpus_on_a_machine_without_any_is_one_sentence_and_writes_nothing(jobman, exp, tmp_path):
    db = tmp_path / "none.db"
    r = run(jobman, exp, "dispatch", f"sqlite:///{db}?table=x", "--gpus", "all")
    assert r.code == 2 and "Traceback" not in r.err
    assert "this machine has no GPU" in r.err
    assert not db.exists()
    bad = run(jobman, exp, "dispatch", f"sqlite:///{db}?table=x", "--gpus", "0,1", "--gpus-per-job", "3")
    assert bad.code == 2 and "more than the 2 GPU(s)" in bad.err and not db.exists()


def test_a_job_asks_for_more_gpus_in_its_resources(jobman, db_url, store, exp):
    two, one, too_many = schedule(
        store,
        ("on_gpu", {"resources": {"gpus": 2}, "seconds": 0}),
        ("on_gpu", {"seconds": 0}),
        ("on_gpu", {"resources": "--gres=gpu:4"}),
    )
    r = run(jobman, exp, "worker", db_url, "--gpus", "0,1,2")
    assert r.code == 0, r.err
    assert len(store.job(two).results["cuda"].split(",")) == 2
    assert len(store.job(one).results["cuda"].split(",")) == 1
    job = store.job(too_many)
    assert job.status is Status.FAILED and "asks for 4 GPU(s); this worker has 3" in job.error


def test_a_crashed_jobs_gpu_goes_back_to_the_pool(jobman, db_url, store, exp):
    crashed, after = schedule(store, ("sigkill", {}), ("on_gpu", {"seconds": 0}))
    r = run(jobman, exp, "worker", db_url, "--gpus", "7")
    assert r.code == 0, r.err
    assert store.job(crashed).status is Status.CRASHED and store.job(crashed).gpus == "7"
    assert store.job(after).status is Status.DONE and store.job(after).results["cuda"] == "7"


def test_threads_per_job_reach_the_job(jobman, db_url, store, exp):
    first, second = schedule(store, ("on_gpu", {"seconds": 0}), ("on_gpu", {"seconds": 0, "i": 1}))
    r = run(jobman, exp, "worker", db_url, "--threads-per-job", "3", "--max-jobs", "1")
    assert r.code == 0, r.err
    assert set(store.job(first).results["threads"].values()) == {"3"}
    r = run(jobman, exp, "worker", db_url)
    assert r.code == 0, r.err
    threads = store.job(second).results["threads"]
    assert threads["OMP_NUM_THREADS"] == threads["OPENBLAS_NUM_THREADS"] == threads["MKL_NUM_THREADS"] == "1"

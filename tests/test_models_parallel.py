"""Variables (local and in the parameter server) and the MLP trained data-parallel across a gang's ranks
(``ps=1 --ranks N``), with real MPI processes started by the mpich wheel's mpiexec and a rank really
SIGKILLed: the variables' pulls, pushes, updates, saves and loads; the 2-rank MLP DONE as accurate as one
process; a killed rank's job CRASHED, relaunched from rank 0's checkpoint and ending bit for bit where an
uninterrupted one ends; and the sentences ``ps=1`` gets where it cannot run."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import experiment_module, need_service, signal_once_started
from test_ps import mpiexec, run

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.models.checkpoint import load_npz
from jobman.models.optim import make_optimizer
from jobman.models.variables import LocalVariable

PROGRAM = Path(__file__).parent / "ps_programs" / "variables.py"
sys.path.insert(0, str(PROGRAM.parent))
from variables import SHAPES, STEPS, gradient, initial  # noqa: E402 - the program's own definitions

MODULE = "jm_parallel_exp"
EXPERIMENTS = textwrap.dedent('''
    """The bundled MLP, its rank ``victim`` SIGKILLed once a checkpoint is written, in the first attempt only."""
    import os
    import signal

    from jobman.models import mlp
    from jobman.models.plugins import Plugin, always


    def train(state, channel):
        def killer(loop):
            checkpoint = channel.workdir / "checkpoint.npz"
            victim = int(state.get("victim", -1))
            if channel.attempt == 1 and channel.rank == victim and loop.clock.epochs >= 2 and checkpoint.exists():
                os.kill(os.getpid(), signal.SIGKILL)

        return mlp.train(state, channel, plugins=[Plugin(always(), "iterations", killer, "killer")])


    def late(state, channel):
        """jobman.ps used and left; rank 0 goes on alone long after the others have returned."""
        import time

        import numpy as np

        ps = channel.parameter_server()
        table = ps.ArrayTableHandler(3)
        table.add(np.ones(3))
        ps.barrier()
        total = table.get().tolist()
        ps.shutdown()
        if channel.rank == 0:
            time.sleep(3)
        state.total = total
''')
DIGITS = ("dataset=digits", "nhid=64", "epochs=8", "checkpoint_every=0.3", "progress_every=0")


def local_run(optimizer: str, ranks: int) -> tuple[LocalVariable, list[list[float]]]:
    """What the program's ranks must see, from one local variable given every rank's gradient."""
    updater = make_optimizer(optimizer, {}, lr=0.1, momentum=0.9, weight_decay=0.01)
    var = LocalVariable(SHAPES, type(updater).slot_names)
    var.init(initial())
    pulled = []
    for step in range(STEPS):
        for rank in range(ranks):
            var.push(gradient(rank, step))
        updater.begin_step()
        var.update(updater)
        pulled.append(var.pull().tolist())
    return var, pulled


def listed(arrays: dict[str, np.ndarray]) -> dict[str, list]:
    return {k: np.asarray(v).tolist() for k, v in arrays.items()}


@pytest.mark.parametrize(
    ("optimizer", "ranks"), [("momentum", 2), ("adam", 2), pytest.param("adam", 3, marks=pytest.mark.slow)]
)
def test_a_variable_in_the_parameter_server_is_a_local_one_given_every_ranks_gradients(tmp_path, optimizer, ranks):
    argv = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", str(PROGRAM), str(tmp_path), optimizer]
    done = run(argv)
    assert done.returncode == 0, done.stderr
    local, pulled = local_run(optimizer, ranks)
    slots = {"momentum": ["v"], "adam": ["m", "v"]}[optimizer]
    for rank in range(ranks):
        seen = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert seen["rank"] == rank and seen["size"] == ranks
        assert seen["initial"] == np.concatenate([a.ravel() for a in initial().values()]).tolist()
        assert seen["pulled"] == pulled  # bit for bit: the gradients added in rank order, as here
        assert seen["pulled"][0] != seen["initial"] and seen["pulled"][-1] != seen["pulled"][-2]
        assert seen["with_slots"] == listed(local.save(slots=True))
        assert sorted(seen["with_slots"]) == sorted(["W", "b"] + [f"{k}/{s}" for k in ("W", "b") for s in slots])
        assert seen["without_slots"] == listed(local.save(slots=False))
        zeros = {k: np.zeros_like(np.asarray(v)).tolist() for k, v in seen["with_slots"].items() if "/" in k}
        assert seen["loaded_without"] == {**seen["without_slots"], **zeros}
        assert seen["loaded_with"] == seen["with_slots"]
        assert seen["tally"] == [sum(r + 0.5 for r in range(ranks)), float(ranks)]


def test_a_local_variable_saves_with_or_without_slots_and_loads_either():
    updater = make_optimizer("momentum", {}, lr=0.5, momentum=0.9)
    var = LocalVariable({"w": (2,)}, ("v",))
    var.init({"w": np.array([1.0, 2.0])})
    var.push(np.array([1.0, 0.0], np.float32))
    var.push(np.array([1.0, 1.0], np.float32))  # pushes add up
    updater.begin_step()
    var.update(updater)
    assert var.pull().tolist() == [0.0, 1.5]  # v = -0.5 * g; w += v
    assert listed(var.save()) == {"w": [0.0, 1.5], "w/v": [-1.0, -0.5]}
    assert listed(var.save(slots=False)) == {"w": [0.0, 1.5]}
    var.load({"w": np.array([3.0, 3.0])})
    assert listed(var.save()) == {"w": [3.0, 3.0], "w/v": [0.0, 0.0]}
    with pytest.raises(ValueError, match="has no 'w'"):
        var.load({})


@pytest.fixture
def exp(tmp_path: Path) -> dict[str, str]:
    from jobman.dispatch.gang import mpiexec_path

    if mpiexec_path() is None or importlib.util.find_spec("mpi4py") is None:
        need_service("mpiexec and mpi4py are not installed (pip install -e '.[ps]')")
    path = experiment_module(tmp_path, MODULE, EXPERIMENTS)
    return {**os.environ, "PYTHONPATH": path, "JOBMAN_GANG_LAUNCH": "mpiexec"}


def schedule(jobman, url: str, exp: dict, target: str, *args: str) -> None:
    r = jobman("sqlschedule", url, target, *args, env=exp)
    assert r.code == 0, r.out + r.err


def work(jobman, url: str, exp: dict, tmp_path: Path, *args: str, timeout: float = 600) -> None:
    r = jobman("worker", url, "--exproot", str(tmp_path / "runs"), *args, env=exp, timeout=timeout)
    assert r.code == 0, r.out + r.err


def by_params(store: Store) -> dict[tuple, object]:
    return {tuple(sorted((k, v) for k, v in job.params.items() if k in ("ps", "victim"))): job for job in store.jobs()}


@pytest.mark.slow
def test_the_mlp_on_two_ranks_is_done_and_as_accurate_as_one_process(jobman, exp, tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=mlp"
    schedule(jobman, url, exp, "jobman.models.mlp:train", *DIGITS, "ps=1", "--ranks", "2")
    schedule(jobman, url, exp, "jobman.models.mlp:train", *DIGITS)
    work(jobman, url, exp, tmp_path)
    store = Store.open(url)
    try:
        jobs = by_params(store)
        gang, alone = jobs[(("ps", 1),)], jobs[()]
        assert gang.status is Status.DONE and alone.status is Status.DONE, (gang.error, alone.error)
        assert gang.ranks == 2 and alone.ranks == 1
        assert gang.results["test_error"] < 0.15 and alone.results["test_error"] < 0.15  # chance is 0.9
        assert abs(gang.results["test_error"] - alone.results["test_error"]) <= 0.02
        assert abs(gang.results["valid_error"] - alone.results["valid_error"]) <= 0.02
        assert {name for _job, _step, name, _value in store.metrics([gang.id])} >= {"train_loss", "valid_loss"}
        assert (Path(gang.workdir) / "weights.npz").exists()
    finally:
        store.dispose()


@pytest.mark.slow
def test_a_rank_killed_mid_training_resumes_from_the_checkpoint_to_the_same_weights(jobman, exp, tmp_path):
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=mlp"
    # checkpoints often enough that one exists by epoch 2 on a quiet machine too (not part of a job's identity)
    often = [p for p in DIGITS if not p.startswith("checkpoint_every=")] + ["checkpoint_every=0.02"]
    schedule(jobman, url, exp, f"{MODULE}:train", *often, "ps=1", "victim=-1", "--ranks", "2")  # never killed
    work(jobman, url, exp, tmp_path)
    schedule(jobman, url, exp, f"{MODULE}:train", *often, "ps=1", "victim=1", "--ranks", "2")
    work(jobman, url, exp, tmp_path, "--max-jobs", "1")
    store = Store.open(url)
    try:
        jobs = by_params(store)
        killed, straight = jobs[(("ps", 1), ("victim", 1))], jobs[(("ps", 1), ("victim", -1))]
        assert straight.status is Status.DONE, straight.error
        assert killed.status is Status.QUEUED and killed.attempt == 1  # CRASHED, then relaunched
        crash = [e for e in store.events(killed.id) if e.to_status == "CRASHED"]
        assert len(crash) == 1 and "rank 1 of 2 was killed by SIGKILL" in crash[0].why
        assert (Path(killed.workdir) / "checkpoint.npz").exists()

        work(jobman, url, exp, tmp_path)
        killed = store.job(killed.id)
        assert killed.status is Status.DONE and killed.attempt == 2, killed.error
        resumed, never = (
            load_npz(Path(killed.workdir) / "weights.npz"),
            load_npz(Path(straight.workdir) / "weights.npz"),
        )
        assert sorted(resumed) == sorted(never)
        assert all(np.array_equal(resumed[k], never[k]) for k in never)  # bit for bit
        same = ("train_error", "valid_error", "test_error", "best_epoch")
        assert {k: killed.results[k] for k in same} == {k: straight.results[k] for k in same}
    finally:
        store.dispose()


@pytest.mark.slow
def test_a_stopped_worker_puts_the_data_parallel_job_back_to_resume(jobman, exp, tmp_path):
    """A stopped worker's 2-rank MLP is put back to resume from rank 0's checkpoint, not crashed."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=stop"
    long = [p for p in DIGITS if not p.startswith("epochs=")] + ["epochs=200", "patience=1000", "lr_patience=0"]
    schedule(jobman, url, exp, "jobman.models.mlp:train", *long, "ps=1", "--ranks", "2")
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "jobman.cli.main", "worker", url, "--exproot", str(runs)]
    code, err = signal_once_started(argv, exp, runs / "stop" / "1" / "checkpoint.npz")
    assert code == 0, err
    store = Store.open(url)
    try:
        [job] = store.jobs()
        assert job.status is Status.QUEUED and job.attempt == 1, job.error  # put back to resume, not crashed
        assert 0 < job.results["epochs"] < 200
    finally:
        store.dispose()


def test_a_rank_that_returns_early_leaves_rank_0_to_finish_and_report(jobman, exp, tmp_path):
    """MPICH's launcher ends every rank once one exits without MPI_Finalize: rank 0 would die unreported."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=late"
    schedule(jobman, url, exp, f"{MODULE}:late", "--ranks", "2")
    work(jobman, url, exp, tmp_path, timeout=120)
    store = Store.open(url)
    try:
        [job] = store.jobs()
        assert job.status is Status.DONE, job.error
        assert job.results == {"total": [2.0, 2.0, 2.0]}
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("launch", "ranks", "sentence"),
    [
        ("mpiexec", "1", "ps=1 trains across the ranks of one job: schedule it with --ranks 2 or more"),
        ("fork", "2", "start the gang through mpiexec (JOBMAN_GANG_LAUNCH=mpiexec for the worker or dispatch)"),
    ],
    ids=["one-rank", "forked-ranks"],
)
def test_ps_where_it_cannot_run_fails_the_job_in_one_sentence(jobman, exp, tmp_path, launch, ranks, sentence):
    url = f"sqlite:///{tmp_path / 'jobs.db'}?table=mlp"
    env = {**exp, "JOBMAN_GANG_LAUNCH": launch}
    schedule(jobman, url, env, "jobman.models.mlp:train", *DIGITS, "ps=1", "--ranks", ranks)
    work(jobman, url, env, tmp_path)
    store = Store.open(url)
    try:
        [job] = store.jobs()
        assert job.status is Status.FAILED
        assert sentence in job.error
        assert not (Path(job.workdir) / "checkpoint.npz").exists()
    finally:
        store.dispose()

"""Calls that take calls: a future as a parameter is a dependency, identities compose, the cache
follows the graph. Real databases (SQLite and PostgreSQL), real local workers, real artifact store.

The steps live in a module written under ``tmp_path`` (importable by the workers through
PYTHONPATH); each leaves a line in a side file when it runs, so a call answered from the cache
leaves none.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
from conftest import experiment_module, run_jobman

import jobman
from jobman.dispatch.futures import _UNREAD
from jobman.jobdb.callrefs import CALL
from jobman.jobdb.errors import JobNotRun, UsageError
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store

STEPS = """
import os, time
import numpy as np

SIDE = {side!r}


def _ran(step, **params):
    with open(SIDE, "a") as fh:
        fh.write(f"{{step}} {{sorted(params.items())}} {{os.getpid()}}\\n")


def load(name, n=200):
    _ran("load", name=name)
    rng = np.random.default_rng(0)
    return {{"X": rng.normal(size=(n, 8)), "name_seen": name}}


def pca(data, k):
    _ran("pca", k=k)
    X = data["X"] - data["X"].mean(0)
    _u, _s, vt = np.linalg.svd(X, full_matrices=False)
    return {{"X": X @ vt[:k].T, "got": type(data["X"]).__name__}}


def train(features, lr):
    _ran("train", lr=lr)
    return {{"w": float(np.abs(features["X"]).sum() * lr), "width": int(features["X"].shape[1])}}


def evaluate(features, model):
    _ran("evaluate", w=model["w"])
    return {{"score": model["w"] + features["X"].shape[1]}}


def boom(x):
    _ran("boom", x=x)
    raise ValueError("no data here")


def total(parts):
    _ran("total", n=len(parts))
    return {{"sum": sum(p["v"] for p in parts)}}


def part(i):
    _ran("part", i=i)
    return {{"v": i}}


def nap(tag, seconds):
    t0 = time.time()
    time.sleep(seconds)
    return {{"start": t0, "end": time.time(), "tag": tag}}


def flaky(x):
    _ran("flaky", x=x)
    if not os.path.exists(SIDE + ".fixed"):
        raise ValueError("not yet")
    return {{"v": x}}


def lock(x):
    import threading
    _ran("lock", x=x)
    return {{"lock": threading.Lock()}}
"""


@pytest.fixture
def steps(tmp_path, monkeypatch):
    """The steps module, imported here and found by the workers."""
    name = f"graphsteps_{uuid.uuid4().hex[:8]}"
    side = tmp_path / "side.txt"
    path = experiment_module(tmp_path, name, textwrap.dedent(STEPS.format(side=str(side))))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    module = importlib.import_module(name)
    module.side = side
    yield module
    sys.modules.pop(name, None)


def ran(steps) -> list[str]:
    """The step names run so far, in the order their lines were written."""
    side: Path = steps.side
    return [line.split()[0] for line in side.read_text().splitlines()] if side.exists() else []


def experiment(db_url: str, tmp_path: Path, backend: str = "local") -> jobman.Experiment:
    return jobman.Experiment(db_url, backend=backend, workers=2, exproot=tmp_path / "runs", poll_interval=0.1)


def the_graph(exp, steps, k: int = 4, lrs=(0.1, 0.01)):
    """The issue's example: load, then PCA of it, then a model per learning rate, each evaluated."""
    data = exp.call(steps.load, name="fashion")
    feats = exp.call(steps.pca, data=data, k=k)
    models = {lr: exp.call(steps.train, features=feats, lr=lr) for lr in lrs}
    scores = {lr: exp.call(steps.evaluate, features=feats, model=m) for lr, m in models.items()}
    return data, feats, models, scores


def test_the_first_run_runs_each_call_once_and_the_same_run_again_runs_nothing(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        data, feats, models, scores = the_graph(exp, steps)
        got = {lr: f.result(timeout=120)["score"] for lr, f in scores.items()}
        first = feats.result()
    assert sorted(ran(steps)) == ["evaluate", "evaluate", "load", "pca", "train", "train"]
    assert ran(steps)[:2] == ["load", "pca"]  # each waited for the call it takes
    assert isinstance(first["X"], np.ndarray) and first["X"].shape == (200, 4)
    assert first["got"] == "ndarray"  # pca received load's array, not a reference
    assert got == {lr: models[lr].result()["w"] + 4 for lr in (0.1, 0.01)}
    store = Store.open(db_url)
    try:
        jobs = {j.id: j for j in store.jobs()}
        assert [j.status for j in jobs.values()] == [Status.DONE] * 6
        assert jobs[feats.job_id].depends_on == [data.job_id]
        assert jobs[scores[0.1].job_id].depends_on == sorted([feats.job_id, models[0.1].job_id])
        # Stored as a reference to the call's identity, never as its job id.
        assert jobs[feats.job_id].params == {"data": {CALL: jobs[data.job_id].identity}, "k": 4}
    finally:
        store.dispose()

    with experiment(db_url, tmp_path) as again:  # the same script again: everything read back
        data2, feats2, _models2, scores2 = the_graph(again, steps)
        assert {lr: f.result(timeout=60)["score"] for lr, f in scores2.items()} == got
        assert np.array_equal(feats2.result()["X"], first["X"])
        assert (data2.job_id, feats2.job_id) == (data.job_id, feats.job_id)
    assert len(ran(steps)) == 6
    store = Store.open(db_url)
    try:
        assert len(store.jobs()) == 6
    finally:
        store.dispose()


def test_a_changed_downstream_parameter_reruns_only_downstream(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        _d, _f, _m, scores = the_graph(exp, steps, lrs=(0.1,))
        scores[0.1].result(timeout=120)
        before = len(ran(steps))
        _d, _f, _m, scores = the_graph(exp, steps, lrs=(0.5,))
        scores[0.5].result(timeout=120)
    assert ran(steps)[before:] == ["train", "evaluate"]


def test_a_changed_upstream_parameter_reruns_it_and_its_dependents(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        _d, _f, _m, scores = the_graph(exp, steps, k=4)
        [f.result(timeout=120) for f in scores.values()]
        before = len(ran(steps))
        _d, feats, models, scores = the_graph(exp, steps, k=3)
        [f.result(timeout=120) for f in scores.values()]
        assert {m.result()["width"] for m in models.values()} == {3}
    assert sorted(ran(steps)[before:]) == ["evaluate", "evaluate", "pca", "train", "train"]  # not load


def test_a_failed_upstream_blocks_its_dependents_whose_futures_name_it(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        bad = exp.call(steps.boom, x=1)
        child = exp.call(steps.train, features=bad, lr=0.1)
        grandchild = exp.call(steps.evaluate, features=bad, model=child)
        with pytest.raises(JobNotRun) as info:
            grandchild.result(timeout=120)
        with pytest.raises(JobNotRun) as child_info:
            child.result(timeout=60)
    said = str(info.value)
    assert f"job {bad.job_id}" in said and "boom" in said and "FAILED" in said and "no data here" in said
    assert f"job {bad.job_id}" in str(child_info.value)
    assert ran(steps) == ["boom"]
    store = Store.open(db_url)
    try:
        assert [j.status for j in store.jobs(ids=[child.job_id, grandchild.job_id])] == [Status.BLOCKED] * 2
    finally:
        store.dispose()


def test_retrying_a_failed_upstream_call_runs_the_calls_it_blocked(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        up = exp.call(steps.flaky, x=3)
        down = exp.call(steps.total, parts=[up])
        with pytest.raises(JobNotRun, match="not yet"):
            down.result(timeout=120)
        Path(str(steps.side) + ".fixed").touch()
        again = exp.call(steps.total, parts=[exp.call(steps.flaky, x=3, retry=True)])
        assert again.job_id == down.job_id
        assert again.result(timeout=120) == {"sum": 3}
    assert ran(steps) == ["flaky", "flaky", "total"]


def test_an_array_passed_between_calls_is_written_once_and_read_by_the_call_that_takes_it(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        data = exp.call(steps.load, name="big", n=5000)
        feats = exp.call(steps.pca, data=data, k=2)
        assert feats.result(timeout=120)["got"] == "ndarray"
        assert data.done() and data._value is _UNREAD  # passed on, never read here
        stored = sorted(p for p in exp.artifacts.digests())
        # load's array and pca's array: each once in the store; the caller read neither to pass it on.
        assert len(stored) == 2
        assert np.array_equal(data.result()["X"], np.random.default_rng(0).normal(size=(5000, 8)))


def test_futures_inside_lists_and_dicts_fan_in(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        parts = exp.map(steps.part, [{"i": i} for i in range(5)])
        whole = exp.call(steps.total, parts=parts)
        nested = exp.call(steps.total, parts=[parts[0], {"v": 10}])
        assert whole.result(timeout=120) == {"sum": 10}
        assert nested.result(timeout=60) == {"sum": 10}
    store = Store.open(db_url)
    try:
        assert store.jobs(ids=[whole.job_id])[0].depends_on == sorted(f.job_id for f in parts)
    finally:
        store.dispose()


def test_pipeline_gives_each_step_the_previous_steps_future_and_nested_calls_are_the_same_graph(
    db_url, tmp_path, steps
):
    with experiment(db_url, tmp_path) as exp:
        last = exp.pipeline([(steps.load, {"name": "p"}), (steps.pca, {"k": 2}), (steps.train, {"lr": 0.1})])
        w = last.result(timeout=120)["w"]
        nested = exp.call(steps.train, features=exp.call(steps.pca, data=exp.call(steps.load, name="p"), k=2), lr=0.1)
        assert nested.job_id == last.job_id and nested.result()["w"] == w
        from_future = jobman.pipeline([exp.call(steps.load, name="p"), (steps.pca, {"k": 2})], experiment=exp)
        assert from_future.result(timeout=60)["X"].shape == (200, 2)
        with pytest.raises(UsageError, match="step 2 of the pipeline is given 'data'"):
            exp.pipeline([steps.load, (steps.pca, {"data": 1, "k": 2})])
        with pytest.raises(UsageError, match="non-empty list"):
            exp.pipeline([])
    assert sorted(ran(steps)) == ["load", "pca", "train"]


def test_reset_of_an_upstream_call_cascades_to_its_dependents(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        _data, feats, models, scores = the_graph(exp, steps, lrs=(0.1,))
        scores[0.1].result(timeout=120)
    out = run_jobman("reset", str(feats.job_id), "--db", db_url, "--yes")
    assert out.code == 0, out.err
    store = Store.open(db_url)
    try:
        statuses = {j.id: j.status for j in store.jobs()}
        assert statuses[feats.job_id] is Status.QUEUED
        assert statuses[models[0.1].job_id] is Status.WAITING
        assert statuses[scores[0.1].job_id] is Status.WAITING
    finally:
        store.dispose()
    before = len(ran(steps))
    with experiment(db_url, tmp_path) as exp:  # the same script again runs what was reset, nothing else
        _d, _f, _m, scores = the_graph(exp, steps, lrs=(0.1,))
        scores[0.1].result(timeout=120)
    assert ran(steps)[before:] == ["pca", "train", "evaluate"]


def test_independent_branches_run_in_parallel_on_two_workers(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        root = exp.call(steps.part, i=1)
        branches = [exp.call(steps.nap, tag={"after": root, "n": n}, seconds=2.0) for n in range(2)]
        a, b = (f.result(timeout=120) for f in branches)
    assert a["start"] < b["end"] and b["start"] < a["end"], (a, b)  # their runs overlap


def test_list_and_show_name_the_calls_a_job_takes_and_the_calls_that_take_it(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path) as exp:
        data, feats, models, _scores = the_graph(exp, steps, lrs=(0.1,))
        models[0.1].result(timeout=120)
    listed = run_jobman("list", "--db", db_url)
    assert listed.code == 0, listed.err
    assert f"data=<job {data.job_id}>" in listed.out and CALL not in listed.out
    shown = run_jobman("show", str(feats.job_id), "--db", db_url)
    assert shown.code == 0, shown.err
    assert f"takes     data = job {data.job_id} (" in shown.out
    assert f"taken by  job {models[0.1].job_id} (" in shown.out


def test_bad_inputs_are_refused_in_one_sentence_and_nothing_is_written(db_url, tmp_path, steps):
    other_url = db_url.replace("?table=", "?table=other")
    with experiment(db_url, tmp_path) as exp, experiment(other_url, tmp_path) as other:
        theirs = other.call(steps.part, i=1)
        theirs.result(timeout=120)
        with pytest.raises(UsageError) as info:
            exp.call(steps.train, features=theirs, lr=0.1)
        assert "is a future of experiment" in str(info.value) and "own experiment" in str(info.value)
        with pytest.raises(UsageError, match="which jobman keeps for its references"):
            exp.call(steps.train, features={CALL: "0" * 64}, lr=0.1)
        with pytest.raises(UsageError, match="not a JSON value"):
            exp.call(steps.train, features=threading.Lock(), lr=0.1)
        with pytest.raises(jobman.errors.NoSuchExperiment):  # not even the experiment was made
            exp.results(as_frame=False)

        gone = exp.call(steps.part, i=2)
        gone.result(timeout=120)
        assert run_jobman("rm", str(gone.job_id), "--db", db_url, "--yes").code == 0
        with pytest.raises(UsageError, match=f"job {gone.job_id}, which is no longer in experiment"):
            exp.call(steps.total, parts=[gone])
        assert exp.results(as_frame=False) == []  # nothing written

        # A value that cannot be kept (a lock): the call that takes it fails, saying so, and runs nothing.
        locked = exp.call(steps.lock, x=1)
        taker = exp.call(steps.train, features=locked, lr=0.1)
        with pytest.raises(jobman.errors.JobFailed, match="could not be kept"):
            taker.result(timeout=120)
    assert "train" not in ran(steps)


def test_the_inline_backend_runs_the_graph_too(db_url, tmp_path, steps):
    with experiment(db_url, tmp_path, backend="inline") as exp:
        _d, feats, _m, scores = the_graph(exp, steps, lrs=(0.1,))
        assert scores[0.1].result()["score"] > 4
        assert feats.result()["got"] == "ndarray"
        bad = exp.call(steps.boom, x=2)
        with pytest.raises(JobNotRun, match=f"job {bad.job_id}"):
            exp.call(steps.train, features=bad, lr=1).result()


SCRIPT = """
import json, os, sys
import jobman

SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "side.txt")


def load(n):
    open(SIDE, "a").write("load\\n")
    return {"xs": list(range(n))}


def scale(data, by):
    open(SIDE, "a").write("scale\\n")
    return {"xs": [x * by for x in data["xs"]]}


def total(data):
    open(SIDE, "a").write("total\\n")
    return {"sum": sum(data["xs"])}


exp = jobman.Experiment(sys.argv[1], backend="local", workers=2, exproot="runs", poll_interval=0.1)
out = exp.pipeline([(load, {"n": 4}), (scale, {"by": 2}), total]).result(timeout=120)
exp.close()
print(json.dumps(out))
"""


def test_a_changed_function_reruns_it_and_its_dependents_only(db_url, tmp_path):
    """Functions of a script are run by value; editing one is a new call, and so are the calls that take it."""

    def run(source: str) -> dict:
        (tmp_path / "script.py").write_text(source)
        proc = subprocess.run(
            [sys.executable, "script.py", db_url],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ},
        )
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    side = tmp_path / "side.txt"
    assert run(SCRIPT) == {"sum": 12}
    assert run(SCRIPT) == {"sum": 12}  # the same script again runs nothing
    assert side.read_text().split() == ["load", "scale", "total"]
    assert run(SCRIPT.replace("x * by for", "x * by + 1 for")) == {"sum": 16}
    assert side.read_text().split() == ["load", "scale", "total", "scale", "total"]


SLURM_SCRIPT = """
import json, sys, time
import jobman


def root():
    return {"v": 1}


def nap(data, n):
    t0 = time.time()
    time.sleep(6.0)  # long enough for the second worker to start under a loaded Slurm
    return {"start": t0, "end": time.time(), "v": data["v"] + n}


def merge(parts):
    return {"sum": sum(p["v"] for p in parts), "spans": [[p["start"], p["end"]] for p in parts]}


exp = jobman.Experiment(sys.argv[1], backend="slurm", workers=2, exproot="runs")
r = exp.call(root)
out = exp.call(merge, parts=[exp.call(nap, data=r, n=n) for n in (1, 2)]).result(timeout=200)
exp.close()
print(json.dumps(out))
"""


def test_slurm_workers_run_the_graph_and_its_independent_branches_in_parallel(slurm_cluster, pg_database, tmp_path):
    name = f"graphslurm_{uuid.uuid4().hex[:8]}"
    url = f"{pg_database}?table={name}"
    (tmp_path / "script.py").write_text(SLURM_SCRIPT)
    try:
        proc = subprocess.run(
            [sys.executable, "script.py", url], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["sum"] == 5
        (a0, a1), (b0, b1) = out["spans"]
        assert a0 < b1 and b0 < a1, out["spans"]  # the two branches ran at once
        store = Store.open(url)
        try:
            jobs = store.jobs()
            assert [j.status for j in jobs] == [Status.DONE] * 4
            assert {j.backend for j in jobs} == {"slurm"}
        finally:
            store.dispose()
    finally:
        subprocess.run(["scancel", f"--name=jobman-{name}"], capture_output=True)

"""What a job records is what ran: parameters a target cannot take are refused, never dropped.

Real databases, real workers and the real ``jobman`` command; the targets are modules written
under ``tmp_path``, imported as a user's own would be.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import jobman
from jobman.jobdb.errors import NoSuchExperiment, UsageError
from jobman.jobdb.store import Store

KWMOD = '''
    import os

    def kw(lr, width=4, epochs=3):
        """Leaves a line per run: a job run with its defaults would show here."""
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran.txt"), "a") as fh:
            fh.write(f"{lr} {width} {epochs}\\n")
        return {"score": lr * width * epochs}

    def anything(lr, **rest):
        return {"rest": sorted(rest)}

    def classic(state, channel):
        state.seen = sorted(k for k in state if k != "jobman")
'''


@pytest.fixture
def kwmod(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "kwmod.py").write_text(textwrap.dedent(KWMOD))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


# -- 1. parameters checked ------------------------------------------------------------------------


def test_sqlschedule_refuses_a_parameter_the_target_cannot_take_and_writes_nothing(db_url, kwmod, jobman):
    out = jobman("sqlschedule", db_url, "kwmod:kw", "lr=0.1", "nosuch=3", cwd=kwmod)
    assert out.code != 0
    assert out.err.strip() == "jobman: nosuch: kw() takes lr, width, epochs", out.err
    out = jobman("sqlschedule", db_url, "kwmod:kw", "lr={{0.1,0.2}}", "--", "widht=64", cwd=kwmod)
    assert out.code != 0 and "widht: kw() takes lr, width, epochs; did you mean width?" in out.err, out.err
    assert "Traceback" not in out.err
    with pytest.raises(NoSuchExperiment):  # not even the experiment was made
        Store.open(db_url).jobs()
    # What the target can take is scheduled: its own names, anything for **kwargs or (state, channel).
    for target in ("kwmod:kw", "kwmod:anything", "kwmod:classic"):
        out = jobman("sqlschedule", db_url, target, "lr=0.1", *(["other=1"] if target != "kwmod:kw" else []), cwd=kwmod)
        assert out.code == 0, out.err


def test_a_parameter_met_at_run_time_fails_the_job_with_the_same_sentence_and_never_runs_defaults(
    db_url, kwmod, jobman
):
    out = jobman("sqlschedule", db_url, "kwmod:kw", "lr=0.1", "widht={{8,64}}", "--no-check", cwd=kwmod)
    assert out.code == 0, out.err
    out = jobman("sqlschedule", db_url, "kwmod:classic", "lr=0.1", "whatever=2", cwd=kwmod)
    assert out.code == 0, out.err
    out = jobman("worker", db_url, "--exproot", str(kwmod / "runs"), cwd=kwmod)
    jobs = {(j.target, j.params.get("widht")): j for j in Store.open(db_url).jobs()}
    for width in (8, 64):
        job = jobs[("kwmod:kw", width)]
        assert job.status == "FAILED"
        assert "widht: kw() takes lr, width, epochs; did you mean width?" in (job.error or "")
    assert ran(kwmod) == []  # kw never ran with its default width
    classic = jobs[("kwmod:classic", None)]
    assert classic.status == "DONE" and classic.results["seen"] == ["lr", "whatever"]


def test_call_and_map_refuse_a_parameter_the_function_cannot_take(db_url, kwmod):
    import kwmod as module

    exp = jobman.Experiment(db_url, backend="inline", exproot=kwmod / "runs")
    with pytest.raises(UsageError, match=r"^widht: kw\(\) takes lr, width, epochs; did you mean width\?$"):
        exp.call(module.kw, lr=0.1, widht=64)
    with pytest.raises(UsageError, match=r"^nosuch: kw\(\) takes lr, width, epochs$"):
        exp.map("kwmod:kw", [{"lr": 0.1}, {"lr": 0.2, "nosuch": 1}])
    with pytest.raises(UsageError, match="nosuch: kw"):
        exp.schedule("kwmod:kw lr={{0.1,0.2}} nosuch=1")
    with pytest.raises(NoSuchExperiment):
        exp.results(as_frame=False)
    assert ran(kwmod) == []

    def local(a, *, b=1):
        return {"sum": a + b}

    with pytest.raises(UsageError, match=r"^c: local\(\) takes a, b$"):
        exp.call(local, a=1, c=2)
    assert exp.call(local, a=1, b=2).result(timeout=60) == {"sum": 3}
    assert exp.call(module.kw, lr=0.5, width=2).result(timeout=60) == {"score": 3.0}
    assert exp.call(module.anything, lr=0.5, extra=2).result(timeout=60) == {"rest": ["extra"]}
    exp.close()


# -- 2. NaN and the infinities kept ---------------------------------------------------------------

DIVERGED = """
    import math

    def diverged(lr):
        return {"loss": math.inf, "acc": 0.1, "low": -math.inf, "grad": math.nan, "curve": [1.0, math.nan]}

    def logs(state, channel):
        channel.log(0, loss=1.5)
        channel.log(1, loss=math.nan, up=math.inf)
        state.done = True
"""


def test_a_job_returning_nan_and_infinities_is_done_with_every_value_kept(db_url, tmp_path, jobman):
    import math

    (tmp_path / "divmod.py").write_text(textwrap.dedent(DIVERGED))
    out = jobman("sqlschedule", db_url, "divmod:diverged", "lr=0.1", cwd=tmp_path)
    assert out.code == 0, out.err
    out = jobman("worker", db_url, "--exproot", str(tmp_path / "runs"), cwd=tmp_path)
    [job] = Store.open(db_url).jobs()
    assert job.status == "DONE", job.error
    results = job.results or {}
    assert results["loss"] == math.inf and results["low"] == -math.inf and results["acc"] == 0.1
    assert math.isnan(results["grad"]) and results["curve"][0] == 1.0 and math.isnan(results["curve"][1])
    shown = jobman("show", db_url, str(job.id), cwd=tmp_path)
    assert shown.code == 0, shown.err
    assert '"grad": NaN' in shown.out and '"loss": Infinity' in shown.out and "$float" not in shown.out
    listed = jobman("list", db_url, cwd=tmp_path)
    assert "loss=inf" in listed.out and "grad=nan" in listed.out, listed.out
    exported = jobman("show", db_url, str(job.id), "--format", "json", cwd=tmp_path)
    assert '"low": -Infinity' in exported.out and json.loads(exported.out)["results"]["loss"] == math.inf
    # From Python, the same floats come back.
    exp = jobman_api_experiment(db_url, tmp_path)
    [row] = exp.results(as_frame=False)
    assert row["results_loss"] == math.inf and math.isnan(row["results_grad"])
    exp.close()


CURVE = """
    import math

    def curve(state, channel):
        for step, loss in enumerate([1.5, 0.9, math.nan, math.inf, -math.inf]):
            channel.log(step, loss=loss, acc=0.1 * step)
        state.final = state.lr
"""


def test_channel_log_keeps_nan_and_infinities_and_the_plots_cope(db_url, tmp_path, jobman):
    import math

    (tmp_path / "curvemod.py").write_text(textwrap.dedent(CURVE))
    for lr in ("0.1", "0.2"):
        out = jobman("sqlschedule", db_url, "curvemod:curve", f"lr={lr}", cwd=tmp_path)
        assert out.code == 0, out.err
    out = jobman("worker", db_url, "--exproot", str(tmp_path / "runs"), cwd=tmp_path)
    store = Store.open(db_url)
    try:
        jobs = store.jobs()
        assert [j.status for j in jobs] == ["DONE", "DONE"], [j.error for j in jobs]
        points = [(step, value) for _, step, name, value in store.metrics([jobs[0].id]) if name == "loss"]
        assert [s for s, _ in points] == [0, 1, 2, 3, 4]  # no point dropped
        assert points[0][1] == 1.5 and math.isnan(points[2][1]) and points[3][1] == math.inf
        assert points[4][1] == -math.inf
        assert len(store.metrics([j.id for j in jobs])) == 2 * 10
        # The dashboard draws the finite points and names the others.
        from test_web import client

        page = client(db_url).get(f"/e/{store.experiment}/job/{jobs[0].id}").text
        assert f"not drawn: job {jobs[0].id} loss: nan at step 2, inf at step 3, -inf at step 4" in page, page
    finally:
        store.dispose()
    # The learning curves are drawn with the diverged points in the data.
    out = jobman(
        "report", db_url, "--metric", "final", "--plot", str(tmp_path / "plots"), "--curves", "2", cwd=tmp_path
    )
    assert out.code == 0 and "Traceback" not in out.err, out.err
    assert (tmp_path / "plots" / "final_learning_curves.png").exists(), sorted((tmp_path / "plots").iterdir())


def jobman_api_experiment(db_url: str, tmp_path: Path) -> jobman.Experiment:
    return jobman.Experiment(db_url, backend=None, exproot=tmp_path / "runs")


def test_a_resumed_job_gets_its_saved_nan_back_and_the_report_never_picks_it(store, db_url):
    import math

    from test_report import add_jobs, same_report

    add_jobs(
        store,
        [
            ({"lr": 0.1}, "DONE", {"valid_error": math.nan}),
            ({"lr": 0.2}, "DONE", {"valid_error": 0.3}),
            ({"lr": 0.3}, "DONE", {"valid_error": math.inf}),
            ({"lr": 0.4}, "DONE", {"valid_error": -math.inf}),
        ],
    )
    # A checkpoint holding NaN comes back as NaN to the attempt that resumes it.
    from jobman.jobdb.store import WorkerInfo
    from jobman.jobdb.sweep import JobSpec

    [resumed] = store.schedule([JobSpec(1, "fn", "m:f", {"lr": 0.5}, None)]).job_ids
    claimed = store.claim(WorkerInfo.here(), None)
    assert claimed is not None and claimed.job.id == resumed
    store.save(resumed, claimed.lease, {"epoch": 3, "loss": math.nan, "best": -math.inf})
    store.finish(
        resumed, claimed.lease, "INCOMPLETE", results={"epoch": 3, "loss": math.nan, "best": -math.inf}, relaunch=False
    )
    again = store.claim(WorkerInfo.here(), None)
    assert again is not None and again.job.id == resumed
    assert math.isnan(again.job.results["loss"]) and again.job.results["best"] == -math.inf
    rep = same_report(store, phase=0)
    assert rep.best is not None and rep.best.params == {"lr": 0.2}
    assert [r.params["lr"] for r in rep.rows][0] == 0.2
    assert all(not r.eligible for r in rep.rows if r.params["lr"] != 0.2)


# -- 3. one value that cannot be kept never takes the others with it -------------------------------

VALUES = """
    import numpy as np

    class Model:
        pass

    def mixed(lr):
        return {"model": Model(), "loss": 0.1, "weights": np.arange(3), "handle": open(__file__)}

    def array(lr):
        return np.zeros(3)

    def replaced(state, channel):
        state.lr = np.full(2, state.lr)  # a parameter replaced by an array: a result, not a crash
        state.model = Model()
        channel.save()
        state.acc = 0.5
"""


def test_a_value_that_cannot_be_kept_is_named_and_the_others_are_kept(db_url, tmp_path, jobman):
    (tmp_path / "valmod.py").write_text(textwrap.dedent(VALUES))
    for target in ("valmod:mixed", "valmod:array", "valmod:replaced"):
        out = jobman("sqlschedule", db_url, target, "lr=0.1", cwd=tmp_path)
        assert out.code == 0, out.err
    out = jobman("worker", db_url, "--exproot", str(tmp_path / "runs"), cwd=tmp_path)
    jobs = {j.target: j for j in Store.open(db_url).jobs()}
    mixed = jobs["valmod:mixed"]
    assert mixed.status == "DONE", mixed.error
    assert mixed.results is not None
    assert mixed.results["loss"] == 0.1
    # What JSON cannot hold is in the artifact store, referred to; only the open file is lost, and named.
    assert mixed.results["weights"]["kind"] == "npy" and mixed.results["model"]["kind"] == "pickle"
    assert mixed.results["model"]["type"] == "valmod.Model"
    assert mixed.results["_not_kept"] == {
        "handle": "TextIOWrapper cannot be pickled: cannot pickle '_io.TextIOWrapper' object",
    }
    array = jobs["valmod:array"]
    assert array.status == "FAILED"
    assert array.error == "the job returned a ndarray; expected None, a dict, COMPLETE or INCOMPLETE"
    replaced = jobs["valmod:replaced"]
    assert replaced.status == "DONE", replaced.error
    assert replaced.results is not None and replaced.results["acc"] == 0.5
    assert (replaced.results["lr"]["kind"], replaced.results["model"]["kind"]) == ("npy", "pickle")
    assert "_not_kept" not in replaced.results
    shown = jobman("show", db_url, str(mixed.id), "--format", "json", cwd=tmp_path)
    assert json.loads(shown.out)["results"]["_not_kept"]["handle"].startswith("TextIOWrapper cannot be pickled")


def test_from_python_a_value_that_cannot_be_kept_is_named_and_the_others_are_returned(db_url, tmp_path):
    import threading

    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")

    class Model:  # local to a function: pickled by value
        def __init__(self, width):
            self.width = width

    def train(lr):
        return {"model": Model(3), "lock": threading.Lock(), "loss": lr}

    got = exp.call(train, lr=0.25).result(timeout=60)
    assert isinstance(got.pop("model"), Model)
    assert got == {"loss": 0.25, "_not_kept": {"lock": "lock cannot be pickled: cannot pickle '_thread.lock' object"}}
    exp.close()


# -- 4. exp.results(): the job's columns apart from its parameters and results ---------------------


def test_results_keeps_job_columns_apart_from_parameters_and_results(db_url, tmp_path):
    import pandas

    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")

    def clash(status, id):
        return {"status": "diverged", "phase": "warmup", "seconds": -1, "score": status * 2}

    futures = exp.map(clash, [{"status": 1, "id": "a"}, {"status": 2, "id": "b"}])
    assert [f.result(timeout=60)["score"] for f in futures] == [2, 4]
    rows = exp.results(as_frame=False)
    assert [r["id"] for r in rows] == [f.job_id for f in futures]
    for row, status in zip(rows, (1, 2)):
        assert row["status"] == "DONE" and row["phase"] == 0 and row["attempt"] == 1
        assert row["host"] and row["started"] <= row["finished"]
        assert row["seconds"] == pytest.approx(row["finished"] - row["started"])
        assert row["params_status"] == status and row["results_status"] == "diverged"
        assert row["results_phase"] == "warmup" and row["results_seconds"] == -1
        assert row["results_score"] == 2 * status
    assert rows[0]["params_id"] == "a"
    frame = exp.results()
    assert isinstance(frame, pandas.DataFrame)
    assert list(frame.columns[:9]) == [
        "id",
        "status",
        "phase",
        "attempt",
        "host",
        "started",
        "finished",
        "seconds",
        "target",
    ]
    assert list(frame["status"]) == ["DONE", "DONE"] and list(frame["results_status"]) == ["diverged"] * 2
    exp.close()

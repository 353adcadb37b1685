"""cv:retrain, the fan-in job after a cross-validation sweep: select on the parents, retrain, test once."""

import itertools

import numpy as np
import pytest

from jobman.dispatch.channel import DD, DirectChannel, Parent
from jobman.dispatch.experiment import call
from jobman.models import cv

pytest.importorskip("jobman.jobdb.report")

BASE = {"dataset": "synthetic", "progress_every": 0, "nhid": 16, "epochs": 8, "batch_size": 16, "eval_every": 0}
GOOD, BAD = {"lr": 0.01}, {"lr": 1e-6}


def sweep(tmp_path, configs, folds, target="jobman.models.mlp:train", extra=None):
    """Run every configuration on every fold with run_direct; return them as the parents of a fan-in job."""
    from jobman.dispatch.runner import run_direct

    parents = []
    for job_id, (config, fold) in enumerate(itertools.product(configs, folds), start=1):
        params = {**BASE, **(extra or {}), **config, **fold}
        work = tmp_path / f"job{job_id}"
        out = run_direct(target, params, work)
        assert out.status == "DONE", out.error
        parents.append(Parent(job_id=job_id, phase=0, target=target, workdir=work, params=params, results=out.results))
    return parents


def retrain(tmp_path, parents, params=None, channel_cls=DirectChannel):
    params = params or {}
    channel = channel_cls(
        job_id=99, phase=1, attempt=1, workdir=tmp_path / "retrain-job", params=params, parents=parents
    )
    state = DD(params)
    return call(cv.retrain, state, channel), state


CV3 = [{"nb_cross_fold": 3, "id_cross_fold": k} for k in range(3)]


def test_retrain_picks_the_best_configuration_and_retrains_it(tmp_path):
    parents = sweep(tmp_path, [BAD, GOOD], CV3)
    out, _ = retrain(tmp_path, parents)
    assert out.status == "DONE", out.error
    r = out.results
    assert r["best_params"]["lr"] == GOOD["lr"]
    assert "id_cross_fold" not in r["best_params"]
    assert sorted(r["cv_job_ids"]) == [4, 5, 6] and r["cv_n"] == 3
    expected = np.mean([p.results["valid_error"] for p in parents[3:]])
    assert r["cv_mean"] == pytest.approx(expected)
    assert r["best_target"] == "jobman.models.mlp:train"
    # synthetic has no test set of its own: the CV estimate is reported instead of a second test
    assert "test_error" not in r or r["test_error"] is None
    assert r["cv_test_error"] == pytest.approx(np.mean([p.results["test_error"] for p in parents[3:]]))
    assert isinstance(r["train_error"], float) and isinstance(r["valid_error"], float)
    assert (tmp_path / "retrain-job" / "retrain" / "weights.npz").exists()


def test_retrain_with_a_test_set_tests_once(tmp_path):
    rng = np.random.default_rng(0)
    protos = rng.random((3, 10))
    y, yt = rng.integers(0, 3, 300), rng.integers(0, 3, 90)
    np.savez(
        tmp_path / "d.npz",
        X=protos[y] + rng.normal(0, 0.1, (300, 10)),
        y=y,
        X_test=protos[yt] + rng.normal(0, 0.1, (90, 10)),
        y_test=yt,
    )
    parents = sweep(tmp_path, [BAD, GOOD], CV3, extra={"dataset": str(tmp_path / "d.npz")})
    out, _ = retrain(tmp_path, parents, {"metric": "valid_error", "mode": "min"})
    assert out.status == "DONE", out.error
    assert out.results["best_params"]["lr"] == GOOD["lr"]
    assert isinstance(out.results["test_error"], float) and out.results["test_error"] < 0.2


def test_retrain_after_double_cross_validation(tmp_path):
    folds = [
        {"nb_outer_fold": 2, "id_outer_fold": o, "nb_cross_fold": 2, "id_cross_fold": i}
        for o in range(2)
        for i in range(2)
    ]
    parents = sweep(tmp_path, [BAD, GOOD], folds)
    out, _ = retrain(tmp_path, parents)
    assert out.status == "DONE", out.error
    outer = out.results["outer"]
    assert [o["id_outer_fold"] for o in outer] == [0, 1]
    for o in outer:
        assert o["best_params"]["lr"] == GOOD["lr"] and o["cv_n"] == 2
        chosen = [p for p in parents if p.job_id in o["cv_job_ids"]]
        assert all(p.params["id_outer_fold"] == o["id_outer_fold"] for p in chosen)
    assert out.results["test_error"] == pytest.approx(np.mean([o["test_error"] for o in outer]))

    one, _ = retrain(tmp_path / "one", parents, {"id_outer_fold": 1})
    assert [o["id_outer_fold"] for o in one.results["outer"]] == [1]
    assert one.results["test_error"] == pytest.approx(outer[1]["test_error"])


class StopInSecondOuterFold(DirectChannel):
    """Cancels the job as soon as the retrain of outer fold 1 logs anything."""

    def _log(self, step, metrics):
        super()._log(step, metrics)
        if any(k.startswith("outer1_") for k in metrics):
            self.request_stop("test")


def test_double_cv_retrain_resumes_after_a_stop(tmp_path):
    folds = [
        {"nb_outer_fold": 2, "id_outer_fold": o, "nb_cross_fold": 2, "id_cross_fold": i}
        for o in range(2)
        for i in range(2)
    ]
    parents = sweep(tmp_path, [GOOD], folds)
    straight, _ = retrain(tmp_path / "straight", parents)
    first, state = retrain(tmp_path, parents, channel_cls=StopInSecondOuterFold)
    assert first.status == "INCOMPLETE"
    assert [o["id_outer_fold"] for o in state["outer"]] == [0]
    channel = DirectChannel(job_id=99, phase=1, attempt=2, workdir=tmp_path / "retrain-job", params={}, parents=parents)
    second = call(cv.retrain, DD(channel.saved_results()), channel)
    assert second.status == "DONE"
    assert second.results["test_error"] == straight.results["test_error"]


def test_retrain_of_a_dbn_sweep_reruns_both_phases(tmp_path):
    extra = {"n_hidden": 16, "pretrain_epochs": 2}
    parents = sweep(
        tmp_path,
        [GOOD],
        [{"nb_cross_fold": 2, "id_cross_fold": k} for k in range(2)],
        target="jobman.models.dbn:train",
        extra=extra,
    )
    parents = [Parent(p.job_id, 1, "jobman.models.dbn:finetune", p.workdir, p.params, p.results) for p in parents]
    out, _ = retrain(tmp_path, parents)
    assert out.status == "DONE", out.error
    assert out.results["best_target"] == "jobman.models.dbn:finetune"
    assert (tmp_path / "retrain-job" / "retrain" / "pretrain-checkpoint.npz").exists()


def test_retrain_needs_parents_with_the_metric(tmp_path):
    out, _ = retrain(tmp_path, [])
    assert out.status == "FAILED" and "--after" in out.error
    parent = Parent(1, 0, "jobman.models.dbn:pretrain", tmp_path, {"seed": 0}, {"recon_error": 0.1})
    out, _ = retrain(tmp_path, [parent])
    assert out.status == "FAILED" and "valid_error" in out.error


def test_retrain_when_each_configuration_ran_once(tmp_path):
    """No folds: each configuration has one run, so its spread is unknown (None), not a crash."""
    parents = sweep(tmp_path, [BAD, GOOD], [{}])
    out, _ = retrain(tmp_path, parents)
    assert out.status == "DONE", out.error
    r = out.results
    assert r["best_params"]["lr"] == GOOD["lr"] and r["cv_n"] == 1
    assert r["cv_std"] is None and r["cv_mean"] == pytest.approx(parents[1].results["valid_error"])

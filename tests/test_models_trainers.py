"""The MLP trainer end to end through ``run_direct``: results, learning curves, determinism, resume."""

import json

import numpy as np
import pytest

from jobman.dispatch.channel import DD, DirectChannel
from jobman.dispatch.experiment import call
from jobman.dispatch.runner import run_direct
from jobman.models import mlp
from jobman.models.checkpoint import load_npz
from jobman.models.plugins import Plugin, at

SYN = {"dataset": "synthetic", "progress_every": 0, "nhid": 16, "epochs": 12, "batch_size": 16, "eval_every": 0}


def weights(workdir):
    return load_npz(workdir / "weights.npz")


def same_weights(a, b):
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_mlp_trains_and_reports_the_standard_results(tmp_path):
    out = run_direct("jobman.models.mlp:train", {**SYN, "epochs": 30}, tmp_path)
    assert out.status == "DONE", out.error
    r = out.results
    for key in ("train_error", "valid_error", "test_error", "seconds"):
        assert isinstance(r[key], float), key
    assert 0 <= r["test_error"] < 0.2  # the synthetic task is learnable...
    assert r["train_error"] < 0.5
    assert json.loads((tmp_path / "state.json").read_text())["test_error"] == r["test_error"]
    curve = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    valid = [c for c in curve if c["name"] == "valid_error"]
    assert [c["step"] for c in valid] == list(range(1, len(valid) + 1))
    assert {"train_loss", "valid_error"} <= {c["name"] for c in curve}


def test_validation_every_n_examples(tmp_path):
    # 432 training examples per epoch: validation every 1000 examples lands in epochs 3, 5, 7, 10, 12.
    out = run_direct(mlp.train, {**SYN, "eval_every": 1000}, tmp_path)
    assert out.status == "DONE"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["name"] == "valid_error"] == [3, 5, 7, 10, 12]
    assert [r["step"] for r in rows if r["name"] == "train_loss"] == list(range(1, 13))


def test_mlp_is_better_than_chance_by_far_after_training_and_not_before(tmp_path):
    trained = run_direct("jobman.models.mlp:train", {**SYN, "epochs": 20}, tmp_path / "a").results
    untrained = run_direct("jobman.models.mlp:train", {**SYN, "epochs": 0}, tmp_path / "b").results
    assert trained["test_error"] < untrained["test_error"] - 0.2


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
def test_every_optimizer_and_activation_learns(tmp_path, optimizer, activation):
    lr = {"sgd": 0.5, "momentum": 0.05, "adam": 0.01}[optimizer]
    out = run_direct(
        mlp.train,
        {**SYN, "optimizer": optimizer, "activation": activation, "lr": lr, "epochs": 15, "checkpoint_every": 0},
        tmp_path,
    )
    assert out.status == "DONE" and out.results["test_error"] < 0.3


def test_same_seed_same_everything_other_seed_other_weights(tmp_path):
    a = run_direct(mlp.train, {**SYN, "seed": 3}, tmp_path / "a")
    b = run_direct(mlp.train, {**SYN, "seed": 3}, tmp_path / "b")
    run_direct(mlp.train, {**SYN, "seed": 4}, tmp_path / "c")
    assert same_weights(tmp_path / "a", tmp_path / "b")
    assert not same_weights(tmp_path / "a", tmp_path / "c")
    for key in ("train_error", "valid_error", "test_error", "best_epoch"):
        assert a.results.get(key) == b.results.get(key)


class StopAfterEpoch(DirectChannel):
    """A channel whose job gets cancelled once its learning curve reaches ``stop_at``."""

    stop_at = 4

    def _log(self, step, metrics):
        super()._log(step, metrics)
        if step >= self.stop_at:
            self.request_stop("cancelled by test")


def test_a_stopped_job_resumes_to_the_same_weights(tmp_path):
    params = {**SYN, "patience": 100, "epochs": 10}
    straight = run_direct(mlp.train, params, tmp_path / "straight")
    assert straight.status == "DONE"

    work = tmp_path / "resumed"
    channel = StopAfterEpoch(job_id=None, phase=0, attempt=1, workdir=work, params=params)
    first = call(mlp.train, DD(params), channel)
    assert first.status == "INCOMPLETE"
    saved = json.loads((work / "state.json").read_text())
    assert saved["epochs"] == 4 and "test_error" not in saved
    assert not (work / "weights.npz").exists()

    second = run_direct(mlp.train, {**params, "checkpoint_every": 30.0}, work)  # reporting knobs may change
    assert second.status == "DONE"
    assert same_weights(tmp_path / "straight", work)
    assert second.results["test_error"] == straight.results["test_error"]
    assert second.results.get("epochs", 10) == straight.results.get("epochs", 10)
    # the learning curve has each epoch once, across both attempts
    steps = [
        json.loads(line)["step"]
        for line in (work / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["name"] == "valid_error"
    ]
    assert steps == list(range(1, 11))


def test_a_job_stopped_mid_epoch_resumes_to_the_same_weights(tmp_path):
    params = {**SYN, "optimizer": "momentum", "lr": 0.05, "input_noise": 0.1, "epochs": 6}
    run_direct(mlp.train, params, tmp_path / "straight")

    def stopping(state, channel):  # asks to stop at iteration 37 (mid-epoch), once: at() fires on crossing
        stop = Plugin(at(37), "iterations", lambda loop: loop.channel.request_stop("test"))
        return mlp.train(state, channel, plugins=[stop])

    first = run_direct(stopping, params, tmp_path / "resumed")
    assert first.status == "INCOMPLETE"
    second = run_direct(stopping, params, tmp_path / "resumed")
    assert second.status == "DONE"
    assert same_weights(tmp_path / "straight", tmp_path / "resumed")


def test_resume_without_the_optimizer_state_would_not_match(tmp_path):
    """Guards the test above: a resume that loses Adam's slots ends elsewhere."""
    params = {**SYN, "patience": 100, "epochs": 8}
    run_direct(mlp.train, params, tmp_path / "straight")
    work = tmp_path / "broken"
    channel = StopAfterEpoch(job_id=None, phase=0, attempt=1, workdir=work, params=params)
    assert call(mlp.train, DD(params), channel).status == "INCOMPLETE"
    ck = load_npz(work / "checkpoint.npz")
    np.savez(
        work / "checkpoint.npz",
        **{k: (np.zeros_like(v) if k.startswith("opt/") and "/m" in k else v) for k, v in ck.items()},
    )
    run_direct(mlp.train, params, work)
    assert not same_weights(tmp_path / "straight", work)


def test_a_checkpoint_of_other_parameters_is_not_resumed(tmp_path):
    run_direct(mlp.train, {**SYN, "epochs": 3}, tmp_path)
    out = run_direct(mlp.train, {**SYN, "epochs": 5, "lr": 0.01}, tmp_path, resume=False)
    assert out.status == "DONE" and out.results.get("epochs", 5) == 5


def test_a_finished_job_relaunched_returns_the_same_results(tmp_path):
    first = run_direct(mlp.train, SYN, tmp_path)
    again = run_direct(mlp.train, SYN, tmp_path)
    assert again.status == "DONE" and again.results["test_error"] == first.results["test_error"]


def test_digits_end_to_end(tmp_path):
    pytest.importorskip("sklearn")
    out = run_direct(
        "jobman.models.mlp:train", {"nb_cross_fold": 5, "id_cross_fold": 1, "epochs": 8, "progress_every": 0}, tmp_path
    )
    assert out.status == "DONE" and out.results["test_error"] < 0.1


def test_bad_parameters_fail_the_job_with_a_reason(tmp_path):
    out = run_direct(mlp.train, {**SYN, "optimizer": "lbfgs"}, tmp_path)
    assert out.status == "FAILED" and "optimizer must be one of" in out.error

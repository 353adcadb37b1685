"""RBMs and DBNs: CD-k and PCD learn, pretraining feeds fine-tuning through the parent's workdir, resume is exact."""

import json

import numpy as np
import pytest

from jobman.dispatch.channel import DD, DirectChannel, Parent
from jobman.dispatch.experiment import call
from jobman.dispatch.runner import run_direct
from jobman.models import dbn, optim
from jobman.models.checkpoint import load_npz
from jobman.models.plugins import Plugin, at
from jobman.models.rbm import RBM

SYN = {
    "dataset": "synthetic",
    "progress_every": 0,
    "n_hidden": 24,
    "pretrain_epochs": 4,
    "epochs": 10,
    "batch_size": 16,
    "eval_every": 0,
}


@pytest.mark.parametrize("k,pcd", [(1, False), (3, False), (1, True), (2, True)])
def test_rbm_training_lowers_reconstruction_error(k, pcd):
    rng = np.random.default_rng(0)
    protos = rng.random((4, 20)) < 0.5  # four binary patterns, 5% of pixels flipped
    X = np.logical_xor(protos[rng.integers(0, 4, 400)], rng.random((400, 20)) < 0.05).astype(np.float32)
    rbm = RBM(X.shape[1], 16, rng)
    opt = optim.Momentum(rbm.params, 0.1, 0.5, flat=(rbm.flat_params, rbm.flat_grads))
    before = rbm.reconstruction_error(X)
    for _ in range(15):
        for i in range(0, len(X), 20):
            rbm.cd_grads(X[i : i + 20], rng, k, pcd)
            opt.update(rbm.grads)
    assert before > 0.2 and rbm.reconstruction_error(X) < 0.1
    assert (rbm.chain is not None) == pcd


def test_cd_gradient_is_the_difference_of_correlations():
    rng = np.random.default_rng(1)
    rbm = RBM(3, 2, rng, dtype=np.float64)
    v0 = np.array([[1.0, 0.0, 1.0]])
    # With a fixed sample, CD-1's weight gradient is  v1' h1 - v0' h0  (a loss gradient: negative of the update).
    seed_state = np.random.default_rng(5)
    rbm.cd_grads(v0, seed_state, 1, False)
    h0 = rbm.hidden_probs(v0)
    h_sample = RBM.sample(h0, np.random.default_rng(5))
    v1 = rbm.visible_probs(h_sample)
    h1 = rbm.hidden_probs(v1)
    assert np.allclose(rbm.grads["W"], v1.T @ h1 - v0.T @ h0)
    assert np.allclose(rbm.grads["hbias"], (h1 - h0)[0])


def test_pretrain_then_finetune_from_the_parents_workdir(tmp_path):
    params = {**SYN, "n_layers": 2}
    pre = run_direct("jobman.models.dbn:pretrain", params, tmp_path / "pre")
    assert pre.status == "DONE", pre.error
    assert len(pre.results["recon_errors"]) == 2 and pre.results["epochs"] == 8
    stack = load_npz(tmp_path / "pre" / "weights.npz")
    assert stack["rbm0/W"].shape == (20, 24) and stack["rbm1/W"].shape == (24, 24)
    names = {json.loads(line)["name"] for line in (tmp_path / "pre" / "metrics.jsonl").read_text().splitlines()}
    assert {"rbm0_recon_error", "rbm1_recon_error"} <= names

    parent = Parent(
        job_id=1,
        phase=0,
        target="jobman.models.dbn:pretrain",
        workdir=tmp_path / "pre",
        params=params,
        results=pre.results,
    )
    channel = DirectChannel(job_id=2, phase=1, attempt=1, workdir=tmp_path / "ft", params=params, parents=[parent])
    state = DD(params)
    out = call(dbn.finetune, state, channel)
    assert out.status == "DONE", out.error
    for key in ("train_error", "valid_error", "test_error", "seconds"):
        assert isinstance(out.results[key], float)
    assert out.results["test_error"] < 0.3
    tuned = load_npz(tmp_path / "ft" / "weights.npz")
    assert tuned["0.W"].shape == (20, 24) and tuned["4.W"].shape == (24, 3)
    assert not np.array_equal(tuned["0.W"], stack["rbm0/W"])  # fine-tuning moved the pretrained weights


def test_finetune_starts_from_the_pretrained_weights(tmp_path):
    params = {**SYN, "epochs": 0}
    run_direct(dbn.pretrain, params, tmp_path / "pre")
    parent = Parent(1, 0, "jobman.models.dbn:pretrain", tmp_path / "pre", params, {})
    channel = DirectChannel(job_id=2, phase=1, attempt=1, workdir=tmp_path / "ft", params=params, parents=[parent])
    assert call(dbn.finetune, DD(params), channel).status == "DONE"
    assert np.array_equal(
        load_npz(tmp_path / "ft" / "weights.npz")["0.W"], load_npz(tmp_path / "pre" / "weights.npz")["rbm0/W"]
    )


def test_finetune_without_a_finished_parent_fails_clearly(tmp_path):
    channel = DirectChannel(
        job_id=2,
        phase=1,
        attempt=1,
        workdir=tmp_path / "ft",
        params=SYN,
        parents=[Parent(1, 0, "x", tmp_path / "empty", SYN, {})],
    )
    out = call(dbn.finetune, DD(SYN), channel)
    assert out.status == "FAILED" and "no pretrained stack" in out.error
    out = call(dbn.finetune, DD(SYN), DirectChannel(job_id=3, phase=1, attempt=1, workdir=tmp_path, params=SYN))
    assert out.status == "FAILED" and "needs a parent" in out.error


def test_pretraining_stopped_twice_resumes_to_the_same_stack(tmp_path):
    params = {**SYN, "n_layers": 2, "pcd": True, "cd_k": 2, "pretrain_epochs": 3}
    run_direct(dbn.pretrain, params, tmp_path / "straight")

    def stopping(state, channel):
        # Every layer's loop counts its own iterations: this stops layer 0, then layer 1, at iteration 40.
        return dbn.pretrain(
            state, channel, plugins=[Plugin(at(40), "iterations", lambda loop: loop.channel.request_stop("t"))]
        )

    statuses = [run_direct(stopping, params, tmp_path / "resumed").status for _ in range(3)]
    assert statuses == ["INCOMPLETE", "INCOMPLETE", "DONE"]
    a, b = load_npz(tmp_path / "straight" / "weights.npz"), load_npz(tmp_path / "resumed" / "weights.npz")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_dbn_train_does_both_phases_and_is_deterministic(tmp_path):
    a = run_direct("jobman.models.dbn:train", SYN, tmp_path / "a")
    b = run_direct("jobman.models.dbn:train", SYN, tmp_path / "b")
    assert a.status == "DONE", a.error
    assert a.results["pretrain_seconds"] > 0 and a.results["seconds"] >= a.results["pretrain_seconds"]
    assert a.results["test_error"] == b.results["test_error"]
    wa, wb = load_npz(tmp_path / "a" / "weights.npz"), load_npz(tmp_path / "b" / "weights.npz")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_layer_sizes():
    assert dbn.layer_sizes({"n_hidden": 10, "n_layers": 3}) == [10, 10, 10]
    assert dbn.layer_sizes({"n_hidden": [10, 5], "n_layers": 3}) == [10, 5]
    assert dbn.layer_sizes({"n_hidden": "10,5", "n_layers": 1}) == [10, 5]

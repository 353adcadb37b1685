"""Deep belief networks: greedy RBM pretraining, then supervised fine-tuning.

Two phases, two jobs, the jobman way:

- ``jobman.models.dbn:pretrain`` (phase 0) trains a stack of RBMs layer by layer
  on the training set (labels unused) and writes it to ``weights.npz`` in its workdir.
- ``jobman.models.dbn:finetune`` (phase 1) reads that file from its parent's workdir
  (``channel.parents[0].workdir``), turns the stack into a sigmoid MLP with a new
  softmax layer on top, and trains it by backpropagation.

``jobman.models.dbn:train`` does both in one job (the benchmark uses it).

Parameters (defaults): ``n_hidden`` (256; an int, or a list of layer sizes),
``n_layers`` (2; ignored when ``n_hidden`` is a list), ``cd_k`` (1), ``pcd``
(False: CD-k; True: persistent CD), ``pretrain_epochs`` (50 per layer),
``pretrain_lr`` (0.05), ``pretrain_momentum`` (0.5), ``pretrain_weight_decay``
(1e-4), ``pretrain_batch_size`` (20), ``seed`` (0); fine-tuning takes the
training parameters of :mod:`jobman.models.classifier` with ``lr`` 5e-3
(sigmoid units learn more slowly than ReLUs); data: :mod:`jobman.models.splits`.
Both phases must see the same data parameters so they cut the same training set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jobman.dispatch.channel import COMPLETE, DD, INCOMPLETE, Channel

from . import plugins as pl
from .checkpoint import from_json_array, json_array, load_npz, save_npz, unprefixed
from .classifier import TRAIN_DEFAULTS, WEIGHTS_FILE, fit, standard_plugins
from .layers import Dense, Layer, Network, Sigmoid, sigmoid
from .loop import Loop, read_checkpoint
from .optim import Optimizer, make_optimizer
from .params import fingerprint, int_list, job_params, settings
from .plugins import Plugin
from .rbm import RBM
from .splits import SPLIT_DEFAULTS, Split, make_split

PRETRAIN_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "n_hidden": 256,
    "n_layers": 2,
    "cd_k": 1,
    "pcd": False,
    "pretrain_epochs": 50,
    "pretrain_lr": 0.05,
    "pretrain_momentum": 0.5,
    "pretrain_weight_decay": 1e-4,
    "pretrain_batch_size": 20,
    "checkpoint_every": 60.0,
    "progress_every": 30.0,
}
# Sigmoid units learn more slowly than ReLUs: fine-tuning takes a larger step than the MLP's.
FINETUNE_DEFAULTS: dict[str, Any] = {**TRAIN_DEFAULTS, "lr": 5e-3}
DEFAULTS: dict[str, Any] = {**SPLIT_DEFAULTS, **FINETUNE_DEFAULTS, **PRETRAIN_DEFAULTS}

PRETRAIN_CHECKPOINT = "pretrain-checkpoint.npz"
STACK_FILE = WEIGHTS_FILE  # what phase 0 leaves for phase 1
RECON_SAMPLE = 2000  # examples the per-epoch reconstruction error is measured on


def layer_sizes(p: Mapping[str, Any]) -> list[int]:
    """Hidden layer sizes: ``n_hidden`` as a list, or ``n_hidden`` repeated ``n_layers`` times."""
    sizes = int_list(p["n_hidden"])
    return sizes if len(sizes) > 1 else sizes * max(1, int(p["n_layers"]))


class _Stack:
    """The RBMs finished so far, as (W, hbias, vbias) triples; checkpointed with the loop."""

    def __init__(self) -> None:
        self.layers: list[dict[str, np.ndarray]] = []

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"rbm{i}/{k}": v for i, layer in enumerate(self.layers) for k, v in layer.items()}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        self.layers = []
        while f"rbm{len(self.layers)}/W" in arrays:
            i = len(self.layers)
            self.layers.append({k: arrays[f"rbm{i}/{k}"].copy() for k in ("W", "hbias", "vbias")})

    def transform(self, X: np.ndarray) -> np.ndarray:
        """Hidden probabilities of the top finished layer (the next RBM's data)."""
        for layer in self.layers:
            X = sigmoid(X @ layer["W"] + layer["hbias"]).astype(np.float32)
        return X


class _Progress:
    """Which layer is in training, and what the finished layers took; checkpointed with the loop."""

    def __init__(self) -> None:
        self.layer, self.epochs, self.seconds = 0, 0, 0.0
        self.recon: list[float] = []

    def state_dict(self) -> dict[str, np.ndarray]:
        return {
            "meta": json_array(
                {"layer": self.layer, "epochs": self.epochs, "seconds": self.seconds, "recon": self.recon}
            )
        }

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        meta = from_json_array(arrays["meta"])
        self.layer, self.epochs = meta["layer"], meta["epochs"]
        self.seconds, self.recon = meta["seconds"], meta["recon"]


def pretrain_stack(
    X: np.ndarray,
    p: Mapping[str, Any],
    channel: Channel,
    state: dict,
    checkpoint_path: Path,
    plugins: Sequence[Plugin] = (),
) -> list[dict[str, np.ndarray]] | None:
    """Greedy layer-wise CD training on ``X``; the stack, or None when stopped (INCOMPLETE).

    Resumes from ``checkpoint_path``: finished layers, the layer in progress
    (weights, momentum slots, persistent chain), RNG and loop position. A layer's
    final checkpoint is where the next layer starts from, so a job stopped between
    two layers initialises the next one exactly as an uninterrupted job does.
    """
    sizes = layer_sizes(p)
    rng = np.random.default_rng(int(p["seed"]))
    stack, progress = _Stack(), _Progress()
    run_id = fingerprint(p, {**PRETRAIN_DEFAULTS, **SPLIT_DEFAULTS})
    saved = read_checkpoint(checkpoint_path, run_id)
    if saved is not None:
        stack.load_state_dict(unprefixed("stack", saved))
        progress.load_state_dict(unprefixed("progress", saved))
    while len(stack.layers) < len(sizes):
        i = len(stack.layers)
        data = stack.transform(X)
        rbm = RBM(data.shape[1], sizes[i], rng)
        opt = make_optimizer(
            "momentum",
            rbm.params,
            p["pretrain_lr"],
            p["pretrain_momentum"],
            p["pretrain_weight_decay"],
            flat=(rbm.flat_params, rbm.flat_grads),
        )
        k, persistent = int(p["cd_k"]), bool(p["pcd"])
        sample = data[:RECON_SAMPLE]

        def step(
            idx: np.ndarray,
            rbm: RBM = rbm,
            opt: Optimizer = opt,
            data: np.ndarray = data,
            k: int = k,
            persistent: bool = persistent,
        ) -> None:
            rbm.cd_grads(data[idx], rng, k, persistent)
            opt.update(rbm.grads)

        def recon_error(_loop: Loop, rbm: RBM = rbm, sample: np.ndarray = sample) -> dict[str, float | None]:
            return {"recon_error": rbm.reconstruction_error(sample)}

        def progress_results(loop: Loop) -> None:
            state["epochs"] = progress.epochs + int(loop.clock.epochs)
            state["seconds"] = progress.seconds + float(loop.clock.wall_time)

        progress.layer = i
        loop = Loop(
            n_examples=len(data),
            batch_size=int(p["pretrain_batch_size"]),
            max_epochs=int(p["pretrain_epochs"]),
            step=step,
            rng=rng,
            channel=channel,
            plugins=standard_plugins(p, evaluate=pl.evaluate(recon_error), extra=plugins, log_prefix=f"rbm{i}_"),
            parts={"stack": stack, "progress": progress, "rbm": rbm, "opt": opt},
            checkpoint_path=checkpoint_path,
            fingerprint=run_id,
            on_checkpoint=progress_results,
        )
        if saved is not None:  # the checkpoint's loop is the first unfinished layer's
            loop.load_state_dict(saved)
            saved = None
        if loop.run() == INCOMPLETE:
            return None
        progress.recon.append(rbm.reconstruction_error(sample))
        progress.epochs += int(loop.clock.epochs)
        progress.seconds += float(loop.clock.wall_time)
        stack.layers.append({name: rbm.params[name].copy() for name in ("W", "hbias", "vbias")})
        state["recon_errors"] = list(progress.recon)
        state["recon_error"] = progress.recon[-1]
        state["epochs"], state["seconds"] = progress.epochs, progress.seconds
    return stack.layers


def pretrain(state: dict, channel: Channel, plugins: Sequence[Plugin] = ()) -> str:
    """Phase 0: greedy RBM pretraining; the stack goes to ``weights.npz`` in the workdir.

    Results: ``recon_error`` (of the top layer), ``recon_errors`` (per layer),
    ``epochs`` (summed over layers) and ``seconds``; no classification errors (no labels used).
    """
    _, _, stack = _pretrained(state, channel, plugins)
    if stack is None:
        return INCOMPLETE
    save_npz(channel.workdir / STACK_FILE, stack_arrays(stack))
    return COMPLETE


def _pretrained(
    state: dict, channel: Channel, plugins: Sequence[Plugin]
) -> tuple[DD, Split, list[dict[str, np.ndarray]] | None]:
    """The job's settings, its data split and its pretrained stack (None when stopped): the first
    phase of ``pretrain`` and of ``train``."""
    p = settings(job_params(state, channel), DEFAULTS)
    channel.bind(state)
    split = make_split(p)
    return p, split, pretrain_stack(split.X_train, p, channel, state, channel.workdir / PRETRAIN_CHECKPOINT, plugins)


def stack_arrays(stack: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """A stack as the flat arrays of ``weights.npz`` (``rbm0/W``, ``rbm0/hbias``, ...)."""
    s = _Stack()
    s.layers = stack
    return s.state_dict()


def load_stack(workdir: str | Path) -> list[dict[str, np.ndarray]]:
    """The RBM stack a pretraining job left in ``workdir``."""
    path = Path(workdir) / STACK_FILE
    if not path.exists():
        raise FileNotFoundError(f"no pretrained stack at {path}: did the pretraining job finish?")
    s = _Stack()
    s.load_state_dict(load_npz(path))
    if not s.layers:
        raise ValueError(f"{path} holds no RBM layers")
    return s.layers


def network_from_stack(stack: list[dict[str, np.ndarray]], n_classes: int, rng: np.random.Generator) -> Network:
    """The sigmoid MLP a DBN fine-tunes: the RBMs' weights and hidden biases, then a new softmax layer."""
    layers: list[Layer] = []
    for rbm in stack:
        W = rbm["W"]
        layers += [Dense(W.shape[0], W.shape[1], W=W, b=rbm["hbias"]), Sigmoid()]
    top = stack[-1]["W"].shape[1]
    layers.append(Dense(top, n_classes, rng))
    return Network(layers)


def finetune_stack(
    stack: list[dict[str, np.ndarray]],
    split: Split,
    p: Mapping[str, Any],
    channel: Channel,
    state: dict,
    plugins: Sequence[Plugin] = (),
) -> str:
    """Supervised fine-tuning of the stack (see :func:`classifier.fit`)."""
    if stack[0]["W"].shape[0] != split.n_features:
        raise ValueError(f"the pretrained stack takes {stack[0]['W'].shape[0]} inputs, the data has {split.n_features}")
    rng = np.random.default_rng([int(p["seed"]), 1])
    net = network_from_stack(stack, split.n_classes, rng)
    return fit(net, split, p, channel, state, rng, plugins=plugins)


def finetune(state: dict, channel: Channel, plugins: Sequence[Plugin] = ()) -> str:
    """Phase 1: fine-tune the parent job's pretrained stack; the standard results land in ``state``."""
    if not channel.parents:
        raise ValueError("dbn:finetune needs a parent: schedule it as the phase after dbn:pretrain")
    p = settings(job_params(state, channel), DEFAULTS)
    channel.bind(state)
    stack = load_stack(channel.parents[0].workdir)
    return finetune_stack(stack, make_split(p), p, channel, state, plugins)


def train(state: dict, channel: Channel, plugins: Sequence[Plugin] = ()) -> str:
    """Both phases in one job: pretrain, then fine-tune (files of both in the one workdir).

    Results: those of fine-tuning, plus ``recon_error``, ``recon_errors`` and
    ``pretrain_seconds``; ``seconds`` covers both phases.
    """
    p, split, stack = _pretrained(state, channel, plugins)
    if stack is None:
        return INCOMPLETE
    pretrain_seconds = float(state["seconds"])
    state["pretrain_seconds"] = pretrain_seconds
    status = finetune_stack(stack, split, p, channel, state, plugins)
    if status == COMPLETE:
        state["seconds"] = float(state["seconds"]) + pretrain_seconds
    return status

"""Supervised training of a :class:`~layers.Network` inside a jobman job.

Shared by the MLP and by DBN fine-tuning: builds the optimizer, the loop and
its plugins (validation, early stopping with the best weights kept, learning
curves, checkpoints, remote stop, progress), resumes from the workdir's
checkpoint, and writes the standard results into ``state``:
``train_error``, ``valid_error``, ``test_error`` (fractions), ``epochs``,
``best_epoch`` and ``seconds``. The final weights go to ``weights.npz``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from jobman.dispatch.channel import COMPLETE, INCOMPLETE, Channel

from . import plugins as pl
from .checkpoint import save_npz
from .layers import Network
from .loop import Loop
from .optim import make_optimizer
from .parallel import DataParallel, share
from .params import fingerprint
from .splits import Split

# Supervised training parameters and their defaults (tuned on digits and fashion-mnist, see bench/):
#   optimizer     "adam", "momentum", "nesterov" or "sgd"; lr, momentum, weight_decay (L2, matrices only)
#   input_noise   std of the uniform noise added to each training input (clipped to [0, 1]); 0 = none
#   epochs        the most epochs; batch_size; seed (weights, shuffling, noise)
#   eval_every    validate every so many examples (0: after each epoch): patience then means the same
#                 amount of training on a small data set as on a large one
#   monitor       "valid_loss" or "valid_error": what early stopping, the rate decay and restore_best watch
#   patience      validations without a better monitor before stopping; restore_best keeps the best weights
#   lr_patience   validations without a better monitor before lr /= lr_factor (at most lr_reductions times)
#   checkpoint_every, progress_every   seconds of wall time between checkpoints / progress lines (0: never)
TRAIN_DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "optimizer": "adam",
    "lr": 2e-3,
    "momentum": 0.9,
    "weight_decay": 0.0,
    "input_noise": 0.1,
    "epochs": 100,
    "batch_size": 64,
    "patience": 20,
    "eval_every": 10000,
    "monitor": "valid_loss",
    "restore_best": True,
    "lr_patience": 5,
    "lr_factor": 5.0,
    "lr_reductions": 2,
    "checkpoint_every": 60.0,
    "progress_every": 30.0,
}

CHECKPOINT_FILE = "checkpoint.npz"
WEIGHTS_FILE = "weights.npz"


class BestWeights:
    """A copy of the parameters at the best validation score so far, saved with the checkpoint."""

    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.params = params
        self.copy: dict[str, np.ndarray] | None = None

    def capture(self, _loop: Loop | None = None) -> None:
        self.copy = {k: v.copy() for k, v in self.params.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {} if self.copy is None else dict(self.copy)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        self.copy = {k: arrays[k].copy() for k in self.params} if arrays else None


def standard_plugins(
    p: Mapping[str, Any],
    *,
    evaluate: pl.Plugin | None = None,
    early: pl.Plugin | None = None,
    extra: Sequence[pl.Plugin] = (),
    log_prefix: str = "",
) -> list[pl.Plugin]:
    """The plugins every bundled trainer runs, in order; ``extra`` run before checkpoint and stop.

    Learning curves are written after each epoch (step: the epoch), with the metrics measured during it.
    """
    out = [x for x in (evaluate, early) if x is not None]
    out.append(pl.log_metrics(prefix=log_prefix))
    out.extend(extra)
    if float(p["checkpoint_every"]) > 0:
        out.append(pl.checkpoint(pl.each(float(p["checkpoint_every"])), "wall_time"))
    out.append(pl.remote_stop())
    if float(p["progress_every"]) > 0:
        out.append(pl.progress(pl.each(float(p["progress_every"])), "wall_time", label=log_prefix))
    return out


def fit(
    net: Network,
    split: Split,
    p: Mapping[str, Any],
    channel: Channel,
    state: dict,
    rng: np.random.Generator,
    *,
    plugins: Sequence[pl.Plugin] = (),
    log_prefix: str = "",
    ps: Any = None,
) -> str:
    """Train ``net`` on ``split`` as ``p`` says; COMPLETE with results in ``state``, or INCOMPLETE.

    With ``ps`` (``jobman.ps``, joined by every rank of a gang), train data-parallel: see :mod:`.parallel`.
    """
    started = time.perf_counter()
    if ps is not None:  # the slots live with the weights, in the parameter server
        opt = make_optimizer(p["optimizer"], {}, p["lr"], p["momentum"], p["weight_decay"])
        gang: DataParallel | None = DataParallel(ps, net, opt, channel)
    else:
        flat = (net.flat_params, net.flat_grads)
        opt = make_optimizer(p["optimizer"], net.params, p["lr"], p["momentum"], p["weight_decay"], flat=flat)
        gang = None
    best = BestWeights(net.params)
    X, y = split.X_train, split.y_train

    noise = float(p["input_noise"])
    # Uniform noise of standard deviation ``noise``: as good a jitter as Gaussian noise, cheaper to draw.
    half_width = np.float32(noise * np.sqrt(3.0))

    def step(idx: np.ndarray) -> float:
        # A gang's rank takes its share of the batch, with the noise a lone process would draw for it.
        first, end = (0, len(idx)) if gang is None else share(len(idx), gang.rank, gang.ranks)
        xb = X[idx[first:end]]
        if noise > 0:  # denoising regulariser: jitter the inputs, stay in [0, 1]
            u = rng.random((len(idx), X.shape[1]), dtype=np.float32)[first:end]
            u -= np.float32(0.5)
            u *= 2 * half_width
            xb += u
            np.clip(xb, 0, 1, out=xb)
        if gang is not None:
            return gang.step(xb, y[idx[first:end]], len(idx))
        loss = net.loss_and_grads(xb, y[idx])
        opt.update(net.grads)
        return loss

    def validate(_loop: Loop) -> dict[str, float | None]:
        measure = net.evaluate if gang is None else gang.evaluate
        error, loss = measure(split.X_valid, split.y_valid)
        return {"valid_error": error, "valid_loss": loss}

    monitor = str(p["monitor"])
    if monitor not in ("valid_error", "valid_loss"):
        raise ValueError(f"monitor must be valid_error or valid_loss, not {monitor!r}")
    has_valid = len(split.y_valid) > 0
    # Validation runs after each epoch, or every ``eval_every`` examples: patience then counts
    # evaluations, i.e. examples seen, the same on a small data set as on a large one.
    every = int(p["eval_every"])
    when = (pl.each(every), "examples") if every > 0 else (pl.each(1), "epochs")
    evaluate = pl.evaluate(validate, *when) if has_valid else None
    early = (
        pl.early_stopping(monitor, int(p["patience"]), on_improve=best.capture, schedule=when[0], timeline=when[1])
        if has_valid
        else None
    )
    extra = list(plugins)
    if has_valid and int(p["lr_patience"]) > 0 and int(p["lr_reductions"]) > 0:
        extra.insert(
            0,
            pl.reduce_on_plateau(
                opt,
                monitor,
                int(p["lr_patience"]),
                float(p["lr_factor"]),
                int(p["lr_reductions"]),
                schedule=when[0],
                timeline=when[1],
            ),
        )

    def progress_results(loop: Loop) -> None:
        state["epochs"] = int(loop.clock.epochs)
        state["seconds"] = float(loop.clock.wall_time)
        if "valid_error" in loop.metrics:
            state["valid_error"] = float(loop.metrics["valid_error"])

    loop = Loop(
        n_examples=len(y),
        batch_size=int(p["batch_size"]),
        max_epochs=int(p["epochs"]),
        step=step,
        rng=rng,
        channel=channel if gang is None else cast(Channel, gang.stop),
        plugins=standard_plugins(p, evaluate=evaluate, early=early, extra=extra, log_prefix=log_prefix),
        parts={"net": net if gang is None else gang, "opt": opt, "best": best},
        checkpoint_path=channel.workdir / CHECKPOINT_FILE,
        fingerprint=fingerprint(p),
        on_checkpoint=progress_results,
        writes=channel.rank == 0,
    )
    loop.restore()
    resumed_seconds = loop.clock.wall_time
    ended = loop.run()
    if gang is not None:
        gang.release()
    if ended == INCOMPLETE:
        return INCOMPLETE
    if channel.rank != 0:  # the job's results and weights are rank 0's
        return COMPLETE
    if best.copy is not None and p["restore_best"]:
        net.load_state_dict(best.copy)
    save_npz(channel.workdir / WEIGHTS_FILE, net.state_dict())
    state["train_error"] = net.error(X, y)
    state["valid_error"] = net.error(split.X_valid, split.y_valid)
    state["test_error"] = net.error(split.X_test, split.y_test)
    state["epochs"] = int(loop.clock.epochs)
    if early is not None and isinstance(early.fn, pl.EarlyStopping) and early.fn.best_step is not None:
        state["best_epoch"] = int(early.fn.best_step)
    state["seconds"] = float(resumed_seconds + (time.perf_counter() - started))
    return COMPLETE

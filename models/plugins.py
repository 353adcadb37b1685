"""Plugins of the training loop: (schedule, timeline, function), and the built-in ones.

A plugin runs ``function(loop)`` after an iteration when its schedule fires on
its timeline over the interval since the previous iteration. Timelines:
``iterations``, ``epochs`` (completed), ``examples`` (seen), ``wall_time``
(seconds, plugins included) and ``train_time`` (seconds, plugins excluded);
both times add up across the attempts of a resumed job.

Built-ins: :func:`evaluate` (compute metrics), :func:`early_stopping`,
:func:`reduce_on_plateau` (learning-rate decay),
:func:`log_metrics` (learning curves via ``channel.log``), :func:`checkpoint`
(weights file, then ``channel.save()``), :func:`remote_stop` (checkpoint and end
INCOMPLETE when ``channel.should_stop()``), :func:`progress` (one line to stderr).
Plugins run in list order; a plugin with state (early stopping) is checkpointed
with the loop, so a resumed run decides exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

import numpy as np

from .checkpoint import from_json_array, json_array
from .schedules import Schedule, always, at, each, never  # noqa: F401 - re-exported for plugin authors

if TYPE_CHECKING:
    from .loop import Loop
    from .optim import Optimizer

TIMELINES = ("iterations", "epochs", "examples", "wall_time", "train_time")


@dataclass
class Plugin:
    """Run ``fn(loop)`` whenever ``schedule`` fires on ``timeline``."""

    schedule: Schedule
    timeline: str
    fn: Callable[[Loop], None]
    name: str = ""

    def __post_init__(self) -> None:
        if self.timeline not in TIMELINES:
            raise ValueError(f"timeline must be one of {', '.join(TIMELINES)}, not {self.timeline!r}")
        if not self.name:
            self.name = getattr(self.fn, "__name__", type(self.fn).__name__)


def evaluate(
    fn: Callable[[Loop], dict[str, float | None]], schedule: Schedule | None = None, timeline: str = "epochs"
) -> Plugin:
    """Merge the metrics ``fn(loop)`` returns into ``loop.metrics`` (default: after each epoch)."""

    def run(loop: Loop) -> None:
        loop.set_metrics(fn(loop))

    return Plugin(schedule or each(1), timeline, run, "evaluate")


class EarlyStopping:
    """Ends the loop after ``patience`` evaluations without improving ``metric``.

    A value equal to the best counts as a new best: on a small validation set many
    epochs tie, and the later, longer-trained model generalises better.
    ``on_improve(loop)`` runs at each new best (the trainers snapshot their weights
    there). A missing metric (no validation set) disables it.
    """

    def __init__(
        self,
        metric: str = "valid_error",
        patience: int = 10,
        mode: str = "min",
        min_delta: float = 0.0,
        on_improve: Callable[[Loop], None] | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
        self.metric, self.patience, self.mode, self.min_delta = metric, int(patience), mode, float(min_delta)
        self.on_improve = on_improve
        self.best: float | None = None
        self.best_step: float | None = None
        self.waited = 0

    def __call__(self, loop: Loop) -> None:
        value = loop.metrics.get(self.metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        sign = 1 if self.mode == "min" else -1
        if self.best is None or sign * (self.best - value) >= self.min_delta:
            self.best, self.best_step, self.waited = float(value), loop.clock.epochs, 0
            if self.on_improve is not None:
                self.on_improve(loop)
            return
        self.waited += 1
        if self.patience >= 0 and self.waited >= self.patience:
            loop.stop(f"early stopping: no better {self.metric} for {self.waited} evaluations")

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"meta": json_array({"best": self.best, "best_step": self.best_step, "waited": self.waited})}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        meta = from_json_array(arrays["meta"])
        self.best, self.best_step, self.waited = meta["best"], meta["best_step"], meta["waited"]


def early_stopping(
    metric: str = "valid_error",
    patience: int = 10,
    mode: str = "min",
    on_improve: Callable[[Loop], None] | None = None,
    schedule: Schedule | None = None,
    timeline: str = "epochs",
) -> Plugin:
    """An :class:`EarlyStopping` plugin; schedule it right after the metric's evaluation."""
    return Plugin(
        schedule or each(1), timeline, EarlyStopping(metric, patience, mode, on_improve=on_improve), "early_stopping"
    )


class ReduceOnPlateau:
    """Divides ``optimizer.lr`` by ``factor`` after ``patience`` evaluations without a better ``metric``.

    At most ``max_reductions`` times: training first takes large steps, then settles
    into the minimum it found. Its counters, and the optimizer's rate, are checkpointed.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        metric: str = "valid_error",
        patience: int = 10,
        factor: float = 5.0,
        mode: str = "min",
        max_reductions: int = 2,
    ) -> None:
        self.optimizer, self.metric, self.patience = optimizer, metric, int(patience)
        self.factor, self.sign, self.max_reductions = float(factor), 1 if mode == "min" else -1, int(max_reductions)
        self.best: float | None = None
        self.waited = 0
        self.reductions = 0

    def __call__(self, loop: Loop) -> None:
        value = loop.metrics.get(self.metric)
        if value is None or self.reductions >= self.max_reductions:
            return
        if self.best is None or self.sign * (self.best - value) >= 0:  # ties count, as in EarlyStopping
            self.best, self.waited = float(value), 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            self.optimizer.lr /= self.factor
            self.reductions += 1
            self.waited = 0

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"meta": json_array({"best": self.best, "waited": self.waited, "reductions": self.reductions})}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        meta = from_json_array(arrays["meta"])
        self.best, self.waited, self.reductions = meta["best"], meta["waited"], meta["reductions"]


def reduce_on_plateau(
    optimizer: Optimizer,
    metric: str = "valid_error",
    patience: int = 10,
    factor: float = 5.0,
    max_reductions: int = 2,
    schedule: Schedule | None = None,
    timeline: str = "epochs",
) -> Plugin:
    """A :class:`ReduceOnPlateau` plugin; schedule it right after the metric's evaluation."""
    return Plugin(
        schedule or each(1),
        timeline,
        ReduceOnPlateau(optimizer, metric, patience, factor, max_reductions=max_reductions),
        "reduce_on_plateau",
    )


class MetricLogger:
    """Writes the metrics set since it last ran: each point of a learning curve once, resumed or not."""

    def __init__(self, names: Iterable[str] | None, timeline: str, prefix: str) -> None:
        self.names = None if names is None else tuple(names)
        self.timeline, self.prefix = timeline, prefix
        self.last = -1  # the iteration of the last write

    def __call__(self, loop: Loop) -> None:
        fresh = {
            self.prefix + k: v
            for k, v in loop.metrics.items()
            if loop.updated.get(k, -1) > self.last and (self.names is None or k in self.names)
        }
        if fresh:
            loop.channel.log(int(loop.clock.value(self.timeline)), **fresh)
        self.last = loop.clock.iterations

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"last": np.array(self.last, dtype=np.int64)}

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        self.last = int(arrays["last"])


def log_metrics(
    names: Iterable[str] | None = None, schedule: Schedule | None = None, timeline: str = "epochs", prefix: str = ""
) -> Plugin:
    """``channel.log(step, **metrics)`` of the metrics set since the last write (all, or ``names``).

    The step is read on the plugin's timeline: after each epoch by default, the
    epoch number. A metric measured less often (validation every N examples)
    appears at the steps where it was measured.
    """
    return Plugin(schedule or each(1), timeline, MetricLogger(names, timeline, prefix), "log_metrics")


def checkpoint(schedule: Schedule | None = None, timeline: str = "wall_time") -> Plugin:
    """Write the checkpoint file, then ``channel.save()`` (default: every 60 s of wall time)."""
    return Plugin(schedule or each(60.0), timeline, lambda loop: loop.checkpoint(), "checkpoint")


def remote_stop(schedule: Schedule | None = None, timeline: str = "iterations") -> Plugin:
    """When ``channel.should_stop()``: checkpoint, then end the loop INCOMPLETE (re-queued, resumed).

    Checked after every iteration by default, so channels keep ``should_stop`` cheap.
    """

    def run(loop: Loop) -> None:
        if loop.channel.should_stop():
            loop.stop(getattr(loop.channel, "stop_reason", None) or "stop requested", incomplete=True)
            loop.checkpoint()

    return Plugin(schedule or always(), timeline, run, "remote_stop")


def progress(
    schedule: Schedule | None = None, timeline: str = "wall_time", stream: TextIO | None = None, label: str = ""
) -> Plugin:
    """One line of progress to ``stream`` (stderr; default every 30 s of wall time)."""

    def run(loop: Loop) -> None:
        c = loop.clock
        shown = " ".join(f"{k}={v:.4g}" for k, v in sorted(loop.metrics.items()) if isinstance(v, (int, float)))
        print(
            f"{label}epoch {c.epochs} iter {c.iterations} {c.wall_time:.1f}s {shown}".strip(),
            file=stream or sys.stderr,
            flush=True,
        )

    return Plugin(schedule or each(30.0), timeline, run, "progress")

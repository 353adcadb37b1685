"""The minibatch training loop: shuffled epochs, a clock of timelines, plugins, checkpoints.

The loop owns everything a bit-exact resume needs besides the model: the RNG,
the current epoch's permutation and position in it, the clock and the plugins'
state. With the trainer's parts (network, optimizer, ...) it writes them to one
checkpoint file, and :meth:`Loop.restore` puts them all back, so a job stopped
anywhere, even mid-epoch, ends with the same weights as one never stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from jobman.dispatch.channel import COMPLETE, INCOMPLETE, Channel

from .checkpoint import from_json_array, json_array, load_npz, prefixed, rng_state, save_npz, set_rng_state, unprefixed
from .plugins import Plugin


class Checkpointable(Protocol):
    def state_dict(self) -> dict[str, np.ndarray]: ...

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None: ...


@dataclass
class Clock:
    """Where training is on every timeline."""

    iterations: int = 0
    epochs: int = 0
    examples: int = 0
    wall_time: float = 0.0
    train_time: float = 0.0

    def value(self, timeline: str) -> float:
        return getattr(self, timeline)

    def snapshot(self) -> dict[str, float]:
        return {
            "iterations": self.iterations,
            "epochs": self.epochs,
            "examples": self.examples,
            "wall_time": self.wall_time,
            "train_time": self.train_time,
        }


class Loop:
    """Run ``step(batch_indices) -> loss`` over shuffled epochs until done, stopped or out of epochs.

    ``parts`` are the objects saved with the loop (name -> state_dict/load_state_dict);
    ``fingerprint`` identifies the run (its parameters) so a checkpoint left by a
    different run in the same directory is ignored instead of resumed. ``timer``
    is the clock the time timelines read (tests pass a fake one). ``writes=False``
    reads the checkpoint but never writes it (a gang's ranks other than 0).
    """

    def __init__(
        self,
        *,
        n_examples: int,
        batch_size: int,
        max_epochs: int,
        step: Callable[[np.ndarray], float | None],
        rng: np.random.Generator,
        channel: Channel,
        plugins: Sequence[Plugin] = (),
        parts: dict[str, Checkpointable] | None = None,
        checkpoint_path: str | Path | None = None,
        fingerprint: Any = None,
        on_checkpoint: Callable[[Loop], None] | None = None,
        timer: Callable[[], float] = time.perf_counter,
        writes: bool = True,
    ) -> None:
        if n_examples <= 0:
            raise ValueError("the training set is empty")
        self.n_examples, self.batch_size = int(n_examples), max(1, min(int(batch_size), int(n_examples)))
        self.max_epochs = int(max_epochs)
        self.step, self.rng, self.channel = step, rng, channel
        self.plugins = list(plugins)
        self.parts = dict(parts or {})
        self.checkpoint_path = None if checkpoint_path is None else Path(checkpoint_path)
        self.fingerprint = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
        self.on_checkpoint = on_checkpoint
        self.writes = writes  # False in a gang's other ranks: the checkpoint file is rank 0's
        self.clock = Clock()
        self.metrics: dict[str, float] = {}
        self.updated: dict[str, int] = {}  # metric -> iteration at which it was last set
        self.finished = False
        self.stop_reason: str | None = None
        self.incomplete = False
        self._perm: np.ndarray | None = None
        self._pos = 0
        self._loss_sum, self._loss_n = 0.0, 0
        self._timer = timer
        self._mark = timer()

    def set_metrics(self, values: dict[str, float | None]) -> None:
        """Record fresh metric values (None: not measured); loggers write what changed since they last ran."""
        for name, value in values.items():
            if value is not None:
                self.metrics[name] = value
                self.updated[name] = self.clock.iterations

    # -- control --------------------------------------------------------
    def stop(self, reason: str, incomplete: bool = False) -> None:
        """End the loop after the current plugins; ``incomplete`` means "resume me later"."""
        if self.stop_reason is None:
            self.stop_reason, self.incomplete = reason, incomplete
            if not incomplete:
                self.finished = True

    def run(self) -> str:
        """Train until finished (COMPLETE) or stopped to be resumed (INCOMPLETE)."""
        self.stop_reason, self.incomplete = None, False
        self._mark = self._timer()
        prev = self.clock.snapshot()
        while not self.finished and self.stop_reason is None:
            if self.clock.epochs >= self.max_epochs:
                self.finished = True
                break
            self._iterate()
            self._tick()
            now = self.clock.snapshot()
            for plugin in self.plugins:
                if plugin.schedule.fires(prev[plugin.timeline], now[plugin.timeline]):
                    plugin.fn(self)
            self._tick(training=False)
            prev = now
        if self.incomplete:
            return INCOMPLETE
        self.finished = True
        self.checkpoint()
        return COMPLETE

    def _iterate(self) -> None:
        if self._pos == 0 or self._perm is None:
            self._perm = self.rng.permutation(self.n_examples)
            self._pos = 0
        idx = self._perm[self._pos : self._pos + self.batch_size]
        loss = self.step(idx)
        c = self.clock
        c.iterations += 1
        c.examples += len(idx)
        self._pos += len(idx)
        if loss is not None:
            self._loss_sum += float(loss) * len(idx)
            self._loss_n += len(idx)
        if self._pos >= self.n_examples:
            self._pos = 0
            c.epochs += 1
            if self._loss_n:
                self.set_metrics({"train_loss": self._loss_sum / self._loss_n})
            self._loss_sum, self._loss_n = 0.0, 0

    def _tick(self, training: bool = True) -> None:
        t = self._timer()
        self.clock.wall_time += t - self._mark
        if training:
            self.clock.train_time += t - self._mark
        self._mark = t

    # -- checkpoints ----------------------------------------------------
    def _plugin_parts(self) -> dict[str, Checkpointable]:
        return {
            f"plugin.{p.name}": p.fn
            for p in self.plugins
            if hasattr(p.fn, "state_dict") and hasattr(p.fn, "load_state_dict")
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        """The loop's own state and its parts' as flat ``part/name`` arrays."""
        meta = {
            "clock": self.clock.snapshot(),
            "pos": self._pos,
            "finished": self.finished,
            "stop_reason": self.stop_reason,
            "metrics": self.metrics,
            "updated": self.updated,
            "loss": [self._loss_sum, self._loss_n],
            "fingerprint": self.fingerprint,
        }
        out = {"loop/meta": json_array(meta), "loop/rng": rng_state(self.rng)}
        if self._perm is not None:
            out["loop/perm"] = self._perm
        for name, part in {**self.parts, **self._plugin_parts()}.items():
            out.update(prefixed(name, part.state_dict()))
        return out

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        meta = from_json_array(arrays["loop/meta"])
        self.clock = Clock(**meta["clock"])
        self._pos, self.finished, self.metrics = meta["pos"], meta["finished"], dict(meta["metrics"])
        if self.finished and meta.get("stop_reason") is None and self.clock.epochs < self.max_epochs:
            self.finished = False  # it ended at its epoch limit, and this run may go further (a promoted rung)
        self.updated = dict(meta.get("updated", {}))
        self._loss_sum, self._loss_n = meta["loss"]
        set_rng_state(self.rng, arrays["loop/rng"])
        self._perm = arrays.get("loop/perm")
        for name, part in {**self.parts, **self._plugin_parts()}.items():
            part.load_state_dict(unprefixed(name, arrays))

    def checkpoint(self) -> None:
        """Write the checkpoint file (if any), let the trainer note progress, then ``channel.save()``."""
        if self.checkpoint_path is not None and self.writes:
            save_npz(self.checkpoint_path, self.state_dict())
        if self.on_checkpoint is not None:
            self.on_checkpoint(self)
        self.channel.save()

    def restore(self) -> bool:
        """Load the checkpoint file if there is one from this same run; True if it was loaded."""
        arrays = read_checkpoint(self.checkpoint_path, self.fingerprint)
        if arrays is None:
            return False
        self.load_state_dict(arrays)
        return True


def read_checkpoint(path: str | Path | None, fingerprint: Any) -> dict[str, np.ndarray] | None:
    """The arrays of the checkpoint at ``path`` if it exists and was written by a run with this fingerprint."""
    if path is None or not Path(path).exists():
        return None
    arrays = load_npz(path)
    if "loop/meta" not in arrays:
        return None
    wanted = json.loads(json.dumps(fingerprint, sort_keys=True, default=str))
    return arrays if from_json_array(arrays["loop/meta"]).get("fingerprint") == wanted else None

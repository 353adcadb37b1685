"""The experiment API: what a job function sees, jobman's ``fn(state, channel)``.

``state`` is the job's parameters as a dict with attribute access; what the job
writes into it (or returns as a dict) becomes its results. The channel lets the
job checkpoint, log learning curves, learn where it lives and when to stop.

Two channels exist: :class:`WorkerChannel` (a job claimed from the database by a
worker, see ``dispatch.forkserver``) and :class:`DirectChannel` (``jobman cmdline``:
one run in a directory, no database).
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

COMPLETE = "complete"
INCOMPLETE = "incomplete"


class DD(dict):
    """A dict whose keys are also attributes: ``state.lr`` is ``state['lr']``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getstate__(self) -> dict:
        return dict(self)

    def __setstate__(self, data: dict) -> None:
        self.update(data)


@dataclass(frozen=True)
class Parent:
    """What a job knows of a job it depends on."""

    job_id: int
    phase: int
    target: str
    workdir: Path
    params: Mapping[str, Any]
    results: Mapping[str, Any]


@dataclass
class Channel:
    """Base of both channels: identity, stop requests and the wall-time limit.

    Subclasses implement :meth:`_save` and :meth:`_log`.
    """

    job_id: int | None
    phase: int
    attempt: int
    workdir: Path
    params: Mapping[str, Any]
    parents: list[Parent] = field(default_factory=list)
    deadline: float | None = None  # time.time() after which should_stop() is true

    COMPLETE = COMPLETE
    INCOMPLETE = INCOMPLETE

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self._stop_reason: str | None = None
        self._state: DD | None = None
        self._stop_poll: Callable[[], bool] | None = None
        self.pruned = False

    # -- stopping -------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Ask the job to stop at its next convenient point (checkpoint first)."""
        if self._stop_reason is None:
            self._stop_reason = reason

    def should_stop(self) -> bool:
        """True once the job was cancelled, got SIGTERM, or ran out of wall time."""
        if self._stop_reason is None and self.deadline is not None and time.time() >= self.deadline:
            self._stop_reason = "wall-time limit reached"
        if self._stop_reason is None and self._stop_poll is not None and self._stop_poll():
            self._stop_reason = "cancel requested"
        return self._stop_reason is not None

    def prune(self, reason: str) -> None:
        """The search gave up on this job (its curve is worse than the finished jobs'): stop, end DONE."""
        self.pruned = True
        self.request_stop(reason)

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def install_signal_handlers(self) -> None:
        """SIGTERM (and SIGUSR1, sent by Slurm before a time limit) turn should_stop() on."""

        def on_signal(signum, _frame):
            self.request_stop(f"received {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGUSR1, on_signal)

    # -- state ----------------------------------------------------------
    def bind(self, state: DD) -> None:
        """Attach the state object that save() checkpoints."""
        self._state = state

    def results_of(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The part of ``state`` that is results: what is not an unchanged parameter."""
        return {k: v for k, v in state.items() if k not in self.params or self.params[k] != v}

    def save(self) -> None:
        """Checkpoint the job's state (its results so far) so a relaunch resumes from it."""
        if self._state is None:
            raise RuntimeError("channel.save() called before the channel was bound to a state")
        self._save(self.results_of(self._state))

    def log(self, step: int, **metrics: float) -> None:
        """Record learning-curve points: ``channel.log(epoch, valid_error=0.03)``.

        NaN and infinite values (a diverged loss) are left out: the databases cannot all hold them.
        """
        clean = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        if clean:
            self._log(int(step), clean)

    def _save(self, results: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _log(self, step: int, metrics: dict[str, float]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class DirectChannel(Channel):
    """A channel for one run without a database: checkpoints go to ``workdir/state.json``.

    This is what ``jobman cmdline`` uses, and what a user can call from a notebook.
    """

    STATE_FILE = "state.json"
    METRICS_FILE = "metrics.jsonl"

    def _save(self, results: dict[str, Any]) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / self.STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, sort_keys=True, default=_json_default))
        os.replace(tmp, path)

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / self.METRICS_FILE, "a") as fh:
            for name, value in metrics.items():
                fh.write(json.dumps({"step": step, "name": name, "value": value}) + "\n")

    def saved_results(self) -> dict[str, Any]:
        """The last checkpoint written in this workdir, or {}."""
        path = self.workdir / self.STATE_FILE
        return json.loads(path.read_text()) if path.exists() else {}


def _json_default(value: Any) -> Any:
    """Let NumPy scalars and arrays through json.dumps."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def to_jsonable(value: Any) -> Any:
    """``value`` with NumPy scalars/arrays and paths turned into plain JSON types."""
    return json.loads(json.dumps(value, default=_json_default))

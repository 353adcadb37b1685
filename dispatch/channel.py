"""The experiment API: what a job function sees, jobman's ``fn(state, channel)``.

``state`` is the job's parameters as a dict with attribute access; what the job
writes into it (or returns as a dict) becomes its results. The channel lets the
job checkpoint, log learning curves, learn where it lives and when to stop.

Every channel is here: :class:`WorkerChannel` (a job claimed by a worker and run by
its fork server: the worker writes), :class:`StoreChannel` (a job claimed and run in
the calling process, the Python API's inline mode: written under its lease) and
:class:`DirectChannel` (``jobman cmdline``: one run in a directory, no database).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import (
    Callable,
    Mapping,  # not typing's: its isinstance is several times slower
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobman.jobdb.nested import DD, RESERVED, expand, flatten

from .messages import recv_msg, send_msg

COMPLETE = "complete"
INCOMPLETE = "incomplete"


def job_info(
    job_id: int | None, target: str, experiment: str, priority: float, attempt: int, phase: int, workdir: Path | str
) -> dict[str, Any]:
    """What a job finds in ``state.jobman``, the original jobman's names (flat, dotted); ``target``
    is a function's path."""
    import socket

    # The original named a function module.function.
    return {
        "id": job_id,
        "experiment": target.replace(":", "."),
        "table": experiment,
        "status": 1,
        "attempt": attempt,
        "phase": phase,
        "sql.priority": priority,
        "sql.host_name": socket.gethostname(),
        "sql.host_workdir": str(workdir),
    }


def job_state(
    params: Mapping[str, Any], results: Mapping[str, Any] | None, info: Mapping[str, Any] | None = None
) -> DD:
    """The ``state`` a job is called with: its parameters and what it saved before, nested by their
    dots, and ``state.jobman`` (which is never stored as a parameter or a result)."""
    groups = {k.split(".", 1)[0] for k in params if "." in k}
    # A result inside a group of parameters (state.hyper.best) is stored by its dotted path and nests
    # back; any other result comes back under the name it was written with, dots and all (state['a.b']).
    nested = {k: v for k, v in (results or {}).items() if k.split(".", 1)[0] in groups}
    state = expand({**params, **nested})
    for key, value in (results or {}).items():
        if key not in nested:
            state[key] = _as_written(value)
    if info is not None:
        state[RESERVED] = expand(info)
    return state


def taking(channel: Channel, state: DD, taken: Mapping[str, Any] | None) -> None:
    """A job that takes other calls' values: ``taken`` (by top-level name, read back) put into its state
    and its channel's parameters as the same objects, so that they are never kept again as its results."""
    if taken:
        state.update(taken)
        channel.params = {**channel.params, **taken}


def _as_written(value: Any) -> Any:
    """A stored result as the job wrote it: its dicts with attribute access, their keys unsplit."""
    if isinstance(value, Mapping):
        return DD({k: _as_written(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_as_written(v) for v in value]
    return value


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
    save_every: float | None = None  # seconds between the 'save' answers of switch()
    rank: int = 0  # this process's rank in its job's gang (0 in a job of one process)
    world_size: int = 1  # the processes of the job: ``ranks`` it was scheduled with
    artifacts: Any = None  # the database's artifact store (a jobdb.artifacts.ArtifactStore), if it has one

    COMPLETE = COMPLETE
    INCOMPLETE = INCOMPLETE

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)
        self._stop_reason: str | None = None
        self._state: dict[str, Any] | None = None
        self._stop_poll: Callable[[], bool] | None = None
        self._last_save_hint = time.time()
        self._param_groups: set[str] | None = None
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

    def switch(self, message: Any = None) -> str | None:
        """The original jobman's checkpoint opportunity: ``'stop'`` (cancelled or signalled: save
        and return INCOMPLETE), ``'finish-up'`` (the wall-time limit: reach a checkpoint, save,
        return INCOMPLETE), ``'save'`` (``--save-every`` elapsed: save and go on), else None."""
        if self.should_stop():
            return "finish-up" if self._stop_reason == "wall-time limit reached" else "stop"
        if self.save_every is not None and time.time() - self._last_save_hint >= self.save_every:
            self._last_save_hint = time.time()
            return "save"
        return None

    def __call__(self, message: Any = None) -> str | None:
        return self.switch(message)

    def save_and_switch(self) -> str | None:
        """The original's shortcut: :meth:`save`, then :meth:`switch`'s answer."""
        self.save()
        return self.switch()

    def install_signal_handlers(self) -> None:
        """SIGTERM (and SIGUSR1, sent by Slurm before a time limit) turn should_stop() on."""

        def on_signal(signum: int, _frame: object) -> None:
            self.request_stop(f"received {signal.Signals(signum).name}")

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGUSR1, on_signal)

    # -- the job's other processes ---------------------------------------
    def parameter_server(self) -> Any:
        """``jobman.ps``, joined (``init()`` done) by this process: the tables this job's ranks share.

        For code that may import nothing of jobman but this module (the bundled trainers). Raises
        ``jobman.ps.PSError`` in one sentence in a job of one process or without the ``ps`` extra.
        """
        from . import ps

        ps.init()
        return ps

    # -- state ----------------------------------------------------------
    def bind(self, state: dict[str, Any]) -> None:
        """Attach the state object that save() checkpoints."""
        self._state = state

    def results_of(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """The part of ``state`` that is results: what is not an unchanged parameter, nor jobman's
        own ``state.jobman``. Inside a group of parameters (``state.hyper``) results are named by
        their dotted path, as the parameters are; any other dict a job writes is kept whole."""
        groups = self._groups()
        out: dict[str, Any] = {}
        for key, value in state.items():
            if key == RESERVED:
                continue
            items = (
                flatten(value, key + ".").items() if key in groups and isinstance(value, Mapping) else ((key, value),)
            )
            out.update((k, v) for k, v in items if k not in self.params or not _unchanged(self.params[k], v))
        return out

    def _groups(self) -> set[str]:
        """The top-level names of dotted parameters (``hyper`` of ``hyper.lr``)."""
        if self._param_groups is None:
            self._param_groups = {k.split(".", 1)[0] for k in self.params if "." in k}
        return self._param_groups

    def save(self) -> None:
        """Checkpoint the job's state (its results so far) so a relaunch resumes from it."""
        if self._state is None:
            raise RuntimeError("channel.save() called before the channel was bound to a state")
        self._save(keepable(self.results_of(self._state), self.artifacts))

    def attach(self, name: str, value: Any) -> dict[str, Any]:
        """Keep a file (a path: a plot, a checkpoint) or any picklable object under ``name`` in the
        job's artifact store; recorded as the job's result ``name`` (a reference), given back to Python
        as the object, or for a file as a handle to read or copy. The reference is returned."""
        if not isinstance(name, str) or not name or name == RESERVED or name.startswith("_"):
            raise ValueError(f"an artifact's name is a non-empty string not starting with '_', not {name!r}")
        if self.artifacts is None:
            raise RuntimeError("this job has no artifact store: attach() works in jobs run from a database")
        if self._state is None:
            raise RuntimeError("channel.attach() called before the channel was bound to a state")
        if isinstance(value, (str, os.PathLike)):
            path = Path(value)
            if not path.is_file():
                raise FileNotFoundError(f"channel.attach({name!r}, ...): {str(path)!r} is not a file")
            ref = self.artifacts.attach_file(path)
        else:
            ref = self.artifacts.put_object(value)
        self._state[name] = ref
        return dict(ref)

    def log(self, step: int, **metrics: float) -> None:
        """Record learning-curve points: ``channel.log(epoch, valid_error=0.03)``.

        NaN and infinite values (a diverged loss) are kept as such: they are what a diverged run shows.
        """
        values = {k: float(v) for k, v in metrics.items()}
        if values:
            self._log(int(step), values)

    def best(
        self,
        metric: str,
        mode: str = "min",
        group_over: Sequence[str] | None = None,
        parents: Sequence[Parent] | None = None,
    ) -> Any:
        """The best configuration of the parents (or of ``parents``) by ``metric``: the report's selection
        (``jobman.jobdb.report.best``) over what the worker gave the job of them, so a fan-in job retrains
        it without a database. Its ``.params``, ``.mean``, ``.std``, ``.n`` and ``.job_ids``."""
        from jobman.jobdb.report import best  # NumPy's report: imported by a fan-in job only

        records = [
            {
                "job_id": p.job_id,
                "params": dict(p.params),
                "results": dict(p.results or {}),
                "status": "DONE",
                "target": p.target,
            }
            for p in (self.parents if parents is None else parents)
        ]
        return best(records, metric=metric, mode=mode, group_over=group_over)

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


class WorkerChannel(Channel):
    """The channel of a job run by a worker's fork server: ``save`` and ``log`` are written by the worker.

    Each call waits for the worker's answer, so a checkpoint is in the database when
    ``save()`` returns; an error there (the job was taken from this worker, a state too
    large to keep) is raised in the job as the same exception.
    """

    def __init__(self, *args: Any, sock: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sock = sock
        self._asking = threading.Lock()  # one question and its answer at a time, whichever thread asks
        self._pid = os.getpid()

    @property
    def asking(self) -> threading.Lock:
        """Held while a question waits for its answer: what else is sent on the socket waits for it."""
        return self._asking

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if os.getpid() != self._pid:  # a forked child shares the socket: its answers would go astray
            from jobman.jobdb import errors

            raise errors.JobmanError(
                f"the channel of job {self.job_id} works only in the job's own process, "
                "not in a process it forked: save and log from the job's process"
            )
        with self._asking:
            send_msg(self._sock, request)
            reply = recv_msg(self._sock)
        if reply is None:
            raise RuntimeError("the job's worker went away")
        answer = reply[0]
        if answer.get("error"):
            from jobman.jobdb import errors

            kind = getattr(errors, answer.get("kind", ""), None)
            if not (isinstance(kind, type) and issubclass(kind, errors.JobmanError)):
                kind = errors.JobmanError
            raise kind(answer["error"])
        return answer

    def _save(self, results: dict[str, Any]) -> None:
        self._ask({"op": "save", "results": to_jsonable(results)})

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        answer = self._ask({"op": "log", "step": step, "metrics": metrics})
        if answer.get("prune"):
            self.prune(answer["prune"])


class RankChannel(Channel):
    """The channel of rank R > 0 of a gang job: ``save`` and ``log`` are ignored, as the job's
    record is rank 0's (its results, checkpoints and curves); stop requests reach it as any job's."""

    def save(self) -> None:
        pass

    def _save(self, results: dict[str, Any]) -> None:
        pass

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        pass


class StoreChannel(Channel):
    """The channel of a job run in the calling process: ``save`` and ``log`` write to the store
    under the job's lease (the store is given, so this module needs no database code)."""

    def __init__(self, *args: Any, store: Any, lease: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store, self._lease = store, lease

    def _save(self, results: dict[str, Any]) -> None:
        self._store.save(self.job_id, self._lease, to_jsonable(results))

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        self._store.log_metrics(self.job_id, self._lease, [(step, k, v) for k, v in metrics.items()])


def _json_default(value: Any) -> Any:
    """Let NumPy scalars and arrays through json.dumps."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _unchanged(param: Any, value: Any) -> bool:
    """Whether ``value`` is the parameter as given; an array put in its place is a change, not an error."""
    if param is value:  # a value taken from another call: never compared, arrays and all
        return True
    try:
        return bool(param == value)
    except ValueError:  # NumPy's "truth value of an array is ambiguous"
        return False


NOT_KEPT = "_not_kept"


def keepable(results: Mapping[str, Any], artifacts: Any = None) -> dict[str, Any]:
    """``results`` as JSON values, each kept on its own. With an artifact store, an array or any other
    value JSON cannot hold is stored there and referred to; one that cannot be kept at all (without a
    store: not JSON; with one: not picklable, an open file) is left out and named under ``_not_kept``
    with why, never taking the others with it."""
    convert = to_jsonable if artifacts is None else lambda value: _stored_where_needed(value, artifacts)
    try:  # the common case: plain JSON already (with a store, a NumPy scalar or an array is not)
        return to_jsonable(results) if artifacts is None else json.loads(json.dumps(results))
    except (TypeError, ValueError, RecursionError):
        pass
    kept: dict[str, Any] = {}
    lost: dict[str, str] = {}
    for key, value in results.items():
        try:
            kept[key] = convert(value)
        except (TypeError, ValueError, RecursionError) as exc:
            lost[key] = str(exc)
        except OSError as exc:  # the store cannot be written (a full disk, no such folder)
            lost[key] = f"the artifact store could not keep it: {exc}"
    if not lost:
        return kept
    kept[NOT_KEPT] = {**kept.get(NOT_KEPT, {}), **lost} if isinstance(kept.get(NOT_KEPT), dict) else lost
    return kept


def _stored_where_needed(value: Any, artifacts: Any) -> Any:
    """``value`` as JSON, each array or other value JSON cannot hold stored in ``artifacts`` and referred to."""

    def default(item: Any) -> Any:
        if isinstance(item, Path):
            return str(item)
        if type(item).__module__ == "numpy" and hasattr(item, "item") and getattr(item, "ndim", 1) == 0:
            return item.item()  # a NumPy scalar is a number
        return artifacts.put_object(item)

    try:
        return json.loads(json.dumps(value, default=default))
    except (TypeError, ValueError, RecursionError):  # a key JSON cannot hold (a tuple), a cycle: kept whole
        return artifacts.put_object(value)  # TypeError, naming why, if it cannot be pickled either


def to_jsonable(value: Any) -> Any:
    """``value`` with NumPy scalars/arrays and paths turned into plain JSON types."""
    return json.loads(json.dumps(value, default=_json_default))

"""jobman from Python: every call is a job row, and the database answers a call made before.

An :class:`Experiment` is one experiment of one database. ``call(fn, **params)`` and
``map(fn, params)`` return :class:`concurrent.futures.Future` objects; a call's identity is
the job's (target and canonical parameters), so a call whose job is DONE is answered from
the database without running, a FAILED one raises its stored error, and one QUEUED or
RUNNING is waited for, never duplicated. Where the job runs is the backend's choice:
``"inline"`` (here, now), ``"local"`` (worker processes started on this host and stopped
when the futures are done), ``"slurm"`` (a job array of workers) or ``None`` (workers started
elsewhere pick the jobs up); the workers are started as ``jobman dispatch`` starts them
(:mod:`.launch`). A background thread reads the pending jobs' statuses and settles their futures.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import os
import shlex
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jobman.jobdb import artifacts
from jobman.jobdb.canonical import dump_json
from jobman.jobdb.command_paths import anchored_command
from jobman.jobdb.errors import CallTimeout, JobFailed, JobmanError, JobNotRun, UsageError
from jobman.jobdb.halving import sampled, sweep_space
from jobman.jobdb.priority import check_ranks
from jobman.jobdb.scheduling import pickled_by_value
from jobman.jobdb.shape import MAX_DEPTH
from jobman.jobdb.status import BLOCKING, ENDED, RAN_BADLY, Status
from jobman.jobdb.store import Job, Store, params_hash
from jobman.jobdb.sweep import JobSpec, expand, parse_sweep
from jobman.jobdb.url import mask_password

from .calls import CallRef, code_version, json_params, source_version, target_of
from .channel import DD, NOT_KEPT, Channel
from .experiment import TargetError, by_value, resolve, unaccepted
from .worker_settings import DEFAULT_EXPROOT

__all__ = [
    "Experiment",
    "JobFuture",
    "as_completed",
    "cached",
    "call",
    "default_experiment",
    "map",
    "pipeline",
    "wait",
]

BACKENDS = ("inline", "local", "slurm", None)
_FINAL = set(ENDED)
_AGAIN = set(BLOCKING)  # what retry=True runs again
REDERIVE_EVERY = 2.0  # seconds between two re-derivations of the calls still WAITING
KEEP_WORKERS_EVERY = 0.25  # seconds between two looks at the workers (started, crashed jobs found)

# -- futures --------------------------------------------------------------------------------


class JobFuture(concurrent.futures.Future):
    """The future of one job: its result is the job's results dict.

    ``result()`` raises :class:`~jobman.jobdb.errors.JobFailed` (with the job's stored error) for
    a FAILED or CRASHED job, :class:`~jobman.jobdb.errors.JobNotRun` for a CANCELED or BLOCKED
    one, and :class:`~jobman.jobdb.errors.CallTimeout` when ``timeout`` passes first.
    ``cancel()`` cancels the job (a running one is asked to stop).
    """

    def __init__(self, experiment: Experiment, job_id: int, target: str) -> None:
        super().__init__()
        self.job_id = job_id
        self.target = target
        self._experiment = weakref.ref(experiment)
        self._unwrap: Callable[[dict[str, Any]], Any] | None = None
        self._value: Any = _UNREAD  # a result with artifacts, read back when first asked for
        self._reading = threading.Lock()

    def __repr__(self) -> str:
        return f"<JobFuture job {self.job_id} {self.target} {self._state}>"

    def _repr_html_(self) -> str:
        """In a notebook: the job as it is now, and its page on a serving dashboard."""
        from .notebook import future_html

        return future_html(self)

    def cancel(self) -> bool:
        if self.done():
            return False
        exp = self._experiment()
        if exp is not None:
            exp.store.cancel([self.job_id], running=True, why="cancelled from Python")
        cancelled = super().cancel()
        if exp is not None:
            exp._cancelled = True  # its follower lets it go at its next poll
        return cancelled

    def result(self, timeout: float | None = None) -> Any:
        try:
            raw = super().result(timeout)
        except concurrent.futures.TimeoutError as exc:
            if isinstance(exc, JobmanError):
                raise
            raise CallTimeout(f"job {self.job_id} ({self.target}) did not finish within {timeout:g} s") from None
        if self._value is _UNREAD and not getattr(self, "_lazy", False):
            return raw
        with self._reading:  # artifacts are read once, by whoever asks first: a call taking it never does
            if self._value is _UNREAD:
                exp = self._experiment()
                given = exp.given_back(raw) if exp is not None else raw
                self._value = self._unwrap(given) if self._unwrap else given
            return self._value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            return super().exception(timeout)
        except concurrent.futures.TimeoutError:
            raise CallTimeout(f"job {self.job_id} ({self.target}) did not finish within {timeout:g} s") from None

    def _settle(
        self, job: Job, unwrap: Callable[[dict[str, Any]], Any] | None = None, store: Store | None = None
    ) -> bool:
        """Resolve from the job's row if it is final; True if it was. A BLOCKED job's error names the call
        that did not finish (looked up on ``store``: the calling thread's)."""
        if job.status not in _FINAL:
            return False
        try:
            if job.status is Status.DONE:
                self._set_done(job.results or {}, unwrap)
            else:
                exp = self._experiment()
                culprit = exp._blocked_by(job, store) if exp is not None and job.status is Status.BLOCKED else None
                self.set_exception(_failure(job, culprit))
        except concurrent.futures.InvalidStateError:  # cancelled meanwhile
            pass
        return True

    def _set_done(self, results: dict[str, Any], unwrap: Callable[[dict[str, Any]], Any] | None) -> None:
        """The result of a DONE job: its results as the job gave them (artifacts read back), unwrapped.
        Artifacts are read when the result is first asked for, not here: a future only passed on to
        other calls never brings its arrays into this process."""
        if any(artifacts.refs_in(results)):
            self._lazy, self._unwrap = True, unwrap
            self.set_result(results)
            return
        exp = self._experiment()
        try:
            given = exp.given_back(results) if exp is not None else results
            value = unwrap(given) if unwrap else given
        except JobmanError as exc:  # an artifact gone from the store, a value that could not be kept
            self.set_exception(exc)
            return
        self.set_result(value)


_UNREAD = object()


def _failure(job: Job, culprit: Job | None = None) -> JobFailed:
    where = f"job {job.id} ({job.target})"
    error = (job.error or "").strip()
    if job.status is Status.CANCELED:
        return JobNotRun(f"{where} was cancelled", job_id=job.id, status=job.status.value, error=job.error)
    if job.status is Status.BLOCKED:
        cause = "a job it depends on did not finish"
        if culprit is not None:
            said = (culprit.error or "").strip().splitlines()
            cause = f"job {culprit.id} ({culprit.target}), which it depends on, is {culprit.status.value}" + (
                f": {said[-1]}" if said else ""
            )
        return JobNotRun(
            f"{where} is BLOCKED: {cause}",
            job_id=job.id,
            status=job.status.value,
            error=job.error,
        )
    last = error.splitlines()[-1] if error else "no error was recorded"
    exc = JobFailed(f"{where} {job.status.value}: {last}", job_id=job.id, status=job.status.value, error=job.error)
    if error and hasattr(exc, "add_note"):  # shown under the exception's own traceback
        exc.add_note(f"the job's error, as stored:\n{error}")
    return exc


# -- the experiment -------------------------------------------------------------------------


class Experiment:
    """One experiment of a jobman database, from Python.

    ``url`` is a jobman URL (``sqlite:///runs.db?table=mlp``, ``postgresql://u@host/db?table=mlp``;
    default ``$JOBMAN_DB``). ``backend`` says where jobs run: ``"inline"``, ``"local"`` (``workers``
    processes on this host), ``"slurm"`` (``sbatch`` options as for ``jobman dispatch``) or
    ``None`` (only enqueue). ``exproot`` is where job workdirs go; ``timeout`` a job's wall-time
    limit in seconds; ``max_attempts`` how often a crashed job runs before its crash is final.

    ``jobs_per_process`` K: the workers started here run up to K calls in turn in one job process
    before a fresh one replaces it, as Dask's and joblib's pools reuse theirs (default
    ``$JOBMAN_JOBS_PER_PROCESS``, else 100; 1: a fresh process per call). A call that crashes its
    process (a segfault, ``os._exit``, SIGKILL, the OOM killer) still loses only itself: it is
    recorded CRASHED (or FAILED) and the next call gets a fresh process. A call sees what the calls
    before it in the same process left behind (module globals, ``os.environ``, threads, leaked
    memory): give 1 for calls that need a clean process. Command jobs always get a process each.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        backend: str | None = "local",
        workers: int | None = None,
        exproot: str | os.PathLike | None = None,
        timeout: float | None = None,
        max_attempts: int = 3,
        poll_interval: float = 0.5,
        sbatch: str = "",
        allow_sqlite: bool = False,
        jobs_per_process: int | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise UsageError(f"backend {backend!r} is not one of 'inline', 'local', 'slurm' or None")
        if workers is not None and workers < 1:
            raise UsageError(f"workers must be at least 1, not {workers}")
        self.jobs_per_process = _jobs_per_process(jobs_per_process)
        self.store = Store.open(url, create=True)
        if backend == "slurm" and self.store.target.dialect == "sqlite" and not allow_sqlite:
            self.store.dispose()
            raise UsageError(
                "Slurm jobs on other nodes cannot share a SQLite file safely: use a PostgreSQL "
                "database, or allow_sqlite=True if every job runs on this host"
            )
        self.backend = backend
        self.workers = workers or os.cpu_count() or 1
        self.exproot = Path(exproot or os.environ.get("JOBMAN_EXPROOT") or DEFAULT_EXPROOT).resolve()
        self.artifacts = artifacts.for_database(self.store.target, self.exproot)
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.poll_interval = poll_interval
        self.sbatch = sbatch
        self._pending: dict[int, tuple[JobFuture, Callable | None]] = {}
        self._lock = threading.RLock()  # a future's callbacks may call again
        self._pump: _Pump | None = None
        self._inline: Any = None  # an inline.InlineRunner, made for the first job run here
        self._code_stored: weakref.WeakKeyDictionary[Any, dict[str, tuple[str, bytes]]] = weakref.WeakKeyDictionary()
        self._targets_stored: set[str] = set()
        self._cancelled = False  # a future was cancelled since the follower last looked

    @property
    def name(self) -> str:
        """The experiment's name (jobman's table)."""
        return self.store.experiment

    def __repr__(self) -> str:
        return f"Experiment({mask_password(self.store.target.with_table())!r}, backend={self.backend!r})"

    def _repr_html_(self) -> str:
        """In a notebook: jobs by status, a progress bar, the best so far, and the dashboard's link."""
        from .notebook import experiment_html

        return experiment_html(self)

    def __enter__(self) -> Experiment:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop following the pending jobs and stop the workers this experiment started."""
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.stop()
        self._discard_zygote()
        self.store.dispose()

    def _discard_zygote(self) -> None:
        """Stop the zygote started for this experiment's workers if none of them took it (the calls
        were done before a worker was wanted)."""
        if self.backend == "local":
            from .backends import zygote

            zygote.discard_prestarted()

    def given_back(self, results: dict[str, Any]) -> dict[str, Any]:
        """A job's results as the job gave them: each artifact it refers to read back from the store."""
        return artifacts.load_refs(results, self.artifacts)  # type: ignore[no-any-return,unused-ignore]

    # -- calls ---------------------------------------------------------------------------
    def call(
        self,
        fn: Callable[..., Any] | str,
        params: Mapping[str, Any] | None = None,
        /,
        *,
        retry: bool = False,
        version: str | None = None,
        cache: str | None = None,
        ranks: int = 1,
        **kwargs: Any,
    ) -> JobFuture:
        """Call ``fn(**params)`` as a job; a future of its results dict.

        Parameters are keywords (or a dict first, for names such as ``retry``). A DONE call is
        answered from the database; a FAILED one raises its error unless ``retry``. The function's
        source is part of the call's identity (an edited function is a new call; ``cache="source"``
        says so explicitly); ``version`` pins one whatever the source. A call recorded before the
        source was part of it still answers. ``ranks`` N runs it as N processes started together (a
        gang); rank 0's results are the call's.
        """
        merged = {**(params or {}), **kwargs}
        return self.map(fn, [merged], retry=retry, version=version, cache=cache, ranks=ranks)[0]

    def map(
        self,
        fn: Callable[..., Any] | str,
        params: Iterable[Mapping[str, Any]],
        *,
        retry: bool = False,
        version: str | None = None,
        cache: str | None = None,
        ranks: int = 1,
    ) -> list[JobFuture]:
        """One :meth:`call` per params dict (``jobman.grid(...)`` makes them), scheduled in one transaction."""
        check_ranks(ranks)
        if ranks > 1 and self.backend == "inline":
            raise UsageError(f"ranks={ranks} needs workers: the inline backend runs each call in this one process")
        if cache not in (None, "source"):
            raise UsageError(f"cache={cache!r}: use cache='source' (or give version=)")
        if cache == "source" and not isinstance(fn, str):
            version = source_version(fn)
        target = target_of(fn, version)
        points = list(params)
        function = resolve(target.partition("@")[0]) if isinstance(fn, str) else fn
        _refuse_unaccepted(function, points)
        # A function's code is part of its call's identity (a changed function is a new call), unless
        # a version pins it; a call recorded before code was, under the plain target, still answers.
        legacy = None
        if version is None and not by_value(target):
            automatic = code_version(function)
            if automatic is not None:
                legacy, target = target, target_of(target, automatic)
        if isinstance(fn, str):
            runnable = resolve(target) if self.backend == "inline" else None
            return self._submit(target, points, runnable, retry=retry, code=None, ranks=ranks, legacy=legacy)
        code = None
        if by_value(target):
            target, code = self._by_value(target, fn)
        return self._submit(target, points, fn, retry=retry, code=code, ranks=ranks, legacy=legacy)

    def _submit(
        self,
        target: str,
        params: list[Mapping[str, Any]],
        fn: Callable | None,
        *,
        retry: bool,
        code: bytes | None,
        unwrap: Callable[[dict[str, Any]], Any] | None = None,
        ranks: int = 1,
        legacy: str | None = None,
    ) -> list[JobFuture]:
        params, needs = self._taking(params)
        clean = [json_params(p) for p in params]  # first: a bad value is refused before anything is written
        encoded = [dump_json(p, "parameters") for p in clean]
        hashes = [params_hash(0, "fn", target, e) for e in encoded]
        if by_value(target) and fn is None:
            raise UsageError(f"{target!r} cannot be imported by name: pass the function itself")
        found = self.store.find(hashes)
        missing = [i for i, h in enumerate(hashes) if h not in found]
        if missing and legacy is not None:
            old = {i: params_hash(0, "fn", legacy, encoded[i]) for i in missing}
            recorded = self.store.find(list(old.values()))
            for i, h in old.items():
                if h in recorded:
                    found[hashes[i]] = recorded[h]
            missing = [i for i in missing if old[i] not in recorded]
        if missing and self.backend == "local" and (self._pump is None or not self._pump.alive()):
            from .backends import zygote

            # What forks the workers starts before the calls are written: its imports (a quarter of
            # a second) overlap this scheduling and the next calls' instead of following them.
            zygote.prestart()
        if missing and code is not None:
            self._store_code(target, code)
        specs = [JobSpec(0, "fn", target, clean[i], None, encoded[i]) for i in missing]
        new_ids = self._schedule(specs, [hashes[i] for i in missing], [needs[i] for i in missing], ranks)
        again = [job for job in found.values() if job.status in _AGAIN] if retry else []
        self._again(again)
        again_ids = {job.id for job in again}
        futures: dict[int, JobFuture] = {}
        out = []
        for h in hashes:
            job = found.get(h)
            job_id = job.id if job is not None else new_ids[h]
            if job_id not in futures:
                futures[job_id] = self._future(job_id, target, None if job_id in again_ids else job, unwrap)
            out.append(futures[job_id])
        if self.backend == "inline" and fn is not None:
            for job_id, future in futures.items():
                if not future.done():
                    results = self._run_inline(job_id, fn)
                    if results is not None:  # DONE here: settled without reading the job back
                        with self._lock:
                            entry = self._pending.pop(job_id, None)
                        if entry is not None and not future.done():
                            future._set_done(results, entry[1])
                    else:
                        self._settle_now([future])
        if any(not f.done() for f in futures.values()):
            self._follow()
        return out

    def pipeline(self, steps: Sequence[Any], *, retry: bool = False) -> JobFuture:
        """Steps run one after another, each called with the previous step's future as its first
        parameter (by name: ``pca(data, k)`` gets ``data``), as nested calls would be; the last
        step's future. A step is a function (or its path), or ``(function, {params})`` for its other
        parameters; the first may be a future already made. ``exp.pipeline([load, (pca, {"k": 32}),
        train])`` is ``exp.call(train, features=exp.call(pca, data=exp.call(load), k=32))``."""
        if isinstance(steps, (str, Mapping)) or not isinstance(steps, Sequence) or not steps:
            raise UsageError("a pipeline is a non-empty list of steps: functions, or (function, {params}) pairs")
        previous: JobFuture | None = None
        for n, step in enumerate(steps):
            if isinstance(step, JobFuture) and n == 0:
                previous = step
                continue
            fn, params = step if isinstance(step, tuple) and len(step) == 2 else (step, {})
            if not isinstance(params, Mapping) or not (callable(fn) or isinstance(fn, str)):
                raise UsageError(
                    f"step {n + 1} of the pipeline is a {type(step).__name__}: give a function, "
                    "or a (function, {params}) pair"
                )
            params = dict(params)
            if previous is not None:
                name = _first_parameter(resolve(target_of(fn).partition("@")[0]) if isinstance(fn, str) else fn)
                if name is None:
                    raise UsageError(f"step {n + 1} of the pipeline takes no parameter to give the step before to")
                if name in params:
                    raise UsageError(f"step {n + 1} of the pipeline is given {name!r}, which the step before gives it")
                params[name] = previous
            previous = self.call(fn, params, retry=retry)
        assert previous is not None
        return previous

    def _schedule(self, specs: list[JobSpec], hashes: list[str], needs: list[list[int]], ranks: int) -> dict[str, int]:
        """Schedule new calls in one transaction; their job ids by identity. A call that takes calls
        waits for those it takes."""
        if not specs:
            return {}
        if any(needs):
            return self.store.schedule_calls(specs, needs, max_attempts=self.max_attempts, ranks=ranks)
        scheduled = self.store.schedule(specs, max_attempts=self.max_attempts, ranks=ranks)
        return dict(zip(dict.fromkeys(hashes), scheduled.job_ids))

    def _taking(self, params: list[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], list[list[int]]]:
        """Each point with the futures in its values made references to their calls (by identity: see
        :mod:`jobman.jobdb.callrefs`), and the jobs each point takes. A future of another experiment,
        or of a job no longer there, is refused in one sentence."""
        given = [(name, f) for p in params if isinstance(p, Mapping) for name, f in _futures_in(p)]
        if not given:
            return params, [[] for _ in params]
        here = self.store.target.with_table()
        for name, f in given:
            other = f._experiment()
            if other is not self and (other is None or other.store.target.with_table() != here):
                where = "a closed experiment" if other is None else f"experiment {other.name!r} of {other.store.target}"
                raise UsageError(
                    f"parameter {name!r} is a future of {where}: a call takes only calls of its own "
                    f"experiment ({self.name!r}); pass its .result() instead"
                )
        identities = self.store.identities(sorted({f.job_id for _name, f in given}))
        for name, f in given:
            if f.job_id not in identities:
                raise UsageError(
                    f"parameter {name!r} is the future of job {f.job_id}, "
                    f"which is no longer in experiment {self.name!r}"
                )
        points: list[Mapping[str, Any]] = []
        needs: list[list[int]] = []
        for p in params:
            taken: list[int] = []

            def ref(f: JobFuture, taken: list[int] = taken) -> CallRef:
                taken.append(f.job_id)
                return CallRef(identities[f.job_id])

            points.append({k: _with_refs(v, ref) for k, v in p.items()} if isinstance(p, Mapping) else p)
            needs.append(taken)
        return points, needs

    def _again(self, jobs: list[Job]) -> None:
        """``retry=True``: failed and crashed calls resume from their checkpoint, cancelled ones start over."""
        failed = [j.id for j in jobs if j.status in RAN_BADLY]
        other = [j.id for j in jobs if j.status in (Status.CANCELED, Status.BLOCKED)]
        if failed:
            self.store.retry(failed, "called again with retry=True")
        if other:
            self.store.reset(other, why="called again with retry=True")

    def _future(self, job_id: int, target: str, job: Job | None, unwrap: Callable | None) -> JobFuture:
        with self._lock:
            pending = self._pending.get(job_id)
            if pending is not None and not pending[0].done():
                return pending[0]
            self._pending.pop(job_id, None)
            future = JobFuture(self, job_id, target)
            if job is None or not future._settle(job, unwrap):
                self._pending[job_id] = (future, unwrap)
            return future

    def _settle_now(
        self, futures: Sequence[JobFuture], store: Store | None = None, *, waiting_too: bool = True
    ) -> list[int]:
        """Settle the futures whose jobs are final (read on ``store``: the calling thread's); the ids of
        those still WAITING (unless not ``waiting_too``: then only the final jobs are read)."""
        ids = [f.job_id for f in futures]
        waiting = []
        wanted = sorted(_FINAL | {Status.WAITING} if waiting_too else _FINAL, key=lambda s: s.value)
        for start in range(0, len(ids), 900):
            for job in (store or self.store).jobs(ids=ids[start : start + 900], status=wanted, with_deps=False):
                if job.status is Status.WAITING:
                    waiting.append(job.id)
                with self._lock:
                    entry = self._pending.get(job.id)
                    if entry is not None and (entry[0].done() or entry[0]._settle(job, entry[1], store)):
                        del self._pending[job.id]
        return waiting

    def _blocked_by(self, job: Job, store: Store | None = None) -> Job | None:
        """The job upstream of a BLOCKED one that ended badly (FAILED, CRASHED, CANCELED), nearest first."""
        store = store or self.store
        seen: set[int] = set()
        todo = list(job.depends_on) or [p.id for p in store.parents(job.id)]
        while todo and len(seen) < 1000:
            parents = store.jobs(ids=sorted(set(todo) - seen))
            seen.update(todo)
            for p in parents:
                if p.status in _AGAIN and p.status is not Status.BLOCKED:
                    return p
            todo = [d for p in parents if p.status is Status.BLOCKED for d in p.depends_on]
        return None

    def _follow(self) -> None:
        """Make sure the background thread follows the pending jobs (and runs workers for them)."""
        with self._lock:
            if self._pump is None or not self._pump.alive():
                self._pump = _Pump(self)
                self._pump.start()
            else:
                self._pump.wake(workers=True)

    def _by_value(self, name: str, fn: Callable[..., Any]) -> tuple[str, bytes]:
        """The target a function a worker cannot import is called under (``name#digest`` of its code)
        and its code, pickled once per function object and name."""
        try:
            made = self._code_stored.setdefault(fn, {})
        except TypeError:  # not weakly referable: pickle it each time
            made = {}
        if name not in made:
            made[name] = pickled_by_value(fn, name)
        return made[name]

    def _store_code(self, target: str, code: bytes) -> None:
        """Store a function a worker cannot import, by value, once per target."""
        if target not in self._targets_stored:
            self.store.put_function(target, code)
            self._targets_stored.add(target)

    def _run_inline(self, job_id: int, fn: Callable[..., Any]) -> dict[str, Any] | None:
        """Run the job here if it is QUEUED; the results it was recorded DONE with, if it was here."""
        if self._inline is None:
            from .inline import InlineRunner  # the runner's imports, for this mode only

            self._inline = InlineRunner(self.store)
        return self._inline.run(job_id, fn, self.exproot, self.timeout)

    def _launch_plan(self) -> Any:
        """How this experiment's workers are started: as ``jobman dispatch`` would start them."""
        from .launch import LaunchPlan
        from .machine import JobProcesses
        from .worker_settings import WorkerSettings

        # A module next to the calling script is importable by its workers, as it is here.
        here = [p for p in (os.getcwd(), sys.path[0] if sys.path and sys.path[0] else None) if p]
        paths = os.pathsep.join(
            dict.fromkeys(here + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        )
        processes = JobProcesses(self.jobs_per_process)
        settings = WorkerSettings(str(self.exproot), self.timeout, processes=processes)
        assert self.backend is not None  # the pump starts workers for "local" and "slurm" only
        # Said in the environment too: a worker reads it there when its command line does not say it (K=1).
        environment = {"PYTHONPATH": paths, JOBS_PER_PROCESS_VARIABLE: str(self.jobs_per_process)}
        return LaunchPlan(self.backend, settings, self.workers, environment=environment, sbatch=self.sbatch)

    # -- reading ----------------------------------------------------------------------------
    def results(self, *, phase: int | None = None, as_frame: bool | None = None) -> Any:
        """One dict per job (by id): its own columns (id, status, phase, attempt, host, started,
        finished, seconds, target), then ``params_<name>`` and ``results_<name>``, as Optuna's
        ``trials_dataframe`` keeps them apart: a result named ``status`` never hides the job's.

        A pandas DataFrame when pandas is installed (``as_frame=None``) or asked for (``True``).
        """
        rows = [job_row(job, self.given_back) for job in self.store.jobs(phase=phase, with_deps=False)]
        if as_frame is False:
            return rows
        try:
            import pandas
        except ImportError:
            if as_frame:
                raise UsageError("as_frame=True needs pandas: pip install pandas") from None
            return rows
        return pandas.DataFrame(rows)

    def search(
        self,
        space: Mapping[str, Any],
        *,
        metric: str | Sequence[str],
        sampler: str = "tpe",
        samples: int | None = None,
        seed: int = 0,
        maximize: bool = False,
        constraints: Sequence[str] = (),
        name: str = "told",
    ) -> Any:
        """An ask/tell search over ``space`` (distributions such as ``jobman.loguniform(1e-4, 1e-1)``,
        and fixed values): ``point = search.ask()``, then ``search.tell(point, loss=0.3)``. Each point
        is a job of this experiment, so ``report`` and the next proposals see it. The same arguments
        again continue the same search; ``samples`` caps the points asked (none: no cap)."""
        from .asktell import UNBOUNDED, Search, learning_plan

        rules, plan = learning_plan(
            space,
            sampler,
            metric,
            samples=samples if samples is not None else UNBOUNDED,
            parallel=0,
            seed=seed,
            kind="asked",
            target=name,
            maximize=maximize,
            constraints=constraints,
        )
        return Search(self.store, rules, plan)

    def optimize(
        self,
        fn: Callable[..., Any] | str,
        space: Mapping[str, Any],
        *,
        samples: int,
        metric: str | Sequence[str],
        sampler: str = "tpe",
        parallel: int | None = None,
        seed: int = 0,
        maximize: bool = False,
        constraints: Sequence[str] = (),
        halving: str | None = None,
        eta: int = 3,
        asynchronous: bool = False,
    ) -> tuple[list[JobFuture], Any]:
        """Run a learning search of ``samples`` calls of ``fn`` over ``space`` (as ``sqlschedule
        --sampler``): each point proposed as a job ends, ``parallel`` (default: the workers) pending
        at once. Waits for the search to end; its futures, in the order proposed, and :meth:`best`.

        ``halving="epochs=1:27"`` (with ``eta`` and ``asynchronous``, as ``--halving``, ``--eta`` and
        ``--async``): ``samples`` configurations, each starting at its Hyperband bracket's rung,
        proposed from a model of every configuration that ended, ranked by how far it got, and the best
        of each bracket are promoted; the best is then the best at the highest rung reached."""
        import time

        from .asktell import learning_plan

        target = target_of(fn, None)
        if not isinstance(fn, str):
            _refuse_unaccepted(fn, [dict.fromkeys(space)])
        if by_value(target):
            if isinstance(fn, str):
                raise UsageError(f"{target!r} cannot be imported by name: pass the function itself")
            target, code = self._by_value(target, fn)
            self._store_code(target, code)
        rules, plan = learning_plan(
            space,
            sampler,
            metric,
            samples=samples,
            parallel=parallel or self.workers,
            seed=seed,
            kind="fn",
            target=target,
            maximize=maximize,
            constraints=constraints,
            max_attempts=self.max_attempts,
            halving=halving,
            eta=eta,
            asynchronous=asynchronous,
        )
        search_id, _, _ = self.store.start_search(rules, plan)
        futures: dict[int, JobFuture] = {}
        runnable = (resolve(target) if isinstance(fn, str) else fn) if self.backend == "inline" else None
        while True:
            budget, jobs = self.store.search_members(search_id)
            for job_id, status in jobs:
                if job_id not in futures:
                    futures[job_id] = self._future(job_id, target, None, None)
                if runnable is not None and status == Status.QUEUED.value:
                    self._run_inline(job_id, runnable)
            if runnable is None and any(not f.done() for f in futures.values()):
                self._follow()
            if runnable is not None:
                self._settle_now(list(futures.values()))
            if self.backend is None:
                break  # only enqueued: the points proposed so far, for workers started elsewhere
            if len(jobs) >= budget and all(status in {s.value for s in ENDED} for _, status in jobs):
                break
            time.sleep(0 if runnable is not None else self.poll_interval)
        self._settle_now(list(futures.values()))
        objectives = plan.objectives
        if len(objectives) > 1 or plan.constraints or rules.rungs:
            best = self.best()
        else:
            best = self.best(objectives[0][0], objectives[0][1])
        return list(futures.values()), best

    def best(
        self,
        metric: str | None = None,
        mode: str = "min",
        *,
        phase: int | None = None,
        group_over: Sequence[str] | None = None,
        allow_incomplete: bool = False,
    ) -> Any:
        """The best configuration by ``metric``, chosen as ``jobman report`` does (folds and seeds
        averaged): it has ``.params``, ``.mean``, ``.std``, ``.n`` and ``.job_ids``.

        Without ``metric``, the experiment's learning search says what is best: the Pareto front of
        a multi-objective search (a list of ``.params``, ``.values``, ``.job_ids``), the best feasible
        configuration of one under ``--constraint`` (one such point), else the best by its metric."""
        from jobman.jobdb.report import NothingEligible, from_store

        if metric is None:
            fronts = self.store.search_fronts()
            if fronts and len(fronts[-1].objectives) > 1:
                return list(fronts[-1].points)
            if fronts:  # one metric under constraints, or at a multi-fidelity search's top rung
                if not fronts[-1].points:
                    raise NothingEligible("no configuration of the search is feasible and finished yet")
                return fronts[-1].points[0]
            goals = self.store.search_objectives()
            if not goals:
                raise UsageError("best() needs a metric: this experiment has no learning search to take one from")
            metric, mode = goals[0]
        if mode not in ("min", "max"):
            raise UsageError(f"mode {mode!r} is 'min' or 'max'")
        report = from_store(
            self.store, metric, mode, group_over, phase=phase, outer=None, allow_incomplete=allow_incomplete
        )
        if report.best is None:
            raise NothingEligible(report.why_none().replace("--allow-incomplete", "allow_incomplete=True"))
        return report.best

    def history(self, metric: str | None = None, *, phase: int | None = None, as_frame: bool | None = None) -> Any:
        """The logged learning curves: a row per job, step and metric (``id``, ``step``, ``metric``,
        ``value``, then ``params_<name>``); see :func:`.notebook.history`."""
        from .notebook import history

        return history(self, metric, phase=phase, as_frame=as_frame)

    def plot(
        self,
        metric: str | None = None,
        mode: str | None = None,
        *,
        phase: int | None = None,
        group_over: Sequence[str] | None = None,
        curves: int = 5,
    ) -> Any:
        """What ``jobman report --plot`` draws, as matplotlib figures by name (a notebook shows them all)."""
        from .notebook import plot

        return plot(self, metric, mode, phase=phase, group_over=group_over, curves=curves)

    def schedule(
        self,
        sweep: str | Sequence[str],
        *,
        priority: int = 0,
        command: str | None = None,
        check: bool = True,
        samples: int | None = None,
        seed: int = 0,
        sampler: str = "random",
    ) -> list[JobFuture]:
        """Schedule a sweep in ``jobman sqlschedule``'s grammar (phases included); a future per job.

        ``exp.schedule("mypkg.train:main lr={{0.1,0.01}} -- epochs={{10,50}}")``; with distributions,
        ``exp.schedule("mypkg.train:main lr=loguniform(1e-4,1e-1)", samples=32, seed=7)``.
        """
        tokens = shlex.split(sweep) if isinstance(sweep, str) else list(sweep)
        if command is not None:
            command = anchored_command(command, os.getcwd())  # the job runs in its workdir, not here
        parsed = parse_sweep(tokens, command=command)
        specs = expand(parsed, samples=samples, seed=seed, sampler=sampler)
        if check:
            for target in dict.fromkeys(s.target for s in specs if s.kind == "fn"):
                try:
                    found = resolve(target)
                except TargetError as exc:
                    raise UsageError(f"{exc} (check=False if it only exists where the jobs run)") from None
                _refuse_unaccepted(found, [s.params for s in specs if s.kind == "fn" and s.target == target])
        scheduled = self.store.schedule(
            specs, priority=priority, max_attempts=self.max_attempts, halving=sampled(sweep_space(parsed))
        )
        targets = dict(zip(scheduled.job_ids, (s.target for s in _unique(specs))))
        futures = [self._future(job_id, targets.get(job_id, ""), None, None) for job_id in scheduled.job_ids]
        if any(not f.done() for f in futures):
            self._follow()
        return futures


def job_row(job: Job, given_back: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> dict[str, Any]:
    """A job as a row of :meth:`Experiment.results`: its own columns, then its prefixed parameters and
    results (``given_back``: how its stored results become what the job gave)."""
    results = job.results or {}
    if given_back is not None and results:
        results = given_back(results)
    seconds = job.finished_at - job.started_at if job.finished_at and job.started_at else None
    return {
        "id": job.id,
        "status": job.status.value,
        "phase": job.phase,
        "attempt": job.attempt,
        "host": job.host,
        "started": job.started_at,
        "finished": job.finished_at,
        "seconds": seconds,
        "target": job.target,
        **{f"params_{k}": v for k, v in job.params.items()},
        **{f"results_{k}": v for k, v in results.items()},
    }


JOBS_PER_PROCESS = 100  # calls one job process runs in turn, by default, for the workers started from Python
JOBS_PER_PROCESS_VARIABLE = "JOBMAN_JOBS_PER_PROCESS"


def _jobs_per_process(given: int | None) -> int:
    """How many calls a job process runs in turn: as given, else ``$JOBMAN_JOBS_PER_PROCESS``, else
    ``JOBS_PER_PROCESS``; a UsageError for anything but a whole number of at least 1."""
    if given is None:
        text = os.environ.get(JOBS_PER_PROCESS_VARIABLE, "").strip()
        if not text:
            return JOBS_PER_PROCESS
        if not text.isdigit() or int(text) < 1:
            raise UsageError(f"${JOBS_PER_PROCESS_VARIABLE}={text!r}: give a whole number of at least 1")
        return int(text)
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise UsageError(f"jobs_per_process must be a whole number of at least 1, not {given!r}")
    return given


def _first_parameter(fn: Callable[..., Any]) -> str | None:
    """The name of the first parameter ``fn`` takes by name (``data`` of ``pca(data, k)``)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return next((p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)), None)


def _futures_in(params: Mapping[str, Any]) -> Iterable[tuple[str, JobFuture]]:
    """The futures among ``params``' values (inside lists, tuples and dicts too), each with its name."""

    def walk(value: Any, name: str, depth: int) -> Iterable[tuple[str, JobFuture]]:
        if isinstance(value, JobFuture):
            yield name, value
        elif depth < MAX_DEPTH and isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                yield from walk(v, f"{name}[{i}]", depth + 1)
        elif depth < MAX_DEPTH and isinstance(value, Mapping):
            for k, v in value.items():
                yield from walk(v, f"{name}.{k}", depth + 1)

    for key, value in params.items():
        yield from walk(value, str(key), 1)


def _with_refs(value: Any, ref: Callable[[JobFuture], CallRef]) -> Any:
    """``value`` with each future in it replaced by ``ref(future)``; untouched if it holds none."""
    if isinstance(value, JobFuture):
        return ref(value)
    if isinstance(value, (list, tuple)) and any(_futures_in({"": value})):
        return [_with_refs(v, ref) for v in value]
    if isinstance(value, Mapping) and any(_futures_in({"": value})):
        return {k: _with_refs(v, ref) for k, v in value.items()}
    return value


def _refuse_unaccepted(fn: Callable[..., Any], params: Iterable[Mapping[str, Any]]) -> None:
    """A UsageError naming the first parameter ``fn`` cannot take: refused before anything is written."""
    names: dict[str, None] = {}
    for p in params:
        if isinstance(p, Mapping):  # anything else is refused by json_params, in its own words
            names.update(dict.fromkeys(k for k in p if isinstance(k, str)))
    refused = unaccepted(fn, names)
    if refused is not None:
        raise UsageError(refused)


def _unique(specs: Sequence[JobSpec]) -> list[JobSpec]:
    """Specs in the order the store returns their ids: one per identity."""
    seen, out = set(), []
    for s in specs:
        key = (s.phase, s.kind, s.target, dump_json(s.params, "parameters"))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


class _Pump(threading.Thread):
    """Follows an experiment's pending jobs: settles their futures, and keeps its workers running.

    It has its own store (a store's writer connection belongs to one thread) and ends when no
    future is pending, stopping the workers it started.
    """

    def __init__(self, experiment: Experiment) -> None:
        super().__init__(daemon=True, name=f"jobman-{experiment.name}")
        self.experiment = experiment
        self.store = Store(experiment.store.target, check_schema=False)
        self._wake = threading.Event()
        self._stopping = False
        self._rederive_at = time.monotonic() + REDERIVE_EVERY
        self._workers_at = 0.0  # when the workers are next looked after (at once, the first time)
        self._workers_wanted = False  # calls were scheduled since the last look: look at the next poll
        self.launch: Any = None  # the workers it started (a launch.Launch), made when first wanted
        self.dispatcher: Any = None

    def alive(self) -> bool:
        return self.is_alive() and not self._stopping

    def wake(self, *, workers: bool = False) -> None:
        """Poll now; with ``workers``, look after the workers too (calls were scheduled: a graph's
        first call may have started one worker, and its next calls want the others now, not later)."""
        if workers:
            self._workers_wanted = True  # cleared by the pump before it looks, so a look under way misses none
        self._wake.set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join()

    def run(self) -> None:
        exp = self.experiment
        delay = 0.02
        try:
            while not self._stopping:
                with exp._lock:
                    futures = [f for f, _unwrap in exp._pending.values()]
                    if not futures:
                        self._stopping = True  # under the lock: a call made now starts a new thread
                        break
                # Only the jobs that ended are read (not every pending one, each poll), and those
                # WAITING when they are due to be re-derived.
                rederive = time.monotonic() >= self._rederive_at
                waiting = exp._settle_now(futures, self.store, waiting_too=rederive)
                if rederive:
                    if waiting:  # see Store.rederive
                        self.store.rederive(waiting)
                    self._rederive_at = time.monotonic() + REDERIVE_EVERY
                with exp._lock:
                    settled = len(exp._pending) < len(futures)
                    if exp._cancelled:
                        exp._cancelled = False
                        for job_id in [i for i, (f, _u) in exp._pending.items() if f.cancelled()]:
                            del exp._pending[job_id]
                due = self._workers_wanted or time.monotonic() >= self._workers_at
                if exp.backend in ("local", "slurm") and exp._pending and due:
                    self._workers_wanted = False
                    self._keep_workers()
                    self._workers_at = time.monotonic() + KEEP_WORKERS_EVERY
                if settled:  # jobs are ending: the next may end soon too (a fan-in's last call)
                    delay = min(delay, 0.05)
                if self._wake.wait(delay):
                    self._wake.clear()
                    delay = 0.02
                delay = min(delay * 1.5, exp.poll_interval)
        except Exception as exc:  # noqa: BLE001 - the database went away, sbatch refused: every pending future says so
            if not isinstance(exc, JobmanError):
                exc = JobmanError(f"following the jobs of {exp.name!r} failed: {type(exc).__name__}: {exc}")
            with exp._lock:
                pending, exp._pending = exp._pending, {}
            for future, _unwrap in pending.values():
                try:
                    future.set_exception(exc)
                except concurrent.futures.InvalidStateError:  # cancelled meanwhile
                    pass
        finally:
            self._stopping = True
            if self.launch is not None:
                self.launch.stop(grace=30.0)
            self.store.dispose()

    def _keep_workers(self) -> None:
        """As ``jobman dispatch`` does: enough workers for the ready jobs, up to ``workers``, and crashed
        jobs found."""
        from .dispatcher import Tally

        if self.launch is None:
            from .launch import Launch

            self.launch = Launch(self.store, self.experiment._launch_plan())
            self.dispatcher = self.launch.dispatcher()
        tally = Tally.of(self.store)
        if tally["WAITING"]:  # a graph of calls: workers for its width start while its first calls run
            tally = Tally({**tally.counts, "QUEUED": tally["QUEUED"] + tally["WAITING"]})
        self.dispatcher.keep_workers(tally)
        self.dispatcher.scan_when_due()


# -- memoizing a function ------------------------------------------------------------------


def cached(
    url: str | None = None,
    *,
    version: str | None = None,
    cache: str | None = None,
    retry: bool = False,
    exproot: str | os.PathLike | None = None,
) -> Callable[[Callable], Callable]:
    """Memoize a function in a jobman database: each distinct call is a job, run here once.

    ``@jobman.cached("sqlite:///cache.db?table=features")`` over ``def features(dataset, pca=32)``:
    ``features("mnist")`` runs once, then is read back, across processes and runs. Arguments
    are bound to the signature with defaults applied, so ``features("mnist", pca=32)`` is the same
    call. The return value is stored as JSON (a tuple comes back a list), or, when JSON cannot
    hold it (a NumPy array, any picklable object), in the database's artifact store and given back
    as itself. An edited function is a new call (its source is part of the identity); ``version``
    pins one whatever the source.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        import functools

        signature = inspect.signature(fn)
        if any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
            raise UsageError(f"{fn.__qualname__} takes *args: a cached function's arguments need names")
        state: dict[str, Any] = {}

        def experiment() -> Experiment:
            if "exp" not in state:
                state["exp"] = Experiment(url, backend="inline", exproot=exproot)
                pinned = version if version is not None else None if by_value(target_of(fn)) else code_version(fn)
                state["target"] = target_of(fn, pinned)
                state["legacy"] = target_of(fn) if version is None and pinned is not None else None
            return state["exp"]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{fn.__qualname__}(): {exc}") from None
            bound.apply_defaults()
            params = dict(bound.arguments)
            for p in signature.parameters.values():
                if p.kind is p.VAR_KEYWORD:
                    params.update(params.pop(p.name, {}))
            exp = experiment()
            future = exp._submit(
                state["target"],
                [params],
                _returning(fn),
                retry=retry,
                code=None,
                unwrap=lambda results: _returned(fn, results),
                legacy=state["legacy"],
            )
            return future[0].result()

        wrapper.experiment = experiment  # type: ignore[attr-defined]
        return wrapper

    if cache not in (None, "source"):
        raise UsageError(f"cache={cache!r}: use cache='source' (or give version=)")
    return decorate


def _returning(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The job a cached call runs: the function on its parameters, its return value kept as ``return``
    (as JSON, or in the artifact store: an array comes back an array)."""

    def run(state: DD, channel: Channel) -> dict[str, Any]:
        return {"return": fn(**channel.params)}

    run.code_of = fn  # type: ignore[attr-defined]  # its code record is the function's (not __wrapped__: the signature)
    return run


def _returned(fn: Callable[..., Any], results: dict[str, Any]) -> Any:
    """A cached call's value from its job's results; an error saying why if it could not be kept."""
    if "return" in results:
        return results["return"]
    why = (results.get(NOT_KEPT) or {}).get("return") if isinstance(results.get(NOT_KEPT), dict) else None
    if why:
        raise JobmanError(f"the value {fn.__name__}() returned could not be kept: {why}")
    return results


# -- the default experiment: $JOBMAN_DB ------------------------------------------------------

_DEFAULT: dict[str, Experiment] = {}


def default_experiment() -> Experiment:
    """The experiment ``jobman.call`` and ``jobman.map`` use: ``$JOBMAN_DB`` (else ./jobman.db), local workers."""
    key = os.environ.get("JOBMAN_DB") or ""
    if key not in _DEFAULT:
        _DEFAULT[key] = Experiment(key or None)
    return _DEFAULT[key]


def call(fn: Callable[..., Any] | str, params: Mapping[str, Any] | None = None, /, **kwargs: Any) -> JobFuture:
    """:meth:`Experiment.call` on the default experiment (``$JOBMAN_DB``)."""
    return default_experiment().call(fn, params, **kwargs)


def map(fn: Callable[..., Any] | str, params: Iterable[Mapping[str, Any]], **kwargs: Any) -> list[JobFuture]:
    """:meth:`Experiment.map` on the default experiment (``$JOBMAN_DB``)."""
    return default_experiment().map(fn, params, **kwargs)


def pipeline(steps: Sequence[Any], *, experiment: Experiment | None = None, retry: bool = False) -> JobFuture:
    """:meth:`Experiment.pipeline` on ``experiment`` (default: ``$JOBMAN_DB``'s): each step is called
    with the previous step's future as its first parameter; the last step's future."""
    return (experiment or default_experiment()).pipeline(steps, retry=retry)


as_completed = concurrent.futures.as_completed


def wait(
    fs: Iterable[concurrent.futures.Future],
    timeout: float | None = None,
    return_when: str = concurrent.futures.ALL_COMPLETED,
    *,
    progress: bool | None = None,
) -> Any:
    """:func:`concurrent.futures.wait` with a live progress bar in a notebook (text on stderr with
    ``progress=True``); see :func:`.notebook.wait`."""
    from .notebook import wait as waiting

    return waiting(fs, timeout, return_when, progress=progress)

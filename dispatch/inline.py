"""A call's job run in the calling process (``backend="inline"``, ``@jobman.cached``): claimed as a worker
would claim it, heartbeat from a thread, recorded under its lease.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobman.jobdb import artifacts
from jobman.jobdb.callrefs import takes_calls
from jobman.jobdb.errors import JobmanError
from jobman.jobdb.status import Status
from jobman.jobdb.store import Job, Store, WorkerInfo
from jobman.jobdb.url import DbTarget

from .calls import taken_values
from .channel import Parent, StoreChannel, job_info
from .experiment import failure_why
from .provenance import CodeRecords, what_ran, where_of
from .runner import continued_state, run_here


class InlineRunner:
    """Runs an experiment's jobs here, one at a time, on the experiment's own store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._heartbeats: _Heartbeats | None = None
        self._records = CodeRecords()  # the code each function run here runs, worked out once
        self._texts_kept: set[str] = set()

    def run(self, job_id: int, fn: Callable[..., Any], exproot: Path, timeout: float | None) -> dict[str, Any] | None:
        """Run the job here if it is QUEUED (claimed, as a worker would), else leave it to whoever has it;
        the results it was recorded DONE with, if it was here. ``timeout`` is its channel's deadline."""
        store = self.store
        root = str(exproot / store.experiment)
        worker = WorkerInfo.here(backend="inline", backend_id=str(os.getpid()))
        while True:
            claimed = store.claim_job(job_id, worker, root)
            if claimed is None:
                return None
            job, lease = claimed.job, claimed.lease
            workdir = Path(job.workdir or root)
            workdir.mkdir(parents=True, exist_ok=True)
            parents = store.parents(job.id) if job.depends_on else []
            channel = StoreChannel(
                job.id,
                job.phase,
                job.attempt,
                workdir,
                dict(job.params),
                deadline=time.time() + timeout if timeout else None,
                store=store,
                lease=lease,
                artifacts=artifacts.for_database(store.target, exproot),
            )
            channel.parents = [_parent(p) for p in parents]
            info = job_info(job.id, job.target, store.experiment, job.priority, job.attempt, job.phase, workdir)
            if self._heartbeats is None:
                self._heartbeats = _Heartbeats(store.target)
                self._heartbeats.start()
            self._heartbeats.running[job.id] = lease
            try:
                taken = taken_values(job.params, parents) if takes_calls(job.params) else None
            except JobmanError as exc:  # a call it takes is gone, or gave what cannot be taken
                store.finish(job.id, lease, "FAILED", error=str(exc), why=f"could not start: {exc}")
                self._heartbeats.running.pop(job.id, None)
                return None
            try:
                start = continued_state(job, workdir, functools.partial(store.continuation, job.id))
                ending = run_here(fn, channel, start, info, taken)
            except BaseException:  # Ctrl-C: the job goes back to the queue, to resume
                store.finish(job.id, lease, "REQUEUE", why="interrupted in the calling process; put back")
                raise
            finally:
                self._heartbeats.running.pop(job.id, None)
            why = failure_why(ending.error) if ending.status == "FAILED" else None
            status = store.finish(
                job.id,
                lease,
                ending.status,
                results=ending.results,
                error=ending.error,
                why=why,
                code=self._what_ran(job, fn),
            )
            if status is Status.DONE:
                return ending.results
            if status is not Status.QUEUED:  # QUEUED: it returned INCOMPLETE, resume it here at once
                return None

    def _what_ran(self, job: Job, fn: Callable[..., Any]) -> dict[str, Any]:
        """The code and environment a job run here ran (a cached call's own function, not its
        wrapper); the texts it names kept first, once per runner."""
        ran = self._records.message(job.target, job.target, getattr(fn, "code_of", fn))
        record, texts = what_ran(ran, job.target, where_of(job.code))
        new = {k: v for k, v in texts.items() if k not in self._texts_kept}
        if new:
            self.store.keep_texts(new)
            self._texts_kept.update(new)
        return record


def _parent(job: Job) -> Parent:
    return Parent(job.id, job.phase, job.target, Path(job.workdir or "."), job.params, job.results or {})


class _Heartbeats(threading.Thread):
    """Heartbeats of the jobs an experiment runs inline: one thread, with its own connection (a
    store's writer belongs to one thread), started on the first inline job."""

    INTERVAL = 10.0

    def __init__(self, target: DbTarget) -> None:
        super().__init__(daemon=True, name="jobman-heartbeats")
        self.target = target
        self.running: dict[int, int] = {}  # job id -> lease

    def run(self) -> None:
        store = None
        while True:
            time.sleep(self.INTERVAL)
            for job_id, lease in list(self.running.items()):
                store = store or Store(self.target, check_schema=False)
                try:
                    store.heartbeat(job_id, lease)
                except JobmanError:  # taken from us (or the database is away): the finish will say
                    pass

"""Keeping enough workers running on a backend until the work is done: ``jobman dispatch``'s loop, whose
steps the Python API's background thread takes too (through the launch room)."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from jobman.jobdb.errors import DatabaseError, DatabaseUnavailable, JobmanError, LeaseLost, TargetUnimportable
from jobman.jobdb.status import BAD, ENDED, Status, in_display_order
from jobman.jobdb.store import Store

from .backends.base import Backend, WorkerSpec
from .backends.local import LocalBackend
from .interrupted import mark_interrupted
from .outage import Outage, no_connection_to_spare
from .unimportable import VARIABLE, Unimportable

logger = logging.getLogger("jobman.dispatch")
CONNECTION_CHECK_S = 2.0  # how often a full PostgreSQL server is looked for, until it is found once


@dataclass
class Tally:
    """Jobs of the experiment per status, summed over phases."""

    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, store: Store) -> Tally:
        counts: dict[str, int] = {}
        for (_phase, status), n in store.counts().items():
            counts[status] = counts.get(status, 0) + n
        return cls(counts)

    def __getitem__(self, status: Status | str) -> int:
        return self.counts.get(str(status), 0)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(self[s] for s in ENDED)

    @property
    def active(self) -> bool:
        """Work is left that can still happen."""
        return self["QUEUED"] > 0 or self["RUNNING"] > 0

    @property
    def bad(self) -> int:
        return sum(self[s] for s in BAD)

    def line(self) -> str:
        return ", ".join(f"{n} {s}" for s, n in in_display_order(self.counts))


class Watcher(Protocol):
    def scan(self) -> object: ...


@dataclass
class DispatchOptions:
    workers: int
    poll_interval: float = 0.5
    scan_interval: float = 5.0
    stop_on_interrupt: bool = True  # Ctrl-C or giving up stops the workers (False: they go on, e.g. on Slurm)
    outage_wait: float | None = None  # how long to wait out a database outage (None: the default)
    max_failed_starts: int = 5  # workers failing in a row before dispatch gives up
    respawn_delay: float = 0.5  # before starting a worker after one failed; doubles each time


class DispatchError(JobmanError):
    """Dispatch stopped: its workers could not run."""


class ExitedWorkers(Protocol):
    def exited(self) -> list[tuple[str, int, str]]: ...


class Dispatcher:
    """Starts workers as jobs become ready, tops them up as phases unlock, returns when all is done."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        spec: WorkerSpec,
        options: DispatchOptions,
        watcher: Watcher | None = None,
        on_tick: Callable[[Tally, int], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.spec = spec
        self.options = options
        self.watcher = watcher
        self.on_tick = on_tick or (lambda _t, _w: None)
        self.log = log or logger.warning  # what goes wrong on the way: failed workers, a database away
        self.outage = Outage(self.log, options.outage_wait)
        self.failed_in_a_row = 0
        self.worker_starts = 0
        self._hold_until = 0.0  # no new worker before this (time.monotonic), after failed ones
        self._last_scan = 0.0
        self._scan_error: str | None = None
        self._said_full = False  # the server refusing connections is said once
        self._last_connection_check = 0.0
        # Targets its workers cannot import, shared with them (None: the first worker to meet one stops it all).
        self.unimportable: Unimportable | None = None

    def run(self) -> Tally:
        """Until the experiment is finished; on any other way out (Ctrl-C, giving up) the workers are
        stopped first, and they put their jobs back. Local workers
        share the targets they cannot import: one job of such a target fails, its others are left
        QUEUED, the other targets' jobs run, and then :class:`TargetUnimportable` says why."""
        # A file on this host: its workers' own (Slurm's run elsewhere, each stopping at its first).
        environment = self.backend.environment if isinstance(self.backend, LocalBackend) else None
        if environment is not None:
            fd, path = tempfile.mkstemp(prefix="jobman-unimportable-", suffix=".jsonl")
            os.close(fd)
            self.unimportable = Unimportable(path)
            environment[VARIABLE] = path
        try:
            while True:
                tally = self.outage.call(lambda: Tally.of(self.store), "reading progress")
                alive = self.keep_workers(tally)
                self.on_tick(tally, alive)
                if not self._left(tally) and alive == 0:
                    if self.unimportable is not None and self.unimportable.known():
                        raise TargetUnimportable(self.unimportable.sentence())
                    return tally
                self.scan_when_due()
                self.backend.wait(self.options.poll_interval)
        except BaseException as exc:
            if self.options.stop_on_interrupt:
                self.backend.stop_workers()
                self._put_back_jobs_of_stopped_workers(exc)
            raise
        finally:
            if self.unimportable is not None:
                self.unimportable.remove()
                if environment is not None:
                    environment.pop(VARIABLE, None)

    def _queued(self, tally: Tally) -> int:
        """The QUEUED jobs a worker can take: those of targets found unimportable are left out."""
        skip = self.unimportable.known() if self.unimportable is not None else frozenset()
        if not skip or not tally["QUEUED"]:
            return tally["QUEUED"]
        return self.outage.call(lambda: self.store.outstanding(skip), "reading progress")["QUEUED"]

    def _left(self, tally: Tally) -> bool:
        """Work is left that its workers can still do."""
        return tally["RUNNING"] > 0 or self._queued(tally) > 0

    def keep_workers(self, tally: Tally) -> int:
        """Start enough workers for the ready jobs, up to ``workers``, unless failed ones hold starts back;
        how many were alive before (workers failing too often in a row raise :class:`DispatchError`)."""
        self._count_exits()
        alive = self.backend.running_workers()
        queued = self._queued(tally)
        wanted = min(self.options.workers, queued + tally["RUNNING"])
        if queued and alive < wanted and time.monotonic() >= self._hold_until:
            logger.debug("%d worker(s) alive, %d wanted: starting %d", alive, wanted, wanted - alive)
            self.backend.start_workers(self.spec, wanted - alive)
            self.worker_starts += wanted - alive
        return alive

    def scan_when_due(self) -> None:
        """Look for crashed jobs every ``scan_interval`` seconds, if there is a watcher, and at the
        connections the server has left."""
        if self.watcher is not None and time.time() - self._last_scan >= self.options.scan_interval:
            self._scan(self.watcher)
            self._last_scan = time.time()
        if time.time() - self._last_connection_check >= CONNECTION_CHECK_S:
            self._last_connection_check = time.time()
            self.check_connections()

    def check_connections(self) -> None:
        """Say once, in one sentence, that the PostgreSQL server refuses connections, and what to do."""
        if self._said_full:
            return
        sentence = no_connection_to_spare(self.store)
        if sentence is None:
            return
        self.log(sentence)
        self._said_full = True

    def _put_back_jobs_of_stopped_workers(self, exc: BaseException) -> None:
        """After its workers were stopped: any job still RUNNING under one of them (a worker that could
        not write, or was killed after its grace) is put back without spending an attempt; where the
        database refuses even that, the job is marked as interrupted (``dispatch.interrupted``), for the
        next dispatch or monitor to put back once it can."""
        started = getattr(self.backend, "started_ids", None)
        if started is None:
            return
        ours = started()
        cause = str(exc) or type(exc).__name__
        why = f"its dispatch stopped ({cause.splitlines()[0][:300]})"
        try:
            running = self.store.running_brief()
        except JobmanError as err:
            self.log(f"could not look for jobs left running by the stopped workers: {err}")
            return
        host = socket.gethostname()
        for job in running:
            if job.backend_id not in ours or job.host != host:
                continue
            try:
                self.store.finish(job.id, job.lease, "REQUEUE", why=f"{why}; put back")
            except LeaseLost:
                pass
            except JobmanError as err:
                mark_interrupted(job.workdir, job.lease, f"{why}, and the database refused to put it back: {err}")

    def _count_exits(self) -> None:
        """Workers that exited with an error, counted in a row; too many, and dispatch gives up."""
        exited = getattr(self.backend, "exited", None)
        if exited is None:
            return
        for backend_id, code, last_line in exited():
            if code <= 0:  # done, or killed by a signal (that is the monitor's business)
                self.failed_in_a_row = 0
                continue
            if code == TargetUnimportable.exit_code and self.unimportable is not None:
                continue  # it ran what it could; the target is in the shared file, said at the end
            self.failed_in_a_row += 1
            cause = last_line or f"worker {backend_id} exited with code {code}"
            if code == TargetUnimportable.exit_code:  # another worker would fail the same way
                raise TargetUnimportable(cause.removeprefix("jobman: "))
            if self.failed_in_a_row >= self.options.max_failed_starts:
                raise DispatchError(
                    f"{self.failed_in_a_row} workers in a row failed, the last one with: "
                    f"{cause.removeprefix('jobman: ')}"
                )
            delay = self.options.respawn_delay * 2 ** (self.failed_in_a_row - 1)
            self.log(f"worker {backend_id} failed ({cause.removeprefix('jobman: ')}); starting another in {delay:g} s")
            self._hold_until = time.monotonic() + delay

    def _scan(self, watcher: Watcher) -> None:
        """Look for crashed jobs; a database that refuses the scan's writes is said once, not fatal here
        (the workers meet it too, and their failures stop dispatch)."""
        try:
            self.outage.call(watcher.scan, "looking for crashed jobs")
        except DatabaseUnavailable:
            raise
        except DatabaseError as exc:
            if str(exc) != self._scan_error:
                self.log(f"looking for crashed jobs failed: {exc}")
            self._scan_error = str(exc)

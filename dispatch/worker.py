"""The worker loop: claim, run, record, claim again, until nothing is ready or a limit is hit.

``jobman worker`` and jobman's ``jobman sql`` are this loop. SIGTERM, SIGINT and
SIGUSR1 (Slurm's warning before a time limit) make it stop: the running job is
told to checkpoint (``channel.should_stop()``), put back in the queue without
counting an attempt, and the worker exits. It never leaves a job RUNNING.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jobman.jobdb import artifacts
from jobman.jobdb.errors import DatabaseUnavailable, JobmanError, ServerFull, TargetUnimportable
from jobman.jobdb.store import Claimed, Store, WorkerInfo

from .forkhandle import ForkServer
from .interrupted import mark_interrupted
from .lifetime import become_subreaper
from .outage import Outage
from .runner import LOST, RunLimits, Runner


@dataclass
class WorkerOptions:
    workdir_root: Path
    limits: RunLimits = field(default_factory=RunLimits)
    max_jobs: int | None = None  # None: no limit
    wait: bool = True  # while other jobs run, wait for the ones they unlock
    poll_interval: float = 1.0
    idle_timeout: float | None = None  # give up waiting after this long without a claim
    outage_wait: float | None = None  # how long to wait out a database outage (None: the default)


@dataclass
class WorkerSummary:
    ran: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    stopped_by_signal: bool = False

    def line(self) -> str:
        parts = ", ".join(f"{n} {s}" for s, n in sorted(self.by_status.items()))
        return f"worker ran {self.ran} job(s)" + (f": {parts}" if parts else "")


def worker_identity() -> WorkerInfo:
    """Who this worker is, including the Slurm job it runs in, if any."""
    env = os.environ
    if env.get("SLURM_JOB_ID"):
        array_job, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
        backend_id = f"{array_job}_{task}" if array_job and task else env["SLURM_JOB_ID"]
        return WorkerInfo.here(backend="slurm", backend_id=backend_id, log_path=env.get("JOBMAN_WORKER_LOG"))
    return WorkerInfo.here(backend="local", backend_id=str(os.getpid()), log_path=env.get("JOBMAN_WORKER_LOG"))


# Workers are the parallelism: one BLAS thread each, unless the user says otherwise. Set before a
# job's module imports NumPy (small matrix products ran ~50x slower with 2 threads per worker).
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def one_blas_thread() -> None:
    """One BLAS thread per job, unless the environment says otherwise; before the fork server
    starts, whose jobs inherit its environment."""
    for name in BLAS_THREAD_VARIABLES:
        os.environ.setdefault(name, "1")


class StoppableLoop:
    """A loop that runs jobs through a :class:`Runner` until a signal asks it to stop: the worker's,
    and the Slurm one-job runner's. SIGTERM, SIGINT and SIGUSR1 (Slurm's warning before a time limit)
    set ``_stop_signal``; the runner sees it and puts the running job back from its checkpoint."""

    name = "loop"  # its logger is jobman.NAME; `jobman worker` prints its lines as [jobman NAME PID] ...

    def __init__(
        self,
        store: Store,
        options: WorkerOptions,
        log: Callable[[str], None] | None = None,
        server: ForkServer | None = None,
    ) -> None:
        self.store = store
        self.options = options
        self.logger = logging.getLogger(f"jobman.{self.name}")
        self.log = log or self.logger.info
        self._stop_signal: int | None = None
        self.outage = self._outage()
        self.runner = Runner(
            store,
            options.limits,
            stopping=lambda: self._stop_signal is not None,
            log=self.log,
            outage=self.outage,
            server=server,
        )
        self.runner.artifacts = artifacts.location(
            store.target.dialect, store.target.artifacts, store.target.sqlite_path, options.workdir_root
        )

    def _outage(self) -> Outage | None:
        """How a database outage is waited out (None: the runner's default)."""
        return None

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)

    def workdir_root(self) -> str:
        """Where this experiment's job workdirs go."""
        return str(self.options.workdir_root.resolve() / self.store.experiment)


class Worker(StoppableLoop):
    """One worker process's loop over one experiment."""

    name = "worker"
    outage: Outage  # always one here: a worker waits out a database outage itself (see _outage)

    def __init__(
        self,
        store: Store,
        options: WorkerOptions,
        log: Callable[[str], None] | None = None,
        server: ForkServer | None = None,
    ) -> None:
        one_blas_thread()
        super().__init__(store, options, log, server)

    def _outage(self) -> Outage:
        return Outage(self.log, self.options.outage_wait, stopping=lambda: self._stop_signal is not None)

    def install_signal_handlers(self) -> None:
        super().install_signal_handlers()
        stop_with_dispatcher(self._on_signal)
        become_subreaper()  # should the fork server die under a job, what the job started is found

    def run(self) -> WorkerSummary:
        summary = WorkerSummary()
        identity = worker_identity()
        root = self.workdir_root()
        self.runner.server.warm()
        # What the worker holds from now on (modules, SQLAlchemy's and the store's objects) is left out
        # of its garbage collections, which otherwise walk all of it every few hundred jobs.
        gc.freeze()
        idle_since = time.time()
        idle_polls = 0
        claimed = None  # the next job, when the last one's record claimed it
        try:
            while self._stop_signal is None:
                if self.options.max_jobs is not None and summary.ran >= self.options.max_jobs:
                    break
                if claimed is None:
                    # Once nothing was ready, a server that cannot be reached is not waited for: the
                    # jobs others run are theirs to record, and this worker holds nothing.
                    idle = idle_polls > 0
                    waits = _never if idle else _always
                    skip = self.runner.unimportable.known()  # the targets found unimportable: their jobs stay QUEUED
                    try:
                        claimed = self.outage.call(
                            functools.partial(self.store.claim, identity, root, skip=skip), "claiming a job", waits
                        )
                    except DatabaseUnavailable as exc:
                        if not idle:
                            raise
                        self._exit_unreachable(exc)
                        break
                if claimed is None:
                    wait = self._should_wait(idle_since)  # on the connection the claim was tried on
                    # Waiting for others' jobs to unlock more, a worker holds no connection: those others
                    # need one to record their jobs, and a full server would otherwise never free one.
                    self.store.keep_connection(False)
                    if not wait:
                        break
                    # Soon at first (the jobs others run may be about to end), then every poll_interval.
                    pause = min(self.options.poll_interval, 0.05 * 2**idle_polls)
                    idle_polls += 1
                    self.logger.debug("nothing ready; looking again in %.2f s", pause)
                    time.sleep(pause * random.uniform(0.7, 1.3))
                    # The next look (a claim, then what is left) on one connection: one connect a poll.
                    self.store.keep_connection(True)
                    continue
                idle_polls = 0
                self.store.keep_connection(True)
                job = claimed.job
                self.log(f"running job {job.id} (attempt {job.attempt}) {job.target}")
                more = self.options.max_jobs is None or summary.ran + 1 < self.options.max_jobs
                status, claimed = self.runner.run_then_claim(claimed, (identity, root) if more else None)
                summary.ran += 1
                summary.by_status[status] = summary.by_status.get(status, 0) + 1
                self.log(f"job {job.id} {'was taken from this worker' if status == LOST else status}")
                idle_since = time.time()
        finally:
            if claimed is not None:  # claimed with the last record, never started: back to the queue
                self._put_back(claimed)
            self.runner.close()
        summary.stopped_by_signal = self._stop_signal is not None
        if self.runner.cannot_import is not None:  # the other targets' jobs ran: now say why some did not
            raise TargetUnimportable(self.runner.cannot_import)
        return summary

    def _put_back(self, claimed: Claimed) -> None:
        try:
            self.outage.call(
                lambda: self.store.finish(
                    claimed.job.id, claimed.lease, "REQUEUE", why="its worker was stopped before starting it; put back"
                ),
                f"putting job {claimed.job.id} back",
            )
        except JobmanError as exc:  # the monitor will find it, its worker gone, and this mark
            mark_interrupted(claimed.job.workdir, claimed.lease, f"its worker could not put it back: {exc}")
            self.logger.warning("could not put job %s back: %s", claimed.job.id, exc)

    def _should_wait(self, idle_since: float) -> bool:
        """Nothing is ready: wait only while running jobs may still unlock others."""
        if not self.options.wait or self._stop_signal is not None:
            return False
        if self.options.idle_timeout is not None and time.time() - idle_since > self.options.idle_timeout:
            return False
        try:
            skip = self.runner.unimportable.known()  # their jobs wait for a fix, not for others
            left = self.outage.call(lambda: self.store.outstanding(skip), "looking for jobs left", waits=_never)
        except DatabaseUnavailable as exc:
            self._exit_unreachable(exc)
            return False
        return left["QUEUED"] > 0 or left["RUNNING"] > 0

    def _exit_unreachable(self, exc: DatabaseUnavailable) -> None:
        """Says why a worker with nothing to claim exits rather than wait: a full server is left one
        slot more, and one that is away has its running jobs' workers to wait for it."""
        state = "full" if isinstance(exc, ServerFull) else "unreachable"
        self.log(f"nothing ready to claim and the database server is {state} ({exc}): this worker exits")


def _always(_exc: DatabaseUnavailable) -> bool:
    return True


def _never(_exc: DatabaseUnavailable) -> bool:
    return False


def stop_with_dispatcher(on_signal: Callable[[int, object], None]) -> None:
    """A worker started by a local dispatch gets SIGTERM when that dispatch ends, however it ends
    (even SIGKILL), and so stops, putting its job back: no worker outlives its dispatcher."""
    from .lifetime import DIE_WITH_VARIABLE, signal_on_parent_death

    pid = os.environ.pop(DIE_WITH_VARIABLE, None)
    if pid and signal_on_parent_death(signal.SIGTERM) and os.getppid() != int(pid):  # it ended already
        on_signal(signal.SIGTERM, None)

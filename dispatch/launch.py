"""Starting workers for an experiment on a backend: the one place ``jobman dispatch`` and the Python API
share.

A :class:`Launch` is made from a :class:`LaunchPlan` (the backend, how many workers, the settings each
worker gets) and an open store. It builds the backend, hands each worker the database's URL without
its password (the password goes in the workers' environment: a command line is readable by every user
of the host), and runs the crash watcher for what it started. Its verbs are the ways of dispatching:
keep workers running until the experiment ends (local, or Slurm with ``--follow``), submit one array
of pull workers and return, or submit one Slurm job per ready job.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from jobman.jobdb.errors import UsageError
from jobman.jobdb.store import Store
from jobman.jobdb.url import DbTarget

from .backends.base import WorkerSpec
from .dispatcher import Dispatcher, DispatchOptions, Tally
from .worker_settings import WorkerSettings

if TYPE_CHECKING:
    from .backends.local import LocalBackend
    from .backends.slurm import SlurmBackend
    from .monitor import Monitor
    from .slurm_dispatch import JobPerTaskDispatcher, Submitted

BACKENDS = ("local", "slurm")
SLURM_DEFAULT_WORKERS = 64  # pull workers submitted at most, unless told how many


def worker_access(target: DbTarget) -> tuple[str, dict[str, str]]:
    """The URL (with ``?table=``) workers are started with, and the variables that give them the rest
    of it: a PostgreSQL password goes in PGPASSWORD, which only this user can read, never on their argv."""
    from sqlalchemy.engine import URL, make_url

    url = make_url(target.sqlalchemy_url)
    if target.dialect != "postgresql" or url.password is None:
        return target.with_table(), {}
    # Made anew: URL.set(password=None) leaves the password as it was.
    bare = URL.create(url.drivername, url.username, None, url.host, url.port, url.database, url.query).render_as_string(
        hide_password=False
    )
    return dataclasses.replace(target, sqlalchemy_url=bare).with_table(), {"PGPASSWORD": str(url.password)}


@dataclass(frozen=True)
class LaunchPlan:
    """Where an experiment's workers run, how many at once, and what each is started with."""

    backend: str = "local"  # "local" or "slurm"
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    workers: int | None = None  # None: local, the cores; slurm, one per ready job up to SLURM_DEFAULT_WORKERS
    environment: Mapping[str, str] = field(default_factory=dict)  # more variables for the workers
    sbatch: str | Sequence[str] = ""  # slurm: options of every Slurm job
    array_parallelism: int | None = None  # slurm: array tasks running at once, at most
    requeue: bool | None = None  # slurm: --requeue / --no-requeue; None: the cluster's setting


class Launch:
    """The workers of one experiment on one backend: the backend, the spec each worker is started
    with, and the watcher that finds their crashed jobs."""

    def __init__(self, store: Store, plan: LaunchPlan) -> None:
        from .monitor import Monitor, MonitorOptions

        if plan.backend not in BACKENDS:
            raise ValueError(f"no backend {plan.backend!r}")
        self.store = store
        self.plan = plan
        url, secrets = worker_access(store.target)
        exproot = str(Path(plan.worker.exproot).resolve())
        self.spec = WorkerSpec(url, dataclasses.replace(plan.worker, exproot=exproot))
        environment = {**secrets, **plan.environment}
        self.backend: LocalBackend | SlurmBackend
        if plan.backend == "local":
            from .backends.local import LocalBackend

            self.log_dir = Path(exproot) / store.experiment / "_workers"
            self.backend = LocalBackend(self.log_dir, environment=environment)
            # A local worker's end shows in its pid; a Slurm job's in its allocation's state (CANCELLED,
            # TIMEOUT, ...), which says more than a missing pid, even for a worker that ran on this host.
            self.watcher: Monitor = Monitor(store, MonitorOptions(relaunch=True), backends={"local": self.backend})
            self._count_slots()
        else:
            from .backends.slurm import SlurmBackend

            self.log_dir = Path(exproot) / store.experiment / "_slurm"
            self.backend = SlurmBackend(
                sbatch_options=plan.sbatch,
                array_parallelism=plan.array_parallelism,
                log_dir=self.log_dir,
                job_name=f"jobman-{store.experiment}",
                merge_output=True,
                requeue=plan.requeue,
                environment=environment,
            )
            self.watcher = Monitor(
                store, MonitorOptions(relaunch=True, check_pids=False), backends={"slurm": self.backend}
            )

    def _count_slots(self) -> None:
        """Local: the workers share the dispatch's slots (one per worker), each job holding as many as it
        has ranks. Counted from the start, whether or not a job of several ranks is there yet, so that one
        scheduled while the dispatch runs never runs beside more processes than it was given. A job wider
        than them all is refused here, before any worker starts; one scheduled later fails, when a worker
        meets it, with the same reason."""
        gang = self.store.widest_gang()
        if gang is not None and gang[1] > self.workers:
            job_id, ranks = gang
            raise UsageError(
                f"job {job_id} has {ranks} ranks, more than the {self.workers} slots of this dispatch: "
                f"dispatch with -j {ranks} or more"
            )
        settings = self.spec.settings
        slot_dir = str(self.log_dir / "slots" / str(os.getpid()))  # this dispatch's: another has slots of its own
        processes = dataclasses.replace(settings.processes, slots=self.workers, slot_dir=slot_dir)
        self.spec = dataclasses.replace(self.spec, settings=dataclasses.replace(settings, processes=processes))

    def _no_gangs_for_pull_workers(self) -> None:
        """Slurm's pull workers are one task each: a job of several ranks needs a Slurm job of its own."""
        gang = self.store.widest_gang()
        if gang is not None:
            raise UsageError(
                f"job {gang[0]} has {gang[1]} ranks: on Slurm, jobs of several ranks run with --one-job-per-task "
                "(each its own Slurm job of --ntasks ranks)"
            )

    @property
    def workers(self) -> int:
        """Workers at once: as the plan says, else the backend's default."""
        if self.plan.workers:
            return self.plan.workers
        if self.plan.backend == "slurm":
            return SLURM_DEFAULT_WORKERS
        return self.plan.worker.processes.gpu_workers or os.cpu_count() or 1

    def dispatcher(
        self, on_tick: Callable[[Tally, int], None] | None = None, poll_interval: float | None = None
    ) -> Dispatcher:
        """The loop that keeps enough workers running for the ready jobs, and watches for crashes.

        On Slurm it polls less often, and leaves the workers running when it stops (Ctrl-C)."""
        slurm = self.plan.backend == "slurm"
        if slurm:
            self._no_gangs_for_pull_workers()
        options = DispatchOptions(self.workers, outage_wait=self.plan.worker.outage_wait, stop_on_interrupt=not slurm)
        if poll_interval is not None or slurm:
            options.poll_interval = poll_interval if poll_interval is not None else 2.0
        return Dispatcher(self.store, self.backend, self.spec, options, watcher=self.watcher, on_tick=on_tick)

    def run(self, on_tick: Callable[[Tally, int], None] | None = None) -> Tally:
        """Keep workers running until the experiment is finished; the tally it ended with."""
        try:
            return self.dispatcher(on_tick).run()
        finally:
            self.close()

    def submit_array(self) -> tuple[Tally, list[str]]:
        """Slurm: one array of pull workers, one per ready job up to ``workers``, and return; the tally
        it was sized by, and the task ids (none when no job is ready)."""
        self._no_gangs_for_pull_workers()
        tally = Tally.of(self.store)
        count = min(self.workers, tally["QUEUED"])
        if count == 0:
            return tally, []
        return tally, self.backend.start_workers(self.spec, count)

    def job_per_task(
        self,
        per_phase: Mapping[int, list[str]],
        on_tick: Callable[[Tally, int], None] | None = None,
        on_submit: Callable[[Submitted], None] | None = None,
    ) -> JobPerTaskDispatcher:
        """Slurm: a dispatcher that submits one Slurm job per ready job (``jobman run-job``), with the
        options of ``per_phase`` for the jobs of each phase; at most ``workers`` unfinished if given."""
        from .backends.slurm import SlurmBackend
        from .slurm_dispatch import JobPerTaskDispatcher, JobPerTaskOptions

        if not isinstance(self.backend, SlurmBackend):
            raise ValueError("one Slurm job per job is for the slurm backend")
        options = JobPerTaskOptions(dict(per_phase), max_outstanding=self.plan.workers)
        return JobPerTaskDispatcher(
            self.store, self.backend, self.spec, options, watcher=self.watcher, on_tick=on_tick, on_submit=on_submit
        )

    def slurm_jobs(self) -> list[str]:
        """The Slurm jobs this launch submitted (an array counts once), oldest first."""
        submitted = getattr(self.backend, "submitted", [])
        return sorted({job_id.split("_")[0] for job_id in submitted}, key=int)

    def stop(self, grace: float = 30.0) -> None:
        """Stop every worker this launch started (they put their jobs back), then what runs them."""
        from .backends.local import LocalBackend

        if isinstance(self.backend, LocalBackend):
            self.backend.stop_workers(grace=grace)
        else:
            self.backend.stop_workers()
        self.close()

    def close(self) -> None:
        """Stop what starts local workers (the zygote) once they are gone; the workers themselves go on."""
        from .backends.local import LocalBackend

        if isinstance(self.backend, LocalBackend):
            self.backend.close()

"""One Slurm job per jobman job (``jobman dispatch --one-job-per-task``), and the run inside it.

Each QUEUED job becomes its own Slurm job running ``jobman run-job DB ID``, with
its own sbatch options: the dispatch's ``--sbatch``, then its phase's
``--sbatch-phase``, then the job's ``resources`` parameter (later options win).
Phases stay in jobman's database, not in Slurm's ``afterok``: a job is submitted
once it is QUEUED, so a relaunched parent or a reset needs nothing from Slurm.

No job is submitted twice: ``Store.assign`` records the Slurm id on the QUEUED
job in one conditional update, and a submitter that loses that race cancels its
Slurm job. The Slurm job claims exactly that job (``Store.claim_job``). A Slurm
job that ends without claiming its job (cancelled while pending, a node that
failed at start) is found by :meth:`JobPerTaskDispatcher.release_ended`: that
costs the job an attempt, and it is submitted again.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobman.jobdb.errors import UsageError
from jobman.jobdb.status import Status
from jobman.jobdb.store import Job, Store

from .backends.base import WorkerSpec
from .backends.slurm import SlurmBackend, parse_sbatch_options
from .dispatcher import Tally, Watcher
from .runner import LOST
from .worker import StoppableLoop, WorkerOptions, worker_identity

#: The job parameter that holds a job's own sbatch options.
RESOURCES_PARAM = "resources"
RUN_JOB_COMMAND = (sys.executable, "-m", "jobman.cli.main", "run-job")


# -- what each job asks of Slurm -----------------------------------------------------


def resources_options(value: Any) -> list[str]:
    """A job's ``resources`` parameter as sbatch options.

    A string is split like ``--sbatch`` (``"--mem=4G --cpus-per-task=2"``); a list
    holds options as they are; a dict maps option names to values
    (``{"mem": "4G", "gres": "gpu:1", "exclusive": True}``).
    """
    if value is None:
        return []
    if isinstance(value, str):
        return parse_sbatch_options(value)
    if isinstance(value, Mapping):
        out = []
        for key, item in value.items():
            name = "--" + str(key).lstrip("-")
            if item is True:
                out.append(name)
            elif item not in (False, None):
                out.append(f"{name}={item}")
        return out
    if isinstance(value, (list, tuple)):
        return [str(item) for item in value]
    raise UsageError(
        f"the {RESOURCES_PARAM!r} parameter must be a string, list or dict of sbatch options, "
        f"not {type(value).__name__}"
    )


def parse_phase_options(values: Sequence[str]) -> dict[int, list[str]]:
    """``--sbatch-phase 1='--mem=4G'`` (repeatable) as {phase: options}; a phase given twice adds up."""
    out: dict[int, list[str]] = {}
    for value in values:
        phase, sep, options = value.partition("=")
        if not sep or not phase.strip().isdigit():
            raise UsageError(f"--sbatch-phase takes PHASE=OPTIONS, like 1='--mem=4G', not {value!r}")
        out.setdefault(int(phase), []).extend(parse_sbatch_options(options))
    return out


def job_sbatch_options(job: Job, per_phase: Mapping[int, Sequence[str]]) -> list[str]:
    """The options of this job's own Slurm job beyond the dispatch's ``--sbatch``: a job of N ranks asks
    for N tasks (srun starts ranks 1..N-1 beside the job's process)."""
    tasks = [f"--ntasks={job.ranks}"] if job.ranks > 1 else []
    return [*tasks, *per_phase.get(job.phase, ()), *resources_options(job.params.get(RESOURCES_PARAM))]


# -- the submitting side --------------------------------------------------------------


@dataclass
class JobPerTaskOptions:
    per_phase: dict[int, list[str]] = field(default_factory=dict)
    max_outstanding: int | None = None  # Slurm jobs submitted and not finished, at most
    poll_interval: float = 2.0
    scan_interval: float = 5.0
    command: tuple[str, ...] = RUN_JOB_COMMAND


@dataclass(frozen=True)
class Submitted:
    """A job and the Slurm job made for it, with that Slurm job's log."""

    job_id: int
    slurm_id: str
    log_path: str


class JobPerTaskDispatcher:
    """Submits one Slurm job per QUEUED job; with :meth:`run`, keeps doing so until the experiment ends."""

    def __init__(
        self,
        store: Store,
        backend: SlurmBackend,
        spec: WorkerSpec,
        options: JobPerTaskOptions,
        watcher: Watcher | None = None,
        on_tick: Callable[[Tally, int], None] | None = None,
        on_submit: Callable[[Submitted], None] | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.options = options
        self.watcher = watcher
        self.on_tick = on_tick or (lambda _t, _n: None)
        self.on_submit = on_submit or (lambda _s: None)
        self.spec = spec  # the database URL and the limits of each job's run

    def argv(self, job: Job) -> list[str]:
        """What the Slurm job of ``job`` runs: ``jobman run-job DB ID`` with the dispatch's limits."""
        return [*self.options.command, self.spec.db_url, str(job.id), *self.spec.settings.argv()]

    def submit_ready(self, queued: Sequence[Job] | None = None) -> list[Submitted]:
        """Submit every QUEUED job no Slurm job waits for (within ``max_outstanding``); highest priority first."""
        if queued is None:
            queued = self.store.jobs(status=[Status.QUEUED], with_deps=False)
        ready = sorted((j for j in queued if not j.awaiting_allocation), key=lambda j: (-j.priority, j.id))
        if self.options.max_outstanding is not None:
            outstanding = sum(j.awaiting_allocation for j in queued) + Tally.of(self.store)["RUNNING"]
            ready = ready[: max(0, self.options.max_outstanding - outstanding)]
        done = []
        for job in ready:
            slurm_id = self.backend.submit_job(self.argv(job), job_sbatch_options(job, self.options.per_phase))
            log_path = str(self.backend.log_paths(slurm_id)[0])
            if not self.store.assign(job.id, "slurm", slurm_id, log_path):
                self.backend.cancel([slurm_id])  # another dispatch got there first, or the job moved on
                continue
            submitted = Submitted(job.id, slurm_id, log_path)
            self.on_submit(submitted)
            done.append(submitted)
        return done

    def release_ended(self, queued: Sequence[Job] | None = None) -> list[int]:
        """Jobs whose Slurm job ended before it claimed them: count the attempt, make them submittable."""
        if queued is None:
            queued = self.store.jobs(status=[Status.QUEUED], with_deps=False)
        # (job, its Slurm job): awaiting an allocation, a job has its backend_id
        waiting = [
            (j, j.backend_id)
            for j in queued
            if j.awaiting_allocation and j.backend == "slurm" and j.backend_id is not None
        ]
        if not waiting:
            return []
        states = self.backend.allocation_states([backend_id for _, backend_id in waiting])
        released = []
        for job, backend_id in waiting:
            state = states[backend_id]
            if state.alive:
                continue
            why = f"{state.reason.rstrip('.')} before it started job {job.id}"
            if self.store.release(job.id, backend_id, why) is not None:
                released.append(job.id)
        return released

    def run(self) -> Tally:
        """Submit as jobs become QUEUED and watch for crashes until nothing is left to run."""
        last_scan = 0.0
        while True:
            if time.time() - last_scan >= self.options.scan_interval:
                self.release_ended()
                if self.watcher is not None:
                    self.watcher.scan()
                last_scan = time.time()
            queued = self.store.jobs(status=[Status.QUEUED], with_deps=False)
            self.submit_ready(queued)
            tally = Tally.of(self.store)
            self.on_tick(tally, tally["RUNNING"] + sum(j.awaiting_allocation for j in queued))
            if not tally.active:
                return tally
            time.sleep(self.options.poll_interval)


# -- the side that runs inside the Slurm job ----------------------------------------------


class RunJob(StoppableLoop):
    """Runs one given job inside the allocation made for it (``jobman run-job``).

    Inside Slurm it claims the job only if the job was assigned to this Slurm job
    (or this Slurm job ran it last: a job that returned INCOMPLETE, or crashed and
    was relaunched, runs again here). Outside Slurm it claims the job if QUEUED.
    SIGTERM, SIGINT and SIGUSR1 (Slurm's warning before the time limit) put the job
    back in the queue from its checkpoint, without counting an attempt.
    """

    name = "run-job"

    def __init__(
        self,
        store: Store,
        job_id: int,
        options: WorkerOptions,
        assignment_wait: float = 60.0,
        log: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(store, options, log)
        self.job_id = job_id
        self.assignment_wait = assignment_wait

    def run(self) -> str | None:
        """Run the job until it leaves the queue; its last status, or None if it was not ours to run."""
        identity = worker_identity()
        mine = identity.backend_id if identity.backend == "slurm" else None
        root = self.workdir_root()
        deadline = time.time() + self.assignment_wait
        status: str | None = None
        try:
            while self._stop_signal is None:
                claimed = self.store.claim_job(self.job_id, identity, root, assigned_to=mine)
                if claimed is None:
                    if status is not None or not self._worth_waiting(mine, deadline):
                        break
                    time.sleep(0.2)
                    continue
                job = claimed.job
                self.log(f"running job {job.id} (attempt {job.attempt}) {job.target}")
                status = self.runner.run(claimed)
                self.log(f"job {job.id} {'was taken from this run' if status == LOST else status}")
                if status != Status.QUEUED.value:
                    break
        finally:
            self.runner.close()
        return status

    def _worth_waiting(self, mine: str | None, deadline: float) -> bool:
        """Not claimable yet: wait only while the dispatch may still be recording this Slurm job on it."""
        job = self.store.job(self.job_id)
        if job.status is not Status.QUEUED:
            self.log(f"job {job.id} is {job.status.value}: nothing to run")
            return False
        if job.awaiting_allocation:
            self.log(f"job {job.id} waits for {job.backend} job {job.backend_id}, not this one: nothing to run")
            return False
        if mine is None:  # outside Slurm a QUEUED job is claimed at once; it just left the queue
            return False
        if time.time() >= deadline:
            self.log(f"job {job.id} was not assigned to Slurm job {mine} within {self.assignment_wait:.0f} s")
            return False
        return True

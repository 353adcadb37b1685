"""What a worker process is started with, as one value: its limits, its job processes, its log level.

``jobman worker`` parses its options into a :class:`WorkerSettings`; a dispatch makes one and hands
it to each worker it starts: as a message to the local zygote (no command line parsed again), or
as the ``jobman worker`` options of a fresh interpreter or a Slurm task (:meth:`WorkerSettings.argv`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .machine import JobProcesses

DEFAULT_EXPROOT = "jobman_runs"
DEFAULT_HEARTBEAT = 10.0
DEFAULT_GRACE = 30.0


@dataclass(frozen=True)
class WorkerSettings:
    """How one worker runs: where workdirs go, each job's limits, when to stop, its job processes."""

    exproot: str = DEFAULT_EXPROOT  # job workdirs go to EXPROOT/EXPERIMENT/JOB_ID
    timeout: float | None = None  # a job's wall-time limit (s)
    heartbeat: float = DEFAULT_HEARTBEAT
    grace: float = DEFAULT_GRACE  # between asking a job to stop and killing it (s)
    max_jobs: int | None = None
    wait: bool = True  # while other jobs run, wait for the ones they unlock
    idle_timeout: float | None = None
    outage_wait: float | None = None  # None: JOBMAN_OUTAGE_WAIT, else the default
    save_every: float | None = None  # jobman sql's --save-every; no `jobman worker` option says it
    processes: JobProcesses = field(default_factory=JobProcesses)
    verbose: bool = False

    def argv(self) -> list[str]:
        """The ``jobman worker`` (or ``jobman run-job``) options that say the same, for a worker started
        as a command. The limits are always written out, so a task's command line shows them."""
        args = ["--exproot", self.exproot, "--heartbeat", str(self.heartbeat), "--grace", str(self.grace)]
        if self.verbose:
            args += ["--verbose"]
        if self.timeout:
            args += ["--timeout", str(self.timeout)]
        if self.outage_wait is not None:
            args += ["--outage-wait", str(self.outage_wait)]
        if self.max_jobs is not None:
            args += ["--max-jobs", str(self.max_jobs)]
        if not self.wait:
            args += ["--no-wait"]
        if self.idle_timeout is not None:
            args += ["--idle-timeout", str(self.idle_timeout)]
        return args + self.processes.worker_args()

    def to_message(self) -> dict[str, Any]:
        """As JSON values, for the zygote's socket."""
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> WorkerSettings:
        processes = dict(message.get("processes") or {})
        processes["gpus"] = tuple(processes.get("gpus", ()))
        return cls(**{**message, "processes": JobProcesses(**processes)})

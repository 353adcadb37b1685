"""How a worker runs its jobs on this machine: job processes reused or not.

Options shared by ``jobman worker`` and ``jobman dispatch`` (which hands them to
each worker it starts, as worker arguments).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobProcesses:
    """What the job processes of one worker are given."""

    jobs_per_process: int = 1  # function jobs one process runs in turn before a fresh one replaces it

    def worker_args(self) -> list[str]:
        """The ``jobman worker`` options that say the same."""
        return ["--jobs-per-process", str(self.jobs_per_process)] if self.jobs_per_process > 1 else []

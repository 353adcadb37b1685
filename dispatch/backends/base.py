"""The backend interface: where workers run, and what became of them.

A backend starts pull workers (each runs as ``jobman worker`` does against the
database until nothing is ready) and, for the monitor, says whether the processes or
allocations that jobs run in are still alive. ``local`` and ``slurm`` implement it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..worker_settings import WorkerSettings


@dataclass(frozen=True)
class WorkerSpec:
    """How to start one worker: the database URL (with ``?table=``) and the worker's settings."""

    db_url: str
    settings: WorkerSettings = field(default_factory=WorkerSettings)

    def argv(self) -> list[str]:
        """The arguments of ``jobman worker`` that start it as a command."""
        return [self.db_url, *self.settings.argv()]


@dataclass(frozen=True)
class AllocationState:
    """What the backend knows of one backend id (a pid, a Slurm job id).

    ``alive`` is True while it runs or waits to run; once ended, ``state`` is the
    backend's word for how (``COMPLETED``, ``TIMEOUT``, ``NODE_FAIL``, ...), and
    ``reason`` is one sentence for the job's event log.
    """

    backend_id: str
    alive: bool
    state: str
    reason: str = ""


class Backend(Protocol):
    """What ``jobman dispatch`` and ``jobman monitor`` need of a place that runs workers."""

    name: str

    def start_workers(self, spec: WorkerSpec, count: int) -> list[str]:
        """Start ``count`` workers; return their backend ids."""

    def running_workers(self) -> int:
        """How many workers started by this object are still running or pending."""

    def stop_workers(self) -> None:
        """Ask every worker started by this object to stop (they put their job back)."""

    def wait(self, seconds: float) -> None:
        """Pause for ``seconds``, or less once a worker started by this object ends."""

    def allocation_states(self, backend_ids: Sequence[str]) -> dict[str, AllocationState]:
        """The state of each backend id, in one query for all of them."""


class BackendError(Exception):
    """A backend could not do what was asked (a missing command, a refused submission)."""

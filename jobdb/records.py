"""What the store's verbs return: one row of ``job`` and its kin, decoded by column name."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .canonical import load_json, load_results
from .status import Status


def code_of(raw: Any) -> dict[str, Any] | None:
    """A job's ``code`` column decoded (text on SQLite, already text from jsonb on PostgreSQL)."""
    if raw is None:
        return None
    value = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    return value if isinstance(value, dict) else None


@dataclass
class Job:
    """One row of ``job``, decoded."""

    id: int
    experiment_id: int
    phase: int
    kind: str
    target: str
    params: dict[str, Any]
    status: Status
    priority: int
    attempt: int
    max_attempts: int
    lease: int
    results: dict[str, Any] | None
    host: str | None
    pid: int | None
    pid_started_at: float | None
    backend: str | None
    backend_id: str | None
    log_path: str | None
    workdir: str | None
    created_at: float
    queued_at: float | None
    started_at: float | None
    heartbeat_at: float | None
    finished_at: float | None
    error: str | None
    exit_code: int | None
    stop_requested: bool = False
    resume: bool = False
    depends_on: list[int] = field(default_factory=list)
    gpus: str | None = None  # the devices of its last run, as CUDA_VISIBLE_DEVICES
    ranks: int = 1  # processes that run it together (a gang), rank 0's results being the job's
    code: dict[str, Any] | None = None  # what it ran: where found, code and environment (``coderecord``)
    # its params_hash, when read whole (a call that takes it refers to it so); a function of the parameters
    # and target, so not part of a job's equality: a claim, which does not read it, hands over the same job
    identity: str | None = field(default=None, compare=False)

    def _repr_html_(self) -> str:
        """The job in a notebook: status, parameters, results or error, times."""
        from .notebook import job_html

        return job_html(self)

    @classmethod
    def from_row(cls, row: Any, deps: list[int] | None = None) -> Job:
        return cls.from_mapping(row._mapping, deps)

    @classmethod
    def from_mapping(cls, m: Any, deps: list[int] | None = None) -> Job:
        return cls(
            id=m["id"],
            experiment_id=m["experiment_id"],
            phase=m["phase"],
            kind=m["kind"],
            target=m["target"],
            params=json.loads(m["params"]),
            status=Status(m["status"]),
            priority=m["priority"],
            attempt=m["attempt"],
            max_attempts=m["max_attempts"],
            lease=m["lease"],
            results=load_results(m["results"]) if m["results"] else None,
            host=m["host"],
            pid=m["pid"],
            pid_started_at=m["pid_started_at"],
            backend=m["backend"],
            backend_id=m["backend_id"],
            log_path=m["log_path"],
            workdir=m["workdir"],
            created_at=m["created_at"],
            queued_at=m["queued_at"],
            started_at=m["started_at"],
            heartbeat_at=m["heartbeat_at"],
            finished_at=m["finished_at"],
            error=m["error"],
            exit_code=m["exit_code"],
            stop_requested=bool(m["stop_requested"]),
            resume=bool(m["resume"]),
            depends_on=deps or [],
            gpus=m.get("gpus"),
            ranks=m.get("ranks") or 1,
            code=code_of(m.get("code")),
            identity=m.get("params_hash"),
        )

    @classmethod
    def from_claimed(cls, row: Sequence[Any], deps: list[int], worker: WorkerInfo, now: float) -> Job:
        """A job as the claim statement left it: the row it returns (``CLAIMED_COLUMNS``, by name), and
        the values it set itself (the claiming worker, ``now``)."""
        m = dict(zip(CLAIMED_COLUMNS, row))
        params, results = m.pop("params"), m.pop("results")
        m["code"] = code_of(m["code"])
        return cls(
            **m,
            params=load_json(params),
            results=load_results(results) if results else None,
            status=Status.RUNNING,
            host=worker.host,
            pid=worker.pid,
            pid_started_at=worker.pid_started_at,
            backend=worker.backend,
            backend_id=worker.backend_id,
            log_path=worker.log_path,
            started_at=now,
            heartbeat_at=now,
            finished_at=None,
            error=None,
            exit_code=None,
            depends_on=deps,
        )

    @property
    def awaiting_allocation(self) -> bool:
        """QUEUED for one allocation made for it (``assign``) that has not claimed it yet."""
        return self.status is Status.QUEUED and self.backend_id is not None and self.pid is None


# The columns a claim returns: those of Job it does not set itself (see Job.from_claimed).
CLAIMED_COLUMNS = (
    "id",
    "experiment_id",
    "phase",
    "kind",
    "target",
    "params",
    "priority",
    "attempt",
    "max_attempts",
    "lease",
    "results",
    "workdir",
    "created_at",
    "queued_at",
    "ranks",
    "code",
)
CLAIMED_ATTEMPT = CLAIMED_COLUMNS.index("attempt")


@dataclass(frozen=True)
class Event:
    id: int
    job_id: int
    at: float
    from_status: str | None
    to_status: str | None
    attempt: int | None
    why: str
    source: str | None
    data: dict[str, Any] | None


@dataclass(frozen=True)
class ScheduleResult:
    added: int
    existing: int
    job_ids: list[int]
    repeated: bool = False  # the copies asked for (``repeat``) were added


@dataclass(frozen=True)
class SchedulePreview:
    """What a schedule would do (``--dry-run``): jobs it would add, already there, named twice by the sweep."""

    added: int
    existing: int
    merged: int  # jobs of the sweep that are another of its jobs (a grid value given twice)
    first: list[Job]  # the first jobs it would add, as they would be stored


@dataclass(frozen=True)
class WorkerInfo:
    """Who claims: recorded on the job so the monitor can find the process again."""

    host: str
    pid: int
    pid_started_at: float | None = None
    backend: str = "local"
    backend_id: str | None = None
    log_path: str | None = None

    @classmethod
    def here(cls, **kwargs: Any) -> WorkerInfo:
        try:
            import psutil

            started = psutil.Process(kwargs.get("pid", os.getpid())).create_time()
        except Exception:  # noqa: BLE001 - no psutil, or the process is gone: the start time is only a hint
            started = None
        kwargs.setdefault("pid", os.getpid())
        kwargs.setdefault("pid_started_at", started)
        return cls(host=socket.gethostname(), **kwargs)


@dataclass(frozen=True)
class Claimed:
    """A claimed job: what a worker needs to run it and to prove it still owns it."""

    job: Job
    lease: int
    parents: list[Job] | None = None  # the jobs it depends on, whole, when the claim read them


# What a claim's transaction gives back: the claimed row, its parents (each a row by column name), and
# the time it was claimed at.
Found = tuple[Sequence[Any], list[dict[str, Any]], float]


def to_claimed(found: Found | None, worker: WorkerInfo) -> Claimed | None:
    """A claim as handed to a worker (made after the commit, out of the write lock)."""
    if found is None:
        return None
    parents = [Job.from_mapping(row) for row in found[1]]
    job = Job.from_claimed(found[0], [p.id for p in parents], worker, found[2])
    return Claimed(job, job.lease, parents)


@dataclass(frozen=True)
class RunningJob:
    """What the monitor needs of a RUNNING job to judge whether it still runs (no params, no results)."""

    id: int
    phase: int
    lease: int
    attempt: int
    max_attempts: int
    host: str | None
    pid: int | None
    pid_started_at: float | None
    backend: str | None
    backend_id: str | None
    started_at: float | None
    heartbeat_at: float | None
    stop_requested: bool
    workdir: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> RunningJob:
        m = row._mapping
        values = {name: m[name] for name in RUNNING_COLUMNS}
        values["stop_requested"] = bool(values["stop_requested"])
        return cls(**values)


# The columns of a RUNNING job the monitor's liveness check reads: those of RunningJob.
RUNNING_COLUMNS = tuple(RunningJob.__dataclass_fields__)

"""The monitor: find RUNNING jobs whose run is over, declare them CRASHED, relaunch them.

A job's row says RUNNING until its worker records how it ended. When the worker
itself dies (SIGKILL, the OOM killer, a lost node, an ended allocation) nobody
does, so the monitor looks for three signs, most specific first:

* its worker process is gone from this host: pid and start time (psutil), so a
  reused pid is not taken for the worker; checked only for jobs whose host is
  the one the monitor runs on, and at once, without waiting for a grace;
* its backend allocation ended (a Slurm job FAILED, TIMEOUT, NODE_FAIL, ...):
  one question to each backend per scan for all of its jobs; a state the
  backend does not know (UNKNOWN) is not taken for success;
* its heartbeat is older than the grace.

A job that is slow but heartbeats is never touched. When a worker of this host
is found gone, what its jobs left running in their cgroups (where the machine let
them have one, ``dispatch.cgroup``) is killed. What is found is written in
one transaction, fenced by each job's lease, so a job that finished meanwhile is
left alone. Within max_attempts a crashed job goes back to the queue keeping its
workdir and checkpoint; past it, it stays CRASHED and its dependents are BLOCKED.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from jobman.jobdb.errors import LeaseLost
from jobman.jobdb.status import REQUEUED
from jobman.jobdb.store import RunningJob, Store

from .backends.base import Backend
from .cgroup import folders_of_dead_worker, kill_cgroup
from .interrupted import clear_interruption, interruption
from .outage import no_connection_to_spare

logger = logging.getLogger("jobman.monitor")

PID_START_TOLERANCE = 1.0  # seconds: two readings of one process's start time agree within this
CLOCK_SKEW_TOLERANCE = 60.0  # seconds a heartbeat may seem to come from the future before it is distrusted
UNCHECKED_BACKENDS = ("local",)  # a local worker is checked by pid on its own host, not by the backend


@dataclass
class MonitorOptions:
    """What a scan does with what it finds."""

    relaunch: bool = True  # queue crashed jobs again within their attempts
    max_attempts: int | None = None  # overrides each job's own limit
    heartbeat_grace: float = 60.0  # seconds without a heartbeat before a job is declared lost
    include_failed: bool = False  # relaunch FAILED jobs too (their own doing, so only when asked)
    dry_run: bool = False  # find and report, change nothing
    # Look for the processes of jobs that run on this host. Off where a backend's allocations say more
    # than a pid (a Slurm dispatch), even for a worker that ran here.
    check_pids: bool = True


@dataclass
class Finding:
    """A RUNNING job found dead, and what became of it."""

    job_id: int
    lease: int
    sign: str  # "process", "allocation" or "heartbeat"
    reason: str
    host: str | None = None
    status: str | None = None  # after the scan: CRASHED, QUEUED, WAITING, CANCELED; None if left alone


@dataclass
class ScanReport:
    """What one scan looked at, found and did (JSON-able through :meth:`to_dict`)."""

    at: float
    checked: int = 0
    crashed: list[Finding] = field(default_factory=list)
    finished_meanwhile: list[int] = field(default_factory=list)
    relaunched: list[int] = field(default_factory=list)
    put_back: list[int] = field(default_factory=list)  # interrupted by the database, not crashed: no attempt spent
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what looked wrong but was left alone, and why
    dry_run: bool = False
    elapsed: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for a log."""
        parts = [f"checked {self.checked} running"]
        if self.crashed:
            verb = "would declare" if self.dry_run else "declared"
            shown = "; ".join(f"job {f.job_id}: {f.reason}" for f in self.crashed[:3])
            more = f"; and {len(self.crashed) - 3} more" if len(self.crashed) > 3 else ""
            parts.append(f"{verb} {len(self.crashed)} crashed ({shown}{more})")
        if self.relaunched:
            verb = "would relaunch" if self.dry_run else "relaunched"
            parts.append(f"{verb} {len(self.relaunched)}: {_ids_text(self.relaunched)}")
        if self.put_back:
            verb = "would put back" if self.dry_run else "put back"
            parts.append(
                f"{verb} {len(self.put_back)} interrupted by the database, no attempt spent: {_ids_text(self.put_back)}"
            )
        parts.extend(f"note: {n}" for n in self.notes)
        parts.extend(f"error: {e}" for e in self.errors)
        return ", ".join(parts)


class Monitor:
    """Scans one experiment's RUNNING jobs; ``backends`` answer for the jobs they run (by name)."""

    def __init__(
        self,
        store: Store,
        options: MonitorOptions | None = None,
        backends: Mapping[str, Backend] | None = None,
        *,
        hostname: str | None = None,
    ) -> None:
        self.store = store
        self.options = options or MonitorOptions()
        self.backends: dict[str, Backend] = dict(backends or {})
        self.hostname = hostname or socket.gethostname()
        self._said_full = False  # a server with no connection to spare is said once

    def scan(self) -> ScanReport:
        """One pass: find the dead among RUNNING jobs, declare them CRASHED, relaunch what may be."""
        start = time.time()
        report = ScanReport(at=start, dry_run=self.options.dry_run)
        running = self.store.running_brief()
        report.checked = len(running)
        found = self.find_dead(running, report.errors, report.notes)
        opts = self.options
        if found:
            if not opts.dry_run:
                self._end_leftovers(running, found, report.notes)
            found = self._put_back_interrupted(running, found, report)
        report.crashed = found
        if found and not opts.dry_run:
            outcome = self.store.crash_many(
                [(f.job_id, f.lease, f.reason) for f in found], relaunch=opts.relaunch, max_attempts=opts.max_attempts
            )
            for f in found:
                new = outcome.get(f.job_id)
                f.status = new.value if new is not None else None
            report.finished_meanwhile += [f.job_id for f in found if f.status is None]
            report.crashed = [f for f in found if f.status is not None]
            report.relaunched = [f.job_id for f in report.crashed if f.status in REQUEUED]
        if opts.relaunch:
            again = self.store.relaunch_due(
                include_failed=opts.include_failed,
                max_attempts=opts.max_attempts,
                why="relaunched by the monitor: it has attempts left",
                dry_run=opts.dry_run,
            )
            report.relaunched = sorted(set(report.relaunched) | set(again))
        if not self._said_full:
            full = no_connection_to_spare(self.store)
            if full is not None:
                report.notes.append(full)
                self._said_full = True
        report.elapsed = time.time() - start
        logger.debug("scan: %s", report.line())
        return report

    def _end_leftovers(self, running: Sequence[RunningJob], found: Sequence[Finding], notes: list[str]) -> None:
        """Kill what the jobs of workers found gone from this host left in their cgroups."""
        dead = {f.job_id for f in found if f.sign == "process"}
        for job in running:
            if job.id in dead and job.pid is not None:
                killed = sum(kill_cgroup(folder) for folder in folders_of_dead_worker(job.pid, job.pid_started_at))
                if killed:
                    notes.append(f"job {job.id}: killed {killed} process(es) it left running in its cgroup")

    def _put_back_interrupted(
        self, running: Sequence[RunningJob], found: list[Finding], report: ScanReport
    ) -> list[Finding]:
        """Jobs found dead whose worker left the mark of a database it could not write to in their
        workdir (``dispatch.interrupted``; readable on the worker's host, or anywhere the workdir is
        shared) are put back to resume, without spending an attempt; the others are returned, to be
        declared crashed."""
        by_id = {j.id: j for j in running}
        left = []
        for f in found:
            job = by_id[f.job_id]
            why = interruption(job.workdir, job.lease)
            if why is None:
                left.append(f)
                continue
            if report.dry_run:
                report.put_back.append(job.id)
                continue
            try:
                self.store.finish(
                    job.id,
                    job.lease,
                    "REQUEUE",
                    why=f"{why or 'its worker could not write to the database'}; {f.reason}; "
                    "put back without spending an attempt",
                )
                report.put_back.append(job.id)
            except LeaseLost:
                report.finished_meanwhile.append(job.id)
            clear_interruption(job.workdir, job.lease)
        return left

    # -- the three signs -----------------------------------------------------------------
    def find_dead(
        self, running: Sequence[RunningJob], errors: list[str] | None = None, notes: list[str] | None = None
    ) -> list[Finding]:
        """The jobs among ``running`` that show a sign of death, with the most specific reason each.

        A heartbeat stamped in the future (clock skew) is no sign of life. On this host, a worker
        process that is alive (same pid, same start time) is not declared dead for its heartbeat
        alone: the job is left alone and ``notes`` says why.
        """
        errors = errors if errors is not None else []
        notes = notes if notes is not None else []
        now = self.store.server_time()  # the clock heartbeats are stamped with, whatever this host's says
        found: dict[int, Finding] = {}
        here = [j for j in running if j.host == self.hostname and j.pid] if self.options.check_pids else []
        if here:
            pids = set(psutil.pids())
            verdicts: dict[tuple[int | None, float | None], str | None] = {}  # one look at each worker process
            for job in here:
                key = (job.pid, job.pid_started_at)
                if key not in verdicts:
                    verdicts[key] = process_gone(job, pids)
                reason = verdicts[key]
                if reason:
                    found[job.id] = Finding(job.id, job.lease, "process", reason, job.host)
        for job, reason in self._ended_allocations([j for j in running if j.id not in found], errors):
            found[job.id] = Finding(job.id, job.lease, "allocation", reason, job.host)
        grace = self.options.heartbeat_grace
        for job in running:
            last = job.heartbeat_at or job.started_at
            if job.id in found or last is None:
                continue
            age = now - last
            worker = f"{job.host}:{job.pid}"
            if age < -CLOCK_SKEW_TOLERANCE:
                reason = (
                    f"its heartbeat is stamped {-age:,.0f} s in the future (clock skew between its worker "
                    f"{worker} and this monitor), which is no sign of life"
                )
            elif age > grace:
                reason = f"no heartbeat for {age:,.0f} s (grace {grace:g} s) from its worker {worker}"
            else:
                continue
            if job.host == self.hostname and worker_alive(job):
                notes.append(
                    f"job {job.id}: {reason}; but its worker process {job.pid} is alive on this host, "
                    "so it is left alone"
                )
            else:
                found[job.id] = Finding(job.id, job.lease, "heartbeat", reason, job.host)
        return [found[i] for i in sorted(found)]

    def _ended_allocations(self, jobs: Sequence[RunningJob], errors: list[str]) -> list[tuple[RunningJob, str]]:
        by_backend: dict[str, list[RunningJob]] = {}
        for job in jobs:
            if job.backend and job.backend not in UNCHECKED_BACKENDS and job.backend_id:
                by_backend.setdefault(job.backend, []).append(job)
        out = []
        for name, group in sorted(by_backend.items()):
            backend = self._backend(name)
            if backend is None:
                continue  # a backend we cannot ask: the heartbeat still tells
            try:
                states = backend.allocation_states([j.backend_id for j in group if j.backend_id])
            except Exception as exc:  # noqa: BLE001 - a backend that cannot answer must not stop the scan
                errors.append(f"could not ask {name} about {len(group)} job(s): {exc}")
                continue
            for job in group:
                state = states.get(job.backend_id) if job.backend_id else None
                if state is not None and not state.alive:
                    out.append((job, state.reason or f"its {name} allocation {job.backend_id} ended ({state.state})"))
        return out

    def _backend(self, name: str) -> Backend | None:
        if name not in self.backends and name == "slurm":
            from .backends.slurm import SlurmBackend

            self.backends[name] = SlurmBackend()
        return self.backends.get(name)


def process_gone(job: RunningJob, pids: set[int] | None = None) -> str | None:
    """Why the job's worker process is no longer on this host, or None while it is (or cannot be told)."""
    pid = job.pid
    if pid is None:
        return None
    where = f"worker process {pid} on {job.host}"
    if pids is not None and pid not in pids:
        return f"its {where} is gone"
    try:
        proc = psutil.Process(pid)
        started = proc.create_time()
        zombie = proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return f"its {where} is gone"
    except psutil.AccessDenied:
        return None  # it exists; whose it is, the heartbeat will tell
    if job.pid_started_at is not None and abs(started - job.pid_started_at) > PID_START_TOLERANCE:
        return f"its {where} is gone (pid {pid} now belongs to a process started later)"
    if zombie:
        return f"its {where} has exited"
    return None


def worker_alive(job: RunningJob) -> bool:
    """Whether the job's worker process is alive on this host: its pid, with the start time it claimed with."""
    if job.pid is None or job.pid_started_at is None:
        return False
    try:
        proc = psutil.Process(job.pid)
        return (
            abs(proc.create_time() - job.pid_started_at) <= PID_START_TOLERANCE
            and proc.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def _ids_text(ids: Sequence[int], shown: int = 10) -> str:
    text = ", ".join(map(str, ids[:shown]))
    return text + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


__all__ = ["Monitor", "MonitorOptions", "ScanReport", "Finding", "process_gone", "worker_alive"]

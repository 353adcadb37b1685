"""Run one claimed job in its own process, watch it, and record how it ended.

Function jobs run in a child forked from the worker, so imports stay warm and a
segfault, ``os._exit`` or a memory blow-up kills only the child. Command jobs run
as their own process group, parameters passed as argv (never through a shell).
The worker supervises single-threaded: it heartbeats, enforces the time limit,
forwards stop requests, and is the only writer of the job's final status.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from jobman.jobdb.errors import DatabaseError, JobmanError, LeaseLost, UsageError
from jobman.jobdb.store import Claimed, Job, Store

from .channel import DD, Parent, to_jsonable
from .db_channel import DbChannel
from .experiment import Outcome, TargetError, call, resolve, takes_state_and_channel

EXIT_INCOMPLETE = 75  # a command job exits 75 (EX_TEMPFAIL) to be re-queued and resumed
STDERR_TAIL = 4000
LOST = "LOST"
STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}


@dataclass
class RunLimits:
    """How a worker treats the jobs it runs."""

    timeout: float | None = None  # the job's wall-time limit, seconds
    heartbeat_interval: float = 10.0
    grace: float = 30.0  # between SIGTERM (should_stop) and SIGKILL


def command_argv(command: str, params: dict[str, Any]) -> list[str]:
    """The argv of a command job: ``{key}`` placeholders filled, else ``--key value`` appended.

    Values never pass through a shell: each becomes exactly one argument.
    """
    argv = shlex.split(command)
    as_text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}
    if any("{" in tok and "}" in tok for tok in argv):
        out = []
        for tok in argv:
            try:
                out.append(tok.format_map(as_text))
            except KeyError as exc:
                raise JobmanError(f"the command uses {{{exc.args[0]}}}, which is not a parameter of the job") from None
            except (ValueError, IndexError):
                out.append(tok)
        return out
    for key, value in as_text.items():
        argv.extend([f"--{key}", value])
    return argv


class _Child:
    """A running job process: a forked function or a command's process group."""

    def __init__(self, pid: int, result_fd: int | None, group: bool) -> None:
        self.pid = pid
        self.result_fd = result_fd
        self.group = group
        self.buffer = bytearray()
        self.status: int | None = None  # os.waitpid status once reaped
        try:  # readable the moment the process exits (Linux 5.3+), so no polling delay
            self.exit_fd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.exit_fd = None

    def send(self, sig: int) -> None:
        try:
            if self.group:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def pump(self, wait: float) -> None:
        """Read what the child reported, waiting at most ``wait`` seconds or until it exits."""
        fds = [fd for fd in (self.result_fd, self.exit_fd) if fd is not None]
        if not fds:
            time.sleep(min(max(0.0, wait), 0.01))
            return
        if self.exit_fd is None:
            wait = min(wait, 0.01)
        ready, _, _ = select.select(fds, [], [], max(0.0, wait))
        if self.result_fd is not None and self.result_fd in ready:
            self._read()

    def _read(self) -> bool:
        """Read what is in the pipe; False when nothing more is there right now."""
        try:
            data = os.read(self.result_fd, 1 << 20)
        except BlockingIOError:
            return False
        if data:
            self.buffer.extend(data)
            return True
        os.close(self.result_fd)
        self.result_fd = None
        return False

    def reap(self) -> bool:
        """True once the child has exited (and its report, if any, is read)."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return False
            self.status = status
            if self.exit_fd is not None:
                os.close(self.exit_fd)
                self.exit_fd = None
        # The child wrote its whole report before exiting; a process it forked may still hold the
        # pipe open, so read what is there and do not wait for the end of the stream.
        while self.result_fd is not None and self._read():
            pass
        if self.result_fd is not None:
            os.close(self.result_fd)
            self.result_fd = None
        return True

    @property
    def signal(self) -> int | None:
        return os.WTERMSIG(self.status) if self.status is not None and os.WIFSIGNALED(self.status) else None

    @property
    def exit_code(self) -> int | None:
        return os.WEXITSTATUS(self.status) if self.status is not None and os.WIFEXITED(self.status) else None


class Runner:
    """Runs claimed jobs for one worker, keeping resolved targets warm between jobs."""

    def __init__(self, store: Store, limits: RunLimits, stopping: Callable[[], bool] = lambda: False,
                 log: Callable[[str], None] = lambda _m: None) -> None:
        self.store = store
        self.limits = limits
        self.stopping = stopping
        self.log = log
        self._targets: dict[str, Callable[..., Any]] = {}
        _prctl()

    # -- one job ----------------------------------------------------------------
    def run(self, claimed: Claimed) -> str:
        """Run the job to its end; return its new status name, or ``LOST`` if it was taken from us."""
        job, lease = claimed.job, claimed.lease
        workdir = Path(job.workdir or ".").resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            parents = [Parent(p.id, p.phase, p.target, Path(p.workdir) if p.workdir else Path("."), p.params,
                              p.results or {}) for p in (self.store.parents(job.id) if job.depends_on else [])]
            if job.kind == "fn":
                fn = self._resolve(job.target)
                child = self._fork_function(fn, job, lease, parents, workdir)
            else:
                child = self._spawn_command(job, parents, workdir)
        except (TargetError, JobmanError, OSError) as exc:
            return self._finish(job, lease, "FAILED", error=str(exc), why=f"could not start: {exc}")
        try:
            kill_reason = self._supervise(child, job, lease)
        except LeaseLost as exc:
            self.log(str(exc))
            return LOST
        return self._record(child, job, lease, workdir, kill_reason)

    def _resolve(self, target: str) -> Callable[..., Any]:
        if target not in self._targets:
            fn = resolve(target)
            takes_state_and_channel(fn)  # worked out here once, so each forked job finds it done
            self._targets[target] = fn
        return self._targets[target]

    # -- starting -----------------------------------------------------------------
    def _fork_function(self, fn: Callable[..., Any], job: Job, lease: int, parents: list[Parent],
                       workdir: Path) -> _Child:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # Blocked until the child has installed its handlers: a SIGTERM sent at once must reach
        # channel.should_stop(), not the worker's handler inherited by the fork.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        # Frozen, the worker's objects stay out of the job's garbage collections, which would
        # otherwise touch (and so copy) every page of the worker's heap.
        gc.freeze()
        try:
            pid = os.fork()
        except OSError:
            gc.unfreeze()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:  # the job's process
            code = 0
            try:
                os.close(read_fd)
                _child_main(self.store, fn, job, lease, parents, workdir, self.limits, write_fd, mask)
            except BaseException:  # noqa: BLE001 - nothing may escape into the worker's code path
                code = 70
            finally:
                os._exit(code)
        gc.unfreeze()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        return _Child(pid, read_fd, group=False)

    def _spawn_command(self, job: Job, parents: list[Parent], workdir: Path) -> _Child:
        state = {**job.params, **(job.results or {})}
        state_path, results_path = workdir / "jobman_state.json", workdir / "jobman_results.json"
        state_path.write_text(json.dumps({"params": job.params, "state": state, "job_id": job.id,
                                          "phase": job.phase, "attempt": job.attempt,
                                          "parents": [{"id": p.job_id, "workdir": str(p.workdir),
                                                       "params": dict(p.params), "results": dict(p.results)}
                                                      for p in parents]}, indent=1))
        if results_path.exists():
            results_path.unlink()
        env = {**os.environ, "JOBMAN_STATE": str(state_path), "JOBMAN_RESULTS": str(results_path),
               "JOBMAN_WORKDIR": str(workdir), "JOBMAN_JOB_ID": str(job.id), "JOBMAN_ATTEMPT": str(job.attempt),
               "JOBMAN_PARENT_WORKDIRS": os.pathsep.join(str(p.workdir) for p in parents)}
        argv = command_argv(job.target, job.params)
        with open(workdir / "stdout.txt", "ab") as out, open(workdir / "stderr.txt", "ab") as err:
            proc = subprocess.Popen(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
        return _Child(proc.pid, None, group=True)

    # -- watching -------------------------------------------------------------------
    def _supervise(self, child: _Child, job: Job, lease: int) -> str | None:
        """Wait for the child; heartbeat, enforce limits. Returns why we stopped it, if we did."""
        start = time.time()
        deadline = start + self.limits.timeout if self.limits.timeout else None
        next_beat = start + self.limits.heartbeat_interval
        reason: str | None = None
        term_at: float | None = None
        killed = False
        while not child.reap():
            now = time.time()
            wake = [next_beat, now + 0.5]
            if deadline is not None and reason is None:
                wake.append(deadline)
            if term_at is not None and not killed:
                wake.append(term_at + self.limits.grace)
            child.pump(min(wake) - now)
            now = time.time()
            if now >= next_beat:
                next_beat = now + self.limits.heartbeat_interval
                try:
                    if self.store.heartbeat(job.id, lease) and reason is None:
                        reason = "cancel"
                except LeaseLost:
                    child.send(signal.SIGKILL)
                    while not child.reap():
                        time.sleep(0.01)
                    raise
                except DatabaseError as exc:  # the database may come back; the job goes on meanwhile
                    self.log(f"heartbeat of job {job.id} failed: {exc}")
            if reason is None and deadline is not None and now >= deadline:
                reason = "timeout"
            if reason is None and self.stopping():
                reason = "stopping"
            if reason is not None and term_at is None:
                term_at = now
                child.send(signal.SIGTERM)
            if term_at is not None and not killed and now >= term_at + self.limits.grace:
                child.send(signal.SIGKILL)
                killed = True
        return reason

    # -- recording --------------------------------------------------------------------
    def _record(self, child: _Child, job: Job, lease: int, workdir: Path, reason: str | None) -> str:
        results: dict[str, Any] | None = None
        error: str | None = None
        outcome: str
        if job.kind == "fn" and child.exit_code == 0 and child.buffer:
            report = json.loads(bytes(child.buffer).decode())
            outcome, results, error = report["status"], report["results"], report["error"]
        elif job.kind == "cmd" and child.exit_code in (0, EXIT_INCOMPLETE):
            outcome = "DONE" if child.exit_code == 0 else "INCOMPLETE"
            results, error = _read_results(workdir / "jobman_results.json")
            if error:
                outcome = "FAILED"
        elif child.signal is not None:
            name = signal.Signals(child.signal).name
            outcome, error = "CRASHED", f"the job's process was killed by {name}"
        else:
            outcome = "FAILED"
            error = f"the job's process exited with code {child.exit_code}" + (
                "" if child.exit_code else " without reporting an outcome")
            if job.kind == "cmd":
                error += _stderr_tail(workdir / "stderr.txt")
        why = None
        if reason == "timeout" and outcome != "DONE":
            outcome, why = "FAILED", f"time limit of {self.limits.timeout:g} s exceeded"
            error = (error + "\n" if error else "") + why
        elif reason == "stopping" and outcome in ("INCOMPLETE", "CRASHED"):
            outcome, why = "REQUEUE", "its worker was stopped; put back to resume"
        elif reason == "cancel" and outcome != "DONE":
            why = "cancelled while running"
        elif outcome == "CRASHED":
            why = error
        elif outcome == "FAILED":
            why = (error or "failed").strip().splitlines()[-1][:300]
        return self._finish(job, lease, outcome, results=results, error=error, exit_code=child.exit_code,
                            why=why)

    def _finish(self, job: Job, lease: int, outcome: str, **kwargs: Any) -> str:
        delay = 1.0
        for attempt in range(8):  # a result computed must not be dropped for a passing database outage
            try:
                return self.store.finish(job.id, lease, outcome, **kwargs).value
            except LeaseLost as exc:
                self.log(str(exc))
                return LOST
            except UsageError as exc:  # results the database cannot hold (NaN, infinity): the job's bad return
                if kwargs.get("results") is None:
                    raise
                error = "\n".join(e for e in (kwargs.get("error"), str(exc)) if e)
                outcome, kwargs = "FAILED", {**kwargs, "results": None, "error": error, "why": str(exc)}
            except DatabaseError as exc:
                if attempt == 7:
                    raise
                self.log(f"recording job {job.id} failed ({exc}); retrying in {delay:.0f} s")
                time.sleep(delay)
                delay = min(delay * 2, 30)
        raise AssertionError("unreachable")  # pragma: no cover


def _read_results(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    if not path.exists():
        return None, None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"$JOBMAN_RESULTS ({path}) is not valid JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"$JOBMAN_RESULTS ({path}) must hold a JSON object, not {type(data).__name__}"
    return data, None


def _stderr_tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - STDERR_TAIL))
            tail = fh.read().decode(errors="replace").strip()
    except OSError:
        return ""
    return f"\n--- end of stderr ---\n{tail}" if tail else ""


_PRCTL: Any = False  # libc's prctl once looked up; None where there is none


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up once in the worker so that each forked job only calls it."""
    global _PRCTL
    if _PRCTL is False:
        try:
            _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
        except (OSError, AttributeError):
            _PRCTL = None
    return _PRCTL


def _die_with_parent() -> None:
    """Linux: the job's process gets SIGKILL when its worker dies, so no orphan runs unwatched."""
    prctl = _prctl()
    if prctl is not None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    try:  # under memory pressure the OOM killer should take the job, not its worker
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"500")
        finally:
            os.close(fd)
    except OSError:
        pass


def _child_main(store: Store, fn: Callable[..., Any], job: Job, lease: int, parents: list[Parent],
                workdir: Path, limits: RunLimits, report_fd: int, mask: set | None = None) -> None:
    """Inside the forked job process: run the function and report its outcome to the worker."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the worker's to handle
    os.chdir(workdir)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        target = os.open(workdir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    state = DD(job.params)
    if job.results:
        state.update(job.results)
    channel = DbChannel(job.id, job.phase, job.attempt, workdir, dict(job.params), parents,
                        deadline=time.time() + limits.timeout if limits.timeout else None, store=store, lease=lease,
                        forked=True)
    channel.install_signal_handlers()
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        outcome = call(fn, state, channel)
    except BaseException:  # SystemExit and friends from the job
        outcome = Outcome("FAILED", {}, traceback.format_exc(limit=20))
    sys.stdout.flush()
    sys.stderr.flush()
    report = json.dumps({"status": outcome.status, "results": to_jsonable(outcome.results),
                         "error": outcome.error}).encode()
    view = memoryview(report)
    while view:
        written = os.write(report_fd, view)
        view = view[written:]
    os.close(report_fd)

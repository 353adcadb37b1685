"""Run one claimed job in its own process, watch it, and record how it ended.

Function jobs run in a child of the worker's fork server (``dispatch.forkserver``,
reached through ``dispatch.forkhandle``),
so imports stay warm and a segfault, ``os._exit`` or a memory blow-up kills only
the child; the job's checkpoints and metrics come to the worker, which writes
them under the job's lease. Command jobs are executed by the same fork server,
parameters passed as argv (never through a shell). Either way the job's process
has a process group (and, where the machine allows, a cgroup) of its own, and its
fork server, a subreaper, kills all of it when the job ends or the worker dies.
The worker supervises single-threaded: it heartbeats, enforces the time limit,
forwards stop requests, and is the only writer of the job's final status.

How a job ended is decided by one pure function, :func:`classify_end`. A job run in
the calling process (the Python API's inline mode, ``jobman cmdline``) goes through
:func:`run_here`.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import select
import shlex
import signal
import socket
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobman.jobdb.callrefs import takes_calls
from jobman.jobdb.canonical import dump_json
from jobman.jobdb.errors import DatabaseError, DatabaseUnavailable, JobmanError, LeaseLost, UsageError
from jobman.jobdb.status import LOST

from .calls import taken_values
from .channel import Channel, DirectChannel, job_info, job_state, taking
from .experiment import CallEnd, TargetError, by_value, call, failure_why, given, resolve, resumed
from .forkhandle import ForkServer, ForkServerGone, JobProcess, job_environment
from .interrupted import mark_interrupted
from .jobfiles import copy_tree, read_capped, read_tail
from .leftovers import end_job_processes
from .lifetime import child_pids
from .machine import GpuPool, SlotPool, gpus_asked
from .messages import Frames, MalformedMessage, job_request, send_nowait
from .oom import OomWatch
from .outage import Outage
from .provenance import what_ran, where_of
from .unimportable import Unimportable

if TYPE_CHECKING:  # annotations only: the runner itself needs no database code
    from jobman.jobdb.store import Claimed, Job, Store, WorkerInfo

EXIT_INCOMPLETE = 75  # a command job exits 75 (EX_TEMPFAIL) to be re-queued and resumed
STDERR_TAIL = 4000
# A job that runs longer than this leaves its worker holding no database connection until it ends
# (heartbeats and saves open one and close it): a lab's server is shared by every worker. Jobs shorter
# than this, back to back, keep the one connection, and a long job costs one connect at its end.
HOLD_CONNECTION_S = 2.0
RESULTS_LIMIT = 8 * 1024 * 1024  # a command job's $JOBMAN_RESULTS: twice the largest state the database keeps


@dataclass
class RunLimits:
    """How a worker treats the jobs it runs."""

    timeout: float | None = None  # the job's wall-time limit, seconds
    heartbeat_interval: float = 10.0
    grace: float = 30.0  # between SIGTERM (should_stop) and SIGKILL
    jobs_per_process: int = 1  # function jobs one job process runs in turn before it is replaced
    save_every: float | None = None  # seconds between the job's channel.switch() == 'save' answers


def deadline_of(timeout: float | None) -> float | None:
    """The ``time.time()`` at which a job starting now reaches its wall-time limit, if it has one."""
    return time.time() + timeout if timeout else None


def command_argv(command: str, params: dict[str, Any]) -> list[str]:
    """The argv of a command job: ``{key}`` placeholders filled, else ``--key value`` appended as
    argparse reads them: True a bare ``--key`` (``store_true``), False left out, a list as
    ``--key v1 v2`` (``nargs``).

    Values never pass through a shell: each becomes exactly one argument.
    """
    argv = shlex.split(command)
    as_text = {k: _argument(v) for k, v in params.items()}
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
    for key, value in params.items():
        if value is False:
            continue
        argv.append(f"--{key}")
        if isinstance(value, list):
            argv.extend(_argument(v) for v in value)
        elif value is not True:
            argv.append(as_text[key])
    return argv


def _argument(value: Any) -> str:
    """One value as one argument: a string as it is, anything else as JSON (``0.1``, ``true``, ``[1, 2]``)."""
    return value if isinstance(value, str) else json.dumps(value)


def continued_state(
    job: Job, workdir: Path, continuation: Callable[[], tuple[str | None, dict[str, Any]] | None]
) -> dict[str, Any] | None:
    """The state a job starts from (see ``continuation``: the job it continues at a higher rung of a
    search, read only when needed): its own checkpoint when it has one, else a copy of its parent's
    workdir, made while its own is still empty, and the state the parent saved."""
    empty = not any(workdir.iterdir())
    if job.results and not empty:  # a relaunch of a job that has its own checkpoint
        return job.results
    found = continuation()
    if found is None:
        return job.results
    source, saved = found
    if empty and source and Path(source).is_dir():  # symlinks stay symlinks: what they point to is not the job's
        copy_tree(source, workdir)
    return job.results or saved


def run_here(
    fn: Callable[..., Any],
    channel: Channel,
    results: Mapping[str, Any] | None = None,
    info: Mapping[str, Any] | None = None,
    taken: Mapping[str, Any] | None = None,
) -> CallEnd:
    """Run one job in this process, on ``channel``: its state is its parameters, ``results`` (what it
    saved before), ``taken`` (the values of the calls it takes, by parameter, artifacts still stored)
    and ``info`` (``state.jobman``). How it ended; recording it is the caller's.

    The inline mode of the Python API (a :class:`~.channel.StoreChannel`) and ``jobman cmdline``
    (:func:`run_direct`) run jobs through it; an exception that is not an ``Exception`` (Ctrl-C)
    goes through to the caller, whose job it is to put the job back.
    """
    try:
        saved = resumed(results, channel.artifacts)
        values = given(taken, channel.artifacts)
    except ValueError as exc:
        return CallEnd("FAILED", dict(results or {}), str(exc))
    state = job_state(channel.params, saved, info)
    taking(channel, state, values)
    return call(fn, state, channel)


def run_direct(
    target: str | Callable[..., Any],
    params: Mapping[str, Any],
    workdir: str | Path,
    *,
    resume: bool = True,
    save_every: float | None = None,
    deadline: float | None = None,
) -> CallEnd:
    """Run one experiment in ``workdir`` without a database (``jobman cmdline``, a notebook).

    With ``resume``, the last checkpoint in ``workdir`` is loaded into the state first;
    ``save_every`` and ``deadline`` are the channel's (``channel.switch()`` answers). What the job
    ends with (unless it FAILED) is its last checkpoint.
    """
    fn = resolve(target) if isinstance(target, str) else target
    channel = DirectChannel(
        job_id=None,
        phase=0,
        attempt=1,
        workdir=Path(workdir),
        params=dict(params),
        save_every=save_every,
        deadline=deadline,
    )
    channel.workdir.mkdir(parents=True, exist_ok=True)
    name = target if isinstance(target, str) else f"{fn.__module__}.{fn.__qualname__}"
    ending = run_here(
        fn, channel, channel.saved_results() if resume else None, job_info(None, name, "", 0, 1, 0, channel.workdir)
    )
    if ending.status != "FAILED":
        channel._save(ending.results)
    return ending


@dataclass(frozen=True)
class JobEnd:
    """How a job run by a worker ended, as its worker records it: an outcome of
    ``jobdb.status.Outcome``, the results and error text, the command's exit code, and the
    reason for the job's event log."""

    outcome: str
    results: dict[str, Any] | None = None
    error: str | None = None
    exit_code: int | None = None
    why: str | None = None


def classify_end(
    kind: str,
    status: int | None,
    report: Mapping[str, Any] | None = None,
    *,
    server_gone: bool = False,
    stopped_for: str | None = None,
    timeout: float | None = None,
    command_results: dict[str, Any] | None = None,
    command_error: str | None = None,
    oom_cause: str | None = None,
    stderr_tail: str = "",
    malformed: str | None = None,
    ranks: int = 1,
) -> JobEnd:
    """How a job ended, from what its worker saw: its ``kind`` ("fn" or "cmd"), its process's
    ``os.waitpid`` ``status``, a function's ``report`` (how its call ended), whether the fork server
    died under it, why the worker stopped it if it did ("timeout", "stopping", "cancel"), and,
    read by the caller where they count, a command's results file (or what is wrong with it), the
    OOM killer's word on a SIGKILL nobody here sent, and a failed command's stderr tail. A job that
    broke the protocol with its worker (``malformed``: how, after "the job") FAILED, whatever else it sent.
    In a job of ``ranks`` > 1 processes, the job's process is rank 0, and is named so.

    Pure: no clock, no files, no database.
    """
    exit_code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
    killed_by = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None
    results: dict[str, Any] | None = None
    error: str | None = None
    if malformed is not None:  # checked first: nothing else the job sent can be trusted
        exit_code = None
        outcome, error = "FAILED", f"the job {malformed}"
    elif kind == "fn" and exit_code == 0 and report is not None:
        exit_code = None  # a function that reported its outcome exits 0 whatever it was: that says nothing
        outcome, results, error = report["status"], report["results"], report["error"]
    elif kind == "cmd" and exit_code in (0, EXIT_INCOMPLETE):
        outcome = "DONE" if exit_code == 0 else "INCOMPLETE"
        results, error = command_results, command_error
        if error:
            outcome = "FAILED"
    elif server_gone:
        outcome, error = "CRASHED", "the worker's fork server died, and the job's process with it"
    elif killed_by is not None:
        who = f"rank 0 of {ranks} (the job's process)" if ranks > 1 else "the job's process"
        outcome, error = "CRASHED", f"{who} was killed by {signal.Signals(killed_by).name}"
        if oom_cause and killed_by == signal.SIGKILL and stopped_for is None:  # not by us: the OOM killer?
            error += f" ({oom_cause})"
    else:
        outcome = "FAILED"
        error = f"the job's process exited with code {exit_code}" + (
            "" if exit_code else " without reporting an outcome"
        )
        if kind == "cmd":
            error += stderr_tail
    why = None
    if stopped_for == "timeout" and outcome != "DONE":
        outcome, why = "FAILED", f"time limit of {timeout:g} s exceeded"
        error = (error + "\n" if error else "") + why
    elif stopped_for == "stopping" and outcome in ("INCOMPLETE", "CRASHED"):
        outcome, why = "REQUEUE", "its worker was stopped; put back to resume"
    elif stopped_for == "cancel" and outcome != "DONE":
        why = "cancelled while running"
    elif outcome == "CRASHED":
        why = error
    elif outcome == "FAILED":
        why = failure_why(error)
    return JobEnd(outcome, results, error, exit_code, why)


class _Child:
    """The process of a running job, as its worker sees it."""

    pid: int
    deadline: float | None  # the job's wall-time limit, as time.time()
    status: int | None  # its os.waitpid status, once it has exited
    cgroup: Path | None = None  # its own cgroup, if it could make one

    @property
    def signal(self) -> int | None:
        return os.WTERMSIG(self.status) if self.status is not None and os.WIFSIGNALED(self.status) else None

    @property
    def exit_code(self) -> int | None:
        return os.WEXITSTATUS(self.status) if self.status is not None and os.WIFEXITED(self.status) else None


class _Forked(_Child):
    """A job started by the fork server, its child: a function job's requests and report come on
    its socket, its exit status from the server."""

    def __init__(
        self,
        pid: int,
        deadline: float | None,
        sock: socket.socket | None,
        ctrl: socket.socket,
        answer: Callable[[dict[str, Any]], dict[str, Any]],
        cgroup: Path | None = None,
    ) -> None:
        self.pid = pid
        self.deadline = deadline
        self.sock: socket.socket | None = sock
        self.ctrl = ctrl
        self.answer = answer
        self.cgroup = cgroup
        self.report: dict[str, Any] | None = None
        self.status: int | None = None
        self.server_gone = False
        self.malformed: str | None = None  # how the job broke the protocol with its worker, if it did
        self.code: dict[str, Any] | None = None  # the code record its fork server sent (function jobs)
        self.oom = OomWatch()
        self._frames, self._ctrl_frames = Frames(), Frames()

    def send(self, sig: int) -> None:
        if self.status is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def pump(self, wait: float) -> None:
        """Answer the job's requests and read its report, waiting at most ``wait`` seconds."""
        fds = [s for s in (self.sock, self.ctrl) if s is not None]
        ready, _, _ = select.select(fds, [], [], max(0.0, wait))
        if self.sock is not None and self.sock in ready:
            self._read_job()
        if self.ctrl in ready:
            self._read_exit()

    def _read_job(self) -> bool:
        """Handle what the job sent; False when nothing more is there right now."""
        sock = self.sock
        if sock is None:
            return False
        try:
            data = sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._hung_up()
            return False
        try:
            for message in self._frames.feed(data):
                if job_request(message)["op"] == "report":
                    self.report = message
                else:
                    try:
                        sent = send_nowait(sock, self.answer(message))
                    except OSError:  # the job died waiting for the answer
                        sent = True
                    if not sent:  # a job waits for each answer: one that piles them up does not read them
                        self._refuse("stopped reading its worker's replies")
                        return False
        except MalformedMessage as exc:
            self._refuse(f"sent a malformed message: {exc}")
            return False
        return True

    def _refuse(self, why: str) -> None:
        """The job broke the protocol (``why``, after "the job"): it is ended now (its process too,
        reused or not, since nothing it sends can be trusted any more) and will be recorded FAILED."""
        if self.malformed is None:
            self.malformed = why
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._hung_up()

    def _hung_up(self) -> None:
        """The job's end of its socket closed."""
        if self.sock is not None:
            self.sock.close()
        self.sock = None

    def _read_exit(self) -> None:
        try:
            data = self.ctrl.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the server died, and its job with it (PDEATHSIG)
            self.server_gone = True
            self.status = signal.SIGKILL
            return
        for message in self._ctrl_frames.feed(data):
            if message.get("exit") == self.pid:
                self.status = message["status"]

    def reap(self) -> bool:
        if self.status is None:
            self._read_exit()
            if self.status is None:
                return False
        # The job sent its whole report before exiting; a process it forked may still hold the
        # socket open, so read what is there and do not wait for the end of the stream.
        while self.sock is not None and self._read_job():
            pass
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        return True


class _InProcess(_Forked):
    """A function job run by a job process that runs several in turn: ended by its report (the
    process has ended what the job started by then); a crash, by the process's exit status."""

    def __init__(
        self,
        process: JobProcess,
        deadline: float | None,
        ctrl: socket.socket,
        answer: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        super().__init__(process.pid, deadline, process.link, ctrl, answer, process.cgroup)
        self.process = process

    def send(self, sig: int) -> None:
        if self.report is None:  # once it reported, the process is another job's
            super().send(sig)

    def _hung_up(self) -> None:
        self.process.close()  # it died: the next job gets a fresh one
        self.sock = None

    def reap(self) -> bool:
        if self.malformed is not None and self.status is None:  # wait for the end of the process killed
            self._read_exit()
            return self.status is not None
        if self.report is None and self.status is None:
            self._read_exit()
            if self.status is None:
                return False
        # Died: what it sent before its end is still to be read.
        while self.report is None and self.sock is not None and self._read_job():
            pass
        if self.report is not None:
            self.status = 0  # it lives on for the next job (or exited after its last one, as asked)
        else:
            self.process.close()
        self.sock = None  # the link stays the process's, not this job's
        return True


class _ServedCommand(_Forked):
    """A command job, executed by the fork server: signals go to its whole process group."""

    def send(self, sig: int) -> None:
        if self.status is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass


class Runner:
    """Runs claimed jobs for one worker, keeping resolved targets warm between jobs."""

    def __init__(
        self,
        store: Store,
        limits: RunLimits,
        stopping: Callable[[], bool] = lambda: False,
        log: Callable[[str], None] = lambda _m: None,
        outage: Outage | None = None,
        server: ForkServer | None = None,
    ) -> None:
        self.store = store
        self.limits = limits
        self.stopping = stopping
        self.log = log
        self.outage = outage or Outage(log)
        self.server = server or ForkServer(limits.jobs_per_process)  # given: one started ahead
        weakref.finalize(self, self.server.close)
        self.gpus: GpuPool | None = None  # the host's devices, when the worker was given some
        self.slots: SlotPool | None = None  # its dispatch's -j slots, when ranks are counted
        self.job_env: dict[str, str] = {}  # set in the environment of the job being started
        self.artifacts: str | None = None  # where the jobs' artifact store is (the worker says)
        self._texts_kept: set[str] = set()  # digests of the diffs and package lists this worker kept
        self._ran_json: dict[tuple[str, str | None], tuple[dict[str, Any] | None, str, dict[str, tuple[str, str]]]] = {}
        self.cannot_import: str | None = None  # why a job of this worker's failed: its target cannot be imported
        self.unimportable = Unimportable.from_environment()  # targets whose jobs it leaves QUEUED

    def close(self) -> None:
        """Stop the fork server (it also stops by itself when the worker exits)."""
        self.server.close()

    # -- one job ----------------------------------------------------------------
    def run(self, claimed: Claimed) -> str:
        """Run the job to its end; return its new status name, or ``LOST`` if it was taken from us."""
        return self.run_then_claim(claimed, None)[0]

    def run_then_claim(self, claimed: Claimed, then: tuple[WorkerInfo, str] | None) -> tuple[str, Claimed | None]:
        """``run``; with ``then`` (who claims, and the workdir root), the transaction that records
        the job also claims the next one, returned beside the status (None if none was ready)."""
        if self.slots is None:
            return self._run_on_gpus(claimed, then)
        job, lease = claimed.job, claimed.lease
        try:
            if self.slots.take(job.ranks, self._waiting_for_gpus(job, lease)) is None:
                return self._finish(
                    job, lease, None, "REQUEUE", why="its worker was stopped waiting for slots for its ranks; put back"
                )
        except LeaseLost as exc:
            self.slots.give_back()
            self.log(str(exc))
            return LOST, None
        except JobmanError as exc:
            self.slots.give_back()
            return self._finish(job, lease, then, "FAILED", error=str(exc), why=f"could not start: {exc}")
        try:
            return self._run_on_gpus(claimed, then)
        finally:
            self.slots.give_back()  # however the job ended, its slots go back to the dispatch

    def _run_on_gpus(self, claimed: Claimed, then: tuple[WorkerInfo, str] | None) -> tuple[str, Claimed | None]:
        """``run_then_claim`` once the job holds its slots: its devices taken, if the worker has some."""
        if self.gpus is None:
            return self._run(claimed, then)
        job, lease = claimed.job, claimed.lease
        try:
            taken = self.gpus.take(gpus_asked(job.params, self.gpus.per_job), self._waiting_for_gpus(job, lease))
            if taken is None:
                return self._finish(
                    job, lease, None, "REQUEUE", why="its worker was stopped waiting for a GPU; put back"
                )
            self.job_env = {"CUDA_VISIBLE_DEVICES": ",".join(taken)}
            if taken:
                self.store.set_gpus(job.id, lease, ",".join(taken))
        except LeaseLost as exc:
            self.gpus.give_back()
            self.log(str(exc))
            return LOST, None
        except JobmanError as exc:
            self.gpus.give_back()
            return self._finish(job, lease, then, "FAILED", error=str(exc), why=f"could not start: {exc}")
        try:
            return self._run(claimed, then)
        finally:
            self.gpus.give_back()  # however the job ended, its devices go back to the pool

    def _waiting_for_gpus(self, job: Job, lease: int) -> Callable[[], bool]:
        """While the job waits for devices or slots: heartbeat it, and give up if the worker is stopping."""
        next_beat = [time.time() + self.limits.heartbeat_interval]

        def waiting() -> bool:
            if time.time() >= next_beat[0]:
                next_beat[0] = time.time() + self.limits.heartbeat_interval
                self.store.heartbeat(job.id, lease)
            return not self.stopping()

        return waiting

    def _run(self, claimed: Claimed, then: tuple[WorkerInfo, str] | None) -> tuple[str, Claimed | None]:
        job, lease = claimed.job, claimed.lease
        workdir = Path(os.path.abspath(job.workdir or "."))  # absolute as claimed: no lstat of every part
        try:
            os.mkdir(workdir)
        except FileExistsError:  # a relaunch, or a job continuing another's workdir
            pass
        except FileNotFoundError:  # the first job of an experiment makes the root
            workdir.mkdir(parents=True, exist_ok=True)
        try:
            # A call that takes calls continues none (only a promoted job of a search does): one query less.
            continues = job.depends_on and not takes_calls(job.params)
            start = self._continue_parent(job, workdir) if continues else job.results
            parents = claimed.parents
            if parents is None:  # a claim that did not read them
                parents = (
                    self.outage.call(lambda: self.store.parents(job.id), "reading the job's parents")
                    if job.depends_on
                    else []
                )
            before = tuple(child_pids())
            if job.kind == "fn":
                child: _Forked = self._start_function(job, lease, parents, workdir, start)
            else:
                child = self._spawn_command(job, parents, workdir)
        except TargetError as exc:
            if job.kind != "fn":  # a command that cannot start: that job's own failure
                return self._finish(job, lease, then, "FAILED", error=str(exc), why=f"could not start: {exc}")
            # A function whose module cannot be imported: its other jobs would fail so too, and are left QUEUED.
            where = where_of(job.code)
            cause = (
                f"job {job.id} FAILED: {exc}"
                + (f" (its module was found in {where} when scheduled)" if where else "")
                + "; its other jobs are left QUEUED"
            )
            if not self.unimportable.first_to_fail(job.target, cause):  # another job of it failed so already
                why = "its target cannot be imported here (another of its jobs failed so); put back"
                return self._finish(job, lease, None, "REQUEUE", why=why)
            self.cannot_import = self.cannot_import or cause
            return self._finish(job, lease, None, "FAILED", error=str(exc), why=f"could not start: {exc}")
        except (JobmanError, OSError, ForkServerGone) as exc:
            return self._finish(job, lease, then, "FAILED", error=str(exc), why=f"could not start: {exc}")
        try:
            kill_reason = self._supervise(child, job, lease)
        except LeaseLost as exc:
            self.log(str(exc))
            return LOST, None
        except BaseException:  # we leave on an error: the job goes too (the fork server ends the rest)
            if child.status is None:
                child.send(signal.SIGKILL)
            raise
        finally:
            if child.server_gone:  # the server could not end what the job left: it is ours to end
                self._end_leftovers(child, before)
        return self._record(child, job, lease, workdir, kill_reason, then, child.code)

    def _end_leftovers(self, child: _Forked, keep: tuple[int, ...]) -> None:
        """The fork server died under a job: kill the job's cgroup (with the server's folder of them)
        and process group, and what was orphaned to this worker (a subreaper, when run as
        ``jobman worker``) meanwhile."""
        end_job_processes(child.pid, keep=keep, cgroup=child.cgroup.parent if child.cgroup else None)

    # -- starting -----------------------------------------------------------------
    def _continue_parent(self, job: Job, workdir: Path) -> dict[str, Any] | None:
        """The state a job starts from. A job promoted to a higher rung of a search continues its parent's
        whole checkpoint: a copy of its workdir (made once, while the job's own is still empty) and the
        state it saved, under the job's own parameters; once the job saved a checkpoint of its own, that."""

        def read() -> tuple[str | None, dict[str, Any]] | None:
            return self.outage.call(lambda: self.store.continuation(job.id), "reading the job it continues")

        return continued_state(job, workdir, read)

    def _start_function(
        self, job: Job, lease: int, parents: list[Job], workdir: Path, start: dict[str, Any] | None
    ) -> _Forked:
        deadline = deadline_of(self.limits.timeout)
        request: dict[str, Any] = {
            "target": job.target,
            "workdir": str(workdir),
            "deadline": deadline,
            "save_every": self.limits.save_every,
            "artifacts": self.artifacts,
            "job": {
                "id": job.id,
                "phase": job.phase,
                "attempt": job.attempt,
                "params": job.params,
                "results": start,
                "jobman": job_info(
                    job.id, job.target, self.store.experiment, job.priority, job.attempt, job.phase, workdir
                ),
            },
            "parents": [
                {
                    "id": p.id,
                    "phase": p.phase,
                    "target": p.target,
                    "workdir": p.workdir or ".",
                    "params": p.params,
                    "results": p.results or {},
                }
                for p in parents
            ],
        }
        if self.job_env:
            request["env"] = self.job_env
        if takes_calls(job.params):
            request["taken"] = taken_values(job.params, parents)
        if job.ranks > 1:
            request["ranks"] = job.ranks
        where = where_of(job.code)
        if where and where not in sys.path:  # found there when scheduled: found so here too, after the rest
            sys.path.append(where)
        if by_value(job.target):
            request["code"] = self._code_of(job.target)
        answer = lambda message: self._answer(job, lease, message)  # noqa: E731
        if self.limits.jobs_per_process > 1:
            try:
                process = self.server.run_in_process(request)
            except ForkServerGone:  # killed between two jobs: a new one, once
                process = self.server.run_in_process(request)
            in_process = _InProcess(process, deadline, self.server.control, answer)
            in_process.code = self.server.last_code
            return in_process
        try:
            pid, sock = self.server.start_job(request)
        except ForkServerGone:  # killed between two jobs: a new one, once
            pid, sock = self.server.start_job(request)
        forked = _Forked(pid, deadline, sock, self.server.control, answer, self.server.last_cgroup)
        forked.code = self.server.last_code
        return forked

    def _code_of(self, target: str) -> str:
        """The stored code of a function run by value, as text for the fork server's JSON request."""
        code = self.store.function_code(target)
        if code is None:
            raise TargetError(f"{target!r} is run by value, but no code of it is stored in this experiment")
        return base64.b64encode(code).decode()

    def _answer(self, job: Job, lease: int, message: dict[str, Any]) -> dict[str, Any]:
        """Write a job's checkpoint or metrics under its lease; the answer it waits for."""
        try:
            if message.get("op") == "save":
                self.store.save(job.id, lease, message["results"])
            elif message.get("op") == "log":
                step = message["step"]
                self.store.log_metrics(job.id, lease, [(step, k, v) for k, v in message["metrics"].items()])
                verdict = self.store.prune_verdict(job.id, step, message["metrics"])
                if verdict:
                    return {"prune": verdict}
            else:
                return {"error": f"unknown request {message.get('op')!r}", "kind": "JobmanError"}
        except JobmanError as exc:
            return {"error": str(exc), "kind": type(exc).__name__}
        return {}

    def _spawn_command(self, job: Job, parents: list[Job], workdir: Path) -> _ServedCommand:
        state = {**job.params, **(job.results or {})}
        state_path, results_path = workdir / "jobman_state.json", workdir / "jobman_results.json"
        state_path.unlink(missing_ok=True)  # a FIFO or symlink left there by the job is not written through
        state_path.write_text(
            json.dumps(
                {
                    "params": job.params,
                    "state": state,
                    "job_id": job.id,
                    "phase": job.phase,
                    "attempt": job.attempt,
                    "parents": [
                        {"id": p.id, "workdir": p.workdir or ".", "params": p.params, "results": p.results or {}}
                        for p in parents
                    ],
                },
                indent=1,
            )
        )
        results_path.unlink(missing_ok=True)
        env = {
            **job_environment(os.environ),
            **self.job_env,
            "JOBMAN_STATE": str(state_path),
            "JOBMAN_RESULTS": str(results_path),
            "JOBMAN_WORKDIR": str(workdir),
            "JOBMAN_JOB_ID": str(job.id),
            "JOBMAN_ATTEMPT": str(job.attempt),
            "JOBMAN_PARENT_WORKDIRS": os.pathsep.join(p.workdir or "." for p in parents),
        }
        request = {"argv": command_argv(job.target, job.params), "env": env, "workdir": str(workdir)}
        try:  # the fork server runs it: its child, so what it leaves behind dies with it, even if we die
            pid, sock = self.server.start_job(request)
        except ForkServerGone:  # killed between two jobs: a new one, once
            pid, sock = self.server.start_job(request)
        sock.close()
        return _ServedCommand(
            pid, deadline_of(self.limits.timeout), None, self.server.control, lambda _m: {}, self.server.last_cgroup
        )

    # -- watching -------------------------------------------------------------------
    def _supervise(self, child: _Forked, job: Job, lease: int) -> str | None:
        """Wait for the child; heartbeat, enforce limits. Returns why we stopped it, if we did."""
        deadline = child.deadline
        next_beat = time.time() + self.limits.heartbeat_interval
        reason: str | None = None
        term_at: float | None = None
        killed = False
        beat_failing = False
        release_at: float | None = time.time() + HOLD_CONNECTION_S
        try:
            while not child.reap():
                now = time.time()
                if release_at is not None and now >= release_at:
                    release_at = None
                    self.store.keep_connection(False)
                wake = [next_beat, now + 0.5]
                if deadline is not None and reason is None:
                    wake.append(deadline)
                if term_at is not None and not killed:
                    wake.append(term_at + self.limits.grace)
                child.pump(min(wake) - now)
                now = time.time()
                if now >= next_beat:
                    next_beat = now + self.limits.heartbeat_interval
                    cancelled, beat_failing = self._beat(child, job, lease, beat_failing)
                    if cancelled and reason is None:
                        reason = "cancel"
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
        finally:  # the job's end is recorded, and the next one claimed, on a connection kept again
            self.store.keep_connection(True)
        if reason is None and deadline is not None and time.time() >= deadline:
            reason = "timeout"  # the job saw its wall-time limit (should_stop) before we did
        return reason

    def _beat(self, child: _Forked, job: Job, lease: int, failing: bool) -> tuple[bool, bool]:
        """Heartbeat the running job: whether it was cancelled, and whether heartbeats now fail.
        A lost lease ends the job here and is raised."""
        try:
            cancelled = self.store.heartbeat(job.id, lease)
        except LeaseLost:
            child.send(signal.SIGKILL)
            while not child.reap():
                time.sleep(0.01)
            raise
        except DatabaseError as exc:  # the database may come back; the job goes on meanwhile
            if not failing:
                self.log(f"heartbeat of job {job.id} failed ({exc}); the job goes on, heartbeats are retried")
            return False, True
        if failing:
            self.log(f"heartbeats of job {job.id} go through again")
        return bool(cancelled), False

    # -- recording --------------------------------------------------------------------
    def _record(
        self,
        child: _Forked,
        job: Job,
        lease: int,
        workdir: Path,
        reason: str | None,
        then: tuple[WorkerInfo, str] | None,
        ran: dict[str, Any] | None = None,
    ) -> tuple[str, Claimed | None]:
        """Record how the job ended: what only files and the kernel's log can say is read here,
        only where it counts; the verdict is :func:`classify_end`'s. ``ran``: the code record the
        fork server sent when it started a function job."""
        code, killed_by = child.exit_code, child.signal
        command_results = command_error = oom_cause = None
        stderr_tail = ""
        if job.kind == "cmd" and code in (0, EXIT_INCOMPLETE):
            command_results, command_error = _read_results(workdir / "jobman_results.json", workdir)
        elif job.kind == "cmd" and code is not None and not child.server_gone:
            stderr_tail = _stderr_tail(workdir / "stderr.txt", workdir)
        if killed_by == signal.SIGKILL and reason is None and not child.server_gone:
            oom_cause = child.oom.cause(child.pid)
        end = classify_end(
            job.kind,
            child.status,
            child.report,
            server_gone=child.server_gone,
            stopped_for=reason,
            timeout=self.limits.timeout,
            command_results=command_results,
            command_error=command_error,
            oom_cause=oom_cause,
            stderr_tail=stderr_tail,
            malformed=child.malformed,
            ranks=job.ranks,
        )
        record, texts = self._what_ran(job, ran)
        ended = self._finish(
            job,
            lease,
            then,
            end.outcome,
            results=end.results,
            error=end.error,
            exit_code=end.exit_code,
            why=end.why,
            code=record,
            texts=texts,
        )
        if ended[0] != LOST:  # kept with the job's end, in its transaction
            self._texts_kept.update(texts)
        return ended

    def _what_ran(self, job: Job, ran: dict[str, Any] | None) -> tuple[str, dict[str, tuple[str, str]]]:
        """The job's code and environment record, as JSON, and the texts it names that this worker has
        not kept yet (kept with the job's end, so that an outage has one place to be waited out): made
        once per code record and directory, then the same for every job that ran the same."""
        where = where_of(job.code)
        cached = self._ran_json.get((job.target, where))
        if cached is None or cached[0] is not ran:
            record, texts = what_ran(ran, job.target, where)
            cached = (ran, dump_json(record, "code record"), texts)
            self._ran_json[(job.target, where)] = cached
        return cached[1], {k: v for k, v in cached[2].items() if k not in self._texts_kept}

    def _finish(
        self, job: Job, lease: int, then: tuple[WorkerInfo, str] | None, outcome: str, **kwargs: Any
    ) -> tuple[str, Claimed | None]:
        """Record how the job ended (and claim the next). If the database cannot be told, the job is
        marked as interrupted by it, so that it is put back without spending an attempt."""
        try:
            return self._record_end(job, lease, then, outcome, **kwargs)
        except DatabaseError as exc:
            mark_interrupted(job.workdir, lease, f"its worker could not record its end: {exc}")
            raise

    def _record_end(
        self, job: Job, lease: int, then: tuple[WorkerInfo, str] | None, outcome: str, **kwargs: Any
    ) -> tuple[str, Claimed | None]:
        delay = 1.0
        for attempt in range(4):
            try:  # a result computed must not be dropped for a database outage: it is waited out
                if then is None or outcome == "REQUEUE":  # a stopping worker claims nothing more
                    finish = functools.partial(self.store.finish, job.id, lease, outcome, **kwargs)
                    return self.outage.call(finish, f"recording job {job.id}").value, None
                status, claimed = self.outage.call(
                    functools.partial(
                        self.store.finish_and_claim,
                        job.id,
                        lease,
                        outcome,
                        *then,
                        skip=self.unimportable.known(),
                        **kwargs,
                    ),
                    f"recording job {job.id}",
                )
                return status.value, claimed
            except LeaseLost as exc:
                self.log(str(exc))
                return LOST, None
            except UsageError as exc:  # results the database cannot hold (NaN, infinity): the job's bad return
                if kwargs.get("results") is None:
                    raise
                error = "\n".join(e for e in (kwargs.get("error"), str(exc)) if e)
                outcome, kwargs = "FAILED", {**kwargs, "results": None, "error": error, "why": str(exc)}
            except DatabaseUnavailable:
                raise
            except DatabaseError as exc:  # not an outage (a full disk, a read-only file): a few tries only
                if attempt == 3:
                    raise
                self.log(f"recording job {job.id} failed ({exc}); retrying in {delay:.0f} s")
                time.sleep(delay)
                delay = min(delay * 2, 30)
        raise AssertionError("unreachable")  # pragma: no cover


def _read_results(path: Path, workdir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """A command job's results file, read as a file the job controls (bounded, inside its workdir)."""
    if not os.path.lexists(path):
        return None, None
    try:
        data = json.loads(read_capped(path, workdir, RESULTS_LIMIT))
    except RecursionError:
        return None, f"$JOBMAN_RESULTS ({path}) is nested too deep"
    except (OSError, ValueError) as exc:
        return None, f"$JOBMAN_RESULTS ({path}) is not valid JSON: {exc}"
    if not isinstance(data, dict):
        return None, f"$JOBMAN_RESULTS ({path}) must hold a JSON object, not {type(data).__name__}"
    return data, None


def _stderr_tail(path: Path, workdir: Path) -> str:
    try:
        tail = read_tail(path, workdir, STDERR_TAIL).decode(errors="replace").strip()
    except OSError:
        return ""
    return f"\n--- end of stderr ---\n{tail}" if tail else ""

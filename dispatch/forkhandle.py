"""The worker's handle on its fork server (``dispatch.forkserver``): starting it, sending it jobs,
and the job processes that run several jobs in turn, as the worker sees them."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jobman.jobdb.url import without_password

from .experiment import TargetError
from .lifetime import hang_up, name_process
from .messages import MalformedMessage, recv_msg, send_msg

# Set to 1 in a worker's environment, its jobs get the database password as the worker has it.
PASS_DB_PASSWORD = "JOBMAN_JOBS_GET_DB_PASSWORD"
DB_PASSWORD_VARIABLES = ("PGPASSWORD",)
# a database URL, whose password a job must not get (another URL's, a proxy's say, is the job's to use)
_DATABASE_URL = re.compile(r"\bpostgres(?:ql)?(?:\+\w+)?://", re.I)


def job_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a job starts with: its worker's, without the database password (no PGPASSWORD,
    and every PostgreSQL URL in a variable, such as ``$JOBMAN_DB``, without its password), unless the worker's
    environment sets ``JOBMAN_JOBS_GET_DB_PASSWORD=1``. A job never needs it: it speaks to its worker."""
    if env.get(PASS_DB_PASSWORD) == "1":
        return dict(env)
    return {
        name: without_password(value) if _DATABASE_URL.search(value) else value
        for name, value in env.items()
        if name not in DB_PASSWORD_VARIABLES
    }


class ForkServerGone(Exception):
    """The fork server exited (killed, or out of memory)."""


class JobProcess:
    """The worker's side of a job process that runs several jobs: its pid, its cgroup, the link the
    worker sends it jobs over (and the jobs send their checkpoints, metrics and reports back on),
    and how many jobs it has left."""

    def __init__(self, pid: int, cgroup: Path | None, link: socket.socket, jobs: int) -> None:
        self.pid = pid
        self.cgroup = cgroup
        self.link: socket.socket | None = link
        self.left = jobs
        self.path_sent = list(sys.path)

    @property
    def usable(self) -> bool:
        return self.link is not None and self.left > 0

    def kill(self) -> None:
        """End it now (it sent what it should not); its fork server reports its exit."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Hang up: an idle job process exits at the end of its link."""
        if self.link is not None:
            self.link.close()
            self.link = None


class ForkedServer:
    """A fork server forked from its worker, handled as ``subprocess.Popen`` handles one it executed."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already (the worker ended what a dead server left)
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """The worker's handle on its fork server, started on the first function job.

    ``fork_first``: the first server is a fork of the worker rather than a new interpreter. A worker
    the dispatch's zygote forked has every module the server needs already imported, and shares its
    pages with the zygote: a fork costs it a few milliseconds instead of an interpreter's start and
    imports (90 ms of CPU each, which 200 workers starting at once on two cores queue for). It is
    used only by :meth:`warm`, before the worker opens its database (nothing of it is inherited)
    and starts a thread; a server started again later (the first one died) is a new interpreter.
    """

    def __init__(self, jobs_per_process: int = 1, fork_first: bool = False) -> None:
        self.jobs_per_process = jobs_per_process
        self.fork_first = fork_first
        self.proc: subprocess.Popen | ForkedServer | None = None
        self.ctrl: socket.socket | None = None
        self._path_sent: list[str] | None = None
        self.last_cgroup: Path | None = None  # of the job last started, if it could have one
        self.last_code: dict[str, Any] | None = None  # the code record of the job last started
        self.codes: dict[str, dict[str, Any]] = {}  # code records by target, as the server told them once
        self.process: JobProcess | None = None  # with jobs_per_process > 1: the one that takes the next job

    def _start(self) -> None:
        mine, theirs = socket.socketpair()
        code = (
            f"import sys; sys.path[:] = {sys.path!r}; "
            "from jobman.dispatch.forkserver import serve; "
            f"serve({theirs.fileno()}, {os.getpid()}, {self.jobs_per_process})"
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=job_environment(os.environ),  # its jobs inherit it
            )
        finally:
            theirs.close()
        self.ctrl = mine
        self._path_sent = list(sys.path)

    def _fork(self) -> None:
        """Start the server as a fork of this process (see the class's ``fork_first``)."""
        from .forkserver import serve

        mine, theirs = socket.socketpair()
        environment = job_environment(os.environ)  # its jobs inherit it
        worker = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the server's side, ended by os._exit
            code = 1
            try:
                mine.close()
                name_process(b"jobman-forksrv")  # what ps -e and top show
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.close(null)
                os.environ.clear()
                os.environ.update(environment)
                serve(theirs.fileno(), worker, self.jobs_per_process)
                code = 0
            except BaseException:  # noqa: BLE001 - as an interpreter would end: the traceback, then exit 1
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        theirs.close()
        self.proc = ForkedServer(pid)
        self.ctrl = mine
        self._path_sent = list(sys.path)

    @property
    def control(self) -> socket.socket:
        """The socket to the running server; ForkServerGone if none runs."""
        if self.ctrl is None:
            raise ForkServerGone("the worker's fork server is not running")
        return self.ctrl

    def warm(self) -> None:
        """Start the server now, so that its start overlaps the worker's own (opening the database,
        claiming) instead of delaying the first job."""
        if self.proc is None:
            self._fork() if self.fork_first else self._start()

    def start_job(self, request: dict[str, Any]) -> tuple[int, socket.socket]:
        """Send a job to the server, which forks a process for it: its pid and the worker's end of its
        socket (with ``last_cgroup`` its cgroup).

        A request with ``argv`` is a command job, forked and executed by the server (so it is its
        child, and what it leaves behind is the server's to kill); with jobs_per_process > 1 a
        request naming only a function forks a job process for :meth:`run_in_process`. Raises
        TargetError if the server cannot import the target or start the command, ForkServerGone if it died.
        """
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        if sys.path != self._path_sent:
            request = {**request, "path": list(sys.path)}
            self._path_sent = list(sys.path)
        ctrl = self.control
        mine, theirs = socket.socketpair()
        try:
            send_msg(ctrl, request, [theirs.fileno()])
            while True:  # the exit of a reused job process that ran its last job may come first
                reply = recv_msg(ctrl)
                if reply is None or "exit" not in reply[0]:
                    break
        except OSError:
            reply = None
        finally:
            theirs.close()
        if reply is None:
            mine.close()
            self.close()
            raise ForkServerGone("the worker's fork server exited")
        answer = reply[0]
        if "error" in answer:
            mine.close()
            raise TargetError(answer["error"])
        self.last_cgroup = Path(answer["cgroup"]) if answer.get("cgroup") else None
        self.last_code = self._code(request.get("target"), answer.get("code"))
        return answer["pid"], mine

    def run_in_process(self, request: dict[str, Any]) -> JobProcess:
        """Hand a function job to the reused job process (a fresh one from the server when there is
        none, or it has run its last job, or it died since its last one), once it has said the job
        started. Raises TargetError if the target cannot be imported, ForkServerGone if the server died."""
        for _try in range(2):
            process = self.process
            if process is None or not process.usable:
                if process is not None:
                    process.close()
                self.process = None
                pid, link = self.start_job({key: request[key] for key in ("target", "code") if key in request})
                self.process = process = JobProcess(pid, self.last_cgroup, link, self.jobs_per_process)
            job = request
            if sys.path != process.path_sent:
                job = {**request, "path": list(sys.path)}
                process.path_sent = list(sys.path)
            to_job = process.link
            try:
                if to_job is None:
                    raise OSError("hung up")
                send_msg(to_job, job)
                reply = recv_msg(to_job)
            except OSError:
                reply = None
            except MalformedMessage:  # left by a job it ran before (a thread of it): not to be trusted
                reply = None
                process.kill()
            if reply is not None and reply[0].get("op") == "error":
                raise TargetError(str(reply[0].get("error")))
            if reply is not None and reply[0].get("op") != "started":
                process.kill()  # it says what it should not: not to be trusted with another job
                reply = None
            if reply is None:  # it died between two jobs (killed, out of memory): a fresh one takes this job
                process.close()
                continue
            process.left -= 1
            self.last_code = self._code(request["target"], reply[0].get("code"))
            return process
        raise ForkServerGone("the worker's job process exited before starting its job")

    def _code(self, target: str | None, told: dict[str, Any] | None) -> dict[str, Any] | None:
        """The code record of a job of ``target`` just started: the one told now, else the one kept."""
        if target is None:  # a command
            return None
        if told is not None:
            self.codes[target] = told
        return self.codes.get(target)

    def close(self) -> None:
        """Hang up: the server exits at the end of its stream (killed if it does not)."""
        if self.process is not None:
            self.process.close()
            self.process = None
        hang_up(self)

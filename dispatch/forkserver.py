"""A small process that forks function jobs for a worker.

Forking the worker itself (SQLAlchemy, a database driver, rich: some 40 MB) costs
milliseconds per job in page-table copies, copy-on-write faults and the exit of
a large process. The fork server is a second interpreter that imports only the
experiment API and the jobs' own modules, each once: its children start warm and
cheap. A child never touches the database: ``channel.save()`` and
``channel.log()`` are requests to the worker over the job's socket, written by
the worker under the job's lease, and the job's outcome is its last message.

Lifetimes are chained: the server dies with its worker and a job with its server
(``PR_SET_PDEATHSIG``), so no job runs unwatched. The server ignores SIGTERM, SIGINT
and SIGUSR1: stopping a job is its worker's decision (it signals the job itself),
and a signal sent to a whole process group must not kill the server under a job
that is checkpointing.

Messages on both sockets are JSON, each preceded by its length (4 bytes, network order).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from .channel import Channel, Parent, job_state, to_jsonable
from .experiment import Outcome, TargetError, call, resolve, takes_state_and_channel

STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}
_HEADER = struct.Struct("!I")


# -- framing ---------------------------------------------------------------------------
def send_msg(sock: socket.socket, obj: Any, fds: list[int] | None = None) -> None:
    data = json.dumps(obj, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(sock, [_HEADER.pack(len(data))], fds)
        sock.sendall(data)
    else:
        sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exactly(sock: socket.socket, size: int, into: bytearray) -> bool:
    while len(into) < size:
        chunk = sock.recv(size - len(into))
        if not chunk:
            return False
        into.extend(chunk)
    return True


def recv_msg(sock: socket.socket, with_fds: bool = False) -> tuple[Any, list[int]] | None:
    """The next message and the descriptors sent with it; None at the end of the stream."""
    fds: list[int] = []
    head = bytearray()
    if with_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, 4)
        if not data:
            return None
        head.extend(data)
    if not _recv_exactly(sock, _HEADER.size, head):
        return None
    (size,) = _HEADER.unpack(head)
    body = bytearray()
    if not _recv_exactly(sock, size, body):
        return None
    return json.loads(body), fds


class Frames:
    """Messages read from a non-blocking socket as they arrive."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        self.buffer.extend(data)
        out = []
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                break
            out.append(json.loads(self.buffer[_HEADER.size:_HEADER.size + size]))
            del self.buffer[:_HEADER.size + size]
        return out


# -- the job's side ------------------------------------------------------------------------
class WorkerChannel(Channel):
    """The channel of a job run by a worker: ``save`` and ``log`` are written by the worker.

    Each call waits for the worker's answer, so a checkpoint is in the database when
    ``save()`` returns; an error there (the job was taken from this worker, a state too
    large to keep) is raised in the job as the same exception.
    """

    def __init__(self, *args: Any, sock: socket.socket, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sock = sock

    def _ask(self, request: dict[str, Any]) -> None:
        send_msg(self._sock, request)
        reply = recv_msg(self._sock)
        if reply is None:
            raise RuntimeError("the job's worker went away")
        answer = reply[0]
        if answer.get("error"):
            from jobman.jobdb import errors

            kind = getattr(errors, answer.get("kind", ""), None)
            if not (isinstance(kind, type) and issubclass(kind, errors.JobmanError)):
                kind = errors.JobmanError
            raise kind(answer["error"])

    def _save(self, results: dict[str, Any]) -> None:
        self._ask({"op": "save", "results": to_jsonable(results)})

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        self._ask({"op": "log", "step": step, "metrics": metrics})


_PRCTL: Any = False  # libc's prctl once looked up; None where there is none


def _prctl() -> Callable[..., int] | None:
    global _PRCTL
    if _PRCTL is False:
        try:
            _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
        except (OSError, AttributeError):
            _PRCTL = None
    return _PRCTL


def die_with_parent(oom_score_adj: int | None = None) -> None:
    """Linux: SIGKILL this process when its parent dies; optionally raise its OOM score."""
    prctl = _prctl()
    if prctl is not None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if oom_score_adj is None:
        return
    try:  # under memory pressure the OOM killer should take the job, not its worker
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, str(oom_score_adj).encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _job_main(fn: Callable[..., Any], request: dict[str, Any], sock: socket.socket, mask: set) -> None:
    """Inside the job's process: run the function and send its outcome to the worker."""
    die_with_parent(oom_score_adj=500)
    workdir = Path(request["workdir"])
    os.chdir(workdir)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)
    job = request["job"]
    state = job_state(job["params"], job["results"], job.get("jobman"))
    parents = [Parent(p["id"], p["phase"], p["target"], Path(p["workdir"]), p["params"], p["results"])
               for p in request["parents"]]
    channel = WorkerChannel(job["id"], job["phase"], job["attempt"], workdir, dict(job["params"]), parents,
                            deadline=request["deadline"], save_every=request.get("save_every"), sock=sock)
    channel.install_signal_handlers()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        outcome = call(fn, state, channel)
    except BaseException:  # SystemExit and friends from the job
        outcome = Outcome("FAILED", {}, traceback.format_exc(limit=20))
    sys.stdout.flush()
    sys.stderr.flush()
    send_msg(sock, {"op": "report", "status": outcome.status, "results": to_jsonable(outcome.results),
                    "error": outcome.error})


# -- the server ----------------------------------------------------------------------------
def serve(fd: int, worker_pid: int) -> None:
    """The fork server's loop: one request, one job, its exit status; until the worker hangs up."""
    die_with_parent()
    if os.getppid() != worker_pid:  # the worker died before the line above
        os._exit(0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_IGN)
    ctrl = socket.socket(fileno=fd)
    try:
        _serve_requests(ctrl)
    except ConnectionError:  # the worker was killed (its end of the socket closes before we are)
        pass


def _serve_requests(ctrl: socket.socket) -> None:
    targets: dict[str, Callable[..., Any]] = {}
    while True:
        got = recv_msg(ctrl, with_fds=True)
        if got is None:
            return
        request, fds = got
        if "path" in request:
            sys.path[:] = request["path"]
        job_sock = socket.socket(fileno=fds[0])
        target = request["target"]
        try:
            if target not in targets:
                fn = resolve(target)
                takes_state_and_channel(fn)  # worked out once here, so each child finds it done
                targets[target] = fn
        except TargetError as exc:
            job_sock.close()
            send_msg(ctrl, {"error": str(exc)})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # Blocked until the child has installed its handlers: a SIGTERM sent at once must reach
        # channel.should_stop(), not the disposition (ignore) inherited from the server.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        gc.freeze()  # the server's objects stay out of the job's collections (and its page copies)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ctrl.close()
                _job_main(targets[target], request, job_sock, mask)
            except BaseException:  # noqa: BLE001 - nothing may escape into the server's loop
                code = 70
            finally:
                os._exit(code)
        gc.unfreeze()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        job_sock.close()
        send_msg(ctrl, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        send_msg(ctrl, {"exit": pid, "status": status})


class ForkServerGone(Exception):
    """The fork server exited (killed, or out of memory)."""


class ForkServer:
    """The worker's handle on its fork server, started on the first function job."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.ctrl: socket.socket | None = None
        self._path_sent: list[str] | None = None

    def _start(self) -> None:
        mine, theirs = socket.socketpair()
        code = (f"import sys; sys.path[:] = {sys.path!r}; "
                f"from jobman.dispatch.forkserver import serve; serve({theirs.fileno()}, {os.getpid()})")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                         stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.ctrl = mine
        self._path_sent = list(sys.path)

    def start_job(self, request: dict[str, Any]) -> tuple[int, socket.socket]:
        """Send a job to the server: its pid and the worker's end of its socket.

        Raises TargetError if the server cannot import the target, ForkServerGone if it died.
        """
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        if sys.path != self._path_sent:
            request = {**request, "path": list(sys.path)}
            self._path_sent = list(sys.path)
        mine, theirs = socket.socketpair()
        try:
            send_msg(self.ctrl, request, [theirs.fileno()])
            reply = recv_msg(self.ctrl)
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
        return answer["pid"], mine

    def close(self) -> None:
        """Hang up: the server exits at the end of its stream (killed if it does not)."""
        if self.ctrl is not None:
            self.ctrl.close()
            self.ctrl = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

"""Local workers forked from one warm interpreter instead of each starting its own.

A worker spends most of its start importing SQLAlchemy and the store (a quarter of
a second here when the machine is idle, seconds under load). The local backend
starts one *zygote*: an interpreter that imports the worker (``worker_process``)
once, touches no database, runs no thread, and forks each worker on request. A worker
forked from it runs as ``jobman worker`` does, from the settings the dispatch sent (no
command line to parse): its own session, its log file for stdout and stderr, its own
database connections, made after the fork.

The zygote dies with the dispatcher (``PR_SET_PDEATHSIG``), and each worker it forked
is then told to stop (SIGTERM: it puts its job back), as a worker started by the
dispatcher itself is when the dispatcher ends.
"""

from __future__ import annotations

import gc
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from ..lifetime import die_with_parent, hang_up, name_process
from ..messages import recv_msg, send_msg


def serve(fd: int, parent_pid: int) -> None:
    """The zygote's loop: fork a worker per request and send its pid back; send each worker's exit
    status when it ends; until the dispatcher hangs up."""
    die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the dispatcher's to handle
    import psutil  # noqa: F401 - what a worker reads its own start time with

    import jobman.dispatch.forkserver  # each worker's fork server is a fork of the worker
    import jobman.dispatch.lifetime  # noqa: F401 - what a worker reads to die with its dispatcher
    from jobman.dispatch.worker_process import worker_main  # the worker and the store, imported once
    from jobman.jobdb import sqlite_memory

    sqlite_memory.allow()  # in each worker forked from here, before its first database

    gc.freeze()  # out of every collection, in here and in the workers: their pages stay shared

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a worker ended: wake the loop through the pipe
    ctrl = socket.socket(fileno=fd)
    while True:
        ready, _, _ = select.select([ctrl.fileno(), wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        _send_exits(ctrl)
        if ctrl.fileno() not in ready:
            continue
        got = recv_msg(ctrl)
        if got is None:
            return
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for own in (ctrl.fileno(), wake_r, wake_w):
                os.close(own)
            _worker_main(worker_main, got[0], zygote)
        send_msg(ctrl, {"pid": pid})


def _send_exits(ctrl: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send_msg(ctrl, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _worker_main(main: Any, request: dict[str, Any], zygote: int) -> None:
    """In the forked worker: a session and output of its own, then the worker itself (``main``).

    ``zygote`` is the pid of the process that forked it, named before the fork: should the zygote
    die first (with its dispatcher), the worker's parent is already another process, and the
    worker must still see that its parent is gone."""
    from ..lifetime import DIE_WITH_VARIABLE

    code = 70
    try:
        os.setsid()
        name_process(b"jobman-worker")  # what ps -e and top show, instead of the zygote's name
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        if DIE_WITH_VARIABLE in os.environ:  # the zygote dies with the dispatcher, so the worker with the zygote
            os.environ[DIE_WITH_VARIABLE] = str(zygote)
        code = main(request)
    except BaseException:  # noqa: BLE001 - a worker's error must not return into the zygote's loop
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Forked:
    """A worker forked by the zygote, handled as ``subprocess.Popen`` handles its own children
    (``returncode`` negative for a signal)."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self.zygote = zygote
        self._fd: int | None = os.pidfd_open(pid)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self._fd is not None and select.select([self._fd], [], [], 0)[0]:
            os.close(self._fd)
            self._fd = None
            self.returncode = self.zygote.exit_code(self.pid)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._fd is not None:
            try:
                signal.pidfd_send_signal(self._fd, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        if self._fd is not None:
            select.select([self._fd], [], [], timeout)
        return self.poll()


class Zygote:
    """The dispatcher's handle on its zygote, started with the first worker (or ahead of it, by
    :func:`prestart`)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.ctrl: socket.socket | None = None
        self.exits: dict[int, int] = {}  # pid: exit code, as the zygote reported them

    @classmethod
    def ready(cls) -> Zygote:
        """The zygote :func:`prestart` began in this process, if any (each is used once), else a new one."""
        global _prestarted
        zygote, _prestarted = _prestarted, None
        return zygote if zygote is not None else cls()

    def start_worker(self, request: dict[str, Any], log_path: str, env: dict[str, str]) -> Forked:
        """Fork a worker that runs ``request`` (the database URL and the worker's settings, see
        :func:`~jobman.dispatch.worker_process.worker_main`), its output to ``log_path``."""
        forked = self.start_workers([(request, log_path, env)])
        if not forked:
            raise OSError("the process that starts local workers exited")
        return forked[0]

    def start_workers(self, workers: list[tuple[dict[str, Any], str, dict[str, str]]]) -> list[Forked]:
        """Fork a worker for each (request, log path, environment), as :meth:`start_worker` does: all
        asked for before any pid is read, so that the zygote forks them in one burst. Fewer than asked
        for if the zygote exited meanwhile."""
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self._start()
        assert self.ctrl is not None  # _start made it
        for request, log_path, env in workers:
            send_msg(self.ctrl, {**request, "log": log_path, "env": env})
        forked: list[Forked] = []
        while len(forked) < len(workers):
            message = self._next(None)
            if message is None:
                self.close()
                break
            if "pid" in message:
                forked.append(Forked(message["pid"], self))
        return forked

    def exit_code(self, pid: int) -> int:
        """The exit code of a worker that has ended (its zygote reports it at once; 0 if it cannot)."""
        deadline = time.monotonic() + 5
        while pid not in self.exits and time.monotonic() < deadline:
            if self._next(max(0.0, deadline - time.monotonic())) is None and self.ctrl is None:
                break
        return self.exits.pop(pid, 0)

    def _next(self, timeout: float | None) -> dict[str, Any] | None:
        """The zygote's next message (exit reports are kept aside); None if none came or it is gone."""
        if self.ctrl is None:
            return None
        if timeout is not None and not select.select([self.ctrl], [], [], timeout)[0]:
            return None
        got = recv_msg(self.ctrl)
        if got is None:
            self.close()
            return None
        message = got[0]
        if "exit" in message:
            self.exits[message["exit"]] = message["code"]
        return message

    def _start(self) -> None:
        mine, theirs = socket.socketpair()
        try:  # run as a module, as a worker is: the current directory first on sys.path
            self.proc = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        self.ctrl = mine

    def close(self) -> None:
        hang_up(self)


_prestarted: Zygote | None = None


def prestart() -> None:
    """Start a zygote now, for the local dispatch this process is about to run: its imports (a
    third of a second) then overlap the dispatcher's own start instead of following it. One not
    taken by :meth:`Zygote.ready` exits at :func:`discard_prestarted`, or when this process ends."""
    global _prestarted
    if _prestarted is None:
        zygote = Zygote()
        try:
            zygote._start()
        except OSError:
            return
        _prestarted = zygote


def discard_prestarted() -> None:
    """Stop a zygote :func:`prestart` began that no dispatch took (the command failed first, or
    every call of an experiment was answered from the database)."""
    global _prestarted
    zygote, _prestarted = _prestarted, None
    if zygote is not None:
        if zygote.proc is not None:  # it forked no worker: killed, not waited for while it still imports
            zygote.proc.kill()
        zygote.close()


if __name__ == "__main__":
    try:
        serve(int(sys.argv[1]), int(sys.argv[2]))
    except ConnectionError:  # the dispatcher went away while a pid or an exit was sent to it: no one to tell
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing to tear down: its workers are processes of their own, and it holds no files

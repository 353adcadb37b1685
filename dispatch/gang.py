"""A job of many processes (a gang): its ranks started together, watched together, ended together.

The job's process is rank 0: it keeps the job's channel to its worker, so rank 0's results and
saves are the job's. Before calling the function it forks ranks 1..N-1 itself, each calling the same
function with a channel of its own whose ``save`` and ``log`` are ignored (the job has one record,
rank 0's), and its output in ``rank-R.log`` in the job's workdir.

Why the job's own forks rather than ``mpiexec``: the ranks then sit in the job's process group and
cgroup and die with its process (``PR_SET_PDEATHSIG``), so every way a one-process job is ended
(the worker's stop, the server's leftovers, a dead worker) ends every rank, and the rank that failed
is known exactly (its pid and wait status), not parsed from a launcher's output. Every rank gets
torch.distributed's ``env://`` variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT: a port free when the gang starts).

All or nothing: a thread of rank 0 waits on the other ranks; the first that raises, exits non-zero or
is killed has every other rank killed, and the job's report names it: FAILED with its traceback (its
own doing) or CRASHED (killed by a signal: the world's). Rank 0 raising ends the others the same way.
A job that returns waits for every rank to return before it reports. Stop signals (a cancel, the
time limit, Slurm's warning) reaching rank 0 are passed on to every rank.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .lifetime import die_with_parent

RANK_LOG = "rank-{rank}.log"  # the output of rank R > 0, in the job's workdir (rank 0's: stdout.txt, stderr.txt)
_ERROR_BYTES = 16_000  # of a rank's traceback, passed through a pipe that is read once the rank has ended


def rank_logs(workdir: str, ranks: int) -> list[str]:
    """Where each rank's output goes, by rank: rank 0's is the job's own (stdout.txt, stderr.txt)."""
    return [f"{workdir}/stdout.txt, {workdir}/stderr.txt"] + [
        f"{workdir}/{RANK_LOG.format(rank=rank)}" for rank in range(1, ranks)
    ]


def free_port() -> int:
    """A TCP port no process listens on now, for the ranks' MASTER_PORT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_env(rank: int, world_size: int, port: int, addr: str = "127.0.0.1") -> dict[str, str]:
    """What torch.distributed's ``env://`` reads, for one rank of a gang on one host."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }


class RankFailed(Exception):
    """A rank's call failed; the message is its traceback."""


class Gang:
    """Ranks 1..N-1 of a job, forked by rank 0 (the job's process) and watched by a thread of it."""

    def __init__(self, world_size: int, report: Callable[[str, str], None]) -> None:
        """``report(status, error)`` sends the job's end for a failure found by the watcher; the
        process exits right after it."""
        self.world_size = world_size
        self.port = free_port()
        self._report = report
        self._ranks: dict[int, tuple[int, int]] = {}  # pid -> (rank, read end of its error pipe)
        self._ending = threading.Lock()  # whoever takes it says how the job ended
        self._all_returned = threading.Event()

    def start(self, run_rank: Callable[[int], None]) -> None:
        """Fork ranks 1..N-1, each running ``run_rank(rank)`` with its variables set; rank 0's are set here."""
        for rank in range(1, self.world_size):
            errors_r, errors_w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(errors_r)
                self._rank_process(rank, errors_w, run_rank)
            os.close(errors_w)
            self._ranks[pid] = (rank, errors_r)
        os.environ.update(rank_env(0, self.world_size, self.port))
        threading.Thread(target=self._watch, name="jobman-gang", daemon=True).start()

    def _rank_process(self, rank: int, errors: int, run_rank: Callable[[int], None]) -> None:
        """Inside rank ``rank``: its output to its log, its variables, the call; exit 0 if it returned."""
        code = 1
        try:
            die_with_parent()
            log = os.open(RANK_LOG.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            os.environ.update(rank_env(rank, self.world_size, self.port))
            for sig in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(sig, signal.SIG_DFL)  # until the rank's channel installs its own
            run_rank(rank)
            code = 0
        except RankFailed as exc:  # the call's own traceback
            text = str(exc)
            sys.stderr.write(text)
            try:
                os.write(errors, text.encode(errors="replace")[-_ERROR_BYTES:])
            except OSError:
                pass
        except BaseException:  # noqa: BLE001 - the rank's error, whatever it is, is the job's
            text = traceback.format_exc(limit=20)
            sys.stderr.write(text)
            try:
                os.write(errors, text.encode(errors="replace")[-_ERROR_BYTES:])
            except OSError:
                pass
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def pass_on_stops(self) -> None:
        """A stop signal to rank 0 (its channel's handlers installed) reaches every rank too."""
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            previous = signal.getsignal(sig)

            def forward(signum: int, frame: Any, previous: Any = previous) -> None:
                for pid in list(self._ranks):
                    try:
                        os.kill(pid, signum)
                    except ProcessLookupError:
                        pass
                if callable(previous):
                    previous(signum, frame)

            signal.signal(sig, forward)

    def _watch(self) -> None:
        """Wait for the other ranks; the first that ends badly ends the job."""
        fds = {}
        for pid in self._ranks:
            try:
                fds[pid] = os.pidfd_open(pid)
            except OSError:
                fds[pid] = -1  # polled
        while fds:
            watched = [fd for fd in fds.values() if fd >= 0]
            ready, _, _ = select.select(watched, [], [], None if len(watched) == len(fds) else 0.05)
            for pid, fd in list(fds.items()):
                if fd >= 0 and fd not in ready:
                    continue
                done, status = os.waitpid(pid, 0 if fd >= 0 else os.WNOHANG)
                if done == 0:
                    continue
                if fd >= 0:
                    os.close(fd)
                del fds[pid]
                rank, errors = self._ranks.pop(pid)
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                    os.close(errors)
                    continue
                outcome, error = self._verdict(rank, status, errors)
                if self._ending.acquire(blocking=False):
                    self.kill_all()
                    self._report(outcome, error)
                    os._exit(0)
                return  # rank 0 is saying how the job ended
        self._all_returned.set()

    def _verdict(self, rank: int, status: int, errors: int) -> tuple[str, str]:
        """How a rank that did not return ended, as the job's outcome and error."""
        text = b""
        while chunk := os.read(errors, 65536):
            text += chunk
        os.close(errors)
        name = f"rank {rank} of {self.world_size}"
        if os.WIFSIGNALED(status):
            return "CRASHED", f"{name} was killed by {signal.Signals(os.WTERMSIG(status)).name}"
        if text:
            return "FAILED", f"{name} raised:\n{text.decode(errors='replace')}"
        return "FAILED", f"{name} exited with code {os.WEXITSTATUS(status)}"

    def kill_all(self) -> None:
        """SIGKILL every rank still running (not rank 0)."""
        for pid in list(self._ranks):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def finish(self, status: str, error: str | None) -> tuple[str, str | None]:
        """Rank 0's call ended with ``status``: the job's end, once every rank has (on a failure of
        rank 0, the others are killed). Never returns if another rank's failure is being reported."""
        if status == "FAILED":
            self._take_the_end()
            self.kill_all()
            return status, f"rank 0 of {self.world_size} raised:\n{error}" if error else error
        while not self._all_returned.wait(0.1):
            pass
        self._take_the_end()
        return status, error

    def _take_the_end(self) -> None:
        if not self._ending.acquire(blocking=False):  # the watcher is reporting, then exits the process
            while True:
                time.sleep(60)

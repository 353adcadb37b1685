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

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .lifetime import die_with_parent

RANK_ERROR = "rank-{rank}.error"  # under srun: the traceback of a rank that raised
SRUN_REQUEST = "gang-request.json"  # under srun: what ranks 1..N-1 run, for ``jobman.dispatch.rank_main``
SRUN_LOG = "gang-srun.log"  # under srun: srun's own words (which task was killed)
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


def slurm_tasks() -> int:
    """The tasks of the Slurm allocation this process runs in (0 outside one, or without srun)."""
    if not os.environ.get("SLURM_JOB_ID") or shutil.which("srun") is None:
        return 0
    try:
        return int(os.environ.get("SLURM_NTASKS", "1"))
    except ValueError:
        return 0


def rank_env(
    rank: int, world_size: int, port: int, addr: str = "127.0.0.1", local: tuple[int, int] | None = None
) -> dict[str, str]:
    """What torch.distributed's ``env://`` reads, for one rank of a gang; ``local`` (its rank and the
    ranks on its node) when they differ from the gang's, on a gang over several nodes."""
    local_rank, local_size = local or (rank, world_size)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
    }


class RankFailed(Exception):
    """A rank's call failed; the message is its traceback."""


def rank_process(
    rank: int,
    world_size: int,
    port: int,
    addr: str,
    errors: int,
    run_rank: Callable[[int], None],
    local: tuple[int, int] | None = None,
) -> None:
    """Inside rank ``rank`` > 0: its output to its log, its variables, the call; exits 0 if it returned,
    else 1 with its traceback written to ``errors``. Never returns."""
    code = 1
    try:
        die_with_parent()
        log = os.open(RANK_LOG.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.update(rank_env(rank, world_size, port, addr, local))
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)  # until the rank's channel installs its own
        run_rank(rank)
        code = 0
    except RankFailed as exc:  # the call's own traceback
        _tell(errors, str(exc))
    except BaseException:  # noqa: BLE001 - the rank's error, whatever it is, is the job's
        _tell(errors, traceback.format_exc(limit=20))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _tell(errors: int, text: str) -> None:
    sys.stderr.write(text)
    try:
        os.write(errors, text.encode(errors="replace")[-_ERROR_BYTES:])
    except OSError:
        pass


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
        self.addr = "127.0.0.1"  # MASTER_ADDR: rank 0's host
        self._srun: int | None = None  # under srun: the pid of the step that runs ranks 1..N-1

    def start(self, run_rank: Callable[[int], None], request: dict[str, Any] | None = None) -> None:
        """Start ranks 1..N-1, each running ``run_rank(rank)`` with its variables set; rank 0's are set here.
        Inside a Slurm allocation of enough tasks they are srun's tasks (running ``request``), placed by
        Slurm; elsewhere forks of this process."""
        if request is not None and slurm_tasks() >= self.world_size:
            self._start_srun(request)
        else:
            self._fork_ranks(run_rank)
        os.environ.update(rank_env(0, self.world_size, self.port, self.addr))
        threading.Thread(target=self._watch, name="jobman-gang", daemon=True).start()

    def _start_srun(self, request: dict[str, Any]) -> None:
        """Ranks 1..N-1 as one srun step: each task is ``python -m jobman.dispatch.rank_main``, its rank
        its SLURM_PROCID + 1; srun kills the step when one task fails (``--kill-on-bad-exit``)."""
        self.addr = socket.gethostname()
        for rank in range(1, self.world_size):
            Path(RANK_ERROR.format(rank=rank)).unlink(missing_ok=True)
        Path(SRUN_REQUEST).write_text(json.dumps({**request, "port": self.port, "addr": self.addr}))
        argv = [
            shutil.which("srun") or "srun",
            f"--ntasks={self.world_size - 1}",
            "--kill-on-bad-exit=1",
            sys.executable,
            "-m",
            "jobman.dispatch.rank_main",
            os.path.abspath(SRUN_REQUEST),
        ]
        with open(SRUN_LOG, "ab") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self._srun = proc.pid
        self._ranks[proc.pid] = (0, -1)

    def _fork_ranks(self, run_rank: Callable[[int], None]) -> None:
        for rank in range(1, self.world_size):
            errors_r, errors_w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.close(errors_r)
                rank_process(rank, self.world_size, self.port, self.addr, errors_w, run_rank)
            os.close(errors_w)
            self._ranks[pid] = (rank, errors_r)

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
        """Wait for the other ranks; the first that ends badly ends the job. Should the watching itself
        fail, the job ends too: rank 0 must never wait for ranks nobody watches."""
        try:
            self._watch_ranks()
        except Exception as exc:  # noqa: BLE001 - said as the job's end, never swallowed
            if self._ending.acquire(blocking=False):
                self.kill_all()
                self._report("CRASHED", f"watching the ranks of the gang failed: {exc!r}")
                os._exit(0)

    def _watch_ranks(self) -> None:
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
                    if errors >= 0:
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
        if errors < 0:
            return self._srun_verdict(status)
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

    def _srun_verdict(self, status: int) -> tuple[str, str]:
        """How the srun step of ranks 1..N-1 ended badly: a rank's traceback if one raised (the first),
        else the task srun says was killed."""
        raised = sorted(
            (path.stat().st_mtime, rank, path)
            for rank in range(1, self.world_size)
            if (path := Path(RANK_ERROR.format(rank=rank))).exists()
        )
        if raised:
            _when, rank, path = raised[0]
            return "FAILED", f"rank {rank} of {self.world_size} raised:\n{path.read_text(errors='replace')}"
        said = Path(SRUN_LOG).read_text(errors="replace") if Path(SRUN_LOG).exists() else ""
        killed = re.search(r"task (\d+): (Killed|Terminated|Segmentation fault|Aborted)", said)
        if killed:
            rank = int(killed.group(1)) + 1
            return (
                "CRASHED",
                f"rank {rank} of {self.world_size} was {killed.group(2).lower()} (srun: {killed.group(0)})",
            )
        how = (
            f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
            if os.WIFSIGNALED(status)
            else (f"ended with code {os.WEXITSTATUS(status)}")
        )
        return "CRASHED", f"the srun step of ranks 1..{self.world_size - 1} {how}: {said.strip()[-2000:]}"

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

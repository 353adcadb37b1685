"""A job of many processes (a gang): its ranks started together, watched together, ended together.

The job's process (the fork server's child, holding the job's channel to its worker) leads the gang,
and rank 0's results, saves and curves are the job's; the other ranks call the same function with a
channel whose ``save`` and ``log`` are ignored (the job has one record), their output in ``rank-R.log``
in the job's workdir. Every rank gets torch.distributed's ``env://`` variables (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: a port free when the gang starts). The ranks
come from one of three launches (:func:`launch_of`):

- ``fork`` (the default): the job's process is rank 0 and forks ranks 1..N-1 before calling the
  function. They sit in its process group and cgroup and die with it (``PR_SET_PDEATHSIG``), so every
  way a one-process job is ended ends every rank, and the rank that failed is known by its own pid and
  wait status, not read from a launcher's output. They are not an MPI world, so ``jobman.ps`` is
  refused in them.
- ``mpiexec`` (the ``ps`` extra's MPICH, asked for with ``JOBMAN_GANG_LAUNCH=mpiexec``): every rank,
  rank 0 included, is a process of ``mpiexec -n N`` running ``jobman.dispatch.rank_main``, one MPI
  world, so ``jobman.ps`` works in it. The job's process stays its worker's only contact and relays
  rank 0's requests (save, log, its report) over a Unix socket. A rank is named by the pid file it
  wrote; what MPICH's launcher leaves behind is ended with the job's cgroup and, as orphans, by the
  fork server (a subreaper).
- ``srun``, inside a Slurm allocation of enough tasks (``--ntasks=N``): every rank is a task of one
  srun step (``--kill-on-bad-exit``), placed by Slurm, rank R its task R, and one MPI world through
  Slurm's PMI-2 (``--mpi=pmi2``, which the mpich wheel speaks; ``SLURM_MPI_TYPE``, if set, says
  otherwise), so ``jobman.ps`` works in it. As under mpiexec, the job's process relays rank 0, which
  Slurm starts on the first node of the allocation, the job's own.

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
from typing import Any, NoReturn

from .jobfiles import read_tail
from .lifetime import die_with_parent
from .messages import recv_msg, send_msg

RANK_ERROR = "rank-{rank}.error"  # launched: the traceback of a rank that raised (empty while it runs)
RANK_PID = "rank-{rank}.pid"  # launched: each rank's pid and host, to signal it
RANK_END = "rank-{rank}.end"  # launched: how a rank's process ended, and when
GANG_REQUEST = "gang-request.json"  # launched: what the ranks run, for ``jobman.dispatch.rank_main``
LAUNCH_LOG = "gang-{launch}.log"  # launched: the launcher's own words (which rank was killed)
LAUNCH_ENV = "JOBMAN_GANG_LAUNCH"  # fork (the default) or mpiexec
RANK_LOG = "rank-{rank}.log"  # the output of rank R > 0, in the job's workdir (rank 0's: stdout.txt, stderr.txt)
RANK_WHERE = "rank-{rank}.where"  # every rank: the host and pid it runs as, for show, list and the dashboard
_ERROR_BYTES = 16_000  # of a rank's traceback, passed through a pipe that is read once the rank has ended


def rank_logs(workdir: str, ranks: int) -> list[str]:
    """Where each rank's output goes, by rank: rank 0's is the job's own (stdout.txt, stderr.txt)."""
    return [f"{workdir}/stdout.txt, {workdir}/stderr.txt"] + [
        f"{workdir}/{RANK_LOG.format(rank=rank)}" for rank in range(1, ranks)
    ]


def note_where(rank: int) -> None:
    """Write down, in the job's workdir (the current directory), where this process runs as rank ``rank``."""
    try:
        Path(RANK_WHERE.format(rank=rank)).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    except OSError:  # a workdir that cannot be written: the job runs all the same, unplaced
        pass


def rank_places(workdir: str, ranks: int) -> list[dict[str, Any]]:
    """Each rank of a gang job: where it ran (host and pid, None until it started) and its log, by rank."""
    places = []
    for rank, log in enumerate(rank_logs(workdir, ranks)):
        try:
            where = json.loads(read_tail(Path(workdir, RANK_WHERE.format(rank=rank)), workdir, 4096))
        except (OSError, ValueError):  # not started, or not there to be read from this host
            where = None
        if not isinstance(where, dict):
            where = {}
        host, pid = where.get("host"), where.get("pid")
        places.append(
            {
                "rank": rank,
                "host": host if isinstance(host, str) else None,
                "pid": pid if isinstance(pid, int) else None,
                "log": log,
            }
        )
    return places


def mpiexec_path() -> str | None:
    """The mpiexec of the ``ps`` extra (beside this Python), or one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def launch_of(world_size: int) -> str:
    """How a gang of ``world_size`` ranks starts here: srun inside a Slurm allocation of enough tasks,
    else as $JOBMAN_GANG_LAUNCH says (fork, or mpiexec for an MPI world), fork by default."""
    if slurm_tasks() >= world_size:
        return "srun"
    asked = os.environ.get(LAUNCH_ENV, "fork") or "fork"
    if asked not in ("fork", "mpiexec"):
        raise GangError(f"{LAUNCH_ENV}={asked!r}: say fork or mpiexec")
    if asked == "mpiexec" and mpiexec_path() is None:
        raise GangError(f"{LAUNCH_ENV}=mpiexec, but there is no mpiexec: pip install 'jobman-sql[ps]'")
    return asked


class GangError(Exception):
    """A gang that cannot be started here."""


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
        note_where(rank)
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
    """The ranks of one job, started by its process and watched by a thread of it."""

    def __init__(self, world_size: int, report: Callable[[str, str], None], launch: str = "fork") -> None:
        """``report(status, error)`` sends the job's end for a failure found by the watcher; the
        process exits right after it."""
        self.world_size = world_size
        self.launch = launch
        self.port = free_port()
        self.addr = socket.gethostname() if launch == "srun" else "127.0.0.1"  # MASTER_ADDR: rank 0's host
        self._report = report
        self._ranks: dict[int, tuple[int, int]] = {}  # forked: pid -> (rank, read end of its error pipe)
        self._launcher: int | None = None  # launched: the pid of srun or mpiexec
        self._ending = threading.Lock()  # whoever takes it says how the job ended
        self._all_returned = threading.Event()
        self._reported = threading.Event()  # launched: rank 0's report came in
        self.relay: socket.socket | None = None  # mpiexec: where rank 0 connects

    @property
    def relays(self) -> bool:
        """Whether rank 0 is a launcher's process whose words the job's process relays (mpiexec, srun)."""
        return self.launch != "fork"

    def start(self, run_rank: Callable[[int], None], request: dict[str, Any]) -> None:
        """Start the ranks: forks running ``run_rank(rank)``, or a launcher's processes running ``request``
        (``jobman.dispatch.rank_main``). Rank 0's variables are set here."""
        for rank in range(self.world_size):  # an earlier attempt's places are not this one's
            Path(RANK_WHERE.format(rank=rank)).unlink(missing_ok=True)
        if self.launch == "fork":
            note_where(0)  # the job's process is rank 0
            self._fork_ranks(run_rank)
        else:
            self._start_launcher(request)
        os.environ.update(rank_env(0, self.world_size, self.port, self.addr))
        threading.Thread(target=self._watch, name="jobman-gang", daemon=True).start()

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

    def _start_launcher(self, request: dict[str, Any]) -> None:
        """The ranks as one launcher's processes, each ``python -m jobman.dispatch.rank_main REQUEST``."""
        for rank in range(self.world_size):
            Path(RANK_ERROR.format(rank=rank)).unlink(missing_ok=True)
            Path(RANK_PID.format(rank=rank)).unlink(missing_ok=True)
            Path(RANK_END.format(rank=rank)).unlink(missing_ok=True)
        extra: dict[str, Any] = {"port": self.port, "addr": self.addr, "launch": self.launch}
        self.relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = f"\0jobman-gang-{os.getpid()}-{os.urandom(6).hex()}"  # abstract: no file, no path limit
        self.relay.bind(name)
        self.relay.listen(1)
        extra["relay"] = name[1:]
        if self.launch == "mpiexec":
            argv = [mpiexec_path() or "mpiexec", "-n", str(self.world_size)]
        else:
            mpi = [] if os.environ.get("SLURM_MPI_TYPE") else ["--mpi=pmi2"]  # srun reads the variable itself
            argv = [shutil.which("srun") or "srun", f"--ntasks={self.world_size}", "--kill-on-bad-exit=1", *mpi]
        Path(GANG_REQUEST).write_text(json.dumps({**request, **extra}))
        argv += [sys.executable, "-m", "jobman.dispatch.rank_main", os.path.abspath(GANG_REQUEST)]
        with open(LAUNCH_LOG.format(launch=self.launch), "ab") as log:
            self._launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log).pid

    def pass_on_stops(self) -> None:
        """A stop signal to the job's process (its channel's handlers installed) reaches every rank too."""
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            previous = signal.getsignal(sig)

            def forward(signum: int, frame: Any, previous: Any = previous) -> None:
                targets = self._launched_pids() if self.relays else list(self._ranks)
                if self.launch == "srun" and self._launcher is not None:
                    targets = [self._launcher]  # srun passes a signal on to its tasks, on every node
                for pid in targets:
                    try:
                        os.kill(pid, signum)
                    except ProcessLookupError:
                        pass
                if callable(previous):
                    previous(signum, frame)

            signal.signal(sig, forward)

    def _launched_pids(self) -> list[int]:
        """The pids the launched ranks on this host wrote (those started so far)."""
        pids, here = [], socket.gethostname()
        for rank in range(self.world_size):
            try:
                pid, _, host = Path(RANK_PID.format(rank=rank)).read_text().partition(" ")
                if host in ("", here):
                    pids.append(int(pid))
            except (OSError, ValueError):
                pass
        return pids

    # -- watching --------------------------------------------------------------------------
    def _watch(self) -> None:
        """Wait for the other ranks; the first that ends badly ends the job. Should the watching itself
        fail, the job ends too: rank 0 must never wait for ranks nobody watches."""
        try:
            verdict = self._watch_forks() if self.launch == "fork" else self._watch_launcher()
        except Exception as exc:  # noqa: BLE001 - said as the job's end, never swallowed
            verdict = ("CRASHED", f"watching the ranks of the gang failed: {exc!r}")
        if verdict is None:
            self._all_returned.set()
        elif self._ending.acquire(blocking=False):
            self.kill_all()
            self._report(*verdict)
            os._exit(0)
        # else: the job's process is saying how the job ended

    def _watch_forks(self) -> tuple[str, str] | None:
        """None once every forked rank returned; else how the first that did not ended."""
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
                text = b""
                while chunk := os.read(errors, 65536):
                    text += chunk
                os.close(errors)
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                    continue
                return self._fork_verdict(rank, status, text.decode(errors="replace"))
        return None

    def _fork_verdict(self, rank: int, status: int, text: str) -> tuple[str, str]:
        name = f"rank {rank} of {self.world_size}"
        if os.WIFSIGNALED(status):
            return "CRASHED", f"{name} was killed by {signal.Signals(os.WTERMSIG(status)).name}"
        if text:
            return "FAILED", f"{name} raised:\n{text}"
        return "FAILED", f"{name} exited with code {os.WEXITSTATUS(status)}"

    def _watch_launcher(self) -> tuple[str, str] | None:
        """None once the launcher ended well; else how the gang ended. A rank that raised, or one killed
        under mpiexec, is seen by its file at once: MPICH's launcher waits for the others when a rank
        exits with an error."""
        assert self._launcher is not None
        try:
            fd = os.pidfd_open(self._launcher)
        except OSError:
            fd = -1
        while True:
            if fd >= 0:
                select.select([fd], [], [], 0.1)
            else:
                time.sleep(0.1)
            done, status = os.waitpid(self._launcher, os.WNOHANG)
            raised = self._raised()
            if raised is not None:
                return raised
            killed = self._first_killed()
            if killed is not None:
                return "CRASHED", killed
            if done:
                if fd >= 0:
                    os.close(fd)
                if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                    return None
                if self._others_returned() and self._reported.wait(5):
                    return None  # every call returned: MPICH's launcher ended ranks already waiting to finish
                return self._launcher_verdict(status)

    def _others_returned(self) -> bool:
        """Launched: whether every rank but 0 started and its call returned (its error file, made as it
        started, is removed once its call returned)."""
        return all(
            Path(RANK_WHERE.format(rank=rank)).exists() and not Path(RANK_ERROR.format(rank=rank)).exists()
            for rank in range(1, self.world_size)
        )

    def _raised(self) -> tuple[str, str] | None:
        """The first rank that wrote its traceback, as the job's end; None if none has."""
        raised = []
        for rank in range(self.world_size):
            path = Path(RANK_ERROR.format(rank=rank))
            try:
                if path.stat().st_size:
                    raised.append((path.stat().st_mtime, rank, path))
            except OSError:
                pass
        if not raised:
            return None
        _when, rank, path = min(raised)
        return "FAILED", f"rank {rank} of {self.world_size} raised:\n{path.read_text(errors='replace')}"

    def _launcher_verdict(self, status: int) -> tuple[str, str]:
        """How a launcher that ended badly says its gang ended: the rank it names as killed."""
        log = Path(LAUNCH_LOG.format(launch=self.launch))
        said = log.read_text(errors="replace") if log.exists() else ""
        if self.launch == "srun":
            killed = re.search(r"task (\d+): (Killed|Terminated|Segmentation fault|Aborted)", said)
            if killed:
                rank = int(killed.group(1))
                how = killed.group(2).lower()
                return "CRASHED", f"rank {rank} of {self.world_size} was {how} (srun: {killed.group(0)})"
        else:
            first = self._first_killed()
            if first is not None:
                return "CRASHED", first
        how = (
            f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
            if os.WIFSIGNALED(status)
            else f"ended with code {os.WEXITSTATUS(status)}"
        )
        return "CRASHED", f"{self.launch}, which ran the ranks, {how}: {said.strip()[-2000:]}"

    def _first_killed(self) -> str | None:
        """Launched: the first rank whose process a signal ended, as its ``rank-R.end`` says."""
        ends = []
        for rank in range(self.world_size):
            try:
                end = json.loads(Path(RANK_END.format(rank=rank)).read_text())
            except (OSError, ValueError):
                continue
            if os.WIFSIGNALED(end["status"]):
                ends.append((end["at"], rank, os.WTERMSIG(end["status"])))
        if not ends:
            return None
        _at, rank, sig = min(ends)
        return f"rank {rank} of {self.world_size} was killed by {signal.Signals(sig).name}"

    def kill_all(self) -> None:
        """SIGKILL every rank still running but the job's process (and the launcher, if any)."""
        pids = list(self._ranks) + (self._launched_pids() if self.relays else [])
        pids += [self._launcher] if self._launcher is not None else []
        for pid in pids:
            if pid == os.getpid():
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # -- the end -----------------------------------------------------------------------------
    def relay_rank_0(self, sock: socket.socket, asking: threading.Lock) -> dict[str, Any]:
        """Launched: pass rank 0's requests to the worker and its answers back, until its report, which is
        returned. If rank 0 goes without one, this waits for the watcher to end the job."""
        assert self.relay is not None
        conn, _ = self.relay.accept()
        while True:
            got = recv_msg(conn)
            if got is None:
                self._park()
            message = got[0]
            if message.get("op") == "report":
                if message.get("status") != "FAILED":
                    self._reported.set()
                return message
            with asking:
                send_msg(sock, message)
                answer = recv_msg(sock)
            if answer is None:
                raise RuntimeError("the job's worker went away")
            send_msg(conn, answer[0])

    def finish(self, status: str, error: str | None) -> tuple[str, str | None]:
        """Rank 0's call ended with ``status``: the job's end, once every rank has (on a failure of
        rank 0, the others are killed). Never returns if another rank's failure is being reported."""
        if status == "FAILED":
            if not self._ending.acquire(blocking=False):
                self._park()
            self.kill_all()
            return status, f"rank 0 of {self.world_size} raised:\n{error}" if error else error
        while not self._all_returned.wait(0.1):
            pass
        if not self._ending.acquire(blocking=False):
            self._park()
        return status, error

    @staticmethod
    def _park() -> NoReturn:
        """Wait for the watcher, which is reporting the job's end, to exit the process."""
        while True:
            time.sleep(60)

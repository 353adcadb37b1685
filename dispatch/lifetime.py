"""Linux process lifetimes: dying with a parent, adopting orphans, telling a process from one that
reused its pid, finding and ending children.

What chains a job's life to its fork server's, the server's to its worker's and a worker's to
its dispatcher's. Standard library only (psutil where /proc cannot say), so the fork server
and the zygote can use it before anything else of jobman is imported. Elsewhere than Linux
each helper says it could not, and the chain is looser.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
# Sent to the fork server when its worker dies: it kills its job's processes, then exits.
LAST_RITES = signal.SIGUSR2
# Set by a local dispatch in its workers' environment: the pid whose death they stop with.
DIE_WITH_VARIABLE = "JOBMAN_DIE_WITH"

_PRCTL: Any = False  # libc's prctl once looked up; None where there is none


def prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up once; None where there is none."""
    global _PRCTL
    if _PRCTL is False:
        try:
            _PRCTL = ctypes.CDLL("libc.so.6", use_errno=True).prctl
        except (OSError, AttributeError):
            _PRCTL = None
    return _PRCTL


def name_process(name: bytes) -> None:
    """Linux: what ``ps -e`` and ``top`` show for this process (its command line stays as it was)."""
    call = prctl()
    if call is not None:
        call(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)


def signal_on_parent_death(sig: int) -> bool:
    """Linux: send ``sig`` to this process when its parent dies; False where that cannot be asked."""
    call = prctl()
    return call is not None and call(PR_SET_PDEATHSIG, sig) == 0


def become_subreaper() -> bool:
    """Linux: processes orphaned below this one (a job's daemons, in whatever session) become its
    children, so that :func:`kill_children` can find them."""
    call = prctl()
    return call is not None and call(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def die_with_parent(oom_score_adj: int | None = None) -> None:
    """Linux: SIGKILL this process when its parent dies; optionally raise its OOM score."""
    call = prctl()
    if call is not None:
        call(PR_SET_PDEATHSIG, signal.SIGKILL)
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


def child_pids() -> list[int]:
    """The pids of this process's children."""
    pid = os.getpid()
    try:  # read on every job: a bare descriptor, no text file object
        fd = os.open(f"/proc/{pid}/task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC)
        try:
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
        finally:
            os.close(fd)
        return [int(child) for child in data.split()]
    except OSError:
        import psutil

        return [p.pid for p in psutil.Process().children()]


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (/proc/PID/stat), or None: with the
    pid, what tells a process from a later one that reused its pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def kill_group(group: int | None) -> None:
    """SIGKILL a process group, if there is one and it is still there."""
    if group:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_children(keep: tuple[int, ...] = ()) -> int:
    """SIGKILL and reap every child of this process but ``keep``, and the children that orphans
    to it meanwhile (it is a subreaper): until none is left. How many were killed."""
    killed = 0
    for _round in range(100):  # each round may orphan grandchildren to us
        left = [pid for pid in child_pids() if pid not in keep]
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in left:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
    return killed


def hang_up(helper: Any) -> None:
    """Close a helper process's control socket (``helper.ctrl``); it exits at the end of its stream,
    and ``helper.proc`` is killed if it does not within five seconds."""
    if helper.ctrl is not None:
        helper.ctrl.close()
        helper.ctrl = None
    if helper.proc is not None:
        try:
            helper.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            helper.proc.kill()
            helper.proc.wait()
        helper.proc = None

"""Telling an out-of-memory kill from any other SIGKILL.

The kernel's OOM killer ends a process with SIGKILL, which on its own says nothing.
Two records tell more: the ``oom_kill`` counter of the memory cgroup the job runs in
(cgroup v2 ``memory.events``, v1 ``memory.oom_control``), read when the job starts
and again when it is found killed; and the kernel's log (``/dev/kmsg``, readable by
root), which names the pid it killed. Failing both, a cgroup whose limit was hit
while the job ran (v2 ``max`` events, v1 ``failcnt``) makes it "likely".
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def memory_cgroup(proc_cgroup: Path = Path("/proc/self/cgroup")) -> tuple[Path, int] | None:
    """The directory of this process's memory cgroup and its version (1 or 2), if it can be read."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _num, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            where = CGROUP_ROOT / "memory" / path.lstrip("/")
            if (where / "memory.oom_control").exists():
                return where, 1
    for line in lines:
        if line.startswith("0::"):
            for base in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
                where = base / line[3:].lstrip("/")
                if (where / "memory.events").exists():
                    return where, 2
    return None


_open_files: dict[tuple[Path, str], int] = {}  # read again and again at offset 0: the kernel writes them anew


def _read(where: Path, name: str) -> str:
    """A cgroup file's current text, from a descriptor kept open (read before every job, so kept cheap)."""
    fd = _open_files.get((where, name))
    if fd is None:
        fd = _open_files[where, name] = os.open(where / name, os.O_RDONLY | os.O_CLOEXEC)
    return os.pread(fd, 65536, 0).decode()


def _counters(cgroup: tuple[Path, int] | None) -> tuple[int, int] | None:
    """(OOM kills, times the limit was hit) in the cgroup so far."""
    if cgroup is None:
        return None
    where, version = cgroup
    try:
        if version == 2:
            fields = dict(line.split() for line in _read(where, "memory.events").splitlines())
            return int(fields.get("oom_kill", 0)), int(fields.get("max", 0))
        fields = dict(line.split() for line in _read(where, "memory.oom_control").splitlines())
        return int(fields.get("oom_kill", 0)), int(_read(where, "memory.failcnt"))
    except (OSError, ValueError):
        return None


def killed_in_kernel_log(pid: int, kmsg: str = "/dev/kmsg") -> bool:
    """Whether the kernel's log says its OOM killer killed ``pid`` (False where it cannot be read)."""
    pattern = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid},)")
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    found = False
    try:
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record overwritten while reading; go on with the next
                continue
            if not record:
                break
            if pattern.search(record.decode(errors="replace")):
                found = True
    finally:
        os.close(fd)
    return found


class OomWatch:
    """Started with a job; asked, if the job is found killed by SIGKILL, whether memory ran out."""

    _cgroup: tuple[Path, int] | None = None  # this process's memory cgroup
    _looked_up = False  # once per process

    def __init__(self) -> None:
        if not OomWatch._looked_up:
            OomWatch._cgroup = memory_cgroup()
            OomWatch._looked_up = True
        self.before = _counters(OomWatch._cgroup)

    def cause(self, pid: int) -> str | None:
        """Why a process killed by SIGKILL was killed, if memory tells; else None."""
        after = _counters(OomWatch._cgroup)
        if self.before is not None and after is not None and after[0] > self.before[0]:
            return "out of memory: the kernel's OOM killer acted in its memory cgroup while it ran"
        if killed_in_kernel_log(pid):
            return "out of memory: the kernel's OOM killer killed it"
        if self.before is not None and after is not None and after[1] > self.before[1]:
            return "likely out of memory: its memory cgroup reached its limit while it ran"
        return None

"""A cgroup of a job's own, where the machine lets us make one: everything the job starts, in
whatever session and however often it forks, is in it, and is killed with it.

A process group and a subreaper already catch what a job leaves behind while the process that
watches it lives; a cgroup holds the job's processes even when that process is gone too. It is
made in a hierarchy that only groups processes: cgroup v2 (``cgroup.kill`` ends every process in it
at once, Linux 5.14+), else the v1 ``pids`` controller (its processes killed until none is left). It
is not a memory cgroup: out-of-memory kills are named from the memory cgroup the worker runs in and
from the kernel's log (``dispatch.oom``). Where no hierarchy is writable (not root, no delegation)
there is no job cgroup, and the process group and subreaper do the work alone.
``JOBMAN_JOB_CGROUP=0`` turns job cgroups off, ``JOBMAN_JOB_CGROUP=v1`` keeps to the v1 ``pids``
hierarchy.

Job cgroups live below the worker's own cgroup, so that every limit set on it (a Slurm step's, a
systemd unit's) holds for its jobs too, one folder per worker, named by its pid and start time:
``<its cgroup>/jobman/w<pid>-<start>/job-<pid>``. Each job process makes its own and moves into it before it
runs anything, so nothing it starts is outside. Whoever finds the worker dead (its fork server, the
worker itself, the monitor on its host, the next fork server started beside it) kills what is left
in its folder.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from .lifetime import start_ticks

CGROUP_ROOT = Path("/sys/fs/cgroup")
TOP = "jobman"

_base: Path | None | bool = False  # where job cgroups go, looked up once per process


def _mount_points() -> dict[str, Path]:
    """The mounted cgroup hierarchies: "2" for v2, else the v1 controller names."""
    found: dict[str, Path] = {}
    try:
        with open("/proc/self/mountinfo") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if len(fields) < 5 or not extra:
            continue
        if extra[0] == "cgroup2":
            found.setdefault("2", Path(fields[4]))
        elif extra[0] == "cgroup" and len(extra) >= 3:
            for option in extra[2].split(","):
                found.setdefault(option, Path(fields[4]))
    return found


def _candidates() -> list[tuple[Path, str]]:
    """Where job cgroups may go (below this process's own cgroup), with the file that says the
    hierarchy is usable: v2 first, then v1 pids."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    mounts = _mount_points()
    own = {}
    for line in lines:
        _num, controllers, path = line.split(":", 2)
        if controllers == "":
            own["2"] = path
        for name in controllers.split(","):
            own[name] = path
    out = []
    kinds: tuple[tuple[str, str], ...] = (("2", "cgroup.kill"), ("pids", "pids.max"))
    if os.environ.get("JOBMAN_JOB_CGROUP") == "v1":  # the v1 hierarchy even where v2 could be used
        kinds = kinds[1:]
    for key, marker in kinds:
        if key in mounts and key in own:
            out.append((mounts[key] / own[key].strip("/") / TOP, marker))
    return out


def _hierarchies() -> list[Path]:
    """The mount points of the hierarchies job cgroups may be in."""
    mounts = _mount_points()
    kinds = ("pids",) if os.environ.get("JOBMAN_JOB_CGROUP") == "v1" else ("2", "pids")
    return [mounts[key] for key in kinds if key in mounts]


def job_cgroup_base() -> Path | None:
    """The directory worker folders of job cgroups are made in, or None where none can be made."""
    global _base
    if _base is not False:
        return _base if isinstance(_base, Path) else None
    _base = None
    for where, marker in _candidates():
        probe = where / f"probe-{os.getpid()}"
        try:
            where.mkdir(exist_ok=True)
            probe.mkdir()
        except OSError:
            continue
        usable = (probe / marker).exists()
        try:
            probe.rmdir()
        except OSError:
            pass
        if usable:
            _base = where
            return _base
    return None


def worker_folder(base: Path | None, worker_pid: int) -> Path | None:
    """Where the job cgroups of worker ``worker_pid`` go (made if need be); None where none can be."""
    ticks = start_ticks(worker_pid)
    if base is None or ticks is None:
        return None
    where = base / f"w{worker_pid}-{ticks}"
    try:
        where.mkdir(exist_ok=True)
    except OSError:
        return None
    end_dead_workers_folders(base)
    return where


def end_dead_workers_folders(base: Path) -> int:
    """Kill what is left in the folders of workers that are gone (killed together with their fork
    server, and no monitor came by), and remove those folders; how many processes were killed."""
    killed = 0
    try:
        folders = [p for p in base.iterdir() if p.name.startswith("w") and p.is_dir()]
    except OSError:
        return 0
    for folder in folders:
        try:
            pid, ticks = (int(part) for part in folder.name[1:].split("-", 1))
        except ValueError:
            continue
        if start_ticks(pid) != ticks:
            killed += kill_cgroup(folder)
    return killed


def cgroup_of(pid: int, folder: Path | None) -> Path | None:
    """The cgroup the job process ``pid`` made for itself (None where none could be made)."""
    return None if folder is None else folder / f"job-{pid}"


def enter_own_cgroup(folder: Path | None) -> bool:
    """In a job process, first thing: make its cgroup and move into it. False where it cannot."""
    if folder is None:
        return False
    where = folder / f"job-{os.getpid()}"
    try:
        where.mkdir()
        with open(where / "cgroup.procs", "w") as fh:
            fh.write("0")
        return True
    except OSError:
        try:
            where.rmdir()
        except OSError:
            pass
        return False


def folders_of_dead_worker(pid: int, started_at: float | None, tolerance: float = 1.0) -> list[Path]:
    """The folders of job cgroups left by worker ``pid`` (started at ``started_at``, epoch seconds),
    in any hierarchy this host uses; [] while a process with that pid and start time lives."""
    if started_at is None:
        return []
    try:
        import psutil

        boot, hertz = psutil.boot_time(), os.sysconf("SC_CLK_TCK")
    except (ImportError, ValueError, OSError):
        return []
    out = []
    for folder in _worker_folders(pid):
        try:
            ticks = int(folder.name.split("-", 1)[1])
        except ValueError:
            continue
        if abs(boot + ticks / hertz - started_at) <= tolerance and start_ticks(pid) != ticks:
            out.append(folder)
    return out


def _worker_folders(pid: int) -> list[Path]:
    """Every ``jobman/w<pid>-*`` folder in the hierarchies, whichever cgroup its worker was in."""
    found: list[Path] = []
    for top in _hierarchies():
        for here, dirs, _files in os.walk(top):
            if os.path.basename(here) == TOP:
                found.extend(Path(here) / d for d in dirs if d.startswith(f"w{pid}-"))
                dirs[:] = []  # nothing of interest below a worker's folder
    return found


def members(where: Path | str) -> list[int]:
    """The pids in a cgroup (not those below it). Read after every job: a bare descriptor."""
    try:
        fd = os.open(os.path.join(where, "cgroup.procs"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        data = b""
        while chunk := os.read(fd, 65536):
            data += chunk
        return [int(p) for p in data.split()]
    except (OSError, ValueError):
        return []
    finally:
        os.close(fd)


def kill_cgroup(
    where: Path | str | None, remove: bool = True, keep: tuple[int, ...] = (), remove_below: bool | None = None
) -> int:
    """Kill every process in the cgroup and those below it but ``keep`` (and what they fork meanwhile),
    and remove them (``remove``; the cgroups below it: ``remove_below``, by default as ``remove``);
    how many were in them. Returns once none of them is left in it (or after some seconds of trying)."""
    if where is None:
        return 0
    if remove_below is None:
        remove_below = remove
    try:  # the kinds of the entries come with the listing: no stat of each of a cgroup's files
        with os.scandir(where) as entries:
            below = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return 0
    except OSError:
        below = []
    count = sum(kill_cgroup(p, remove_below, keep) for p in below)
    pids = [pid for pid in members(where) if pid not in keep]
    if pids:
        if not keep:
            try:
                fd = os.open(os.path.join(where, "cgroup.kill"), os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"1")
                finally:
                    os.close(fd)
            except OSError:  # v1, or not allowed: one by one below
                pass
        for _round in range(100):  # v1, or a v2 kill not allowed: one by one, until none is left
            left = [pid for pid in members(where) if pid not in keep]
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.001 * (_round + 1))
    if remove:
        remove_cgroup(Path(where))
    return count + len(pids)


class Slot:
    """A job cgroup that the jobs of one fork server use in turn (one at a time), instead of one made
    and removed for each job (a cgroup's making, entering and removal cost a millisecond of CPU).
    Between two jobs it is emptied: what the job left in it is killed, and the next job enters it
    only once it is seen empty; a slot that cannot be emptied is left to its folder's removal, and
    the next job gets a new one."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self.path: Path | None = None
        self.fd = -1  # its cgroup.procs, open for writing: a forked job enters with one write
        self.made = 0

    def ready(self) -> Path | None:
        """The slot the next job enters (made if need be), or None where none can be made."""
        if self.path is None and self.folder is not None:
            self.made += 1
            where = self.folder / f"jobs-{self.made}"
            try:
                where.mkdir(exist_ok=True)
                self.fd = os.open(where / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
                self.path = where
            except OSError:
                try:
                    where.rmdir()
                except OSError:
                    pass
        return self.path

    def enter(self) -> bool:
        """In the job's process, first thing: move into the slot. False where it cannot."""
        if self.fd < 0:
            return False
        try:
            os.write(self.fd, b"0")
            return True
        except OSError:
            return False
        finally:
            os.close(self.fd)
            self.fd = -1

    def empty(self) -> int:
        """After a job: kill what it left in the slot, and the cgroups it made below it; how many
        processes were killed. A slot still not empty is let go."""
        if self.path is None:
            return 0
        killed = kill_cgroup(self.path, remove=False, remove_below=True)
        if killed and members(self.path):  # a process that would not die: the next job gets a new slot
            self.drop()
        return killed

    def drop(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.path = None


def remove_cgroup(where: Path, wait: float = 1.0) -> bool:
    """Remove an emptied cgroup (a process just killed may take a moment to leave it)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            where.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

"""Reading and copying files a job controls (its output, its results file, marks in its workdir).

A job may make any of them a symlink, a FIFO or a device, or make them huge; whoever reads them (the
worker, the monitor, the dashboard) must not hang, fill its memory, or show what lies outside the
folder they belong to. So a read here takes regular files only, opened without blocking, refuses
a path that resolves outside the given root, and reads at most a given number of bytes (a tail is
read from the end). Standard library only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

COPY_LIMIT = 20 * 1024**3  # a workdir copied for a job that continues its parent's training
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1 << 20


class NotReadable(OSError):
    """A job's file that is not read: outside its root, not a regular file, or too large. The text
    says which, in one sentence."""


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """``path`` with every symlink resolved, if that lies inside ``root`` (also resolved); else NotReadable."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if real != top and not real.is_relative_to(top):
        raise NotReadable(f"{path} leads outside {root}")
    return real


def _open_regular(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> int:
    """A descriptor on ``path``, a regular file inside ``root``; opened without blocking, so a FIFO
    or a device swapped in after the check cannot hold the reader."""
    real = inside(path, root)
    fd = os.open(real, _OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotReadable(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_upto(fd: int, limit: int) -> bytes:
    parts, got = [], 0
    while got < limit:
        chunk = os.read(fd, min(_CHUNK, limit - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_tail(path: str | os.PathLike[str], root: str | os.PathLike[str], limit: int) -> bytes:
    """The last ``limit`` bytes (at most) of the regular file ``path`` inside ``root``. OSError if
    it cannot be read, NotReadable if it must not be."""
    fd = _open_regular(path, root)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        return _read_upto(fd, limit)
    finally:
        os.close(fd)


def read_capped(path: str | os.PathLike[str], root: str | os.PathLike[str], limit: int) -> bytes:
    """The whole of the regular file ``path`` inside ``root``; NotReadable if it holds more than
    ``limit`` bytes or must not be read, OSError if it cannot be."""
    fd = _open_regular(path, root)
    try:
        data = _read_upto(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotReadable(f"{path} holds more than {limit} bytes")
    return data


def copy_tree(source: str | os.PathLike[str], dest: str | os.PathLike[str], limit: int = COPY_LIMIT) -> int:
    """Copy the folder ``source`` into ``dest`` (made if missing): folders and regular files as they
    are, symlinks as symlinks (never what they point to), nothing else (FIFOs, sockets, devices).
    The bytes copied; NotReadable once more than ``limit`` would be."""
    source, dest = Path(source), Path(dest)
    copied = 0
    for top, dirs, files in os.walk(source):  # symlinked folders are listed, never entered
        here = Path(top)
        there = dest / here.relative_to(source)
        there.mkdir(exist_ok=True)
        for name in [*dirs, *files]:
            src = here / name
            st = os.lstat(src)
            if stat.S_ISLNK(st.st_mode):
                target = dest / src.relative_to(source)
                if not os.path.lexists(target):
                    os.symlink(os.readlink(src), target)
            elif stat.S_ISREG(st.st_mode):
                copied += _copy_file(src, dest / src.relative_to(source), limit - copied, source)
                if copied > limit:
                    raise NotReadable(f"{source} holds more than {limit} bytes to copy")
    return copied


def _copy_file(src: Path, dst: Path, room: int, source: Path) -> int:
    fd = _open_regular(src, source)
    try:
        with open(dst, "wb") as out:
            total = 0
            while True:
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > room:
                    return total  # the caller says so
                out.write(chunk)
        st = os.fstat(fd)
        os.chmod(dst, stat.S_IMODE(st.st_mode))
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))  # as a copy of a checkpoint should be
        return total
    finally:
        os.close(fd)

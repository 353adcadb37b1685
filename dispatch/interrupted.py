"""A job interrupted by the infrastructure, when the database could not be told.

A worker or dispatch that must stop while the database refuses every write (a full
disk, a read-only file, an outage longer than it waits) cannot put its running job
back: the job stays RUNNING with a dead worker, and the monitor would declare it
CRASHED, spending an attempt on a fault that was not the job's. So they leave a mark
in the job's workdir, an empty file named for the run's lease (an empty file needs
no data block, so it can be made on a full disk), holding the reason when there is
room. A monitor (or dispatch) that finds the job dead and can read its workdir (on its
host, or anywhere the workdir is shared) reads the mark and puts the job back without
spending an attempt, then removes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from .jobfiles import read_tail

PREFIX = ".jobman-interrupted-"


def _path(workdir: str | os.PathLike | None, lease: int) -> Path | None:
    return Path(workdir) / f"{PREFIX}{lease}" if workdir else None


def mark_interrupted(workdir: str | os.PathLike | None, lease: int, why: str) -> bool:
    """Leave the mark for the run ``lease`` of the job in ``workdir``; False where it cannot be made."""
    path = _path(workdir, lease)
    if path is None:
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError:
        return False
    try:
        os.write(fd, why.encode()[:1000])
    except OSError:  # no room for the reason: the mark alone says enough
        pass
    finally:
        os.close(fd)
    return True


def interruption(workdir: str | os.PathLike | None, lease: int) -> str | None:
    """Why the run ``lease`` was interrupted, if it left a mark ("" when the reason did not fit); else None."""
    path = _path(workdir, lease)
    if path is None:
        return None
    try:
        # the job could have made it a symlink, a FIFO or a huge file: a bounded read inside its workdir
        return read_tail(path, path.parent, 1000).decode(errors="replace").strip()
    except OSError:
        return None


def clear_interruption(workdir: str | os.PathLike | None, lease: int) -> None:
    path = _path(workdir, lease)
    if path is not None:
        try:
            path.unlink()
        except OSError:
            pass

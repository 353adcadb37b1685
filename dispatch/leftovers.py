"""Ending what a job left behind: its cgroup, its process group, and the orphans of a subreaper."""

from __future__ import annotations

from pathlib import Path

from .cgroup import kill_cgroup
from .lifetime import kill_children, kill_group


def end_job_processes(group: int | None, keep: tuple[int, ...] = (), cgroup: Path | None = None) -> int:
    """Kill what a job left behind: its cgroup, if it has one, its process group, and every child of
    this process (a subreaper) but ``keep`` -- processes the job started in sessions of their own end
    up there. How many died."""
    killed = kill_cgroup(cgroup)
    kill_group(group)
    return killed + kill_children(keep)

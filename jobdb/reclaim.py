"""Reclaiming artifacts that nothing references: after ``jobman rm``, and by ``jobman artifacts gc``.

An artifact is removed only when no job of the database refers to it (in its results, or in
results its event log kept) and it was not written or reused since the oldest running job
started: a job writes its artifacts while it runs, before its results refer to them. Each file
is looked at again just before it goes, so one a job has just reused stays. Since equal
artifacts are one file, deleting a job removes only what no other job refers to.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .artifacts import ArtifactStore
from .store import Store


@dataclass
class Reclaimed:
    """What a collection removed (or, as a dry run, would remove)."""

    removed: list[tuple[str, int]] = field(default_factory=list)  # (digest, size)
    kept: int = 0  # artifacts still referred to, or too recent to judge
    unfinished: int = 0  # partial writes of killed jobs removed

    @property
    def bytes(self) -> int:
        return sum(size for _d, size in self.removed)


# How far a file's modification time may lag the clock that dated a job's start: the kernel stamps
# files from a clock that advances once a tick, and some stores keep whole seconds only.
MTIME_SLACK = 2.0


def cutoff(oldest_running: float | None, read_at: float, grace: float) -> float:
    """The time before which an unreferenced artifact is garbage: before the oldest running job
    started (less what a file's stamp may lag) and before the references were read, less ``grace``
    (clocks of other machines)."""
    if oldest_running is None:
        return read_at - grace
    return min(read_at, oldest_running - MTIME_SLACK) - grace


def collect(
    store: Store,
    artifacts: ArtifactStore,
    *,
    among: set[str] | None = None,
    grace: float = 0.0,
    dry_run: bool = False,
) -> Reclaimed:
    """Remove the artifacts nothing references (only those in ``among``, when given)."""
    read_at = time.time()
    referenced, oldest = store.artifact_references()
    before = cutoff(oldest, read_at, grace)
    out = Reclaimed()
    for digest, size, mtime in list(artifacts.digests()):
        if among is not None and digest not in among:
            continue
        if digest in referenced or mtime >= before or not _still_old(artifacts, digest, before):
            out.kept += 1
            continue
        if dry_run or artifacts.remove(digest):
            out.removed.append((digest, size))
    if among is None and not dry_run:
        out.unfinished = artifacts.stale_temporaries(before - 3600.0)  # a write in flight is never an hour old
    return out


def referenced_by(store: Store, job_ids: Sequence[int]) -> set[str]:
    """The artifacts the jobs ``job_ids`` refer to: what deleting them may leave unreferenced."""
    return store.artifact_references(job_ids)[0]


def _still_old(artifacts: ArtifactStore, digest: str, before: float) -> bool:
    """Whether the artifact is still untouched since ``before`` now, as it is about to go (a folder's
    file looked at again; an fsspec store's listing is all there is)."""
    if type(artifacts) is not ArtifactStore:
        return True
    try:
        return os.lstat(artifacts.root / "sha256" / digest[:2] / digest).st_mtime < before
    except FileNotFoundError:
        return False

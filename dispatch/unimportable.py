"""The targets a dispatch's workers found they cannot import, shared through one file of the dispatch.

The first worker whose job's target cannot be imported writes the target there (under a lock) and
fails that one job; every worker of the dispatch then leaves the target's jobs QUEUED, claiming
the other targets' jobs, and a worker that had already claimed one puts it back. Without a file (a
worker started alone, or on Slurm), each worker keeps the set for itself: one job fails per worker.
"""

from __future__ import annotations

import fcntl
import json
import os
from contextlib import suppress

VARIABLE = "JOBMAN_UNIMPORTABLE"  # the path of the dispatch's file, in each worker's environment


class Unimportable:
    """The targets that cannot be imported, each with the sentence saying why (the first one's)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.causes: dict[str, str] = {}
        self._read_size = 0

    @classmethod
    def from_environment(cls) -> Unimportable:
        return cls(os.environ.get(VARIABLE) or None)

    def known(self) -> frozenset[str]:
        """The targets found so far (the file is read again only when it grew: one stat per claim)."""
        if self.path is not None:
            try:
                size = os.stat(self.path).st_size
            except FileNotFoundError:
                size = 0
            if size != self._read_size:
                with open(self.path, encoding="utf-8") as f:
                    self._parse(f.read())
        return frozenset(self.causes)

    def first_to_fail(self, target: str, cause: str) -> bool:
        """Record that ``target`` cannot be imported; False if it was known already (then its job is
        put back, not failed)."""
        if self.path is None:
            if target in self.causes:
                return False
            self.causes[target] = cause
            return True
        with open(self.path, "a+", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file is closed
            f.seek(0)
            self._parse(f.read())
            if target in self.causes:
                return False
            f.write(json.dumps({"target": target, "cause": cause}) + "\n")
            f.flush()
        self.causes[target] = cause
        self._read_size = 0  # read again next time, whatever others wrote meanwhile
        return True

    def sentence(self) -> str:
        """Why the dispatch stopped short, in one sentence: the first cause, and how many more targets."""
        causes = list(self.causes.values())
        more = len(causes) - 1
        return causes[0] + (
            f"; the jobs of {more} other target(s) that cannot be imported are left QUEUED too" if more else ""
        )

    def remove(self) -> None:
        if self.path is not None:
            with suppress(FileNotFoundError):
                os.unlink(self.path)

    def _parse(self, text: str) -> None:
        for line in text.splitlines():
            with suppress(ValueError, KeyError, TypeError):  # a line being written: read it next time
                entry = json.loads(line)
                self.causes.setdefault(str(entry["target"]), str(entry["cause"]))
        self._read_size = len(text.encode())

"""What code and environment a job runs: its target's source digest, the git state of the tree it
was imported from (commit, uncommitted changes and their diff), and the interpreter's environment.

Standard library only, so the fork server reads it without the rest of jobman. Each fact is worked
out once per process (a worker, its fork server) and repository, never per job: git runs once per
tree, the package list is read once per worker. Texts many jobs share (a diff, a package list) are
returned beside a record under the digest the record names, for the worker to keep once.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import platform
import socket
import subprocess
from collections.abc import Callable
from typing import Any

GIT_TIMEOUT_S = 10.0
# A diff larger than this is kept cut, and says so: the record is a record, not a backup.
DIFF_LIMIT = 4 * 1024 * 1024


def digest(text: str) -> str:
    """The sha256 of a text, as hex: how a source, a diff and a package list are named."""
    return hashlib.sha256(text.encode()).hexdigest()


def source_digest(fn: Callable[..., Any]) -> str | None:
    """The digest of a function's source text, or None when its source cannot be read."""
    try:
        return digest(inspect.getsource(fn))
    except (OSError, TypeError):
        return None


def source_file(fn: Callable[..., Any]) -> str | None:
    """The file a function was defined in, if it is a file on disk."""
    try:
        path = inspect.getsourcefile(inspect.unwrap(fn))
    except (TypeError, ValueError):
        return None
    return os.path.abspath(path) if path and os.path.isfile(path) else None


def _git(cwd: str, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"},  # a read: no index lock taken
        )
    except (OSError, subprocess.SubprocessError):  # no git here, or it hung
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


@functools.lru_cache(maxsize=64)
def repository_of(folder: str) -> str | None:
    """The top of the git working tree ``folder`` is in, or None."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    return top.strip() if top else None


@functools.lru_cache(maxsize=64)
def git_state(repo: str) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """The state of a git working tree: its commit, whether tracked files differ from it, and the
    diff (``git diff HEAD``: staged and unstaged changes of tracked files; new untracked files are
    not in it). Read once per process and tree. Returns the record and the diff text by digest."""
    head = _git(repo, "rev-parse", "HEAD")
    diff = _git(repo, "diff", "HEAD", "--no-color", "--no-ext-diff") if head else None
    record: dict[str, Any] = {"repo": repo, "commit": head.strip() if head else None}
    texts: dict[str, tuple[str, str]] = {}
    if diff is None:
        record["dirty"] = None  # no commit yet, or git could not tell
        return record, texts
    record["dirty"] = bool(diff)
    if diff:
        if len(diff) > DIFF_LIMIT:
            diff = diff[:DIFF_LIMIT] + f"\n[diff cut at {DIFF_LIMIT} characters]\n"
        key = digest(diff)
        record["diff"] = key
        texts[key] = ("diff", diff)
    return record, texts


def code_record(target: str, fn: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """What a job of ``target`` runs when it calls ``fn``: the digest of its source (for a function
    stored by value, the digest its target names when its source is not on disk), the file it came
    from and that file's git state. Returns the record and the texts it names by digest."""
    record: dict[str, Any] = {"target": target.partition("@")[0], "source": source_digest(fn)}
    if record["source"] is None and "#" in target:
        record["source"] = target.rpartition("#")[2].partition("@")[0] or None
    path = source_file(fn)
    texts: dict[str, tuple[str, str]] = {}
    if path is not None:
        record["file"] = path
        repo = repository_of(os.path.dirname(path))
        if repo is not None:
            git, texts = git_state(repo)
            record.update(git)
    return record, texts


class CodeRecords:
    """Code records by target, each worked out once in this process; a record's texts are handed
    out with it the first time only (whoever receives them keeps them)."""

    def __init__(self) -> None:
        self._records: dict[str, dict[str, Any]] = {}
        self._texts_given: set[str] = set()
        self._told: set[str] = set()

    def message(self, key: str, target: str, fn: Callable[..., Any]) -> dict[str, Any]:
        """The record of ``fn`` for a message to the worker: ``{"record": ..., "texts": ...}``."""
        record = self._records.get(key)
        texts: dict[str, tuple[str, str]] = {}
        if record is None:
            record, texts = code_record(target, fn)
            self._records[key] = record
        fresh = {k: v for k, v in texts.items() if k not in self._texts_given}
        self._texts_given.update(fresh)
        return {"record": record, "texts": fresh} if fresh else {"record": record}

    def news(self, key: str, target: str, fn: Callable[..., Any]) -> dict[str, Any] | None:
        """:meth:`message` the first time ``key`` is asked for in this process (and the processes it
        forks after), None after: its receiver keeps it, and a job's messages stay as small as before."""
        if key in self._told:
            return None
        self._told.add(key)
        return self.message(key, target, fn)


def _jobman_version() -> str | None:
    from jobman import __version__

    return __version__


def installed_packages(path: list[str] | None = None) -> dict[str, str]:
    """The packages installed on ``path`` (default ``sys.path``), name to version, read from the names
    of their metadata folders (``name-version.dist-info``, ``name-version-pyX.egg-info``): a directory
    listing per path entry, not a read of every package's metadata. The first of a name wins, as
    for an import."""
    import sys

    seen: dict[str, str] = {}
    for entry in sys.path if path is None else path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip, or gone
            continue
        for name in sorted(names):
            stem, dot, kind = name.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            package, _, version = stem.partition("-")
            key = package.lower().replace("_", "-").replace(".", "-")
            seen.setdefault(key, version.partition("-")[0] or "?")
    return seen


@functools.cache
def environment() -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """This interpreter's environment: Python and jobman versions, the digest of its installed
    packages (``name==version``, sorted; the list is returned by digest) and the host. Read once."""
    listing = "".join(f"{name}=={version}\n" for name, version in sorted(installed_packages().items()))
    key = digest(listing)
    record = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "jobman": _jobman_version(),
        "packages": key,
        "host": socket.gethostname(),
    }
    return record, {key: ("packages", listing)}


def found_at(fn: Callable[..., Any]) -> str | None:
    """The directory ``fn``'s module was imported from: the folder holding its top package (or the
    module itself), which a worker elsewhere puts on its path to import it the same way."""
    import sys

    top = sys.modules.get((getattr(fn, "__module__", None) or "").partition(".")[0])
    if top is None or top.__name__ == "__main__":
        return None
    file = getattr(top, "__file__", None)
    if file:
        folder = os.path.dirname(os.path.abspath(file))
        return os.path.dirname(folder) if os.path.basename(file).startswith("__init__.") else folder
    paths = list(getattr(top, "__path__", []) or [])  # a namespace package
    return os.path.dirname(os.path.abspath(paths[0])) if paths else None


def where_of(record: dict[str, Any] | None) -> str | None:
    """The directory a job's target was found from when scheduled, from its ``code`` record."""
    if not record:
        return None
    return record.get("where") or (record.get("code") or {}).get("where")


def what_ran(
    ran: dict[str, Any] | None, target: str, where: str | None
) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """A run's whole record, ``{"code": ..., "environment": ...}``, from the code record its process
    sent (``CodeRecords.message``; None for a command, whose tree is that of the directory it was
    scheduled from) and this interpreter's environment; with the texts it names, by digest."""
    env, texts = environment()
    if ran is not None:
        code = dict(ran["record"])
        texts = {**texts, **{key: (kind, body) for key, (kind, body) in ran.get("texts", {}).items()}}
    else:
        code = {"target": target}
        repo = repository_of(where or os.getcwd())
        if repo is not None:
            state, more = git_state(repo)
            code.update(state)
            texts = {**texts, **more}
    if where:
        code["where"] = where
    return {"code": code, "environment": env}, texts

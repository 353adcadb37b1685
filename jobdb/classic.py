"""The original jobman's Python scheduling API (``jobman.sql``), spoken over the store.

``db(url)`` opens one experiment (the URL's table); ``insert_job(fn, flatten(state), db)``
and ``insert_dict(d, db)`` schedule one job each, idempotently unless ``force_dup``;
``db.createView(name)`` makes the SQL view of ``jobman sqlview``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from .canonical import dump_json
from .errors import UsageError
from .nested import RESERVED, canonical_params, flatten
from .priority import check_priority
from .scheduling import pickled_by_value
from .status import CODES, Status
from .store import Store, params_hash
from .sweep import JobSpec
from .url import parse_db
from .views import create_view, drop_view

# The original's key names and status codes.
JOBID = "jobman.id"
EXPERIMENT = "jobman.experiment"
STATUS = "jobman.status"
HASH = "jobman.hash"
PRIORITY = "jobman.sql.priority"
HOST = "jobman.sql.host_name"
HOST_WORKDIR = "jobman.sql.host_workdir"
START = CODES[Status.QUEUED]
RUNNING = CODES[Status.RUNNING]
DONE = CODES[Status.DONE]
ERR_START = 3  # never set: a job that cannot start is FAILED (ERR_RUN)
ERR_SYNC = 4  # never set: there is no workdir synchronisation step
ERR_RUN = CODES[Status.FAILED]
CANCELED = CODES[Status.CANCELED]


class Database:
    """What ``sql.db(url)`` returns: one experiment of one database."""

    def __init__(self, url: str) -> None:
        self.store = Store(parse_db(url), create=True)

    @property
    def tablename(self) -> str:
        return self.store.experiment

    def createView(self, viewname: str, verbose: bool = False) -> None:  # camelCase: the original jobman's name
        """(Re)create the SQL view ``viewname``: one column per parameter and result key."""
        columns = create_view(self.store.engine, self.store.experiment, viewname)
        if verbose:
            print(f"view {viewname}: id, jobman_* and {', '.join(c.name for c in columns) or 'no keys yet'}")

    def dropView(self, viewname: str) -> None:  # camelCase: the original jobman's name
        drop_view(self.store.engine, viewname)

    def close(self) -> None:
        self.store.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<jobman database {self.store.target.display} table {self.tablename!r}>"


def db(url: str) -> Database:
    """Open experiment (table) of ``url``: ``postgres://user:pass@host/dbname/tablename``,
    ``sqlite:///file.db/tablename`` or any URL with ``?table=``."""
    return Database(url)


def _split(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A job dict into its parameters and jobman's own keys (``jobman.*``), both flat."""
    flat = flatten(state)
    own = {k: v for k, v in flat.items() if k == RESERVED or k.startswith(RESERVED + ".")}
    return canonical_params({k: v for k, v in flat.items() if k not in own}), own


def hash_state(state: Mapping[str, Any]) -> int:
    """A job dict's identity as a signed 64-bit number: equal for equal parameters and experiment,
    however nested, whatever ``jobman.*`` bookkeeping it carries."""
    params, own = _split(state)
    digest = params_hash(0, "fn", str(own.get(EXPERIMENT, "")), params)
    return int.from_bytes(bytes.fromhex(digest[:16]), "big", signed=True)


def insert_dict(
    jobdict: Mapping[str, Any],
    db: Database,
    force_dup: bool = False,
    session: Any = None,
    priority: float = 1.0,
    hashalgo: Callable[..., Any] | None = None,
) -> int | None:
    """Schedule the job ``jobdict`` describes (``jobman.experiment`` names its function).

    Returns the new job's id, or None when an identical job is already there (unless ``force_dup``).
    ``session`` and ``hashalgo`` are accepted for old scripts; identity is always jobman's own.
    """
    return _insert(jobdict, db, force_dup=force_dup, priority=priority)


def _insert(
    jobdict: Mapping[str, Any], db: Database, *, force_dup: bool, priority: float, code: bytes | None = None
) -> int | None:
    params, own = _split(jobdict)
    target = own.get(EXPERIMENT)
    if not target:
        raise UsageError(f"the job has no {EXPERIMENT!r} key naming its function; use insert_job(fn, state, db)")
    priority = check_priority(own.get(PRIORITY, priority))
    dump_json(params, "parameters")  # first: a value the database cannot hold is refused before any write
    if code is not None:
        db.store.put_function(str(target), code)
    result = db.store.schedule([JobSpec(0, "fn", str(target), params, None)], priority=priority, duplicate=force_dup)
    return result.job_ids[0] if result.added else None


def insert_job(
    experiment_fn: Callable[..., Any],
    state: Mapping[str, Any],
    db: Database,
    force_dup: bool = False,
    session: Any = None,
    priority: float = 1.0,
) -> int | None:
    """Schedule ``experiment_fn(state, channel)`` on ``state``; see :func:`insert_dict`.

    A function a worker cannot import by name (one of the script being run, ``__main__``, or
    one made inside another function) is stored with its jobs by value, as ``jobman.Experiment``
    stores it, and named ``__main__:name#digest`` (a digest of its code).
    """
    module = getattr(experiment_fn, "__module__", None)
    name = getattr(experiment_fn, "__qualname__", None) or getattr(experiment_fn, "__name__", None)
    if not callable(experiment_fn) or not module or not name:
        raise UsageError(f"{experiment_fn!r} is not a function: give insert_job the experiment function itself")
    by_value = module == "__main__" or "<" in name
    named = f"{module}:{name}" if by_value else f"{module}.{name}"
    experiment, code = pickled_by_value(experiment_fn, named) if by_value else (named, None)
    flat = copy.copy(dict(flatten(state)))
    if flat.get(EXPERIMENT, named) not in (named, experiment):
        raise UsageError(f"state[{EXPERIMENT!r}] is {flat[EXPERIMENT]!r}, not the function {named!r}")
    flat[EXPERIMENT] = experiment
    return _insert(flat, db, force_dup=force_dup, priority=priority, code=code)


__all__ = [
    "db",
    "Database",
    "insert_job",
    "insert_dict",
    "hash_state",
    "JOBID",
    "EXPERIMENT",
    "STATUS",
    "HASH",
    "PRIORITY",
    "HOST",
    "HOST_WORKDIR",
    "START",
    "RUNNING",
    "DONE",
    "ERR_START",
    "ERR_SYNC",
    "ERR_RUN",
    "CANCELED",
]

"""Scheduling: a sweep's jobs into the database, each once, by identity.

A job's identity within its experiment is the hash of its phase, kind, target (functions in one
spelling, ``pkg.mod:fn``) and canonical parameters: the same sweep twice adds nothing. Functions run
by value are stored here too, and the end of a job moves its search (successive halving) on by
scheduling the promoted jobs. Functions of one write transaction, as the other rooms.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import graph
from . import halving as _halving
from .canonical import check_nul_all, dump_json
from .errors import NoSuchJob, UsageError
from .graph import Log
from .hot import HotStatements
from .identity import canonical_specs, duplicate_hashes
from .records import ScheduleResult
from .schema import function_code as t_code
from .schema import job as t_job
from .schema import job_dep as t_dep
from .status import Status
from .sweep import JobSpec, canonical_target
from .txn import bulk_insert, chunks

Ended = Callable[[Connection, int], None]  # told of a job that ended, in the transaction that ends it


def params_hash(phase: int, kind: str, target: str, params: dict[str, Any] | str) -> str:
    """A job's identity within its experiment: the same sweep twice adds nothing."""
    encoded = params if isinstance(params, str) else dump_json(params, "parameters")
    target = canonical_target(target) if kind == "fn" else target
    return params_hashes([JobSpec(phase, kind, target, {}, None)], [encoded])[0]


def params_hashes(specs: Sequence[JobSpec], encoded: Sequence[str]) -> list[str]:
    """:func:`params_hash` of each spec, given its parameters' canonical JSON."""
    sha256 = hashlib.sha256
    identities = {(s.phase, s.kind, s.target) for s in specs}
    if len(identities) == 1:  # one grid (100,000 jobs at a time): its prefix made once
        prefix = "\x1f".join(map(str, identities.pop())) + "\x1f"
        return [sha256((prefix + e).encode()).hexdigest() for e in encoded]
    return [sha256(f"{s.phase}\x1f{s.kind}\x1f{s.target}\x1f{e}".encode()).hexdigest() for s, e in zip(specs, encoded)]


class ReadySweep:
    """A sweep made ready outside the transaction: its specs in canonical form, each one's
    parameters as canonical JSON, and each one's identity."""

    def __init__(self, specs: Sequence[JobSpec], duplicate: bool, repeat: int = 1) -> None:
        if repeat < 1:
            raise UsageError(f"repeat must be at least 1, not {repeat}")
        specs = canonical_specs(specs)
        for i, s in enumerate(specs):
            if s.parent is not None and not 0 <= s.parent < i:
                raise UsageError(f"job {i} of the sweep names job {s.parent} as its parent; "
                                 "a parent must come before its children")
        self.specs = canonical_targets(specs)
        # First: says which value is not JSON. A sweep's expansion has encoded its grid already.
        self.encoded = [s.params_json if s.params_json is not None else dump_json(s.params, "parameters")
                        for s in self.specs]
        # The grid a sweep's expansion encoded has not been through dump_json's NUL check: it is here.
        check_nul_all(self.encoded, (s.params for s in self.specs), "parameters")
        hashes = params_hashes(self.specs, self.encoded)
        self.duplicate = duplicate
        self.hashes = duplicate_hashes(hashes) if duplicate else hashes
        # Copies (``repeat``): each a new identity, each phase's copies depending on their own copy
        # of the phase before. They are added only to a sweep new in its experiment (or forced).
        size = len(self.specs)
        self.copy_specs = [s._replace(parent=None if s.parent is None else s.parent + k * size)
                           for k in range(1, repeat) for s in self.specs]
        self.copy_hashes = duplicate_hashes(hashes * (repeat - 1)) if repeat > 1 else []
        self.repeat = repeat


def schedule(conn: Connection, log: Log, hot: HotStatements, exp: int, experiment: str, sweep: ReadySweep, *,
             after: Sequence[int], priority: float, max_attempts: int, progress: Callable[[int], None] | None,
             halving: "_halving.Halving | None") -> ScheduleResult:
    """Insert a prepared sweep's new jobs and their dependencies into experiment ``exp`` (named
    ``experiment``), in the caller's write transaction; see :meth:`Store.schedule`."""
    specs, encoded = sweep.specs, sweep.encoded
    lock_experiment(conn, exp)
    if after:
        found = set()
        for chunk in chunks(list(after)):
            found.update(conn.execute(sa.select(t_job.c.id).where(
                t_job.c.experiment_id == exp, t_job.c.id.in_(chunk))).scalars())
        missing = sorted(set(after) - found)
        if missing:
            raise NoSuchJob(f"--after names job {missing[0]}, which is not in experiment {experiment!r}")
    ids: dict[str, int] = dict(hot.ids_by_hash.rows(conn, exp=exp, after=0))
    hashes = (older_spellings(conn, exp, specs, encoded, sweep.hashes, ids) if ids and not sweep.duplicate
              else sweep.hashes)
    repeated = bool(sweep.copy_specs) and (sweep.duplicate or not set(hashes) & set(ids))
    if repeated:  # a repeated command adds nothing, copies included
        specs, encoded, hashes = [*specs, *sweep.copy_specs], encoded * sweep.repeat, [*hashes, *sweep.copy_hashes]
    unique = len(set(hashes)) == len(hashes)
    if not ids and unique:  # a new sweep in a new experiment: every job is new
        existing, fresh = 0, range(len(specs))
    else:
        existing = len(set(hashes) & set(ids))
        fresh = first_occurrences(hashes, ids)
    now = time.time()
    columns = ("experiment_id", "phase", "kind", "target", "params", "params_hash", "status", "priority",
               "max_attempts", "created_at", "queued_at")
    waiting, queued = Status.WAITING.value, Status.QUEUED.value
    root_status, root_queued_at = (waiting, None) if after else (queued, now)
    rows = [(exp, s.phase, s.kind, s.target, encoded[i], hashes[i],
             waiting if s.parent is not None else root_status, priority, max_attempts, now,
             None if s.parent is not None else root_queued_at)
            for i, s in zip(fresh, map(specs.__getitem__, fresh))]
    # Plain executemany (both drivers' fast path). The experiment is locked for this
    # transaction, so the new ids are those past ``before``.
    before = conn.execute(sa.select(sa.func.coalesce(sa.func.max(t_job.c.id), 0))).scalar_one()
    done = 0
    for batch in chunks(rows, 10000):
        bulk_insert(conn, t_job, columns, batch)
        done += len(batch)
        if progress:
            progress(done)
    fresh_ids = new_ids(conn, before, len(rows))
    if fresh_ids is None:  # not one run of ids: read them back by identity
        ids.update(hot.ids_by_hash.rows(conn, exp=exp, after=before))
        fresh_ids = [ids[hashes[i]] for i in fresh]
    else:
        ids.update(zip((hashes[i] for i in fresh), fresh_ids))
    deps, waiting_ids, pending_parents = [], [], set()
    if after or any(s.parent is not None for s in specs):
        for i, child in zip(fresh, fresh_ids):
            s = specs[i]
            if s.parent is not None:
                parent = ids[hashes[s.parent]]
                deps.append((child, parent))
                waiting_ids.append(child)
                pending_parents.add(parent)
            elif after:
                deps.extend((child, a) for a in after)
                waiting_ids.append(child)
    for batch in chunks(deps, 10000):
        bulk_insert(conn, t_dep, ("job_id", "depends_on"), batch)
    # New jobs whose parents already exist may be ready (or blocked) right away.
    if after or pending_parents - set(fresh_ids):
        graph.refresh(conn, log, waiting_ids, why="scheduled")
    job_ids = fresh_ids if unique and not existing else [ids[h] for h in dict.fromkeys(hashes)]
    if halving is not None:
        members = {ids[h]: s.params for h, s in zip(hashes, specs)}  # one per job, however often listed
        _halving.register(conn, exp, halving, list(members), list(members.values()))
    return ScheduleResult(added=len(rows), existing=existing, job_ids=list(job_ids), repeated=repeated)


def lock_experiment(conn: Connection, exp: int) -> None:
    """Serialise schedulers of one experiment (SQLite's BEGIN IMMEDIATE already does)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k1, :k2)"), {"k1": 0x6A6F62, "k2": exp})


def new_ids(conn: Connection, before: int, count: int) -> Sequence[int] | None:
    """The ids of the ``count`` rows just inserted, in order, when SQLite gave them one after
    another (it does under the write lock: each new rowid is the largest plus one); else None."""
    if conn.dialect.name != "sqlite" or not count:
        return None if count else []
    last, n = conn.execute(sa.select(sa.func.max(t_job.c.id), sa.func.count())
                           .where(t_job.c.id > before)).one()
    return range(before + 1, before + count + 1) if (last, n) == (before + count, count) else None


def canonical_targets(specs: Sequence[JobSpec]) -> Sequence[JobSpec]:
    """The specs with every function target in its one spelling (``pkg.mod:fn``)."""
    if all(s.kind != "fn" or ":" in s.target for s in specs):
        return specs
    return [s._replace(target=canonical_target(s.target)) if s.kind == "fn" else s for s in specs]


def older_spellings(conn: Connection, exp: int, specs: Sequence[JobSpec], encoded: Sequence[str],
                    hashes: list[str], ids: dict[str, int]) -> list[str]:
    """``hashes``, where a job stored before targets had one spelling (``pkg.mod.fn``, hashed so)
    is the same job: its stored hash, so that it is found, not added again. Stored rows keep theirs."""
    dotted = {s.target: s.target.replace(":", ".") for s in specs if s.kind == "fn"}
    if not dotted:
        return hashes
    stored = set(conn.execute(sa.select(t_job.c.target).distinct().where(
        t_job.c.experiment_id == exp, t_job.c.kind == "fn", t_job.c.target.in_(sorted(set(dotted.values())))))
        .scalars())
    if not stored:
        return hashes
    older = [i for i, s in enumerate(specs) if s.kind == "fn" and dotted[s.target] in stored]
    legacy = params_hashes([specs[i]._replace(target=dotted[specs[i].target]) for i in older],
                           [encoded[i] for i in older])
    out = list(hashes)
    for i, h in zip(older, legacy):
        if h in ids and hashes[i] not in ids:
            out[i] = h
    return out


def first_occurrences(hashes: list[str], existing: dict[str, int]) -> list[int]:
    """The positions of the hashes neither in ``existing`` nor earlier in ``hashes``."""
    seen: set[str] = set(existing)
    out = []
    for i, h in enumerate(hashes):
        if h not in seen:
            seen.add(h)
            out.append(i)
    return out


def search_moves_on(log: Log, now: Callable[[Connection], float]) -> Ended:
    """The one place where the end of a job moves a search on: its promotions are scheduled in the
    finishing commit (``transitions``' ``after_end``), stamped with ``now``."""
    def after_end(conn: Connection, job_id: int) -> None:
        _halving.after_finish(conn, job_id, lambda c, ids, why: graph.refresh(c, log, ids, why=why),
                              params_hash, lambda: now(conn))
    return after_end


# -- functions run by value ------------------------------------------------------------------

def put_function(conn: Connection, exp: int, target: str, code: bytes) -> None:
    """Store the code of a function run by value under its target name (the newest wins)."""
    digest = hashlib.sha256(code).hexdigest()
    key = (t_code.c.experiment_id == exp) & (t_code.c.target == target)
    old = conn.execute(sa.select(t_code.c.digest).where(key)).scalar()
    if old is None:
        conn.execute(sa.insert(t_code).values(experiment_id=exp, target=target, digest=digest, code=code,
                                              stored_at=time.time()))
    elif old != digest:
        conn.execute(sa.update(t_code).where(key).values(digest=digest, code=code, stored_at=time.time()))


def function_code(conn: Connection, exp: int, target: str) -> bytes | None:
    """The stored code of a function run by value, or None."""
    code = conn.execute(sa.select(t_code.c.code).where(t_code.c.experiment_id == exp,
                                                          t_code.c.target == target)).scalar()
    return bytes(code) if code is not None else None

"""Scheduling: a sweep's jobs into the database, each once, by identity.

A job's identity within its experiment is the hash of its phase, kind, target (functions in one
spelling, ``pkg.mod:fn``) and canonical parameters: the same sweep twice adds nothing. Functions run
by value are stored here too, and the end of a job moves its search (successive halving) on by
scheduling the promoted jobs. Functions of one write transaction, as the other rooms.
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import pickle
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import coderecord, graph, transitions
from . import halving as _halving
from . import learn as _learn
from .canonical import check_nul_all, dump_json
from .errors import NoSuchJob, UsageError
from .graph import Log
from .hot import HotStatements
from .identity import canonical_specs, duplicate_hashes
from .records import Claimed, ScheduleResult, WorkerInfo
from .schema import function_code as t_code
from .schema import job as t_job
from .schema import job_dep as t_dep
from .shape import check_shape, json_within_limits
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


SCHEDULE_CHUNK = 10_000  # jobs a schedule holds at once: made, hashed, checked, inserted, then let go
_LOOKUP = 5_000  # identities per lookup (two per job at most with older spellings: under SQLite's limit)
ANALYZE_AFTER = 50_000  # jobs, then twice as many each time
_JOB_COLUMNS = (
    "experiment_id",
    "phase",
    "kind",
    "target",
    "params",
    "params_hash",
    "status",
    "priority",
    "max_attempts",
    "ranks",
    "created_at",
    "queued_at",
)


class ReadyChunk(NamedTuple):
    """Jobs of a sweep made ready: canonical specs, each one's parameters as canonical JSON, its identity."""

    specs: list[JobSpec]
    encoded: list[str]
    hashes: list[str]


def ready_chunk(index: int, batch: Sequence[JobSpec], duplicate: bool) -> ReadyChunk:
    """``batch``, the jobs of a sweep from position ``index`` on, made ready (and checked: parents
    before children, parameters that JSON and the database can hold)."""
    for i, s in enumerate(batch, index):
        if s.parent is not None and not 0 <= s.parent < i:
            raise UsageError(
                f"job {i} of the sweep names job {s.parent} as its parent; a parent must come before its children"
            )
    for i, s in enumerate(batch, index):  # before flattening, which would follow a deep nest
        if s.params_json is None or not json_within_limits(s.params_json):
            check_shape(s.params, f"the parameters of job {i} of the sweep")
    specs = list(canonical_targets(canonical_specs(batch)))
    # First: says which value is not JSON. A sweep's expansion has encoded its grid already.
    encoded = [s.params_json if s.params_json is not None else dump_json(s.params, "parameters") for s in specs]
    # The grid a sweep's expansion encoded has not been through dump_json's NUL check: it is here.
    check_nul_all(encoded, (s.params for s in specs), "parameters")
    hashes = params_hashes(specs, encoded)
    return ReadyChunk(specs, encoded, duplicate_hashes(hashes) if duplicate else hashes)


class ReadySweep:
    """A sweep to schedule, read a chunk at a time: a sweep of a million jobs is never held whole.

    ``specs`` is iterated once per pass (a retried transaction, ``repeat``'s copies), so a one-shot
    iterator is read into a list first. A sweep of one chunk is made ready here, outside the
    transaction, as before; a larger one chunk by chunk inside it, each chunk let go once inserted.
    """

    def __init__(self, specs: Iterable[JobSpec], duplicate: bool, repeat: int = 1) -> None:
        if repeat < 1:
            raise UsageError(f"repeat must be at least 1, not {repeat}")
        self.specs = list(specs) if iter(specs) is specs else specs
        self.duplicate, self.repeat = duplicate, repeat
        self.distinct = bool(getattr(self.specs, "distinct", False))  # no job of the sweep is another of it
        self.parents = bool(getattr(self.specs, "parents", True))  # some job depends on another of it
        size = len(self.specs) if isinstance(self.specs, Sized) else None
        self._one = ready_chunk(0, list(self.specs), duplicate) if size is not None and size <= SCHEDULE_CHUNK else None

    def chunks(self, copy: int = 0) -> Iterator[tuple[int, ReadyChunk]]:
        """(position, chunk) over the sweep; ``copy`` k > 0: its k-th copy, new identities whose
        parents are their own copy's, placed after the sweep and the copies before it."""
        size = self.size
        if self._one is not None and not copy:
            yield 0, self._one
            return
        index, it = 0, iter(self.specs)
        while batch := list(itertools.islice(it, SCHEDULE_CHUNK)):
            if copy:
                batch = [s._replace(parent=None if s.parent is None else s.parent + copy * size) for s in batch]
            yield copy * size + index, ready_chunk(copy * size + index, batch, self.duplicate or bool(copy))
            index += len(batch)

    @functools.cached_property
    def size(self) -> int:
        return len(self.specs) if isinstance(self.specs, Sized) else sum(1 for _ in self.specs)


def schedule(
    conn: Connection,
    log: Log,
    hot: HotStatements,
    exp: int,
    experiment: str,
    sweep: ReadySweep,
    *,
    after: Sequence[int],
    priority: float,
    max_attempts: int,
    ranks: int = 1,
    progress: Callable[[int], None] | None,
    halving: _halving.Halving | None,
    keep_ids: bool = True,
    where: Mapping[str, str] | None = None,
) -> ScheduleResult:
    """Insert a sweep's new jobs and their dependencies into experiment ``exp`` (named ``experiment``),
    in the caller's write transaction, a chunk at a time; see :meth:`Store.schedule`."""
    lock_experiment(conn, exp)
    if after:
        found: set[int] = set()
        for part in chunks(list(after)):
            found.update(
                conn.execute(
                    sa.select(t_job.c.id)
                    .where(t_job.c.experiment_id == exp, t_job.c.id.in_(part))
                    .with_for_update(read=True)  # see lock_parents
                ).scalars()
            )
        missing = sorted(set(after) - found)
        if missing:
            raise NoSuchJob(f"--after names job {missing[0]}, which is not in experiment {experiment!r}")
    # The experiment is locked for this transaction: the ids past ``before`` are this sweep's.
    before = newest_id(conn)
    empty = conn.execute(sa.select(t_job.c.id).where(t_job.c.experiment_id == exp).limit(1)).first() is None
    writer = SweepWriter(
        conn,
        log,
        hot,
        exp,
        before,
        after=after,
        priority=priority,
        max_attempts=max_attempts,
        ranks=ranks,
        lookup=not sweep.duplicate and not (empty and sweep.distinct),
        with_parents=sweep.parents or sweep.repeat > 1,
        keep_ids=keep_ids or halving is not None,
        members=halving is not None,
        counted=None if sweep.distinct else set(),
    )
    done = 0
    for index, chunk in sweep.chunks():
        writer.write(index, chunk, lookup=writer.lookup)
        done += len(chunk.specs)
        if progress:
            progress(done)
    # Copies are added only to a sweep new in its experiment (or forced): a repeated command adds nothing.
    repeated = sweep.repeat > 1 and (sweep.duplicate or writer.existing == 0)
    for copy in range(1, sweep.repeat if repeated else 1):
        for index, chunk in sweep.chunks(copy):
            writer.write(index, chunk, lookup=False)
            done += len(chunk.specs)
            if progress:
                progress(done)
    if halving is not None and writer.members is not None:  # members are kept for a search
        _halving.register(conn, exp, halving, list(writer.members), list(writer.members.values()))
    for target, folder in (where or {}).items():
        coderecord.where_found(conn, exp, {target, canonical_target(target)}, folder, before)
    return ScheduleResult(added=writer.added, existing=writer.existing, job_ids=writer.job_ids, repeated=repeated)


def schedule_calls(
    conn: Connection,
    log: Log,
    hot: HotStatements,
    exp: int,
    experiment: str,
    specs: Sequence[JobSpec],
    needs: Sequence[Sequence[int]],
    *,
    max_attempts: int,
    ranks: int = 1,
) -> dict[str, int]:
    """Insert calls from Python, each depending on the jobs of the calls it takes (``needs[i]`` for
    ``specs[i]``), in the caller's transaction; the job id of each spec's identity. Calls that take
    the same calls are one :func:`schedule` with them as ``after``: WAITING until those are DONE,
    QUEUED at once if they are, BLOCKED if one ended badly."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, need in enumerate(needs):
        groups.setdefault(tuple(sorted(set(need))), []).append(i)
    out: dict[str, int] = {}
    for after, members in groups.items():
        group = [specs[i] for i in members]
        result = schedule(
            conn,
            log,
            hot,
            exp,
            experiment,
            ReadySweep(group, False),
            after=after,
            priority=0,
            max_attempts=max_attempts,
            ranks=ranks,
            progress=None,
            halving=None,
        )
        chunk = ready_chunk(0, group, False)
        out.update(zip(dict.fromkeys(chunk.hashes), result.job_ids))
    return out


def newest_id(conn: Connection) -> int:
    """The largest job id given so far (0 in an empty database): a schedule's new jobs come after it."""
    return conn.execute(sa.select(sa.func.coalesce(sa.func.max(t_job.c.id), 0))).scalar_one()


class SweepWriter:
    """A schedule's transaction, one chunk of the sweep at a time.

    Each chunk is checked against the experiment's identity index (``uq_job_experiment_hash``),
    never against every stored identity held in memory; the jobs of earlier chunks are in the index
    by then, so a sweep that names one job twice adds it once. A chunk's jobs are inserted by the
    driver's executemany; their ids are read back only when something needs them (a child's parent,
    ``after``, the caller).
    """

    def __init__(
        self,
        conn: Connection,
        log: Log,
        hot: HotStatements,
        exp: int,
        before: int,
        *,
        after: Sequence[int],
        priority: float,
        max_attempts: int,
        ranks: int = 1,
        lookup: bool,
        with_parents: bool,
        keep_ids: bool,
        members: bool,
        counted: set[int] | None,
    ) -> None:
        self.conn, self.log, self.hot, self.exp, self.before = conn, log, hot, exp, before
        self.after, self.priority, self.max_attempts = list(after), priority, max_attempts
        self.lookup, self.keep_ids = lookup, keep_ids
        self.ranks = ranks
        self.counted = counted  # pre-existing jobs counted already (None: the sweep cannot name one twice)
        self.slots: array | None = array("q") if with_parents else None  # the job each position of the sweep is
        self.job_ids: list[int] = []  # with keep_ids: each distinct job of the sweep, in order
        self._listed: set[int] = set()
        self.members: dict[int, dict[str, Any]] | None = {} if members else None  # job -> params, for a search
        self.added = self.existing = 0
        self.last_id = before  # the largest id this transaction has given
        self.refresh = bool(after)  # a parent that is not new: new jobs may be ready (or blocked) at once
        self.now = time.time()
        waiting, queued = Status.WAITING.value, Status.QUEUED.value
        self.root_status = waiting if after else queued
        self.root_queued_at: float | None = None if after else self.now
        self.dotted: dict[str, bool] = {}  # function target -> a job is stored under its older spelling
        self.needs_ids = with_parents or keep_ids or members or bool(after)
        self.analyze_at = ANALYZE_AFTER  # PostgreSQL: jobs added when the planner's statistics are read again

    def write(self, index: int, chunk: ReadyChunk, *, lookup: bool) -> None:  # noqa: C901
        specs, encoded, hashes = chunk
        found: dict[str, int] = self._found(specs, encoded, hashes) if lookup else {}
        if found:
            hashes = self._older_spellings(specs, encoded, hashes, found)
        fresh: dict[str, int] = {}  # hash -> position in the chunk, of the jobs to insert
        for k, h in enumerate(hashes):
            if h not in found and h not in fresh:
                fresh[h] = k
        for h in dict.fromkeys(h for h in hashes if h in found):
            job_id = found[h]
            if job_id <= self.before and (self.counted is None or job_id not in self.counted):
                self.existing += 1
                if self.counted is not None:
                    self.counted.add(job_id)
        rows = []
        for h, k in fresh.items():
            s = specs[k]
            root = s.parent is None
            rows.append(
                (
                    self.exp,
                    s.phase,
                    s.kind,
                    s.target,
                    encoded[k],
                    h,
                    self.root_status if root else Status.WAITING.value,
                    self.priority,
                    self.max_attempts,
                    self.ranks,
                    self.now,
                    self.root_queued_at if root else None,
                )
            )
        bulk_insert(self.conn, t_job, _JOB_COLUMNS, rows)
        self.added += len(rows)
        if self.added >= self.analyze_at and self.conn.dialect.name == "postgresql":
            self.analyze_at = 2 * self.added
            refresh_statistics(self.conn)
        if not self.needs_ids:
            return
        ids = {**found, **self._new_ids(list(fresh))}
        chunk_ids = [ids[h] for h in hashes]
        deps, waiting = [], []
        for h, k in fresh.items():
            s, child = specs[k], ids[h]
            if s.parent is not None:
                # slots are kept whenever a job of the sweep may have a parent
                parent = self.slots[s.parent] if s.parent < index else chunk_ids[s.parent - index]  # type: ignore[index]
                deps.append((child, parent))
                waiting.append(child)
                self.refresh = self.refresh or parent <= self.before
            elif self.after:
                deps.extend((child, a) for a in self.after)
                waiting.append(child)
        for part in chunks(deps, 10000):
            bulk_insert(self.conn, t_dep, ("job_id", "depends_on"), part)
        # Parents made by this sweep are new, so their new children are WAITING as inserted; once a
        # parent is not (or with --after), every later chunk's new jobs are re-derived from their parents.
        if self.refresh and waiting:
            graph.refresh(self.conn, self.log, waiting, why="scheduled")
        if self.slots is not None:
            self.slots.extend(chunk_ids)
        if self.keep_ids:
            for job_id in chunk_ids:
                if job_id not in self._listed:
                    self._listed.add(job_id)
                    self.job_ids.append(job_id)
        if self.members is not None:
            for job_id, s in zip(chunk_ids, specs):
                self.members.setdefault(job_id, s.params)

    def _found(self, specs: list[JobSpec], encoded: list[str], hashes: list[str]) -> dict[str, int]:
        """The stored job of each identity of the chunk (and of its older spelling), by the index."""
        wanted = set(hashes)
        older = self._dotted_positions(specs)
        if older:
            wanted.update(
                params_hashes(
                    [specs[k]._replace(target=specs[k].target.replace(":", ".")) for k in older],
                    [encoded[k] for k in older],
                )
            )
        out: dict[str, int] = {}
        for part in chunks(sorted(wanted), _LOOKUP):
            out.update(
                self.conn.execute(
                    sa.select(t_job.c.params_hash, t_job.c.id).where(
                        t_job.c.experiment_id == self.exp, t_job.c.params_hash.in_(part)
                    )
                ).all()
            )
        return out

    def _dotted_positions(self, specs: list[JobSpec]) -> list[int]:
        """Jobs of the chunk whose function has jobs stored under its older spelling (``pkg.mod.fn``)."""
        unknown = {s.target for s in specs if s.kind == "fn" and s.target not in self.dotted}
        if unknown:
            spelled = {t: t.replace(":", ".") for t in unknown}
            stored = set(
                self.conn.execute(
                    sa.select(t_job.c.target)
                    .distinct()
                    .where(
                        t_job.c.experiment_id == self.exp,
                        t_job.c.kind == "fn",
                        t_job.c.target.in_(sorted(set(spelled.values()))),
                    )
                ).scalars()
            )
            self.dotted.update((t, d in stored) for t, d in spelled.items())
        return [k for k, s in enumerate(specs) if s.kind == "fn" and self.dotted[s.target]]

    def _older_spellings(
        self, specs: list[JobSpec], encoded: list[str], hashes: list[str], found: dict[str, int]
    ) -> list[str]:
        """``hashes``, where a job stored before targets had one spelling (``pkg.mod.fn``, hashed so)
        is the same job: its stored hash, so that it is found, not added again. Stored rows keep theirs."""
        older = self._dotted_positions(specs)
        if not older:
            return hashes
        legacy = params_hashes(
            [specs[k]._replace(target=specs[k].target.replace(":", ".")) for k in older], [encoded[k] for k in older]
        )
        out = list(hashes)
        for k, h in zip(older, legacy):
            if h in found and hashes[k] not in found:
                out[k] = h
        return out

    def _new_ids(self, hashes: list[str]) -> dict[str, int]:
        """The ids of the rows just inserted (``hashes``, in order). SQLite gives them one after another
        under the write lock (each new rowid is the largest plus one); else they are read back by identity."""
        if not hashes:
            return {}
        start, n = self.last_id, len(hashes)
        if self.conn.dialect.name == "sqlite":
            last, count = self.conn.execute(
                sa.select(sa.func.max(t_job.c.id), sa.func.count()).where(t_job.c.id > start)
            ).one()
            if (last, count) == (start + n, n):
                self.last_id = last
                return dict(zip(hashes, range(start + 1, start + n + 1)))
        got = dict(self.hot.ids_by_hash.rows(self.conn, exp=self.exp, after=start))
        self.last_id = max(self.last_id, *got.values())
        return {h: got[h] for h in hashes}


def refresh_statistics(conn: Connection) -> None:
    """PostgreSQL's planner statistics of the job table, read again inside a schedule's transaction.

    The planner sizes the table by its last statistics, and autovacuum cannot count rows not yet
    committed: past a few hundred thousand new jobs in a table it last saw small, it looked each
    chunk's identities up by reading every job of the experiment (a lookup of 1,000 took over a
    minute at 250,000 jobs). ``ANALYZE`` counts this transaction's own rows. It is skipped when
    another ANALYZE or VACUUM holds the table (a lock it would keep to the end of the schedule)."""
    timeout = conn.exec_driver_sql("SHOW lock_timeout").scalar()
    try:
        with conn.begin_nested():
            conn.exec_driver_sql("SET LOCAL lock_timeout = '200ms'")
            conn.exec_driver_sql("ANALYZE job")
    except sa.exc.OperationalError:  # the lock was not free in time: the savepoint undid the attempt
        pass
    conn.execute(sa.text("SELECT set_config('lock_timeout', :t, true)"), {"t": timeout})


def lock_parents(conn: Connection, job_ids: Sequence[int]) -> None:
    """Hold the rows of the jobs new jobs will depend on (FOR SHARE) until the schedule commits.

    Under PostgreSQL's read committed, a parent ending while its child is scheduled would otherwise
    read its children before the child's dependency is committed, while the schedule read the parent
    as still running: the child would stay WAITING with every parent DONE. With the rows held, a
    parent's end (which takes its row FOR UPDATE first) either commits before the schedule reads it,
    or waits for the schedule's commit and then finds the child. SQLite serialises writers already."""
    if conn.dialect.name == "postgresql":
        for part in chunks(sorted(set(job_ids))):
            conn.execute(sa.select(t_job.c.id).where(t_job.c.id.in_(part)).with_for_update(read=True)).all()


def lock_experiment(conn: Connection, exp: int) -> None:
    """Serialise schedulers of one experiment (SQLite's BEGIN IMMEDIATE already does)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k1, :k2)"), {"k1": 0x6A6F62, "k2": exp})


def start_learning(
    conn: Connection, exp: int, rules: _halving.Halving, plan: _learn.Plan, now: float
) -> tuple[int, list[int], int]:
    """Record a learning search and make its first proposals (see :func:`.learn.start`), schedulers
    of the experiment serialised as for a sweep."""
    lock_experiment(conn, exp)
    return _learn.start(conn, exp, rules, plan, params_hash, now)


def ask_learning(
    conn: Connection, log: Log, exp: int, search_id: int, worker: WorkerInfo, now: float
) -> Claimed | None:
    """The next point of an ask/tell search, as a job proposed and claimed by the asking process in
    one transaction (so that no worker takes it, and the monitor sees it die with its process);
    None when the budget is spent or every point has been asked."""
    new = _learn.propose(conn, search_id, params_hash, now, wanted=1)
    return transitions.claim_job(conn, log, exp, new[0], worker, None, now) if new else None


def canonical_targets(specs: Sequence[JobSpec]) -> Sequence[JobSpec]:
    """The specs with every function target in its one spelling (``pkg.mod:fn``)."""
    if all(s.kind != "fn" or ":" in s.target for s in specs):
        return specs
    return [s._replace(target=canonical_target(s.target)) if s.kind == "fn" else s for s in specs]


def search_moves_on(log: Log, now: Callable[[Connection], float]) -> Ended:
    """The one place where the end of a job moves a search on: its promotions are scheduled in the
    finishing commit (``transitions``' ``after_end``), stamped with ``now``."""

    def after_end(conn: Connection, job_id: int) -> None:
        _halving.after_finish(
            conn, job_id, lambda c, ids, why: graph.refresh(c, log, ids, why=why), params_hash, lambda: now(conn)
        )
        _learn.after_end(conn, job_id, params_hash, lambda: now(conn))

    return after_end


# -- functions run by value ------------------------------------------------------------------


def pickled_by_value(fn: Callable[..., Any], name: str) -> tuple[str, bytes]:
    """A function run by value: the target it is stored and called under, ``name#digest``, and its code
    (cloudpickle). The digest is of the code, so that two functions of one name (two lambdas, two
    functions made by one factory, two scripts' ``train``) never share a stored code, while a re-run
    of the same script finds its calls again."""
    try:
        import cloudpickle
    except ImportError:
        raise UsageError(f"{name!r} is run by value, which needs cloudpickle: pip install cloudpickle") from None
    try:
        code = cloudpickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - whatever cloudpickle cannot carry
        raise UsageError(f"{name!r} cannot be stored by value: {type(exc).__name__}: {exc}") from None
    base, at, version = name.partition("@")
    return f"{base}#{_code_digest(fn, cloudpickle)}{at}{version}", code


def _code_digest(fn: Callable[..., Any], cloudpickle: Any) -> str:
    """The digest of a function's code, the same in every run of its script: pickled as it is stored,
    but with sets in a fixed order (a set of strings, a constant ``{"a", "b"}`` included, iterates in
    an order that changes from one process to the next), and without the random ids cloudpickle
    gives the classes of a script."""

    def stable(obj: Any) -> bytes:
        buffer = io.BytesIO()
        _StablePickler(buffer, protocol=pickle.DEFAULT_PROTOCOL).dump(obj)
        return buffer.getvalue()

    class _StablePickler(cloudpickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if type(obj) in (set, frozenset):
                return type(obj).__name__, tuple(sorted(stable(item) for item in obj))
            return None

    code = stable(fn)
    tracked = getattr(getattr(cloudpickle, "cloudpickle", None), "_DYNAMIC_CLASS_TRACKER_BY_CLASS", None)
    for tracker_id in list(tracked.values()) if tracked is not None else ():
        if isinstance(tracker_id, str):
            code = code.replace(tracker_id.encode(), b"")
    return hashlib.sha256(code).hexdigest()[:16]


def put_function(conn: Connection, exp: int, target: str, code: bytes) -> None:
    """Store the code of a function run by value under its target (the newest wins: a target
    ``name#digest`` only ever gets the same code; one stored before digests, plain ``name``, any)."""
    digest = hashlib.sha256(code).hexdigest()
    key = (t_code.c.experiment_id == exp) & (t_code.c.target == target)
    old = conn.execute(sa.select(t_code.c.digest).where(key)).scalar()
    if old is None:
        conn.execute(
            sa.insert(t_code).values(experiment_id=exp, target=target, digest=digest, code=code, stored_at=time.time())
        )
    elif old != digest:
        conn.execute(sa.update(t_code).where(key).values(digest=digest, code=code, stored_at=time.time()))


def function_code(conn: Connection, exp: int, target: str) -> bytes | None:
    """The stored code of a function run by value, or None."""
    code = conn.execute(
        sa.select(t_code.c.code).where(t_code.c.experiment_id == exp, t_code.c.target == target)
    ).scalar()
    return bytes(code) if code is not None else None

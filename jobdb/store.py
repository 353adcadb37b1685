"""The store: every SQL statement jobman runs, behind domain verbs.

``schedule``, ``claim``, ``heartbeat``, ``save``, ``log_metrics``, ``finish``,
``crash``, ``reset``, ``cancel``, ... Each verb is one transaction. Every status
change writes a ``job_event`` row in the same transaction. ``heartbeat``,
``save`` and ``finish`` take the caller's lease (a fencing token bumped on every
claim) and refuse a caller that no longer owns the job.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Callable, Iterable, Sequence, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from . import engine as _engine
from . import graph, transitions
from . import halving as _halving
from .canonical import dump_json
from .clock import ServerClock
from .errors import DatabaseError, LeaseLost, NoSuchExperiment, NoSuchJob, StateTooLarge, UsageError
from .hot import HotStatements, claim_values, owned
from .identity import canonical_specs, duplicate_hashes
from .priority import check_priority
from .records import (CLAIMED_ATTEMPT, CLAIMED_COLUMNS, RUNNING_COLUMNS, Claimed, Event, Found, Job, RunningJob,
                      ScheduleResult, WorkerInfo, to_claimed)
from .schema import experiment as t_exp
from .schema import function_code as t_code
from .schema import job as t_job
from .schema import job_dep as t_dep
from .schema import job_event as t_event
from .schema import job_metric as t_metric
from .status import OUTSTANDING, Status, names_of
from .sweep import JobSpec, canonical_target
from .txn import Transactions, bulk_insert, chunks, source_tag
from .url import DbTarget, parse_db

T = TypeVar("T")
MAX_STATE_BYTES = 4 * 1024 * 1024  # a job's results/checkpoint JSON; weights belong in its workdir


# The worker loop's status names, read once (an Enum's ``value`` is a property).
_QUEUED, _RUNNING = Status.QUEUED.value, Status.RUNNING.value


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


# -- the store ------------------------------------------------------------------------

class Store:
    """One experiment of one database, spoken to in domain verbs."""

    def __init__(self, target: DbTarget, engine: Engine | None = None, *, check_schema: bool = True,
                 create: bool = True) -> None:
        self.target = target
        path = target.sqlite_path
        if not create and path and path != ":memory:" and not os.path.exists(path):
            raise DatabaseError(f"there is no jobman database at {path}: schedule a sweep first")
        self.engine = engine or _engine.make_engine(target)
        self.hot = HotStatements(self.engine.dialect, CLAIMED_COLUMNS)
        self.clock = ServerClock(self.engine.dialect.name)  # claims, heartbeats, finishes: the server's time
        self._tx = Transactions(target, self.engine, self.hot)
        # The plumbing every verb goes through (jobdb/txn.py).
        self._write, self._read, self._events = self._tx.write, self._tx.read, self._tx.log
        # What the end of a run needs beyond its transaction: the server's time, and the searches it moves on.
        self._ends = dict(clock=self.clock.now, after_end=self._search_after_finish)
        self._experiment_id: int | None = None
        if check_schema:
            with _engine.translated_errors(target):
                _engine.ensure_schema(self.engine, create=create)

    @classmethod
    def open(cls, url: str | None = None, table: str | None = None, **kwargs: Any) -> "Store":
        """Open ``url`` (or ``JOBMAN_DB``, or ./jobman.db) for experiment ``table``."""
        return cls(parse_db(url, table), **kwargs)

    @property
    def experiment(self) -> str:
        return self.target.experiment

    def dispose(self) -> None:
        self._tx.drop_writer()
        self.engine.dispose()

    def _experiment(self, conn: Connection, create: bool = False) -> int:
        if self._experiment_id is not None:
            return self._experiment_id
        found = conn.execute(sa.select(t_exp.c.id).where(t_exp.c.name == self.experiment)).scalar()
        if found is None:
            if not create:
                names = conn.execute(sa.select(t_exp.c.name).order_by(t_exp.c.name)).scalars().all()
                known = ", ".join(names) if names else "none yet"
                raise NoSuchExperiment(f"no experiment {self.experiment!r} in {self.target.display} "
                                       f"(experiments: {known})")
            # Two processes may make the same new experiment at once (PostgreSQL lets both try):
            # the second waits for the first's commit, inserts nothing, and reads its row.
            from sqlalchemy.dialects import postgresql, sqlite

            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            found = conn.execute(dialect.insert(t_exp).values(name=self.experiment, created_at=time.time())
                                 .on_conflict_do_nothing(index_elements=["name"]).returning(t_exp.c.id)).scalar()
            if found is None:
                found = conn.execute(sa.select(t_exp.c.id).where(t_exp.c.name == self.experiment)).scalar_one()
        self._experiment_id = found
        return found

    def _lock_experiment(self, conn: Connection, exp: int) -> None:
        """Serialise schedulers of one experiment (SQLite's BEGIN IMMEDIATE already does)."""
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k1, :k2)"), {"k1": 0x6A6F62, "k2": exp})

    def experiments(self) -> list[str]:
        """Every experiment in the database."""
        return self._read(lambda c: c.execute(sa.select(t_exp.c.name).order_by(t_exp.c.name)).scalars().all())

    # -- schedule -------------------------------------------------------------------
    def schedule(self, specs: Sequence[JobSpec], *, after: Sequence[int] = (), priority: float = 0,
                 max_attempts: int = 3, progress: Callable[[int], None] | None = None,
                 halving: "_halving.Halving | None" = None, duplicate: bool = False) -> ScheduleResult:
        """Insert a sweep's jobs and their dependencies in one transaction; skip jobs already present.

        Roots (phase 0) depend on ``after`` (fan-in); other jobs on their parent. With ``halving``,
        the jobs are the first rung of a successive-halving search, recorded in the same transaction.
        With ``duplicate`` (jobman's ``force_dup``) every job is added, as a new identity, even if present.
        """
        check_priority(priority)
        specs = canonical_specs(specs)
        for i, s in enumerate(specs):
            if s.parent is not None and not 0 <= s.parent < i:
                raise UsageError(f"job {i} of the sweep names job {s.parent} as its parent; "
                                 "a parent must come before its children")
        specs = _canonical_targets(specs)
        # First: says which value is not JSON. A sweep's expansion has encoded its grid already.
        encoded = [s.params_json if s.params_json is not None else dump_json(s.params, "parameters") for s in specs]
        canonical_hashes = params_hashes(specs, encoded)
        if duplicate:
            canonical_hashes = duplicate_hashes(canonical_hashes)

        def run(conn: Connection) -> ScheduleResult:
            exp = self._experiment(conn, create=True)
            self._lock_experiment(conn, exp)
            if after:
                found = set()
                for chunk in chunks(list(after)):
                    found.update(conn.execute(sa.select(t_job.c.id).where(
                        t_job.c.experiment_id == exp, t_job.c.id.in_(chunk))).scalars())
                missing = sorted(set(after) - found)
                if missing:
                    raise NoSuchJob(f"--after names job {missing[0]}, which is not in experiment {self.experiment!r}")
            ids: dict[str, int] = dict(self.hot.ids_by_hash.rows(conn, exp=exp, after=0))
            hashes = (_older_spellings(conn, exp, specs, encoded, canonical_hashes, ids) if ids and not duplicate
                      else canonical_hashes)
            unique = len(set(hashes)) == len(hashes)
            if not ids and unique:  # a new sweep in a new experiment: every job is new
                existing, fresh = 0, range(len(specs))
            else:
                existing = len(set(hashes) & set(ids))
                fresh = _first_occurrences(hashes, ids)
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
            fresh_ids = self._new_ids(conn, before, len(rows))
            if fresh_ids is None:  # not one run of ids: read them back by identity
                ids.update(self.hot.ids_by_hash.rows(conn, exp=exp, after=before))
                fresh_ids = [ids[hashes[i]] for i in fresh]
            else:
                ids.update(zip((hashes[i] for i in fresh), fresh_ids))
            deps, waiting, pending_parents = [], [], set()
            if after or any(s.parent is not None for s in specs):
                for i, child in zip(fresh, fresh_ids):
                    s = specs[i]
                    if s.parent is not None:
                        parent = ids[hashes[s.parent]]
                        deps.append((child, parent))
                        waiting.append(child)
                        pending_parents.add(parent)
                    elif after:
                        deps.extend((child, a) for a in after)
                        waiting.append(child)
            for batch in chunks(deps, 10000):
                bulk_insert(conn, t_dep, ("job_id", "depends_on"), batch)
            # New jobs whose parents already exist may be ready (or blocked) right away.
            if after or pending_parents - set(fresh_ids):
                graph.refresh(conn, self._events, waiting, why="scheduled")
            job_ids = fresh_ids if unique and not existing else [ids[h] for h in dict.fromkeys(hashes)]
            if halving is not None:
                _halving.register(conn, exp, halving, list(job_ids), [s.params for s in specs])
            return ScheduleResult(added=len(rows), existing=existing, job_ids=list(job_ids))

        return self._write(run)

    @staticmethod
    def _new_ids(conn: Connection, before: int, count: int) -> Sequence[int] | None:
        """The ids of the ``count`` rows just inserted, in order, when SQLite gave them one after
        another (it does under the write lock: each new rowid is the largest plus one); else None."""
        if conn.dialect.name != "sqlite" or not count:
            return None if count else []
        last, n = conn.execute(sa.select(sa.func.max(t_job.c.id), sa.func.count())
                               .where(t_job.c.id > before)).one()
        return range(before + 1, before + count + 1) if (last, n) == (before + count, count) else None

    # -- a worker's verbs ------------------------------------------------------------------
    def claim(self, worker: WorkerInfo, workdir_root: str | None = None) -> Claimed | None:
        """Atomically take the first QUEUED job (by priority, then order, then id), or None."""
        return to_claimed(self._write(lambda conn: self._claim(conn, worker, workdir_root)), worker)

    def _claim(self, conn: Connection, worker: WorkerInfo, workdir_root: str | None,
               log: list[dict[str, Any]] | None = None) -> Found | None:
        """The claim in ``conn``'s transaction (with ``log``, its event is left there for the caller to
        write), for :func:`_to_claimed` once the lock is released."""
        now = self.clock.now(conn)
        rows = self.hot.claim.rows(conn, exp=self._experiment(conn), **_claim_args(worker, workdir_root, now))
        if not rows:
            return None
        row = rows[0]
        self._log_claim(conn, row[0], row[CLAIMED_ATTEMPT], worker, log)
        return row, [r[0] for r in self.hot.parents.rows(conn, id=row[0])] if row[-1] else [], now

    def _log_claim(self, conn: Connection, job_id: int, attempt: int, worker: WorkerInfo,
                   log: list[dict[str, Any]] | None = None) -> None:
        """Log a claim (QUEUED -> RUNNING) in the claiming transaction, or leave its event in ``log``."""
        event = {"job_id": job_id, "from_status": _QUEUED, "to_status": _RUNNING, "attempt": attempt,
                 "why": f"claimed by {worker.host}:{worker.pid}"
                 + (f" ({worker.backend} {worker.backend_id})" if worker.backend_id else "")}
        if log is None:
            self._events(conn, [event])
        else:
            log.append(event)

    @staticmethod
    def _running_select(exp: int, *columns: Any) -> sa.Select:
        """RUNNING jobs of an experiment: the monitor's scan."""
        return sa.select(*(columns or (t_job,))).where(t_job.c.experiment_id == exp,
                                                       t_job.c.status == Status.RUNNING.value)

    def claim_query(self) -> sa.Select:
        """The select ``claim`` picks its job with, for this experiment (to EXPLAIN: it must use ix_job_claim)."""
        return self._read(lambda conn: self.hot.claim_pick.params(exp=self._experiment(conn)))

    def running_query(self) -> sa.Select:
        """The select of the monitor's scan of RUNNING jobs, for this experiment (to EXPLAIN)."""
        return self._read(lambda conn: self._running_select(self._experiment(conn)))

    # -- one allocation per job (Slurm's one-job-per-task) ----------------------------------
    # A QUEUED job assigned to an allocation carries its backend id and no pid until that
    # allocation claims it: ``Job.awaiting_allocation``. Pull workers' ``claim`` ignores this.
    def assign(self, job_id: int, backend: str, backend_id: str, log_path: str | None = None) -> bool:
        """Record that allocation ``backend_id`` was made to run this QUEUED job; False if the job is
        not QUEUED any more or another allocation already waits for it (then cancel ``backend_id``)."""
        def run(conn: Connection) -> bool:
            exp = self._experiment(conn)
            row = conn.execute(sa.update(t_job).where(
                t_job.c.id == job_id, t_job.c.experiment_id == exp, t_job.c.status == Status.QUEUED.value,
                sa.or_(t_job.c.backend_id.is_(None), t_job.c.pid.isnot(None)))
                .values(backend=backend, backend_id=backend_id, log_path=log_path, host=None, pid=None,
                        pid_started_at=None).returning(t_job.c.attempt)).first()
            if row is not None:
                self._events(conn, [{"job_id": job_id, "from_status": Status.QUEUED.value,
                                     "to_status": Status.QUEUED.value, "attempt": row.attempt,
                                     "why": f"submitted as {backend} job {backend_id}"}])
            return row is not None

        return self._write(run)

    def claim_job(self, job_id: int, worker: WorkerInfo, workdir_root: str | None = None, *,
                  assigned_to: str | None = None) -> Claimed | None:
        """Atomically take one given QUEUED job, or None; with ``assigned_to``, only if that backend id
        is the job's (the allocation it was assigned to, or the one that last ran it)."""
        def run(conn: Connection) -> Claimed | None:
            exp = self._experiment(conn)
            where = [t_job.c.id == job_id, t_job.c.experiment_id == exp, t_job.c.status == Status.QUEUED.value]
            if assigned_to is not None:
                where.append(t_job.c.backend_id == assigned_to)
            row = conn.execute(sa.update(t_job).where(*where).values(**claim_values()).returning(*t_job.c),
                               _claim_args(worker, workdir_root, self.clock.now(conn))).first()
            if row is None:
                return None
            job = Job.from_row(row, self._parent_ids(conn, row.id))
            self._log_claim(conn, job.id, job.attempt, worker)
            return Claimed(job, job.lease)

        return self._write(run)

    def release(self, job_id: int, backend_id: str, reason: str) -> Status | None:
        """Allocation ``backend_id`` ended without claiming its job: that counts as an attempt; the job
        stays QUEUED for another allocation, or is CRASHED once max_attempts are spent. None if the
        job no longer waits for that allocation."""
        return self._write(lambda conn: transitions.release(conn, self._events, self._experiment(conn), job_id,
                                                            backend_id, reason))

    def _refuse(self, conn: Connection, job_id: int, lease: int, what: str) -> LeaseLost:
        row = conn.execute(sa.select(t_job.c.status, t_job.c.lease, t_job.c.attempt)
                           .where(t_job.c.id == job_id)).first()
        if row is None:
            return LeaseLost(f"job {job_id} was deleted while it ran; its {what} was dropped")
        return LeaseLost(f"job {job_id} is {row.status} at lease {row.lease}; the {what} of lease {lease} was refused")

    def _refuse_logged(self, job_id: int, lease: int, what: str) -> LeaseLost:
        """Record a refused write from a caller that lost the job, then return the error to raise."""
        def run(conn: Connection) -> LeaseLost:
            err = self._refuse(conn, job_id, lease, what)
            if conn.execute(sa.select(t_job.c.id).where(t_job.c.id == job_id)).first() is not None:
                self._events(conn, [{"job_id": job_id, "from_status": None, "to_status": None,
                                     "why": f"refused a stale {what} from lease {lease}"}])
            return err
        return self._write(run)

    def heartbeat(self, job_id: int, lease: int) -> bool:
        """Prove the job alive; returns True when a stop was requested (cancel --running)."""
        def run(conn: Connection) -> bool | None:
            rows = self.hot.heartbeat.rows(conn, id=job_id, lease=lease, now=self.clock.now(conn))
            return bool(rows[0][0]) if rows else None

        answer = self._write(run)
        if answer is None:
            raise self._refuse_logged(job_id, lease, "heartbeat")
        return answer

    def save(self, job_id: int, lease: int, results: dict[str, Any]) -> None:
        """Checkpoint a running job's results so a relaunch resumes from them."""
        blob = dump_json(results, "job state")
        if len(blob) > MAX_STATE_BYTES:
            raise StateTooLarge(f"job {job_id}'s state is {len(blob)} bytes, over the {MAX_STATE_BYTES}-byte "
                                "limit: keep large arrays in files in the job's workdir")
        ok = self._write(lambda c: self.hot.save.rows(c, id=job_id, lease=lease, results=blob, now=self.clock.now(c)))
        if not ok:
            raise self._refuse_logged(job_id, lease, "checkpoint")

    def set_gpus(self, job_id: int, lease: int, gpus: str) -> None:
        """Record the devices a running job was given (``CUDA_VISIBLE_DEVICES``), on the job and in its log."""
        def run(conn: Connection) -> bool:
            mine = sa.and_(t_job.c.id == job_id, t_job.c.lease == lease, t_job.c.status == Status.RUNNING.value)
            if not conn.execute(sa.update(t_job).where(mine).values(gpus=gpus)).rowcount:
                return False
            self._events(conn, [{"job_id": job_id, "from_status": None, "to_status": None,
                                 "why": f"on GPU {gpus}", "data": json.dumps({"gpus": gpus})}])
            return True

        if not self._write(run):
            raise self._refuse_logged(job_id, lease, "GPU assignment")

    def log_metrics(self, job_id: int, lease: int, points: Iterable[tuple[int, str, float]]) -> None:
        """Append learning-curve points (step, name, value) of a job the caller owns."""
        now = time.time()
        rows = [{"job_id": job_id, "step": s, "name": n, "value": v, "at": now} for s, n, v in points]

        def run(conn: Connection) -> bool:
            if conn.execute(sa.select(t_job.c.id).where(owned()), {"id": job_id, "lease": lease}).first() is None:
                return False
            if rows:
                conn.execute(sa.insert(t_metric), rows)
            return True

        if not self._write(run):
            raise self._refuse_logged(job_id, lease, "metrics")

    def finish(self, job_id: int, lease: int, outcome: str, *, results: dict[str, Any] | None = None,
               error: str | None = None, exit_code: int | None = None, why: str | None = None,
               relaunch: bool = True) -> Status:
        """Record how an owned run ended and move the graph on; returns the job's new status.

        ``outcome``: DONE, FAILED, CRASHED (killed by the world), INCOMPLETE (the job asked to be
        re-queued and resumed) or REQUEUE (its worker is stopping: put back without counting an attempt).
        """
        blob, outcome, error = self._result_blob(results, outcome, error)
        status = self._write(lambda conn: transitions.finish(conn, self._events, self.hot, job_id, lease, outcome,
                                                             blob, error, exit_code, why, relaunch, **self._ends))
        if status is None:
            raise self._refuse_logged(job_id, lease, "finish")
        return status

    def finish_and_claim(self, job_id: int, lease: int, outcome: str, worker: WorkerInfo,
                         workdir_root: str | None = None, *, results: dict[str, Any] | None = None,
                         error: str | None = None, exit_code: int | None = None,
                         why: str | None = None) -> tuple[Status, Claimed | None]:
        """``finish`` then ``claim``, in one transaction: a worker's loop commits once per job.

        The claim may take a dependent that this finish has just queued. Nothing is claimed
        if the finish is refused (LeaseLost, as from ``finish``).
        """
        blob, outcome, error = self._result_blob(results, outcome, error)

        def run(conn: Connection) -> tuple[Status | None, Found | None]:
            log: list[dict[str, Any]] = []  # both events in one statement
            status = transitions.finish(conn, self._events, self.hot, job_id, lease, outcome, blob, error, exit_code,
                                        why, True, log, **self._ends)
            claimed = self._claim(conn, worker, workdir_root, log) if status is not None else None
            self._events(conn, log)
            return status, claimed

        status, claimed = self._write(run)
        if status is None:
            raise self._refuse_logged(job_id, lease, "finish")
        return status, to_claimed(claimed, worker)

    @staticmethod
    def _result_blob(results: dict[str, Any] | None, outcome: str,
                     error: str | None) -> tuple[str | None, str, str | None]:
        """The results as stored JSON; results too large to keep make the run FAILED with why."""
        blob = dump_json(results, "job results") if results is not None else None
        if blob is not None and len(blob) > MAX_STATE_BYTES:
            blob, error, outcome = None, (f"the job's results are {len(blob)} bytes, over the {MAX_STATE_BYTES}-byte "
                                          "limit: keep large arrays in files in its workdir"), "FAILED"
        return blob, outcome, error

    def _search_after_finish(self, conn: Connection, job_id: int) -> None:
        """The one place where the end of a job moves a search on: promotions, in the finishing commit."""
        _halving.after_finish(conn, job_id, lambda c, ids, why: graph.refresh(c, self._events, ids, why=why),
                              params_hash, lambda: self.clock.now(conn))

    # -- the monitor's verbs ---------------------------------------------------------------
    def running(self) -> list[Job]:
        """Every RUNNING job of the experiment (the monitor's scan)."""
        def run(conn: Connection) -> list[Job]:
            exp = self._experiment(conn)
            rows = conn.execute(self._running_select(exp)).all()
            return [Job.from_row(r) for r in rows]
        return self._read(run)

    def crash(self, job_id: int, lease: int, reason: str, *, relaunch: bool = True) -> Status:
        """Declare a RUNNING job crashed (found dead); relaunch within max_attempts."""
        return self.finish(job_id, lease, "CRASHED", why=reason, relaunch=relaunch)

    def relaunch(self, job_ids: Sequence[int], why: str, *, include_failed: bool = False,
                 ignore_limit: bool = False, dry_run: bool = False) -> list[int]:
        """Put CRASHED (and, if asked, FAILED) jobs back in the queue within max_attempts, cascading."""
        def run(conn: Connection) -> list[int]:
            chosen = transitions.relaunchable(conn, self._experiment(conn), include_failed=include_failed,
                                              ids=job_ids, ignore_limit=ignore_limit)
            if not dry_run:
                transitions.reset(conn, self._events, chosen, cascade=True, why=why, fresh=False)
            return chosen

        return self._write(run)

    def server_time(self) -> float:
        """The database server's time now (seconds since the epoch): what heartbeats are stamped with."""
        return self._read(self.clock.now)

    def running_brief(self) -> list[RunningJob]:
        """Every RUNNING job of the experiment, only the columns a liveness check needs: one query."""
        cols = [t_job.c[name] for name in RUNNING_COLUMNS]

        def run(conn: Connection) -> list[RunningJob]:
            exp = self._experiment(conn)
            rows = conn.execute(self._running_select(exp, *cols).order_by(t_job.c.id)).all()
            return [RunningJob.from_row(r) for r in rows]
        return self._read(run)

    def crash_many(self, found: Sequence[tuple[int, int, str]], *, relaunch: bool = True,
                   max_attempts: int | None = None) -> dict[int, Status]:
        """Declare many RUNNING jobs crashed in one transaction: the monitor's batch of ``crash``.

        ``found`` holds (job id, lease, reason). A job no longer RUNNING at that lease (it finished or
        was taken meanwhile) is left alone and absent from the answer, which maps every job changed to
        its new status. Within ``max_attempts`` (each job's own when None) a crashed job is queued again
        keeping its checkpoint; past it, it stays CRASHED and its dependents are BLOCKED. A job whose
        stop was requested is CANCELED instead.
        """
        wanted: dict[int, dict[int, str]] = {}
        for job_id, lease, reason in found:
            wanted.setdefault(job_id, {})[lease] = reason
        return self._write(lambda conn: transitions.crash_found(
            conn, self._events, self._experiment(conn), wanted, relaunch=relaunch, max_attempts=max_attempts,
            now=self.clock.now(conn))) \
            if wanted else {}

    def relaunch_due(self, *, include_failed: bool = False, max_attempts: int | None = None,
                     why: str = "relaunched by the monitor", dry_run: bool = False) -> list[int]:
        """Relaunch every CRASHED (and, if asked, FAILED) job with attempts left, cascading; one transaction.

        ``max_attempts`` overrides each job's own limit. The jobs keep their workdir and checkpoint.
        """
        def due(conn: Connection) -> list[int]:
            return transitions.relaunchable(conn, self._experiment(conn), include_failed=include_failed,
                                            max_attempts=max_attempts)

        def run(conn: Connection) -> list[int]:
            ids = due(conn)
            if ids:
                transitions.reset(conn, self._events, ids, cascade=True, why=why, fresh=False)
            return ids

        # Every scan asks; a read first keeps the write lock for the scans that have something to do.
        ids = self._read(due)
        return ids if dry_run or not ids else self._write(run)

    def recent_events(self, *, to_status: Sequence[Status] = (), since: float | None = None,
                      limit: int = 20) -> list[Event]:
        """The experiment's latest status changes, newest first (the monitor's "recent crashes")."""
        def run(conn: Connection) -> list[Event]:
            exp = self._experiment(conn)
            q = (sa.select(t_event).join(t_job, t_job.c.id == t_event.c.job_id)
                 .where(t_job.c.experiment_id == exp).order_by(t_event.c.id.desc()).limit(limit))
            if to_status:
                q = q.where(t_event.c.to_status.in_([str(s) for s in to_status]))
            if since is not None:
                q = q.where(t_event.c.at >= since)
            return [Event(r.id, r.job_id, r.at, r.from_status, r.to_status, r.attempt, r.why, r.source,
                          json.loads(r.data) if r.data else None) for r in conn.execute(q)]
        return self._read(run)

    def changes_of(self, verb: Callable[[], T], *, dry_run: bool = False) -> tuple[T, list[dict[str, Any]]]:
        """Run ``verb`` (a call of this store's write verbs); return its answer and the status changes it made.

        Each change is a dict (job_id, from_status, to_status, why), as logged. With ``dry_run`` every
        transaction is rolled back: a preview that is exactly the real thing, minus the commit. Not for
        a store shared between threads while it runs.
        """
        with self._tx.recording(rehearse=dry_run) as recorder:
            result = verb()
        return result, recorder.changes

    # -- a user's repairs ----------------------------------------------------------------
    def reset(self, job_ids: Sequence[int], *, cascade: bool = True, why: str = "reset by hand",
              force_running: bool = False) -> list[int]:
        """Put jobs back to run again (fresh attempt budget); their dependents back to WAITING.

        Returns every job whose status changed. The results they had go into the event log.
        """
        def run(conn: Connection) -> list[int]:
            self._check_ids(conn, job_ids)
            for chunk in chunks(list(job_ids)) if not force_running else ():  # every chunk, not the first
                busy = conn.execute(sa.select(t_job.c.id).where(t_job.c.id.in_(chunk),
                                                                t_job.c.status == Status.RUNNING.value)).first()
                if busy is not None:
                    raise UsageError(f"job {busy.id} is RUNNING: cancel it with --running first, or reset with --force")
            return transitions.reset(conn, self._events, job_ids, cascade=cascade, why=why, fresh=True)

        return self._write(run)

    def cancel(self, job_ids: Sequence[int], *, running: bool = False, why: str = "cancelled by hand") -> list[int]:
        """Cancel jobs that have not finished; with ``running``, ask running ones to stop."""
        def run(conn: Connection) -> list[int]:
            self._check_ids(conn, job_ids)
            return transitions.cancel(conn, self._events, job_ids, running=running, why=why)

        return self._write(run)

    def set_status(self, job_ids: Sequence[int], status: Status, why: str = "status set by hand") -> list[int]:
        """Force a status (jobman's --set_status), keeping the graph consistent around it.

        RUNNING is refused: a job becomes RUNNING only when a worker claims it (a RUNNING job with
        no worker, pid or heartbeat would never end, and the monitor could not find it)."""
        transitions.check_settable(status)

        def run(conn: Connection) -> list[int]:
            self._check_ids(conn, job_ids)
            return transitions.set_status(conn, self._events, job_ids, status, why)

        return self._write(run)

    def set_priority(self, job_ids: Sequence[int], priority: float, why: str = "by hand") -> int:
        """Higher runs first among QUEUED jobs. Each change is in the event log (status unchanged)."""
        check_priority(priority)

        def run(conn: Connection) -> int:
            self._check_ids(conn, job_ids)
            events = []
            for chunk in chunks(list(job_ids)):
                events += [{"job_id": r.id, "from_status": r.status, "to_status": r.status, "attempt": r.attempt,
                            "why": f"priority set to {priority} {why}"}
                           for r in conn.execute(sa.update(t_job).where(t_job.c.id.in_(chunk))
                                                 .values(priority=priority)
                                                 .returning(t_job.c.id, t_job.c.status, t_job.c.attempt))]
            self._events(conn, events)
            return len(events)
        return self._write(run)

    def delete(self, job_ids: Sequence[int]) -> int:
        """Remove jobs with their events and metrics; their dependents lose that dependency."""
        def run(conn: Connection) -> int:
            self._check_ids(conn, job_ids)
            affected = set()
            n = 0
            for chunk in chunks(list(job_ids)):
                affected.update(conn.execute(sa.select(t_dep.c.job_id).where(t_dep.c.depends_on.in_(chunk))).scalars())
                for table, col in ((t_metric, t_metric.c.job_id), (t_event, t_event.c.job_id),
                                   (t_dep, t_dep.c.job_id), (t_dep, t_dep.c.depends_on)):
                    conn.execute(sa.delete(table).where(col.in_(chunk)))
                n += conn.execute(sa.delete(t_job).where(t_job.c.id.in_(chunk))).rowcount
            graph.refresh(conn, self._events, sorted(affected - set(job_ids)), why="a dependency was deleted")
            return n
        return self._write(run)

    def _check_ids(self, conn: Connection, job_ids: Sequence[int]) -> None:
        exp = self._experiment(conn)
        if not job_ids:
            raise UsageError("no job was selected")
        found: set[int] = set()
        for chunk in chunks(list(job_ids)):
            found.update(conn.execute(sa.select(t_job.c.id).where(t_job.c.experiment_id == exp,
                                                                  t_job.c.id.in_(chunk))).scalars())
        missing = sorted(set(job_ids) - found)
        if missing:
            raise NoSuchJob(f"no job {missing[0]} in experiment {self.experiment!r}")

    # -- reading ------------------------------------------------------------------------
    def _parent_ids(self, conn: Connection, job_id: int) -> list[int]:
        return sorted(conn.execute(sa.select(t_dep.c.depends_on).where(t_dep.c.job_id == job_id)).scalars())

    def jobs(self, *, status: Sequence[Status] = (), phase: int | None = None, ids: Sequence[int] = (),
             with_deps: bool = True, limit: int | None = None) -> list[Job]:
        """Jobs of the experiment, by id, optionally filtered."""
        def run(conn: Connection) -> list[Job]:
            exp = self._experiment(conn)
            q = sa.select(t_job).where(t_job.c.experiment_id == exp).order_by(t_job.c.id)
            if status:
                q = q.where(t_job.c.status.in_([s.value for s in status]))
            if phase is not None:
                q = q.where(t_job.c.phase == phase)
            if ids:
                q = q.where(t_job.c.id.in_(list(ids)))
            if limit:
                q = q.limit(limit)
            rows = conn.execute(q).all()
            deps: dict[int, list[int]] = {}
            if with_deps and rows:
                dq = sa.select(t_dep.c.job_id, t_dep.c.depends_on).join(t_job, t_job.c.id == t_dep.c.job_id) \
                    .where(t_job.c.experiment_id == exp).order_by(t_dep.c.depends_on)
                for child, parent in conn.execute(dq).all():
                    deps.setdefault(child, []).append(parent)
            return [Job.from_row(r, deps.get(r.id, [])) for r in rows]
        return self._read(run)

    def job(self, job_id: int) -> Job:
        """One job, with the ids it depends on."""
        def run(conn: Connection) -> Job:
            exp = self._experiment(conn)
            row = conn.execute(sa.select(t_job).where(t_job.c.id == job_id, t_job.c.experiment_id == exp)).first()
            if row is None:
                raise NoSuchJob(f"no job {job_id} in experiment {self.experiment!r}")
            return Job.from_row(row, self._parent_ids(conn, job_id))
        return self._read(run)

    def prune_verdict(self, job_id: int, step: int, metrics: dict[str, float]) -> str | None:
        """Why a running job should stop (its search prunes, and it is worse than the median), or None."""
        return self._read(lambda conn: _halving.prune_verdict(conn, job_id, step, metrics))

    def continues_from(self, job_id: int) -> str | None:
        """The workdir a promoted job of a search starts from (its parent's), or None."""
        return self._read(lambda conn: _halving.continues_from(conn, job_id))

    def search_summaries(self) -> list[str]:
        """One line per search of this experiment: the configurations reaching each rung, the pruned jobs."""
        return self._read(lambda conn: _halving.summaries(conn, self._experiment(conn)))

    def rungs(self) -> dict[int, tuple[int, int, str]]:
        """Each job of this experiment's searches: (its rung, the number of rungs, the resource)."""
        return self._read(lambda conn: _halving.rungs_of(conn, self._experiment(conn)))

    def children(self, job_id: int) -> list[int]:
        return self._read(lambda c: sorted(graph.children(c, job_id)))

    def parents(self, job_id: int) -> list[Job]:
        """The jobs ``job_id`` depends on, whole (a job reads its parents' workdirs and results)."""
        def run(conn: Connection) -> list[Job]:
            rows = conn.execute(sa.select(t_job).join(t_dep, t_dep.c.depends_on == t_job.c.id)
                                .where(t_dep.c.job_id == job_id).order_by(t_job.c.id)).all()
            return [Job.from_row(r) for r in rows]
        return self._read(run)

    def events(self, job_id: int) -> list[Event]:
        def run(conn: Connection) -> list[Event]:
            rows = conn.execute(sa.select(t_event).where(t_event.c.job_id == job_id).order_by(t_event.c.id)).all()
            return [Event(r.id, r.job_id, r.at, r.from_status, r.to_status, r.attempt, r.why, r.source,
                          json.loads(r.data) if r.data else None) for r in rows]
        return self._read(run)

    def metrics(self, job_ids: Sequence[int]) -> list[tuple[int, int, str, float]]:
        """(job_id, step, name, value) of the given jobs, in step order."""
        def run(conn: Connection) -> list[tuple[int, int, str, float]]:
            out = []
            for chunk in chunks(list(job_ids)):
                out.extend(conn.execute(sa.select(t_metric.c.job_id, t_metric.c.step, t_metric.c.name,
                                                  t_metric.c.value).where(t_metric.c.job_id.in_(chunk))
                                        .order_by(t_metric.c.job_id, t_metric.c.name, t_metric.c.step)).all())
            return out
        return self._read(run)

    def report_rows(self, phase: int | None = None) -> list[tuple[int, int, str, str, str, str | None]]:
        """(id, phase, status, target, params JSON, results JSON) of every job, in one query: what a report reads."""
        def run(conn: Connection) -> list[tuple[int, int, str, str, str, str | None]]:
            exp = self._experiment(conn)
            q = sa.select(t_job.c.id, t_job.c.phase, t_job.c.status, t_job.c.target, t_job.c.params,
                          t_job.c.results).where(t_job.c.experiment_id == exp).order_by(t_job.c.id)
            if phase is not None:
                q = q.where(t_job.c.phase == phase)
            return [tuple(r) for r in conn.execute(q)]
        return self._read(run)

    def counts(self) -> dict[tuple[int, str], int]:
        """Number of jobs per (phase, status)."""
        def run(conn: Connection) -> dict[tuple[int, str], int]:
            exp = self._experiment(conn)
            q = sa.select(t_job.c.phase, t_job.c.status, sa.func.count()).where(t_job.c.experiment_id == exp) \
                .group_by(t_job.c.phase, t_job.c.status)
            return {(p, s): n for p, s, n in conn.execute(q).all()}
        return self._read(run)

    def outstanding(self) -> dict[str, int]:
        """How many jobs are QUEUED, RUNNING and WAITING: whether a worker should wait for more."""
        def run(conn: Connection) -> dict[str, int]:
            exp = self._experiment(conn)
            wanted = names_of(OUTSTANDING)
            q = sa.select(t_job.c.status, sa.func.count()).where(
                t_job.c.experiment_id == exp, t_job.c.status.in_(wanted)).group_by(t_job.c.status)
            found = dict(conn.execute(q).all())
            return {s: found.get(s, 0) for s in wanted}
        return self._read(run)

    def select_ids(self, *, status: Sequence[Status] = (), phase: int | None = None,
                   params: dict[str, Any] | None = None, target: str | None = None) -> list[int]:
        """Ids of jobs matching a selector (``--after``, ``retry --failed --phase 1`` and the like)."""
        jobs = self.jobs(status=status, phase=phase, with_deps=False)
        spelled = canonical_target(target) if target is not None else None
        out = []
        for j in jobs:
            if target is not None and j.target != target and (j.kind != "fn" or canonical_target(j.target) != spelled):
                continue
            if params and any(j.params.get(k, _MISSING) != v for k, v in params.items()):
                continue
            out.append(j.id)
        return out

    # -- calls from Python: jobs found by identity, functions stored by value ------------------
    def find(self, hashes: Sequence[str]) -> dict[str, Job]:
        """The jobs of the experiment whose identity (``params_hash``) is one of ``hashes``.

        What a call from Python looks up first: a DONE call is answered without a write.
        """
        def run(conn: Connection) -> dict[str, Job]:
            try:
                exp = self._experiment(conn)
            except NoSuchExperiment:
                return {}
            out: dict[str, Job] = {}
            if len(hashes) == 1:  # one call, the common case: compiled once, as the hot statements are
                names = t_job.c.keys()
                return {r[names.index("params_hash")]: Job.from_mapping(dict(zip(names, r)))
                        for r in self.hot.by_hash.rows(conn, exp=exp, h=hashes[0])}
            for chunk in chunks(list(hashes)):
                rows = conn.execute(sa.select(t_job).where(t_job.c.experiment_id == exp,
                                                           t_job.c.params_hash.in_(chunk))).all()
                out.update((r.params_hash, Job.from_row(r)) for r in rows)
            return out
        return self._read(run)

    def put_function(self, target: str, code: bytes) -> None:
        """Store the code of a function run by value under its target name (the newest wins)."""
        digest = hashlib.sha256(code).hexdigest()

        def run(conn: Connection) -> None:
            exp = self._experiment(conn, create=True)
            key = (t_code.c.experiment_id == exp) & (t_code.c.target == target)
            old = conn.execute(sa.select(t_code.c.digest).where(key)).scalar()
            if old is None:
                conn.execute(sa.insert(t_code).values(experiment_id=exp, target=target, digest=digest, code=code,
                                                      stored_at=time.time()))
            elif old != digest:
                conn.execute(sa.update(t_code).where(key).values(digest=digest, code=code, stored_at=time.time()))

        self._write(run)

    def function_code(self, target: str) -> bytes | None:
        """The stored code of a function run by value, or None."""
        def run(conn: Connection) -> bytes | None:
            exp = self._experiment(conn)
            code = conn.execute(sa.select(t_code.c.code).where(t_code.c.experiment_id == exp,
                                                                  t_code.c.target == target)).scalar()
            return bytes(code) if code is not None else None
        return self._read(run)


_MISSING = object()


def _claim_args(worker: WorkerInfo, workdir_root: str | None, now: float) -> dict[str, Any]:
    """The values a claim binds (``hot.claim_values``): the claiming worker, the time, the workdir root."""
    return dict(host=worker.host, pid=worker.pid, pid_started_at=worker.pid_started_at, backend=worker.backend,
                backend_id=worker.backend_id, log_path=worker.log_path, now=now,
                root=workdir_root.rstrip("/") + "/" if workdir_root is not None else None)


def _canonical_targets(specs: Sequence[JobSpec]) -> Sequence[JobSpec]:
    """The specs with every function target in its one spelling (``pkg.mod:fn``)."""
    if all(s.kind != "fn" or ":" in s.target for s in specs):
        return specs
    return [s._replace(target=canonical_target(s.target)) if s.kind == "fn" else s for s in specs]


def _older_spellings(conn: Connection, exp: int, specs: Sequence[JobSpec], encoded: Sequence[str],
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


def _first_occurrences(hashes: list[str], existing: dict[str, int]) -> list[int]:
    seen: set[str] = set(existing)
    out = []
    for i, h in enumerate(hashes):
        if h not in seen:
            seen.add(h)
            out.append(i)
    return out


__all__ = ["Store", "Job", "Event", "Claimed", "RunningJob", "WorkerInfo", "ScheduleResult", "DatabaseError",
           "params_hash", "source_tag", "MAX_STATE_BYTES"]

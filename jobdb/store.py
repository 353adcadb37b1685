"""The store: every SQL statement jobman runs, behind domain verbs.

``schedule``, ``claim``, ``heartbeat``, ``save``, ``log_metrics``, ``finish``,
``crash``, ``reset``, ``cancel``, ... Each verb is one transaction. Every status
change writes a ``job_event`` row in the same transaction. ``heartbeat``,
``save`` and ``finish`` take the caller's lease (a fencing token bumped on every
claim) and refuse a caller that no longer owns the job.

This class is the facade: each verb opens its transaction and hands it to the room
that does the work (see docs/store.md): ``scheduling`` (a sweep's jobs, by identity),
``transitions`` (every status move and its rules), ``graph`` (what depends on what),
``browse`` (the reads), ``hot`` (the worker's statements), ``txn`` (the plumbing).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from . import browse, coderecord, connections, graph, scheduling, transitions
from . import engine as _engine
from . import halving as _halving
from . import learn as _learn
from .artifacts import digests_in_text
from .canonical import dump_json
from .clock import ServerClock
from .connections import ConnectionUse
from .errors import DatabaseError, LeaseLost, NoSuchExperiment, NoSuchJob
from .hot import HotStatements
from .priority import check_priority, check_ranks
from .records import (
    CLAIMED_COLUMNS,
    Claimed,
    Event,
    Found,
    Job,
    RunningJob,
    SchedulePreview,
    ScheduleResult,
    WorkerInfo,
    to_claimed,
)
from .scheduling import params_hash
from .status import Status
from .sweep import JobSpec, canonical_target
from .transitions import MAX_STATE_BYTES
from .txn import Transactions, source_tag
from .url import DbTarget, parse_db

T = TypeVar("T")


class Store:
    """One experiment of one database, spoken to in domain verbs."""

    def __init__(
        self,
        target: DbTarget,
        engine: Engine | None = None,
        *,
        check_schema: bool = True,
        create: bool = True,
        worker: bool = False,
    ) -> None:
        self.target = target
        path = target.sqlite_path
        if not create and path and path != ":memory:" and not os.path.exists(path):
            raise DatabaseError(f"there is no jobman database at {path}: schedule a sweep first")
        self.engine = engine or _engine.make_engine(target, worker=worker)
        self.hot = HotStatements(self.engine.dialect, CLAIMED_COLUMNS)
        self.clock = ServerClock(self.engine.dialect.name)  # claims, heartbeats, finishes: the server's time
        # A worker on PostgreSQL holds one connection at most, and none while a job runs on (keep_connection).
        self._tx = self.transactions = Transactions(
            target, self.engine, self.hot, one_connection=worker and self.engine.dialect.name == "postgresql"
        )
        self.keep_connection = self._tx.keep_connection
        # The plumbing every verb goes through (jobdb/txn.py).
        self._write, self._read, self._events = self._tx.write, self._tx.read, self._tx.log
        self._exp = self._tx.experiment  # the experiment's id, read once
        # What the end of a run needs beyond its transaction: the server's time, and the searches it moves on.
        self._ends: dict[str, Any] = dict(
            clock=self.clock.now, after_end=scheduling.search_moves_on(self._events, self.clock.now)
        )
        if check_schema:
            with _engine.translated_errors(target):
                _engine.ensure_schema(self.engine, create=create)

    @classmethod
    def open(cls, url: str | None = None, table: str | None = None, **kwargs: Any) -> Store:
        """Open ``url`` (or ``JOBMAN_DB``, or ./jobman.db) for experiment ``table``."""
        return cls(parse_db(url, table), **kwargs)

    @property
    def experiment(self) -> str:
        return self.target.experiment

    def dispose(self) -> None:
        self._tx.drop_writer()
        self.engine.dispose()

    def experiments(self) -> list[str]:
        """Every experiment in the database."""
        return self._read(browse.experiments)

    # -- schedule -------------------------------------------------------------------
    def schedule(
        self,
        specs: Iterable[JobSpec],
        *,
        after: Sequence[int] = (),
        priority: float = 0,
        max_attempts: int = 3,
        ranks: int = 1,
        progress: Callable[[int], None] | None = None,
        halving: _halving.Halving | None = None,
        duplicate: bool = False,
        repeat: int = 1,
        keep_ids: bool = True,
        where: dict[str, str] | None = None,
    ) -> ScheduleResult:
        """Insert a sweep's jobs and their dependencies in one transaction; skip jobs already present.

        Roots (phase 0) depend on ``after`` (fan-in); other jobs on their parent. With ``halving``,
        the jobs are the first rung of a successive-halving search, recorded in the same transaction.
        With ``duplicate`` (jobman's ``force_dup``) every job is added, as a new identity, even if present.
        ``repeat`` N adds N - 1 copies of each job (new identities, each phase's copies depending on
        their own copy of the phase before) when none of the sweep's jobs was there yet, or with
        ``duplicate``; the copies join the search as runs of the same configurations.

        ``specs`` is read as a stream, ten thousand jobs at a time, each chunk checked against the
        experiment's identity index and inserted before the next is made: memory stays flat however
        large the sweep (a :class:`~.sweep.Expansion` is made as it is read). Without ``keep_ids`` the
        result lists no ids, and nothing grows with the sweep but 8 bytes per job of a sweep with phases.
        ``where`` (target: directory) records on the new jobs where their target was found, so that a
        worker started from another directory finds it there.
        """
        check_priority(priority)
        check_ranks(ranks)
        sweep = scheduling.ReadySweep(specs, duplicate, repeat)
        options = dict(
            after=after, priority=priority, max_attempts=max_attempts, ranks=ranks, progress=progress, halving=halving
        )
        return self._write(lambda conn: self._schedule_in(conn, sweep, keep_ids=keep_ids, where=where, **options))

    def schedule_calls(
        self, specs: Sequence[JobSpec], needs: Sequence[Sequence[int]], *, max_attempts: int = 3, ranks: int = 1
    ) -> dict[str, int]:
        """Insert calls from Python in one transaction, ``specs[i]`` depending on the jobs ``needs[i]``
        (the calls it takes); the job id of each identity. See :func:`.scheduling.schedule_calls`."""
        check_ranks(ranks)

        def run(conn: Connection) -> dict[str, int]:
            exp = self._exp(conn, create=True)
            scheduling.lock_experiment(conn, exp)
            wanted = sorted({i for need in needs for i in need})
            scheduling.lock_parents(conn, wanted)
            found = browse.identities(conn, exp, wanted)
            gone = [i for i in wanted if i not in found]
            if gone:
                raise NoSuchJob(
                    f"a parameter refers to the call of job {gone[0]}, which is no longer in experiment "
                    f"{self.experiment!r}"
                )
            return scheduling.schedule_calls(
                conn,
                self._events,
                self.hot,
                exp,
                self.experiment,
                specs,
                needs,
                max_attempts=max_attempts,
                ranks=ranks,
            )

        return self._write(run)

    def rederive(self, job_ids: Sequence[int]) -> None:
        """Re-derive WAITING/QUEUED/BLOCKED of the not-started ``job_ids`` from their parents: whoever
        waits on a call that takes calls does so now and then, a safety net under the parents' rows held
        while it was scheduled (:func:`.scheduling.lock_parents`)."""
        if job_ids:
            self._write(lambda conn: graph.refresh(conn, self._events, list(job_ids), why="its dependencies ended"))

    def identities(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The identity (``params_hash``) of each of ``job_ids`` still in the experiment, by id."""

        def run(conn: Connection) -> dict[int, str]:
            try:
                exp = self._exp(conn)
            except NoSuchExperiment:
                return {}
            return browse.identities(conn, exp, job_ids)

        return self._read(run)

    def preview_schedule(
        self,
        specs: Iterable[JobSpec],
        *,
        first: int = 10,
        after: Sequence[int] = (),
        priority: float = 0,
        max_attempts: int = 3,
        ranks: int = 1,
        halving: _halving.Halving | None = None,
        duplicate: bool = False,
        repeat: int = 1,
    ) -> SchedulePreview:
        """What :meth:`schedule` would do, found by doing it in a transaction that is rolled back: how many
        jobs it would add, how many are there already, how many the sweep names twice, and the first
        ``first`` jobs it would add. Nothing is written, not even a new experiment."""
        check_priority(priority)
        check_ranks(ranks)
        sweep = scheduling.ReadySweep(specs, duplicate, repeat)
        options = dict(
            after=after, priority=priority, max_attempts=max_attempts, ranks=ranks, progress=None, halving=halving
        )

        def run(conn: Connection) -> SchedulePreview:
            before = scheduling.newest_id(conn)
            result = self._schedule_in(conn, sweep, keep_ids=True, **options)
            new = [i for i in result.job_ids if i > before][:first]
            made = sweep.size * (repeat if result.repeated else 1)
            jobs = [browse.job(conn, self._exp(conn), self.experiment, i) for i in new]
            return SchedulePreview(result.added, result.existing, made - len(result.job_ids), jobs)

        with self._tx.recording(rehearse=True):
            return self._write(run)

    def _schedule_in(self, conn: Connection, sweep: scheduling.ReadySweep, **options: Any) -> ScheduleResult:
        return scheduling.schedule(
            conn, self._events, self.hot, self._exp(conn, create=True), self.experiment, sweep, **options
        )

    def ran_before(self, targets: Sequence[str]) -> bool:
        """Whether a DONE job of one of these targets has its code recorded (none in a new experiment)."""
        canonical = [canonical_target(t) for t in targets]

        def read(conn: Connection) -> bool:
            try:
                exp = self._exp(conn)
            except NoSuchExperiment:  # a sweep's first schedule
                return False
            return coderecord.ran_before(conn, exp, canonical)

        return bool(canonical) and self._read(read)

    def versions_run(self, ids: Sequence[int]) -> dict[int, tuple[Any, ...]]:
        """The version of the code each job ran, (source, commit, diff), for jobs recorded with it."""
        return self._read(lambda conn: coderecord.versions_run(conn, ids))

    def ran_other_source(self, ids: Sequence[int], source: str) -> list[int]:
        """Of the jobs ``ids``, the DONE ones recorded running another source of their target."""
        return self._read(lambda conn: coderecord.ran_other_source(conn, ids, source))

    def start_search(self, rules: _halving.Halving, plan: _learn.Plan) -> tuple[int, list[int], int]:
        """Record a learning search (:class:`.learn.Plan`) or grow the one the same command made, and
        propose its first configurations, in one transaction; (search id, new job ids, configurations
        it held before)."""
        check_priority(plan.priority)
        return self._write(
            lambda conn: scheduling.start_learning(
                conn, self._exp(conn, create=True), rules, plan, self.clock.now(conn)
            )
        )

    def ask(self, search_id: int, worker: WorkerInfo) -> Claimed | None:
        """The next point of an ask/tell search, claimed by ``worker`` (its lease proves it when the
        result is told through :meth:`finish`); None when the search's budget is spent."""
        return self._write(
            lambda conn: scheduling.ask_learning(
                conn, self._events, self._exp(conn), search_id, worker, self.clock.now(conn)
            )
        )

    def search_members(self, search_id: int) -> tuple[int, list[tuple[int, str]]]:
        """A learning search's budget in jobs, and its jobs so far as (id, status)."""
        return self._read(lambda conn: _learn.members(conn, search_id))

    # -- a worker's verbs ------------------------------------------------------------------
    def claim(
        self, worker: WorkerInfo, workdir_root: str | None = None, *, skip: frozenset[str] = frozenset()
    ) -> Claimed | None:
        """Atomically take the first QUEUED job (by priority, then order, then id), or None; with
        ``skip``, of none of those targets (ones that cannot be imported where the worker runs)."""
        return to_claimed(
            self._write(
                lambda conn: transitions.claim(
                    conn,
                    self._events,
                    self.hot,
                    self._exp(conn),
                    worker,
                    workdir_root,
                    self.clock.now(conn),
                    skip=skip,
                )
            ),
            worker,
        )

    def claim_query(self, skip: frozenset[str] = frozenset()) -> sa.Select:
        """The select ``claim`` picks its job with, for this experiment (to EXPLAIN: it must use ix_job_claim)."""
        return self._read(lambda conn: self.hot.claim_pick_skipping(skip).params(exp=self._exp(conn)))

    def running_query(self) -> sa.Select:
        """The select of the monitor's scan of RUNNING jobs, for this experiment (to EXPLAIN)."""
        return self._read(lambda conn: browse.running_select(self._exp(conn)))

    # -- one allocation per job (Slurm's one-job-per-task) ----------------------------------
    # A QUEUED job assigned to an allocation carries its backend id and no pid until that
    # allocation claims it: ``Job.awaiting_allocation``. Pull workers' ``claim`` ignores this.
    def assign(self, job_id: int, backend: str, backend_id: str, log_path: str | None = None) -> bool:
        """Record that allocation ``backend_id`` was made to run this QUEUED job; False if the job is
        not QUEUED any more or another allocation already waits for it (then cancel ``backend_id``)."""
        return self._write(
            lambda conn: transitions.assign(conn, self._events, self._exp(conn), job_id, backend, backend_id, log_path)
        )

    def claim_job(
        self, job_id: int, worker: WorkerInfo, workdir_root: str | None = None, *, assigned_to: str | None = None
    ) -> Claimed | None:
        """Atomically take one given QUEUED job, or None; with ``assigned_to``, only if that backend id
        is the job's (the allocation it was assigned to, or the one that last ran it)."""
        return self._write(
            lambda conn: transitions.claim_job(
                conn, self._events, self._exp(conn), job_id, worker, workdir_root, self.clock.now(conn), assigned_to
            )
        )

    def release(self, job_id: int, backend_id: str, reason: str) -> Status | None:
        """Allocation ``backend_id`` ended without claiming its job: that counts as an attempt; the job
        stays QUEUED for another allocation, or is CRASHED once max_attempts are spent. None if the
        job no longer waits for that allocation."""
        return self._write(
            lambda conn: transitions.release(conn, self._events, self._exp(conn), job_id, backend_id, reason)
        )

    def _refused(self, job_id: int, lease: int, what: str) -> LeaseLost:
        """A refused write from a caller that lost the job, logged: the error to raise."""
        return self._write(lambda conn: transitions.refuse_logged(conn, self._events, job_id, lease, what))

    def heartbeat(self, job_id: int, lease: int) -> bool:
        """Prove the job alive; returns True when a stop was requested (cancel --running)."""

        def run(conn: Connection) -> bool | None:
            rows = self.hot.heartbeat.rows(conn, id=job_id, lease=lease, now=self.clock.now(conn))
            return bool(rows[0][0]) if rows else None

        answer = self._write(run)
        if answer is None:
            raise self._refused(job_id, lease, "heartbeat")
        return answer

    def save(self, job_id: int, lease: int, results: dict[str, Any]) -> None:
        """Checkpoint a running job's results so a relaunch resumes from them."""
        blob = transitions.checkpoint_blob(job_id, results)
        ok = self._write(lambda c: self.hot.save.rows(c, id=job_id, lease=lease, results=blob, now=self.clock.now(c)))
        if not ok:
            raise self._refused(job_id, lease, "checkpoint")

    def set_gpus(self, job_id: int, lease: int, gpus: str) -> None:
        """Record the devices a running job was given (``CUDA_VISIBLE_DEVICES``), on the job and in its log."""
        if not self._write(lambda conn: transitions.set_gpus(conn, self._events, job_id, lease, gpus)):
            raise self._refused(job_id, lease, "GPU assignment")

    def log_metrics(self, job_id: int, lease: int, points: Iterable[tuple[int, str, float]]) -> None:
        """Append learning-curve points (step, name, value) of a job the caller owns."""
        now = time.time()
        rows = [{"job_id": job_id, "step": s, "name": n, "value": v, "at": now} for s, n, v in points]
        if not self._write(lambda conn: transitions.log_metrics(conn, job_id, lease, rows)):
            raise self._refused(job_id, lease, "metrics")

    def finish(
        self,
        job_id: int,
        lease: int,
        outcome: str,
        *,
        results: dict[str, Any] | None = None,
        error: str | None = None,
        exit_code: int | None = None,
        why: str | None = None,
        relaunch: bool = True,
        code: dict[str, Any] | str | None = None,
        texts: dict[str, tuple[str, str]] | None = None,
    ) -> Status:
        """Record how an owned run ended and move the graph on; returns the job's new status.

        ``outcome``: DONE, FAILED, CRASHED (killed by the world), INCOMPLETE (the job asked to be
        re-queued and resumed) or REQUEUE (its worker is stopping: put back without counting an attempt).
        ``code``: what the run ran (its code and environment record, or its JSON), kept on the job;
        ``texts``: the texts that record names (``{digest: (kind, body)}``), kept in the same transaction.
        """
        end = self._end(job_id, lease, outcome, results, error, exit_code, why, relaunch, code, texts)
        status = self._write(end)
        if status is None:
            raise self._refused(job_id, lease, "finish")
        return status

    def finish_and_claim(
        self,
        job_id: int,
        lease: int,
        outcome: str,
        worker: WorkerInfo,
        workdir_root: str | None = None,
        *,
        results: dict[str, Any] | None = None,
        error: str | None = None,
        exit_code: int | None = None,
        why: str | None = None,
        code: dict[str, Any] | str | None = None,
        texts: dict[str, tuple[str, str]] | None = None,
        skip: frozenset[str] = frozenset(),
    ) -> tuple[Status, Claimed | None]:
        """``finish`` then ``claim``, in one transaction: a worker's loop commits once per job.

        The claim may take a dependent that this finish has just queued. Nothing is claimed
        if the finish is refused (LeaseLost, as from ``finish``).
        """
        end = self._end(job_id, lease, outcome, results, error, exit_code, why, True, code, texts)

        def run(conn: Connection) -> tuple[Status | None, Found | None]:
            log: list[dict[str, Any]] = []  # both events in one statement
            status = end(conn, log)
            claimed = (
                transitions.claim(
                    conn,
                    self._events,
                    self.hot,
                    self._exp(conn),
                    worker,
                    workdir_root,
                    self.clock.now(conn),
                    log,
                    skip,
                )
                if status is not None
                else None
            )
            self._events(conn, log)
            return status, claimed

        status, claimed = self._write(run)
        if status is None:
            raise self._refused(job_id, lease, "finish")
        return status, to_claimed(claimed, worker)

    # -- the monitor's verbs ---------------------------------------------------------------
    def running(self) -> list[Job]:
        """Every RUNNING job of the experiment (the monitor's scan)."""
        return self._read(lambda conn: browse.running(conn, self._exp(conn)))

    def crash(self, job_id: int, lease: int, reason: str, *, relaunch: bool = True) -> Status:
        """Declare a RUNNING job crashed (found dead); relaunch within max_attempts."""
        return self.finish(job_id, lease, "CRASHED", why=reason, relaunch=relaunch)

    def retry(self, job_ids: Sequence[int], why: str = "retried by hand", *, fresh: bool = False) -> list[int]:
        """Queue the FAILED and CRASHED jobs of ``job_ids`` again, their dependents back to WAITING: resuming
        from their checkpoint whatever their attempt limit, or started over (``fresh``). Returns those retried."""
        return self._write(
            lambda conn: transitions.retry(conn, self._events, self._exp(conn), job_ids, why=why, fresh=fresh)
        )

    def server_time(self) -> float:
        """The database server's time now (seconds since the epoch): what heartbeats are stamped with."""
        return self._read(self.clock.now)

    def running_brief(self) -> list[RunningJob]:
        """Every RUNNING job of the experiment, only the columns a liveness check needs: one query."""
        return self._read(lambda conn: browse.running_brief(conn, self._exp(conn)))

    def crash_many(
        self, found: Sequence[tuple[int, int, str]], *, relaunch: bool = True, max_attempts: int | None = None
    ) -> dict[int, Status]:
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
        return (
            self._write(
                lambda conn: transitions.crash_found(
                    conn,
                    self._events,
                    self._exp(conn),
                    wanted,
                    relaunch=relaunch,
                    max_attempts=max_attempts,
                    now=self.clock.now(conn),
                    after_end=self._ends["after_end"],
                )
            )
            if wanted
            else {}
        )

    def relaunch_due(
        self,
        *,
        include_failed: bool = False,
        max_attempts: int | None = None,
        why: str = "relaunched by the monitor",
        dry_run: bool = False,
    ) -> list[int]:
        """Relaunch every CRASHED (and, if asked, FAILED) job with attempts left, cascading; one transaction.

        ``max_attempts`` overrides each job's own limit. The jobs keep their workdir and checkpoint.
        """

        def due(conn: Connection) -> list[int]:
            return transitions.relaunchable(
                conn, self._exp(conn), include_failed=include_failed, max_attempts=max_attempts
            )

        def run(conn: Connection) -> list[int]:
            ids = due(conn)
            if ids:
                transitions.reset(conn, self._events, ids, cascade=True, why=why, fresh=False)
            return ids

        # Every scan asks; a read first keeps the write lock for the scans that have something to do.
        ids = self._read(due)
        return ids if dry_run or not ids else self._write(run)

    def recent_events(
        self, *, to_status: Sequence[Status] = (), since: float | None = None, limit: int = 20
    ) -> list[Event]:
        """The experiment's latest status changes, newest first (the monitor's "recent crashes")."""
        return self._read(
            lambda conn: browse.recent_events(conn, self._exp(conn), to_status=to_status, since=since, limit=limit)
        )

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
    def _checked(self, job_ids: Sequence[int], move: Callable[[Connection], T]) -> T:
        """Run ``move`` in one write transaction once every id is known to be one of this experiment's."""

        def run(conn: Connection) -> T:
            transitions.check_ids(conn, self._exp(conn), self.experiment, job_ids)
            return move(conn)

        return self._write(run)

    def reset(
        self, job_ids: Sequence[int], *, cascade: bool = True, why: str = "reset by hand", force_running: bool = False
    ) -> list[int]:
        """Put jobs back to run again (fresh attempt budget); their dependents back to WAITING.

        Returns every job whose status changed. The results they had go into the event log.
        """

        def move(conn: Connection) -> list[int]:
            if not force_running:
                transitions.check_not_running(conn, job_ids)
            return transitions.reset(conn, self._events, job_ids, cascade=cascade, why=why, fresh=True)

        return self._checked(job_ids, move)

    def cancel(self, job_ids: Sequence[int], *, running: bool = False, why: str = "cancelled by hand") -> list[int]:
        """Cancel jobs that have not finished; with ``running``, ask running ones to stop."""
        return self._checked(
            job_ids, lambda conn: transitions.cancel(conn, self._events, job_ids, running=running, why=why)
        )

    def set_status(self, job_ids: Sequence[int], status: Status, why: str = "status set by hand") -> list[int]:
        """Force a status (jobman's --set_status), keeping the graph consistent around it.

        RUNNING is refused: a job becomes RUNNING only when a worker claims it (a RUNNING job with
        no worker, pid or heartbeat would never end, and the monitor could not find it)."""
        transitions.check_settable(status)
        return self._checked(job_ids, lambda conn: transitions.set_status(conn, self._events, job_ids, status, why))

    def set_priority(self, job_ids: Sequence[int], priority: float, why: str = "by hand") -> int:
        """Higher runs first among QUEUED jobs. Each change is in the event log (status unchanged)."""
        check_priority(priority)
        return self._checked(job_ids, lambda conn: transitions.set_priority(conn, self._events, job_ids, priority, why))

    def delete(self, job_ids: Sequence[int]) -> int:
        """Remove jobs with their events and metrics; their dependents lose that dependency."""
        return self._checked(job_ids, lambda conn: transitions.delete(conn, self._events, job_ids))

    # -- reading ------------------------------------------------------------------------
    def jobs(
        self,
        *,
        status: Sequence[Status] = (),
        phase: int | None = None,
        ids: Sequence[int] = (),
        with_deps: bool = True,
        limit: int | None = None,
        params: dict[str, Any] | None = None,
    ) -> list[Job]:
        """Jobs of the experiment, by id, optionally filtered (``params``: these parameters have these values);
        a page (``limit``) is read from an index."""
        return self._read(
            lambda conn: browse.jobs(
                conn,
                self._exp(conn),
                status=status,
                phase=phase,
                ids=ids,
                with_deps=with_deps,
                limit=limit,
                params=params,
            )
        )

    def job(self, job_id: int) -> Job:
        """One job, with the ids it depends on."""
        return self._read(lambda conn: browse.job(conn, self._exp(conn), self.experiment, job_id))

    def prune_verdict(self, job_id: int, step: int, metrics: dict[str, float]) -> str | None:
        """Why a running job should stop (its search prunes, and it is worse than the median), or None."""
        return self._read(lambda conn: _halving.prune_verdict(conn, job_id, step, metrics))

    def continues_from(self, job_id: int) -> str | None:
        """The workdir a promoted job of a search starts from (its parent's), or None."""
        return self._read(lambda conn: _halving.continues_from(conn, job_id))

    def continuation(self, job_id: int) -> tuple[str | None, dict[str, Any]] | None:
        """The workdir and the saved state a promoted job of a search starts from (its parent's, under
        the job's own parameters), or None."""
        return self._read(lambda conn: _halving.continuation(conn, job_id))

    def search_fronts(self, every: bool = False) -> list[_learn.Front]:
        """The Pareto front of each multi-objective (or constrained) learning search of this experiment;
        with ``every``, of each learning search (with one metric, its best)."""
        return self._read(lambda conn: _learn.fronts(conn, self._exp(conn), every))

    def search_objectives(self) -> list[tuple[str, str]]:
        """The metrics and directions of this experiment's latest learning search (none: empty)."""
        return self._read(lambda conn: _learn.objectives_of(conn, self._exp(conn)))

    def search_summaries(self) -> list[str]:
        """One line per search of this experiment: the configurations reaching each rung, the pruned jobs."""
        return self._read(
            lambda conn: _halving.summaries(conn, self._exp(conn)) + _learn.summaries(conn, self._exp(conn))
        )

    def search_space(self) -> dict[str, _halving.Distribution]:
        """The parameters this experiment's sweeps drew, and the distribution of each (for plots)."""
        return self._read(lambda conn: _halving.space_of(conn, self._exp(conn)))

    def search_rungs(self) -> list[_halving.Rungs]:
        """This experiment's successive-halving searches: each configuration's mean metric at each rung."""
        return self._read(lambda conn: _halving.rungs_detail(conn, self._exp(conn)))

    def rungs(self, job_ids: Sequence[int] | None = None) -> dict[int, tuple[int, int, str]]:
        """Each job of this experiment's searches (or of ``job_ids`` only): (its rung, the number of rungs,
        the resource)."""
        return self._read(lambda conn: _halving.rungs_of(conn, self._exp(conn), job_ids))

    def children(self, job_id: int) -> list[int]:
        return self._read(lambda c: graph.dependents(c, [job_id]))

    def parents(self, job_id: int) -> list[Job]:
        """The jobs ``job_id`` depends on, whole (a job reads its parents' workdirs and results)."""
        return self._read(lambda conn: browse.parents(conn, job_id))

    def artifact_references(self, job_ids: Sequence[int] | None = None) -> tuple[set[str], float | None]:
        """The digests of the artifacts referred to (by every job of the database, in results and event
        logs, or by the jobs ``job_ids``), and when the oldest RUNNING job started, read at one instant."""

        def read(conn: Any) -> tuple[set[str], float | None]:
            found: set[str] = set()
            for text in browse.artifact_texts(conn, job_ids):
                found |= digests_in_text(text)
            return found, browse.oldest_running_start(conn)

        return self._read(read)

    def events(self, job_id: int) -> list[Event]:
        return self._read(lambda conn: browse.events(conn, job_id))

    def metrics(self, job_ids: Sequence[int]) -> list[tuple[int, int, str, float]]:
        """(job_id, step, name, value) of the given jobs, in step order."""
        return self._read(lambda conn: browse.metrics(conn, job_ids))

    def report_rows(self, phase: int | None = None) -> list[tuple[int, int, str, str, str, str | None]]:
        """(id, phase, status, target, params JSON, results JSON) of every job, in one query: what a report reads."""
        return self._read(lambda conn: browse.report_rows(conn, self._exp(conn), phase))

    def counts(self) -> dict[tuple[int, str], int]:
        """Number of jobs per (phase, status)."""
        return self._read(lambda conn: browse.counts(conn, self._exp(conn)))

    def connection_use(self) -> ConnectionUse | None:
        """How the PostgreSQL server's connection slots are taken, and how many by jobman (None on SQLite)."""
        if self.engine.dialect.name != "postgresql":
            return None
        return self._read(connections.connection_use)

    def widest_gang(self) -> tuple[int, int] | None:
        """The job still to run with the most ranks (more than one), and its ranks: what a dispatch must fit."""
        return self._read(lambda conn: browse.widest_gang(conn, self._exp(conn)))

    def outstanding(self, skip: frozenset[str] = frozenset()) -> dict[str, int]:
        """How many jobs are QUEUED, RUNNING and WAITING: whether a worker should wait for more; with
        ``skip``, the QUEUED jobs of those targets left out (a worker that cannot import them)."""
        return self._read(lambda conn: browse.outstanding(conn, self._exp(conn), skip))

    def select_ids(
        self,
        *,
        status: Sequence[Status] = (),
        phase: int | None = None,
        params: dict[str, Any] | None = None,
        target: str | None = None,
    ) -> list[int]:
        """Ids of jobs matching a selector (``--after``, ``retry --failed --phase 1`` and the like)."""
        return browse.matching(self.jobs(status=status, phase=phase, with_deps=False, params=params), params, target)

    # -- calls from Python: jobs found by identity, functions stored by value ------------------
    def find(self, hashes: Sequence[str]) -> dict[str, Job]:
        """The jobs of the experiment whose identity (``params_hash``) is one of ``hashes``.

        What a call from Python looks up first: a DONE call is answered without a write.
        """

        def run(conn: Connection) -> dict[str, Job]:
            try:
                exp = self._exp(conn)
            except NoSuchExperiment:
                return {}
            return browse.find(conn, self.hot, exp, hashes)

        return self._read(run)

    def put_function(self, target: str, code: bytes) -> None:
        """Store the code of a function run by value under its target (``name#digest``)."""
        self._write(lambda conn: scheduling.put_function(conn, self._exp(conn, create=True), target, code))

    def function_code(self, target: str) -> bytes | None:
        """The stored code of a function run by value, or None."""
        return self._read(lambda conn: scheduling.function_code(conn, self._exp(conn), target))

    def _end(
        self,
        job_id: int,
        lease: int,
        outcome: str,
        results: dict[str, Any] | None,
        error: str | None,
        exit_code: int | None,
        why: str | None,
        relaunch: bool,
        code: dict[str, Any] | str | None,
        texts: dict[str, tuple[str, str]] | None,
    ) -> Callable[..., Status | None]:
        """How a run ended, recorded in a transaction (``finish`` and ``finish_and_claim``): the texts its
        code record names kept first, then the job's end; events go to ``pending`` when given."""
        blob, outcome, error, why = transitions.result_blob(results, outcome, error, why)
        code_blob = code if isinstance(code, str) or code is None else dump_json(code, "code record")

        def record(conn: Connection, pending: list[dict[str, Any]] | None = None) -> Status | None:
            if texts:
                coderecord.keep_texts(conn, texts, time.time())
            return transitions.finish(
                conn,
                self._events,
                self.hot,
                job_id,
                lease,
                outcome,
                blob,
                error,
                exit_code,
                why,
                relaunch,
                pending,
                code=code_blob,
                **self._ends,
            )

        return record

    def keep_texts(self, texts: dict[str, tuple[str, str]]) -> None:
        """Keep texts jobs' code records name (a diff, a package list: ``{digest: (kind, body)}``),
        each once, whoever kept it first."""
        if texts:
            self._write(lambda conn: coderecord.keep_texts(conn, texts, time.time()))

    def code_text(self, digest: str) -> tuple[str, str] | None:
        """A text a code record names, as ``(kind, body)``, or None if none is kept under ``digest``."""
        return self._read(lambda conn: coderecord.code_text(conn, digest))


__all__ = [
    "Store",
    "Job",
    "Event",
    "Claimed",
    "RunningJob",
    "WorkerInfo",
    "ScheduleResult",
    "DatabaseError",
    "params_hash",
    "source_tag",
    "MAX_STATE_BYTES",
]

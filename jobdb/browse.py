"""Reading a database: the store's reads, and what a person looking at it is shown.

The store's read verbs (``Store.jobs``, ``job``, ``events``, ``counts``, the monitor's scan of
RUNNING jobs, ...) are functions of a read transaction's connection here, below. Above them,
the web dashboard's queries: a paged, sorted and filtered job listing that never loads an
experiment's 100,000 rows to show fifty of them, the status counts and pace of every
experiment in two grouped queries, and how the phases depend on each other; each of those
takes a store and is one read transaction.
"""

from __future__ import annotations

import heapq
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import engine as _engine
from . import graph
from .canonical import dump_json, found_by_json_path
from .errors import NoSuchExperiment, NoSuchJob, UsageError
from .hot import HotStatements
from .records import RUNNING_COLUMNS, Event, Job, RunningJob
from .report import Condition
from .schema import experiment as t_exp
from .schema import job as t_job
from .schema import job_dep as t_dep
from .schema import job_event as t_event
from .schema import job_metric as t_metric
from .status import FINISHED, OUTSTANDING, Status, names_of
from .sweep import canonical_target
from .txn import chunks

if TYPE_CHECKING:
    from .store import Store

T = TypeVar("T")
RATE_WINDOW = 600.0  # seconds of finishes the pace is measured over
SORTABLE = ("id", "phase", "status", "attempt", "priority", "host", "started_at", "finished_at")
_PENDING = (Status.WAITING.value, Status.QUEUED.value, Status.RUNNING.value)


@dataclass(frozen=True)
class ExperimentSummary:
    """One experiment's status counts and pace."""

    name: str
    created_at: float
    counts: dict[str, int]
    first_started: float | None  # the pace: read only while jobs are still to run
    last_finished: float | None
    recent_finished: int  # jobs finished within RATE_WINDOW before ``at``
    at: float

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(self.counts.get(s.value, 0) for s in FINISHED)

    @property
    def pending(self) -> int:
        """Jobs still to run or running (BLOCKED ones wait on a repair, not on time)."""
        return sum(self.counts.get(s, 0) for s in _PENDING)

    @property
    def rate(self) -> float | None:
        """Jobs finished per second over the last RATE_WINDOW (or since the first start)."""
        if not self.recent_finished or self.first_started is None:
            return None
        window = min(RATE_WINDOW, max(self.at - self.first_started, 1.0))
        return self.recent_finished / window

    @property
    def eta(self) -> float | None:
        """Seconds until the pending jobs are finished at the current pace."""
        rate = self.rate
        return self.pending / rate if rate and self.pending else None


@dataclass(frozen=True)
class JobLine:
    """What a row of the job table shows: no checkpoint text beyond the results, no log paths."""

    id: int
    phase: int
    status: str
    attempt: int
    max_attempts: int
    priority: int
    host: str | None
    params: dict[str, Any]
    results: dict[str, Any] | None
    started_at: float | None
    finished_at: float | None
    error: str | None


@dataclass(frozen=True)
class JobPage:
    total: int  # jobs matching the filters, over every page
    jobs: list[JobLine] = field(default_factory=list)


def _read(store: "Store", fn: Callable[[Connection], T]) -> T:
    with _engine.translated_errors(store.target):
        with store.engine.connect().execution_options(jobman_readonly=True) as conn:
            with conn.begin():
                return fn(conn)


def _experiment_id(conn: Connection, store: "Store") -> int:
    found = conn.execute(sa.select(t_exp.c.id).where(t_exp.c.name == store.experiment)).scalar()
    if found is None:
        raise NoSuchExperiment(f"no experiment {store.experiment!r} in {store.target.display}")
    return found


def experiment_summaries(store: "Store", now: float | None = None) -> list[ExperimentSummary]:
    """Every experiment of the store's database with its counts and pace, by name."""
    at = time.time() if now is None else now

    def run(conn: Connection) -> list[ExperimentSummary]:
        exps = conn.execute(sa.select(t_exp.c.id, t_exp.c.name, t_exp.c.created_at).order_by(t_exp.c.name)).all()
        counts: dict[int, dict[str, int]] = {}
        for exp, status, n in conn.execute(sa.select(t_job.c.experiment_id, t_job.c.status, sa.func.count())
                                           .group_by(t_job.c.experiment_id, t_job.c.status)):
            counts.setdefault(exp, {})[status] = n
        since = at - RATE_WINDOW
        # The pace reads every started job's row: only of experiments with jobs still to run.
        busy = [e for e, c in counts.items() if any(c.get(s) for s in _PENDING)]
        pace = {r[0]: r[1:] for r in conn.execute(
            sa.select(t_job.c.experiment_id, sa.func.min(t_job.c.started_at), sa.func.max(t_job.c.finished_at),
                      sa.func.count(t_job.c.finished_at).filter(t_job.c.finished_at >= since))
            .where(t_job.c.experiment_id.in_(busy), t_job.c.started_at.is_not(None))
            .group_by(t_job.c.experiment_id))} if busy else {}
        out = []
        for exp, name, created in exps:
            first, last, recent = pace.get(exp, (None, None, 0))
            out.append(ExperimentSummary(name, created, counts.get(exp, {}), first, last, recent or 0, at))
        return out

    return _read(store, run)


def job_page(store: "Store", *, status: Sequence[Status] = (), phase: int | None = None,
             where: Sequence[Condition] = (), sort: str = "id", descending: bool = False,
             offset: int = 0, limit: int = 50, count: bool = True) -> JobPage:
    """One page of the experiment's jobs, filtered and sorted, and how many match in all.

    Filters on status and phase and the sort run in SQL; a parameter filter reads only the
    matching jobs' ids and parameters, and whole rows only for the page shown. Without ``count``,
    the total is left at -1 (counting reads every matching index entry).
    """
    if sort not in SORTABLE:
        raise UsageError(f"cannot sort jobs by {sort!r} (choose one of {', '.join(SORTABLE)})")
    if offset < 0 or not 0 < limit <= 1000:
        raise UsageError("a page starts at 0 or later and holds 1 to 1000 jobs")

    def run(conn: Connection) -> JobPage:
        exp = _experiment_id(conn, store)
        if not where:
            total = conn.execute(sa.select(sa.func.count()).select_from(t_job)
                                 .where(*_conditions(exp, status, phase))).scalar_one() if count else -1
            rows = conn.execute(page_query(exp, status=status, phase=phase, sort=sort, descending=descending,
                                           offset=offset, limit=limit)).all()
            return JobPage(total, [_line(r) for r in rows])
        found = conn.execute(sa.select(t_job.c.id, t_job.c.params).where(*_conditions(exp, status, phase))
                             .order_by(*_order(sort, descending))).all()
        params = json.loads("[" + ",".join(p for _, p in found) + "]") if found else []
        ids = [r.id for r, p in zip(found, params) if all(c.test(p) for c in where)]
        shown = ids[offset:offset + limit]
        by_id = {r.id: r for r in conn.execute(_page_select().where(t_job.c.id.in_(shown)))} if shown else {}
        return JobPage(len(ids), [_line(by_id[i]) for i in shown])

    return _read(store, run)


def page_query(exp: int, *, status: Sequence[Status] = (), phase: int | None = None, sort: str = "id",
               descending: bool = False, offset: int = 0, limit: int = 50) -> sa.Select:
    """The statement of one page without a parameter filter (an EXPLAIN test reads its plan)."""
    return _page_select().where(*_conditions(exp, status, phase)).order_by(*_order(sort, descending)) \
        .offset(offset).limit(limit)


def _conditions(exp: int, status: Sequence[Status], phase: int | None) -> list[sa.ColumnElement]:
    conds = [t_job.c.experiment_id == exp]
    if status:
        conds.append(t_job.c.status.in_([s.value for s in status]))
    if phase is not None:
        conds.append(t_job.c.phase == phase)
    return conds


def _order(sort: str, descending: bool) -> list[sa.ColumnElement]:
    key = t_job.c[sort]
    if sort == "id":
        return [key.desc() if descending else key]
    return [key.desc(), t_job.c.id.desc()] if descending else [key, t_job.c.id]


def _page_select() -> sa.Select:
    c = t_job.c
    return sa.select(c.id, c.phase, c.status, c.attempt, c.max_attempts, c.priority, c.host, c.params, c.results,
                     c.started_at, c.finished_at, c.error)


def _line(r: Any) -> JobLine:
    return JobLine(r.id, r.phase, r.status, r.attempt, r.max_attempts, r.priority, r.host, json.loads(r.params),
                   json.loads(r.results) if r.results else None, r.started_at, r.finished_at, r.error)


def phase_links(store: "Store") -> list[tuple[int, int, int]]:
    """(phase, phase it depends on, dependencies) for the experiment: the shape of its graph."""
    def run(conn: Connection) -> list[tuple[int, int, int]]:
        exp = _experiment_id(conn, store)
        child, parent = t_job.alias("child"), t_job.alias("parent")
        q = (sa.select(child.c.phase, parent.c.phase, sa.func.count())
             .select_from(t_dep.join(child, child.c.id == t_dep.c.job_id).join(parent, parent.c.id == t_dep.c.depends_on))
             .where(child.c.experiment_id == exp).group_by(child.c.phase, parent.c.phase)
             .order_by(child.c.phase, parent.c.phase))
        return [tuple(r) for r in conn.execute(q)]

    return _read(store, run)


# -- the store's reads: functions of a read transaction, for experiment ``exp`` ----------------

def experiments(conn: Connection) -> list[str]:
    """Every experiment in the database, by name."""
    return list(conn.execute(sa.select(t_exp.c.name).order_by(t_exp.c.name)).scalars())


def jobs(conn: Connection, exp: int, *, status: Sequence[Status] = (), phase: int | None = None,
         ids: Sequence[int] = (), with_deps: bool = True, limit: int | None = None,
         params: dict[str, Any] | None = None) -> list[Job]:
    """Jobs of the experiment, by id, optionally filtered (``params``: these parameters have these values).

    A page (``limit``) is read from an index in id order: all jobs from ix_job_list, one status from
    ix_job_status, one phase from ix_job_phase one status at a time, the ranges merged here.
    """
    q = sa.select(t_job).where(t_job.c.experiment_id == exp)
    if phase is not None:
        q = q.where(t_job.c.phase == phase)
    if ids:
        q = q.where(t_job.c.id.in_(list(ids)))
    statuses = [s.value for s in status]
    if limit and not ids and (len(statuses) > 1 or (phase is not None and not statuses)):
        # Ordering across statuses by id is a sort of every match; a range per status is not.
        merged = heapq.merge(*(_page(conn, q.where(t_job.c.status == s), params, limit)
                               for s in statuses or [s.value for s in Status]), key=lambda r: r.id)
        rows = list(itertools.islice(merged, limit))
    else:
        if statuses:
            q = q.where(t_job.c.status.in_(statuses))
        rows = _page(conn, q, params, limit)
    deps: dict[int, list[int]] = {}
    if with_deps and rows:
        for chunk in chunks([r.id for r in rows]):
            for child, parent in conn.execute(sa.select(t_dep.c.job_id, t_dep.c.depends_on)
                                              .where(t_dep.c.job_id.in_(chunk))
                                              .order_by(t_dep.c.job_id, t_dep.c.depends_on)):
                deps.setdefault(child, []).append(parent)
    return [Job.from_row(r, deps.get(r.id, [])) for r in rows]


def _page(conn: Connection, q: sa.Select, params: dict[str, Any] | None, limit: int | None) -> list[Any]:
    """Rows of ``q`` in id order, at most ``limit``, whose parameters have the values in ``params``.

    The database narrows by parameter where it can (PostgreSQL's ``@>`` on ix_job_params, SQLite's
    json_extract as it reads in id order); the exact comparison, as ``matching`` makes it, is here.
    """
    q = q.order_by(t_job.c.id)
    if not params:
        return conn.execute(q.limit(limit) if limit else q).all()
    q = q.where(*_params_match(conn.dialect.name, params))
    out, last, step = [], 0, max(limit or 0, 100)
    while True:
        batch = conn.execute(q.where(t_job.c.id > last).limit(step) if limit else q).all()
        out += [r for r in batch if _has_params(r.params, params)]
        if not limit or len(out) >= limit or len(batch) < step:
            return out[:limit] if limit else out
        last = batch[-1].id


def _params_match(dialect: str, params: dict[str, Any]) -> list[Any]:
    """SQL that keeps the jobs whose parameters may have these values (a superset; ``_has_params`` decides)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import JSONB

        return [t_job.c.params.op("@>")(sa.cast(sa.literal(dump_json(params, "parameters")), JSONB))]
    out = []
    for key, value in params.items():
        if not found_by_json_path(key, dialect):
            continue  # compared by _has_params alone
        path = f'$."{key}"'
        if value is None or isinstance(value, (bool, list, dict)):
            kind = {type(None): "null", list: "array", dict: "object"}.get(type(value), "true" if value else "false")
            out.append(sa.func.json_type(t_job.c.params, path) == kind)
        else:
            out.append(sa.func.json_extract(t_job.c.params, path) == value)
    return out


def _has_params(stored: str | None, params: dict[str, Any]) -> bool:
    got = json.loads(stored) if stored else {}
    return all(got.get(k, _MISSING) == v for k, v in params.items())


def job(conn: Connection, exp: int, experiment: str, job_id: int) -> Job:
    """One job of experiment ``exp`` (named ``experiment``), with the ids it depends on."""
    row = conn.execute(sa.select(t_job).where(t_job.c.id == job_id, t_job.c.experiment_id == exp)).first()
    if row is None:
        raise NoSuchJob(f"no job {job_id} in experiment {experiment!r}")
    return Job.from_row(row, graph.parent_ids(conn, job_id))


def parents(conn: Connection, job_id: int) -> list[Job]:
    """The jobs ``job_id`` depends on, whole."""
    rows = conn.execute(sa.select(t_job).join(t_dep, t_dep.c.depends_on == t_job.c.id)
                        .where(t_dep.c.job_id == job_id).order_by(t_job.c.id)).all()
    return [Job.from_row(r) for r in rows]


def events(conn: Connection, job_id: int) -> list[Event]:
    """A job's event log, oldest first."""
    rows = conn.execute(sa.select(t_event).where(t_event.c.job_id == job_id).order_by(t_event.c.id)).all()
    return [_event(r) for r in rows]


def recent_events(conn: Connection, exp: int, *, to_status: Sequence[Status] = (), since: float | None = None,
                  limit: int = 20) -> list[Event]:
    """The experiment's latest status changes, newest first."""
    q = (sa.select(t_event).join(t_job, t_job.c.id == t_event.c.job_id)
         .where(t_job.c.experiment_id == exp).order_by(t_event.c.id.desc()).limit(limit))
    if to_status:
        q = q.where(t_event.c.to_status.in_([str(s) for s in to_status]))
    if since is not None:
        q = q.where(t_event.c.at >= since)
    return [_event(r) for r in conn.execute(q)]


def _event(r: Any) -> Event:
    return Event(r.id, r.job_id, r.at, r.from_status, r.to_status, r.attempt, r.why, r.source,
                 json.loads(r.data) if r.data else None)


def metrics(conn: Connection, job_ids: Sequence[int]) -> list[tuple[int, int, str, float]]:
    """(job_id, step, name, value) of the given jobs, in step order."""
    out = []
    for chunk in chunks(list(job_ids)):
        out.extend(conn.execute(sa.select(t_metric.c.job_id, t_metric.c.step, t_metric.c.name, t_metric.c.value)
                                .where(t_metric.c.job_id.in_(chunk))
                                .order_by(t_metric.c.job_id, t_metric.c.name, t_metric.c.step)).all())
    return out


def report_rows(conn: Connection, exp: int, phase: int | None = None) -> list[tuple[int, int, str, str, str, str | None]]:
    """(id, phase, status, target, params JSON, results JSON) of every job, in one query."""
    q = sa.select(t_job.c.id, t_job.c.phase, t_job.c.status, t_job.c.target, t_job.c.params,
                  t_job.c.results).where(t_job.c.experiment_id == exp).order_by(t_job.c.id)
    if phase is not None:
        q = q.where(t_job.c.phase == phase)
    return [tuple(r) for r in conn.execute(q)]


def counts(conn: Connection, exp: int) -> dict[tuple[int, str], int]:
    """Number of jobs per (phase, status)."""
    q = sa.select(t_job.c.phase, t_job.c.status, sa.func.count()).where(t_job.c.experiment_id == exp) \
        .group_by(t_job.c.phase, t_job.c.status)
    return {(p, s): n for p, s, n in conn.execute(q).all()}


def outstanding(conn: Connection, exp: int) -> dict[str, int]:
    """How many jobs are QUEUED, RUNNING and WAITING."""
    wanted = names_of(OUTSTANDING)
    q = sa.select(t_job.c.status, sa.func.count()).where(
        t_job.c.experiment_id == exp, t_job.c.status.in_(wanted)).group_by(t_job.c.status)
    found = dict(conn.execute(q).all())
    return {s: found.get(s, 0) for s in wanted}


def matching(found: Sequence[Job], params: dict[str, Any] | None, target: str | None) -> list[int]:
    """The ids of the jobs of ``found`` with these parameter values and this target (in any spelling)."""
    spelled = canonical_target(target) if target is not None else None
    out = []
    for j in found:
        if target is not None and j.target != target and (j.kind != "fn" or canonical_target(j.target) != spelled):
            continue
        if params and any(j.params.get(k, _MISSING) != v for k, v in params.items()):
            continue
        out.append(j.id)
    return out


_MISSING = object()


def find(conn: Connection, hot: HotStatements, exp: int, hashes: Sequence[str]) -> dict[str, Job]:
    """The jobs of the experiment whose identity (``params_hash``) is one of ``hashes``."""
    if len(hashes) == 1:  # one call, the common case: compiled once, as the hot statements are
        names = t_job.c.keys()
        return {r[names.index("params_hash")]: Job.from_mapping(dict(zip(names, r)))
                for r in hot.by_hash.rows(conn, exp=exp, h=hashes[0])}
    out: dict[str, Job] = {}
    for chunk in chunks(list(hashes)):
        rows = conn.execute(sa.select(t_job).where(t_job.c.experiment_id == exp,
                                                   t_job.c.params_hash.in_(chunk))).all()
        out.update((r.params_hash, Job.from_row(r)) for r in rows)
    return out


def running_select(exp: int, *columns: Any) -> sa.Select:
    """RUNNING jobs of an experiment: the monitor's scan."""
    return sa.select(*(columns or (t_job,))).where(t_job.c.experiment_id == exp,
                                                   t_job.c.status == Status.RUNNING.value)


def running(conn: Connection, exp: int) -> list[Job]:
    """Every RUNNING job of the experiment, whole."""
    return [Job.from_row(r) for r in conn.execute(running_select(exp)).all()]


def running_brief(conn: Connection, exp: int) -> list[RunningJob]:
    """Every RUNNING job of the experiment, only the columns a liveness check needs: one query."""
    cols = [t_job.c[name] for name in RUNNING_COLUMNS]
    return [RunningJob.from_row(r) for r in conn.execute(running_select(exp, *cols).order_by(t_job.c.id)).all()]

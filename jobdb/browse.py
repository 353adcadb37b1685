"""The store's reads: ``Store.jobs``, ``job``, ``events``, ``counts``, the monitor's scan of RUNNING
jobs, ... each a function of a read transaction's connection, called by the store only (the
dashboard's reads, which call the store, are :mod:`.dashboard`'s)."""

from __future__ import annotations

import heapq
import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import graph
from .canonical import dump_json, found_by_json_path
from .errors import NoSuchJob
from .hot import HotStatements
from .records import RUNNING_COLUMNS, Event, Job, RunningJob
from .schema import experiment as t_exp
from .schema import job as t_job
from .schema import job_dep as t_dep
from .schema import job_event as t_event
from .schema import job_metric as t_metric
from .status import OUTSTANDING, Status, names_of
from .sweep import canonical_target
from .txn import chunks


def experiments(conn: Connection) -> list[str]:
    """Every experiment in the database, by name."""
    return list(conn.execute(sa.select(t_exp.c.name).order_by(t_exp.c.name)).scalars())


def jobs(
    conn: Connection,
    exp: int,
    *,
    status: Sequence[Status] = (),
    phase: int | None = None,
    ids: Sequence[int] = (),
    with_deps: bool = True,
    limit: int | None = None,
    params: dict[str, Any] | None = None,
) -> list[Job]:
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
    rows: Sequence[Any]
    if limit and not ids and (len(statuses) > 1 or (phase is not None and not statuses)):
        # Ordering across statuses by id is a sort of every match; a range per status is not.
        merged = heapq.merge(
            *(_page(conn, q.where(t_job.c.status == s), params, limit) for s in statuses or [s.value for s in Status]),
            key=lambda r: r.id,
        )
        rows = list(itertools.islice(merged, limit))
    else:
        if statuses:
            q = q.where(t_job.c.status.in_(statuses))
        rows = _page(conn, q, params, limit)
    deps: dict[int, list[int]] = {}
    if with_deps and rows:
        for chunk in chunks([r.id for r in rows]):
            for child, parent in conn.execute(
                sa.select(t_dep.c.job_id, t_dep.c.depends_on)
                .where(t_dep.c.job_id.in_(chunk))
                .order_by(t_dep.c.job_id, t_dep.c.depends_on)
            ):
                deps.setdefault(child, []).append(parent)
    return [Job.from_row(r, deps.get(r.id, [])) for r in rows]


def _page(conn: Connection, q: sa.Select, params: dict[str, Any] | None, limit: int | None) -> Sequence[Any]:
    """Rows of ``q`` in id order, at most ``limit``, whose parameters have the values in ``params``.

    The database narrows by parameter where it can (PostgreSQL's ``@>`` on ix_job_params, SQLite's
    json_extract as it reads in id order); the exact comparison, as ``matching`` makes it, is here.
    """
    q = q.order_by(t_job.c.id)
    if not params:
        return conn.execute(q.limit(limit) if limit else q).all()
    q = q.where(*_params_match(conn.dialect.name, params))
    out: list[Any] = []
    last, step = 0, max(limit or 0, 100)
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
    rows = conn.execute(
        sa.select(t_job)
        .join(t_dep, t_dep.c.depends_on == t_job.c.id)
        .where(t_dep.c.job_id == job_id)
        .order_by(t_job.c.id)
    ).all()
    return [Job.from_row(r) for r in rows]


def artifact_texts(conn: Connection, job_ids: Sequence[int] | None = None) -> list[str]:
    """The stored results (of jobs, and kept in their event logs) that refer to an artifact: of every
    experiment of the database, or of the jobs ``job_ids``."""
    texts: list[str] = []
    for column, table, owner in ((t_job.c.results, t_job, t_job.c.id), (t_event.c.data, t_event, t_event.c.job_id)):
        text = sa.cast(column, sa.Text)
        q = sa.select(text).select_from(table).where(text.like('%"$artifact"%'))
        if job_ids is None:
            texts.extend(r[0] for r in conn.execute(q))
        else:
            for part in chunks(list(job_ids)):
                texts.extend(r[0] for r in conn.execute(q.where(owner.in_(part))))
    return texts


def oldest_running_start(conn: Connection) -> float | None:
    """When the longest-running job of any experiment started (None: nothing runs): an artifact a job
    is writing now was written after it."""
    started = conn.execute(
        sa.select(sa.func.min(sa.func.coalesce(t_job.c.started_at, t_job.c.created_at))).where(
            t_job.c.status == Status.RUNNING.value
        )
    ).scalar()
    return None if started is None else float(started)


def events(conn: Connection, job_id: int) -> list[Event]:
    """A job's event log, oldest first."""
    rows = conn.execute(sa.select(t_event).where(t_event.c.job_id == job_id).order_by(t_event.c.id)).all()
    return [_event(r) for r in rows]


def recent_events(
    conn: Connection, exp: int, *, to_status: Sequence[Status] = (), since: float | None = None, limit: int = 20
) -> list[Event]:
    """The experiment's latest status changes, newest first."""
    q = (
        sa.select(t_event)
        .join(t_job, t_job.c.id == t_event.c.job_id)
        .where(t_job.c.experiment_id == exp)
        .order_by(t_event.c.id.desc())
        .limit(limit)
    )
    if to_status:
        q = q.where(t_event.c.to_status.in_([str(s) for s in to_status]))
    if since is not None:
        q = q.where(t_event.c.at >= since)
    return [_event(r) for r in conn.execute(q)]


def _event(r: Any) -> Event:
    return Event(
        r.id,
        r.job_id,
        r.at,
        r.from_status,
        r.to_status,
        r.attempt,
        r.why,
        r.source,
        json.loads(r.data) if r.data else None,
    )


def metrics(conn: Connection, job_ids: Sequence[int]) -> list[tuple[int, int, str, float]]:
    """(job_id, step, name, value) of the given jobs, in step order; a logged NaN (stored as NULL) is NaN."""
    out: list[tuple[int, int, str, float]] = []
    for chunk in chunks(list(job_ids)):
        out.extend(
            (job_id, step, name, math.nan if value is None else value)
            for job_id, step, name, value in conn.execute(
                sa.select(t_metric.c.job_id, t_metric.c.step, t_metric.c.name, t_metric.c.value)
                .where(t_metric.c.job_id.in_(chunk))
                .order_by(t_metric.c.job_id, t_metric.c.name, t_metric.c.step)
            )
        )
    return out


def report_rows(
    conn: Connection, exp: int, phase: int | None = None
) -> list[tuple[int, int, str, str, str, str | None]]:
    """(id, phase, status, target, params JSON, results JSON) of every job, in one query."""
    q = (
        sa.select(t_job.c.id, t_job.c.phase, t_job.c.status, t_job.c.target, t_job.c.params, t_job.c.results)
        .where(t_job.c.experiment_id == exp)
        .order_by(t_job.c.id)
    )
    if phase is not None:
        q = q.where(t_job.c.phase == phase)
    return [tuple(r) for r in conn.execute(q)]


def counts(conn: Connection, exp: int) -> dict[tuple[int, str], int]:
    """Number of jobs per (phase, status)."""
    q = (
        sa.select(t_job.c.phase, t_job.c.status, sa.func.count())
        .where(t_job.c.experiment_id == exp)
        .group_by(t_job.c.phase, t_job.c.status)
    )
    return {(p, s): n for p, s, n in conn.execute(q).all()}


def outstanding(conn: Connection, exp: int, skip: frozenset[str] = frozenset()) -> dict[str, int]:
    """How many jobs are QUEUED, RUNNING and WAITING; those QUEUED of ``skip``'s targets not counted."""
    wanted = names_of(OUTSTANDING)
    q = (
        sa.select(t_job.c.status, sa.func.count())
        .where(t_job.c.experiment_id == exp, t_job.c.status.in_(wanted))
        .group_by(t_job.c.status)
    )
    if skip:
        q = q.where(sa.or_(t_job.c.status != Status.QUEUED.value, t_job.c.target.not_in(sorted(skip))))
    found: dict[str, int] = {s: n for s, n in conn.execute(q).all()}
    return {s: found.get(s, 0) for s in wanted}


def widest_gang(conn: Connection, exp: int) -> tuple[int, int] | None:
    """The QUEUED or WAITING job of the most ranks (over one), and its ranks; None if there is none."""
    row = conn.execute(
        sa.select(t_job.c.id, t_job.c.ranks)
        .where(
            t_job.c.experiment_id == exp,
            t_job.c.status.in_([Status.QUEUED.value, Status.WAITING.value]),
            t_job.c.ranks > 1,
        )
        .order_by(t_job.c.ranks.desc(), t_job.c.id)
        .limit(1)
    ).first()
    return (row.id, row.ranks) if row is not None else None


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
        return {
            r[names.index("params_hash")]: Job.from_mapping(dict(zip(names, r)))
            for r in hot.by_hash.rows(conn, exp=exp, h=hashes[0])
        }
    out: dict[str, Job] = {}
    for chunk in chunks(list(hashes)):
        rows = conn.execute(sa.select(t_job).where(t_job.c.experiment_id == exp, t_job.c.params_hash.in_(chunk))).all()
        out.update((r.params_hash, Job.from_row(r)) for r in rows)
    return out


def identities(conn: Connection, exp: int, job_ids: Sequence[int]) -> dict[int, str]:
    """The identity (``params_hash``) of each of ``job_ids`` that is a job of the experiment, by id."""
    out: dict[int, str] = {}
    for chunk in chunks(list(job_ids)):
        out.update(
            conn.execute(
                sa.select(t_job.c.id, t_job.c.params_hash).where(t_job.c.experiment_id == exp, t_job.c.id.in_(chunk))
            ).all()
        )
    return out


def running_select(exp: int, *columns: Any) -> sa.Select:
    """RUNNING jobs of an experiment: the monitor's scan."""
    return sa.select(*(columns or (t_job,))).where(t_job.c.experiment_id == exp, t_job.c.status == Status.RUNNING.value)


def running(conn: Connection, exp: int) -> list[Job]:
    """Every RUNNING job of the experiment, whole."""
    return [Job.from_row(r) for r in conn.execute(running_select(exp)).all()]


def running_brief(conn: Connection, exp: int) -> list[RunningJob]:
    """Every RUNNING job of the experiment, only the columns a liveness check needs: one query."""
    cols = [t_job.c[name] for name in RUNNING_COLUMNS]
    return [RunningJob.from_row(r) for r in conn.execute(running_select(exp, *cols).order_by(t_job.c.id)).all()]

"""The dashboard's reads: what a person looking at a database is shown.

A paged, sorted and filtered job listing that never loads an experiment's 100,000 rows to show
fifty of them, the status counts and pace of every experiment in two grouped queries, and how the
phases depend on each other. Each takes a store and is one of its read transactions; the store
never calls back here (its own reads are :mod:`.browse`'s).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .canonical import load_results
from .errors import UsageError
from .schema import experiment as t_exp
from .schema import job as t_job
from .schema import job_dep as t_dep
from .status import ENDED, OUTSTANDING, Status
from .txn import experiment_id

if TYPE_CHECKING:
    from .selection import Condition
    from .store import Store

RATE_WINDOW = 600.0  # seconds of finishes the pace is measured over
SORTABLE = ("id", "phase", "status", "attempt", "priority", "host", "started_at", "finished_at")


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
        """Jobs that have ended (``status.ENDED``, BLOCKED ones included), as dispatch's progress counts them."""
        return sum(self.counts.get(s.value, 0) for s in ENDED)

    @property
    def pending(self) -> int:
        """Jobs still to run or running (BLOCKED ones wait on a repair, not on time)."""
        return sum(self.counts.get(s.value, 0) for s in OUTSTANDING)

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


def experiment_summaries(store: Store, now: float | None = None) -> list[ExperimentSummary]:
    """Every experiment of the store's database with its counts and pace, by name."""
    at = time.time() if now is None else now

    def run(conn: Connection) -> list[ExperimentSummary]:
        exps = conn.execute(sa.select(t_exp.c.id, t_exp.c.name, t_exp.c.created_at).order_by(t_exp.c.name)).all()
        counts: dict[int, dict[str, int]] = {}
        for exp, status, n in conn.execute(
            sa.select(t_job.c.experiment_id, t_job.c.status, sa.func.count()).group_by(
                t_job.c.experiment_id, t_job.c.status
            )
        ):
            counts.setdefault(exp, {})[status] = n
        since = at - RATE_WINDOW
        # The pace reads every started job's row: only of experiments with jobs still to run.
        busy = [e for e, c in counts.items() if any(c.get(s.value) for s in OUTSTANDING)]
        pace = (
            {
                r[0]: r[1:]
                for r in conn.execute(
                    sa.select(
                        t_job.c.experiment_id,
                        sa.func.min(t_job.c.started_at),
                        sa.func.max(t_job.c.finished_at),
                        sa.func.count(t_job.c.finished_at).filter(t_job.c.finished_at >= since),
                    )
                    .where(t_job.c.experiment_id.in_(busy), t_job.c.started_at.is_not(None))
                    .group_by(t_job.c.experiment_id)
                )
            }
            if busy
            else {}
        )
        out = []
        for exp, name, created in exps:
            first, last, recent = pace.get(exp, (None, None, 0))
            out.append(ExperimentSummary(name, created, counts.get(exp, {}), first, last, recent or 0, at))
        return out

    return store.transactions.read(run)


def job_page(
    store: Store,
    *,
    status: Sequence[Status] = (),
    phase: int | None = None,
    where: Sequence[Condition] = (),
    sort: str = "id",
    descending: bool = False,
    offset: int = 0,
    limit: int = 50,
    count: bool = True,
) -> JobPage:
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
        exp = experiment_id(conn, store.target)
        if not where:
            total = (
                conn.execute(
                    sa.select(sa.func.count()).select_from(t_job).where(*_conditions(exp, status, phase))
                ).scalar_one()
                if count
                else -1
            )
            rows = conn.execute(
                page_query(
                    exp, status=status, phase=phase, sort=sort, descending=descending, offset=offset, limit=limit
                )
            ).all()
            return JobPage(total, [_line(r) for r in rows])
        found = conn.execute(
            sa.select(t_job.c.id, t_job.c.params)
            .where(*_conditions(exp, status, phase))
            .order_by(*_order(sort, descending))
        ).all()
        params = json.loads("[" + ",".join(p for _, p in found) + "]") if found else []
        ids = [r.id for r, p in zip(found, params) if all(c.test(p) for c in where)]
        shown = ids[offset : offset + limit]
        by_id = {r.id: r for r in conn.execute(_page_select().where(t_job.c.id.in_(shown)))} if shown else {}
        return JobPage(len(ids), [_line(by_id[i]) for i in shown])

    return store.transactions.read(run)


def page_query(
    exp: int,
    *,
    status: Sequence[Status] = (),
    phase: int | None = None,
    sort: str = "id",
    descending: bool = False,
    offset: int = 0,
    limit: int = 50,
) -> sa.Select:
    """The statement of one page without a parameter filter (an EXPLAIN test reads its plan)."""
    return (
        _page_select()
        .where(*_conditions(exp, status, phase))
        .order_by(*_order(sort, descending))
        .offset(offset)
        .limit(limit)
    )


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
    return sa.select(
        c.id,
        c.phase,
        c.status,
        c.attempt,
        c.max_attempts,
        c.priority,
        c.host,
        c.params,
        c.results,
        c.started_at,
        c.finished_at,
        c.error,
    )


def _line(r: Any) -> JobLine:
    return JobLine(
        r.id,
        r.phase,
        r.status,
        r.attempt,
        r.max_attempts,
        r.priority,
        r.host,
        json.loads(r.params),
        load_results(r.results) if r.results else None,
        r.started_at,
        r.finished_at,
        r.error,
    )


def phase_links(store: Store) -> list[tuple[int, int, int]]:
    """(phase, phase it depends on, dependencies) for the experiment: the shape of its graph."""

    def run(conn: Connection) -> list[tuple[int, int, int]]:
        exp = experiment_id(conn, store.target)
        child, parent = t_job.alias("child"), t_job.alias("parent")
        q = (
            sa.select(child.c.phase, parent.c.phase, sa.func.count())
            .select_from(
                t_dep.join(child, child.c.id == t_dep.c.job_id).join(parent, parent.c.id == t_dep.c.depends_on)
            )
            .where(child.c.experiment_id == exp)
            .group_by(child.c.phase, parent.c.phase)
            .order_by(child.c.phase, parent.c.phase)
        )
        return [tuple(r) for r in conn.execute(q)]

    return store.transactions.read(run)

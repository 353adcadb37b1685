"""The dashboard's reads: what a person looking at a database is shown.

A paged, sorted and filtered job listing that never loads an experiment's 100,000 rows to show
fifty of them, the status counts and pace of every experiment in two grouped queries, how the
phases depend on each other, and the graph of calls: each job and its dependencies for a small
experiment, grouped by phase and function for a big one, so a page never reads the graph of a
thousand calls one by one. Each takes a store and is one of its read transactions; the store
never calls back here (its own reads are :mod:`.browse`'s). A notebook's view of a job reads what
holds it back here too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .canonical import load_results
from .errors import UsageError
from .schema import experiment as t_exp
from .schema import job as t_job
from .schema import job_dep as t_dep
from .status import ENDED, OUTSTANDING, RAN_BADLY, Status, names_of
from .txn import experiment_id

if TYPE_CHECKING:
    from .selection import Condition
    from .store import Store

RATE_WINDOW = 600.0  # seconds of finishes the pace is measured over
CALLS_DRAWN = 60  # an experiment of more jobs has its graph drawn by phase and function
GROUPS_DRAWN = 40  # groups of calls drawn; the others are counted
NEIGHBOURS = 50  # parents or dependents of a job listed on its page; the others are counted
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
    target: str | None = None,
) -> JobPage:
    """One page of the experiment's jobs, filtered and sorted, and how many match in all.

    Filters on status and phase and the sort run in SQL; a parameter filter reads only the
    matching jobs' ids and parameters, and whole rows only for the page shown. Without ``count``,
    the total is left at -1 (counting reads every matching index entry). ``target``: the calls of that
    function (or command) only, as a box of the graph of calls groups them.
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
                    sa.select(sa.func.count()).select_from(t_job).where(*_conditions(exp, status, phase, target))
                ).scalar_one()
                if count
                else -1
            )
            rows = conn.execute(
                page_query(
                    exp,
                    status=status,
                    phase=phase,
                    sort=sort,
                    descending=descending,
                    offset=offset,
                    limit=limit,
                    target=target,
                )
            ).all()
            return JobPage(total, [_line(r) for r in rows])
        found = conn.execute(
            sa.select(t_job.c.id, t_job.c.params)
            .where(*_conditions(exp, status, phase, target))
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
    target: str | None = None,
) -> sa.Select:
    """The statement of one page without a parameter filter (an EXPLAIN test reads its plan)."""
    return (
        _page_select()
        .where(*_conditions(exp, status, phase, target))
        .order_by(*_order(sort, descending))
        .offset(offset)
        .limit(limit)
    )


def _conditions(
    exp: int, status: Sequence[Status], phase: int | None, target: str | None = None
) -> list[sa.ColumnElement]:
    conds = [t_job.c.experiment_id == exp]
    if target is not None:
        conds.append(t_job.c.target == target)
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


# -- the graph of calls -------------------------------------------------------------------------


def call_name(target: str) -> str:
    """A target as a person names the call: the function's name (``pkg.mod:Cls.fit#ab12@v2`` → ``Cls.fit``),
    a command as it is."""
    name = target.partition("@")[0].partition("#")[0]
    if ":" in name and " " not in name:
        return name.rpartition(":")[2] or name
    return name


@dataclass(frozen=True)
class CallRef:
    """A job as a graph names it: its id, target and status."""

    id: int
    target: str
    status: str

    @property
    def name(self) -> str:
        return call_name(self.target)


@dataclass(frozen=True)
class Call(CallRef):
    """A node of the graph of calls: a job with its phase and parameters."""

    phase: int = 0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CallGroup:
    """The calls of one function in one phase: how many by status, and the first of them."""

    phase: int
    target: str
    counts: dict[str, int]
    first: int

    @property
    def key(self) -> tuple[int, str]:
        return (self.phase, self.target)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class CallGraph:
    """An experiment's jobs and their dependencies: each job (``calls``, ``edges`` as (taken, taking)
    ids) when there are at most ``CALLS_DRAWN``, else its groups (``groups``, ``group_edges`` as
    (taken group, taking group, dependencies)), the first ``GROUPS_DRAWN`` of them by first job."""

    total: int  # jobs of the experiment
    calls: list[Call] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    groups: list[CallGroup] = field(default_factory=list)
    group_edges: list[tuple[tuple[int, str], tuple[int, str], int]] = field(default_factory=list)
    groups_total: int = 0
    links: list[tuple[tuple[int, str], tuple[int, str], int]] | None = None  # between every group, as read

    @property
    def grouped(self) -> bool:
        return not self.calls


GroupLinks = list[tuple[tuple[int, str], tuple[int, str], int]]  # (taken group, taking group, dependencies)


def call_graph(
    store: Store, drawn: int = CALLS_DRAWN, links: Callable[[int], GroupLinks | None] | None = None
) -> CallGraph | None:
    """The experiment's graph of calls, or None when no job of it depends on another.

    At most ``drawn`` jobs are read one by one; a bigger experiment is read in two grouped queries,
    whose answers are as long as it has functions per phase, not jobs. The second, the dependencies
    between groups, reads every dependency: ``links(total)`` may give them as read before for an
    experiment of ``total`` jobs (a page redrawn every few seconds while only statuses change)."""

    def run(conn: Connection) -> CallGraph | None:
        exp = experiment_id(conn, store.target)
        child = t_job.alias("child")
        linked = conn.execute(
            sa.select(t_dep.c.job_id)
            .join(child, child.c.id == t_dep.c.job_id)
            .where(child.c.experiment_id == exp)
            .limit(1)
        ).first()
        if linked is None:
            return None
        count = sa.select(sa.func.count()).select_from(t_job).where(t_job.c.experiment_id == exp)
        total = conn.execute(count).scalar_one()
        if total <= drawn:
            c = t_job.c
            rows = conn.execute(
                sa.select(c.id, c.target, c.status, c.phase, c.params).where(c.experiment_id == exp).order_by(c.id)
            ).all()
            calls = [Call(r.id, r.target, r.status, r.phase, json.loads(r.params)) for r in rows]
            edges = conn.execute(
                sa.select(t_dep.c.depends_on, t_dep.c.job_id)
                .join(child, child.c.id == t_dep.c.job_id)
                .where(child.c.experiment_id == exp)
                .order_by(t_dep.c.job_id, t_dep.c.depends_on)
            ).all()
            return CallGraph(total, calls, [(a, b) for a, b in edges])
        by_group: dict[tuple[int, str], dict[str, int]] = {}
        first: dict[tuple[int, str], int] = {}
        for phase, target, status, n, low in conn.execute(
            sa.select(t_job.c.phase, t_job.c.target, t_job.c.status, sa.func.count(), sa.func.min(t_job.c.id))
            .where(t_job.c.experiment_id == exp)
            .group_by(t_job.c.phase, t_job.c.target, t_job.c.status)
        ):
            by_group.setdefault((phase, target), {})[status] = n
            first[(phase, target)] = min(low, first.get((phase, target), low))
        keys = sorted(by_group, key=first.__getitem__)[:GROUPS_DRAWN]
        known = links(total) if links is not None else None
        found = group_links(conn, exp) if known is None else known
        shown = set(keys)
        return CallGraph(
            total,
            groups=[CallGroup(k[0], k[1], by_group[k], first[k]) for k in keys],
            group_edges=sorted(
                (e for e in found if e[0] in shown and e[1] in shown), key=lambda e: (first[e[0]], first[e[1]])
            ),
            groups_total=len(by_group),
            links=found,
        )

    return store.transactions.read(run)


def group_links(conn: Connection, exp: int) -> GroupLinks:
    """The dependencies between the experiment's groups of calls (phase, target), counted."""
    child, parent = t_job.alias("child"), t_job.alias("parent")
    both = t_dep.join(child, child.c.id == t_dep.c.job_id).join(parent, parent.c.id == t_dep.c.depends_on)
    return [
        ((pp, pt), (cp, ct), n)
        for cp, ct, pp, pt, n in conn.execute(
            sa.select(child.c.phase, child.c.target, parent.c.phase, parent.c.target, sa.func.count())
            .select_from(both)
            .where(child.c.experiment_id == exp)
            .group_by(child.c.phase, child.c.target, parent.c.phase, parent.c.target)
        )
    ]


@dataclass(frozen=True)
class Neighbours:
    """The jobs a job depends on and those depending on it, the first ``NEIGHBOURS`` of each by id."""

    parents: list[CallRef]
    parents_total: int
    children: list[CallRef]
    children_total: int


def neighbours(store: Store, job_id: int, limit: int = NEIGHBOURS) -> Neighbours:
    """What ``job_id`` depends on and what depends on it, a page of each (a fan-in of a thousand calls
    lists fifty and counts the rest)."""

    def side(conn: Connection, mine: sa.Column, theirs: sa.Column) -> tuple[list[CallRef], int]:
        c = t_job.c
        rows = conn.execute(
            sa.select(c.id, c.target, c.status)
            .join(t_dep, theirs == c.id)
            .where(mine == job_id)
            .order_by(c.id)
            .limit(limit)
        ).all()
        total = (
            conn.execute(sa.select(sa.func.count()).select_from(t_dep).where(mine == job_id)).scalar_one()
            if len(rows) >= limit
            else len(rows)
        )
        return [CallRef(*r) for r in rows], total

    def run(conn: Connection) -> Neighbours:
        parents, np = side(conn, t_dep.c.job_id, t_dep.c.depends_on)
        children, nc = side(conn, t_dep.c.depends_on, t_dep.c.job_id)
        return Neighbours(parents, np, children, nc)

    return store.transactions.read(run)


HELD_BY = 10  # calls named as holding a job back; the others are counted


def held_by(store: Store, job_id: int, status: Status, limit: int = HELD_BY) -> tuple[list[CallRef], int]:
    """The calls holding ``job_id`` back, and how many there are: for a WAITING job, those it depends on
    that are not DONE; for a BLOCKED one, the calls upstream of it that ended badly (FAILED, CRASHED,
    CANCELED), found through its BLOCKED ancestors. None for a job in another status."""
    if status not in (Status.WAITING, Status.BLOCKED):
        return [], 0

    def run(conn: Connection) -> tuple[list[CallRef], int]:
        c = t_job.c
        if status is Status.WAITING:
            found = sa.select(t_dep.c.depends_on).where(t_dep.c.job_id == job_id)
            wanted = c.status != Status.DONE.value
        else:  # up through BLOCKED ancestors only: what blocked them is what blocked this one
            up = sa.select(t_dep.c.depends_on.label("id")).where(t_dep.c.job_id == job_id).cte("up", recursive=True)
            step = t_job.alias("step")
            up = up.union(
                sa.select(t_dep.c.depends_on)
                .join(up, t_dep.c.job_id == up.c.id)
                .join(step, step.c.id == up.c.id)
                .where(step.c.status == Status.BLOCKED.value)
            )
            found = sa.select(up.c.id)
            wanted = c.status.in_(names_of(RAN_BADLY) + [Status.CANCELED.value])
        where = (c.id.in_(found), wanted)
        rows = conn.execute(sa.select(c.id, c.target, c.status).where(*where).order_by(c.id).limit(limit)).all()
        total = (
            conn.execute(sa.select(sa.func.count()).select_from(t_job).where(*where)).scalar_one()
            if len(rows) >= limit
            else len(rows)
        )
        return [CallRef(*r) for r in rows], total

    return store.transactions.read(run)

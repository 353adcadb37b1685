"""The statements of the hot path — claim, heartbeat, finish, events — compiled once per dialect.

Building and cache-keying a SQLAlchemy statement costs more than running it on
SQLite; a worker runs these thousands of times, so they are compiled once and
executed through the driver with bound values.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect

from .schema import job as t_job
from .schema import job_dep as t_dep
from .schema import job_event as t_event
from .schema import search_job as t_sjob
from .status import Status

if TYPE_CHECKING:
    from sqlalchemy.sql.compiler import SQLCompiler

    from .records import WorkerInfo

b = sa.bindparam


def execute_raw(conn: Connection, sql: str, args: Any = (), *, many: bool = False) -> Any:
    """Run SQL on the connection's DB-API cursor (``many``: once per set of ``args``); driver errors
    become SQLAlchemy's, as from ``execute``."""
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]  # None only once closed
    try:
        if many:
            cursor.executemany(sql, args)
        else:
            cursor.execute(sql, args)
    except conn.dialect.loaded_dbapi.Error as exc:
        cursor.close()
        raise sa.exc.DBAPIError.instance(sql, args, exc, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect) from exc
    return cursor


class Prepared:
    """A statement compiled for one dialect, run on the transaction's own DB-API cursor."""

    def __init__(self, stmt: sa.sql.ClauseElement, dialect: Dialect) -> None:
        compiled = cast("SQLCompiler", stmt.compile(dialect=dialect))
        self.sql = str(compiled)
        self.defaults: dict[str, Any] = dict(compiled.params)
        order = tuple(compiled.positiontup) if compiled.positional else None  # type: ignore[arg-type]  # set when positional
        # The bound values in the driver's order (a positional paramstyle), or the dict itself.
        if order is None:
            self.args: Callable[[dict[str, Any]], Any] = lambda bound: bound
        elif len(order) < 2:  # itemgetter of one key gives no tuple
            self.args = lambda bound: tuple(bound[k] for k in order)
        else:
            self.args = operator.itemgetter(*order)

    def rows(self, conn: Connection, **values: Any) -> list[tuple]:
        cursor = execute_raw(conn, self.sql, self.args({**self.defaults, **values}))
        try:
            return cursor.fetchall()
        finally:
            cursor.close()

    def run(self, conn: Connection, **values: Any) -> None:
        execute_raw(conn, self.sql, self.args({**self.defaults, **values})).close()

    def run_many(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Once per row, in one call; each row binds every parameter."""
        execute_raw(conn, self.sql, [self.args(r) for r in rows], many=True).close()


def const(value: str | int | bool) -> sa.ColumnElement:
    """A constant written into a statement rather than bound: SQLite plans and runs the claim
    about a tenth faster when its status names, flags and limit are in the SQL text."""
    if isinstance(value, bool):
        return sa.true() if value else sa.false()
    if isinstance(value, int):
        return sa.literal_column(str(value), sa.Integer)
    if not value.isidentifier():  # status names only: nothing here needs quoting
        raise ValueError(f"not a constant to write into SQL: {value!r}")
    return sa.literal_column(f"'{value}'", sa.String)


def owned() -> sa.ColumnElement[bool]:
    """The lease predicate: the job (``:id``) is RUNNING at the caller's lease (``:lease``)."""
    return sa.and_(t_job.c.id == b("id"), t_job.c.lease == b("lease"), t_job.c.status == const(Status.RUNNING.value))


# Spelled out: SQLite's RETURNING loses the table name SQLAlchemy would put before ``id``.
_JOB_ID: sa.ColumnClause[Any] = sa.literal_column(f"{t_job.name}.id")


def _has_parents() -> sa.Label[bool]:
    """Returned by the claim, so that a job without parents costs no second query."""
    return sa.exists().where(t_dep.c.job_id == _JOB_ID).label("has_parents")


def _has_children() -> sa.Label[bool]:
    """Returned by the finish, so that a job without dependents costs no second query."""
    return sa.exists().where(t_dep.c.depends_on == _JOB_ID).label("has_children")


def _in_search() -> sa.Label[bool]:
    """Returned by the finish, so that a job of no search costs no query for the search's promotions."""
    return sa.exists().where(t_sjob.c.job_id == _JOB_ID).label("in_search")


def claim_values() -> dict[str, Any]:
    """What a claim sets: RUNNING at a new lease, the claiming worker (``:host``, ``:pid``, ...), the
    time (``:now``), and a workdir under ``:root`` unless it has one (``:root`` NULL: left as it is)."""
    return dict(
        status=const(Status.RUNNING.value),
        lease=t_job.c.lease + const(1),
        attempt=t_job.c.attempt + sa.case((t_job.c.resume, const(0)), else_=const(1)),
        resume=const(False),
        stop_requested=const(False),
        host=b("host"),
        pid=b("pid"),
        pid_started_at=b("pid_started_at", type_=sa.Float),
        backend=b("backend"),
        backend_id=b("backend_id", type_=sa.String),
        log_path=b("log_path", type_=sa.Text),
        started_at=b("now"),
        heartbeat_at=b("now"),
        finished_at=sa.null(),
        error=sa.null(),
        exit_code=sa.null(),
        workdir=sa.func.coalesce(t_job.c.workdir, b("root", type_=sa.String) + sa.cast(t_job.c.id, sa.String)),
    )


def claim_args(worker: WorkerInfo, workdir_root: str | None, now: float) -> dict[str, Any]:
    """The values a claim binds (:func:`claim_values`): the claiming worker, the time, the workdir root."""
    return dict(
        host=worker.host,
        pid=worker.pid,
        pid_started_at=worker.pid_started_at,
        backend=worker.backend,
        backend_id=worker.backend_id,
        log_path=worker.log_path,
        now=now,
        root=workdir_root.rstrip("/") + "/" if workdir_root is not None else None,
    )


class HotStatements:
    """The prepared statements of one dialect."""

    def __init__(self, dialect: Dialect, claimed_columns: Sequence[str]) -> None:
        """``claimed_columns``: the job's columns a claim returns, in that order (then has_parents)."""
        self.dialect = dialect
        self._claimed_columns = tuple(claimed_columns)
        self._claims_skipping: dict[frozenset[str], Prepared] = {}
        self.claim_pick = self._pick(frozenset())
        self.claim = self._claim(self.claim_pick)
        self.heartbeat = Prepared(
            sa.update(t_job).where(owned()).values(heartbeat_at=b("now")).returning(t_job.c.stop_requested), dialect
        )
        self.save = Prepared(
            sa.update(t_job)
            .where(owned())
            .values(results=b("results", type_=t_job.c.results.type), heartbeat_at=b("now"))
            .returning(t_job.c.id),
            dialect,
        )
        self.finish_done = Prepared(
            sa.update(t_job)
            .where(owned())
            .values(
                status=const(Status.DONE.value),
                finished_at=b("now"),
                heartbeat_at=b("now"),
                results=sa.func.coalesce(b("results", type_=t_job.c.results.type), t_job.c.results),
                error=sa.null(),
                exit_code=sa.func.coalesce(b("exit_code", type_=sa.Integer), t_job.c.exit_code),
                code=sa.func.coalesce(b("code", type_=t_job.c.code.type), t_job.c.code),
            )
            .returning(t_job.c.attempt, _has_children(), _in_search()),
            dialect,
        )
        self.event = Prepared(
            sa.insert(t_event).values(
                job_id=b("job_id"),
                at=b("at"),
                from_status=b("from_status", type_=sa.String),
                to_status=b("to_status", type_=sa.String),
                attempt=b("attempt", type_=sa.Integer),
                why=b("why"),
                source=b("source"),
                data=b("data", type_=sa.Text),
            ),
            dialect,
        )
        # A job just DONE: its children that wait on no other parent. A parent's end as DONE changes no
        # other child (its bad parents are as they were): the graph's refresh is for these alone. The
        # unfinished parent is looked for from the highest id: in a fan-in, parents end about in order,
        # so one is found at once, not after every parent already DONE.
        other, parent = t_dep.alias("other"), t_job.alias("parent")
        unfinished = (
            sa.select(other.c.depends_on)
            .join(parent, parent.c.id == other.c.depends_on)
            .where(other.c.job_id == t_dep.c.job_id, parent.c.status != Status.DONE.value)
            .order_by(other.c.depends_on.desc())
            .limit(1)
            .scalar_subquery()
        )
        self.ready_children = Prepared(
            sa.select(t_dep.c.job_id).where(t_dep.c.depends_on == b("id"), unfinished.is_(None)), dialect
        )
        # A claimed job's parents, whole (every column of job, ``parent_columns``): read by its claim, not
        # by a transaction more.
        self.parent_columns = tuple(c.name for c in t_job.c)
        self.parent_rows = Prepared(
            sa.select(*t_job.c)
            .join(t_dep, t_dep.c.depends_on == t_job.c.id)
            .where(t_dep.c.job_id == b("id"))
            .order_by(t_job.c.id),
            dialect,
        )
        # A sweep's jobs by identity: every one of an experiment, or those past an id (just inserted).
        self.ids_by_hash = Prepared(
            sa.select(t_job.c.params_hash, t_job.c.id).where(
                t_job.c.experiment_id == b("exp"), t_job.c.id > b("after")
            ),
            dialect,
        )

    def _pick(self, skip: frozenset[str]) -> sa.Select:
        """The select of the job a claim takes: the first QUEUED one, of no target in ``skip``."""
        pick = (
            sa.select(t_job.c.id)
            .where(
                t_job.c.experiment_id == b("exp"),
                t_job.c.status == const(Status.QUEUED.value),
                *(t_job.c.target != b(f"skip_{i}", value=target) for i, target in enumerate(sorted(skip))),
            )
            .order_by(t_job.c.priority.desc(), t_job.c.queue_order, t_job.c.id)
            .limit(const(1))
            .offset(const(0))
        )
        return pick.with_for_update(skip_locked=True) if self.dialect.name == "postgresql" else pick

    def _claim(self, pick: sa.Select) -> Prepared:
        return Prepared(
            sa.update(t_job)
            .where(t_job.c.id == pick.scalar_subquery(), t_job.c.status == const(Status.QUEUED.value))
            .values(**claim_values())
            .returning(*(t_job.c[name] for name in self._claimed_columns), _has_parents()),
            self.dialect,
        )

    def claim_skipping(self, skip: frozenset[str]) -> Prepared:
        """The claim of a worker that leaves the jobs of ``skip``'s targets (ones it cannot import)
        QUEUED; compiled once per set, the plain claim when the set is empty."""
        if not skip:
            return self.claim
        found = self._claims_skipping.get(skip)
        if found is None:
            found = self._claims_skipping[skip] = self._claim(self._pick(skip))
        return found

    def claim_pick_skipping(self, skip: frozenset[str]) -> sa.Select:
        """The select of ``claim_skipping`` (to EXPLAIN)."""
        return self._pick(skip)

    @functools.cached_property
    def by_hash(self) -> Prepared:
        """One job of an experiment (``:exp``) by identity (``:h``), every column: a call from Python
        looks its job up so (compiled on first use: a worker never does)."""
        return Prepared(
            sa.select(t_job).where(t_job.c.experiment_id == b("exp"), t_job.c.params_hash == b("h")), self.dialect
        )

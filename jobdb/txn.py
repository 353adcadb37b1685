"""The transaction plumbing under the store's verbs: one kept write connection per process, write
transactions retried on lock and serialization conflicts, read transactions, the event log, and the
recorder that turns a verb into a dry run.

Every status change is logged through :meth:`Transactions.log`, in the transaction that makes it.
While a :class:`Recorder` is active, each logged change is also collected for the caller (``jobman
reset --dry-run`` and the previews that ask before losing something), and with ``rehearse`` every
write transaction is rolled back once its answer is known.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from . import engine as _engine
from .errors import NoSuchExperiment
from .hot import HotStatements
from .schema import experiment as t_exp
from .url import DbTarget

T = TypeVar("T")
CHUNK = 900  # ids per IN (...) list: under SQLite's bound-parameter limit with room to spare
_TRANSIENT = (
    "database is locked",
    "database table is locked",
    "could not serialize",
    "deadlock detected",
    "server closed the connection",
    "connection reset",
    "terminating connection",
)
CHANGE_KEYS = ("job_id", "from_status", "to_status", "why")  # what a recorder keeps of a logged change

_SOURCE: tuple[int, str] = (0, "")


def source_tag() -> str:
    """Who makes a change: host:pid (made once per process)."""
    global _SOURCE
    pid = os.getpid()
    if _SOURCE[0] != pid:
        _SOURCE = (pid, f"{socket.gethostname()}:{pid}")
    return _SOURCE[1]


COPY_EVENTS = 1000  # PostgreSQL: a cascade's events go by COPY from this many on, several times faster
_EVENT_COLUMNS = ("job_id", "at", "from_status", "to_status", "attempt", "why", "source", "data")


def _copy_events(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert event rows through PostgreSQL's COPY, in the transaction of ``conn``."""
    driver = conn.connection.dbapi_connection
    assert driver is not None  # None only once the connection is closed
    cursor = driver.cursor()
    sql = f"COPY job_event ({', '.join(_EVENT_COLUMNS)}) FROM STDIN"
    try:
        with cursor.copy(sql) as copy:
            for r in rows:
                copy.write_row(tuple(r[k] for k in _EVENT_COLUMNS))
    except conn.dialect.loaded_dbapi.Error as exc:
        raise sa.exc.DBAPIError.instance(sql, None, exc, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect) from exc
    finally:
        cursor.close()


def in_list_size(conn: Connection) -> int:
    """Ids per IN (...) list for a verb that may touch a hundred thousand jobs: ten thousand where the
    engine takes them (PostgreSQL; SQLite from 3.32, whose limit is 32,766 parameters), else ``CHUNK``."""
    if conn.dialect.name == "sqlite":
        import sqlite3

        return 10_000 if sqlite3.sqlite_version_info >= (3, 32) else CHUNK
    return 10_000


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def bulk_insert(conn: Connection, table: sa.Table, columns: Sequence[str], rows: Sequence[tuple]) -> None:
    """Insert many rows (tuples in ``columns`` order) through the driver's own executemany.

    The statement is compiled once and values stay bound parameters; this only skips
    SQLAlchemy's per-row processing, which dominates when a sweep inserts 100,000 jobs.
    """
    if not rows:
        return
    compiled = sa.insert(table).compile(dialect=conn.dialect, column_keys=list(columns))
    if compiled.positional:
        where = [list(columns).index(k) for k in compiled.positiontup or ()]
        in_order = where == list(range(len(columns)))
        params: Sequence[Any] = rows if in_order else [tuple(r[i] for i in where) for r in rows]
    else:
        params = [dict(zip(columns, r)) for r in rows]
    conn.exec_driver_sql(str(compiled), params)


class Recorder:
    """The status changes the write transactions log while it is active; with ``rehearse``, a dry run."""

    def __init__(self, rehearse: bool) -> None:
        self.rehearse = rehearse
        self.changes: list[dict[str, Any]] = []

    def wrap(self, fn: Callable[[Connection], T]) -> Callable[[Connection], T]:
        mark = len(self.changes)

        def run(conn: Connection) -> T:
            del self.changes[mark:]  # a retried transaction logs its changes again
            result = fn(conn)
            if self.rehearse:
                raise _Rehearsed(result)
            return result

        return run

    def record(self, rows: list[dict[str, Any]]) -> None:
        self.changes.extend({k: r.get(k) for k in CHANGE_KEYS} for r in rows if r.get("to_status") is not None)


class Transactions:
    """Write and read transactions on one database, and the event log written inside them."""

    def __init__(self, target: DbTarget, engine: Engine, hot: HotStatements, *, one_connection: bool = False) -> None:
        self.target = target
        self.engine = engine
        self.hot = hot
        self.recorder: Recorder | None = None
        self._conn: Connection | None = None
        self._conn_pid = 0
        self._experiment_id: int | None = None
        # A worker's: reads share the kept write connection, and while ``_borrowing`` (its job has run a
        # while) each transaction closes the connection it opened, so the worker holds none in between.
        self.one_connection = one_connection
        self._borrowing = False
        self._writing = False

    def keep_connection(self, keep: bool) -> None:
        """Keep the connection between transactions (jobs follow each other), or not (a job runs on):
        then the kept one is closed now, and each transaction opens one and closes it."""
        self._borrowing = self.one_connection and not keep
        if self._borrowing:
            self.drop_writer()

    def holds_connection(self) -> bool:
        """Whether a connection is kept between transactions."""
        return self._conn is not None and self._conn_pid == os.getpid()

    def experiment(self, conn: Connection, create: bool = False) -> int:
        """The id of the target's experiment (made first with ``create``), read once per store."""
        if self._experiment_id is None:
            self._experiment_id = experiment_id(conn, self.target, create=create)
        return self._experiment_id

    def writer(self) -> Connection:
        """The connection this process writes on: kept between transactions (a worker is one thread)."""
        if self._conn is None or self._conn_pid != os.getpid():
            self._conn = self.engine.connect()
            self._conn_pid = os.getpid()
        return self._conn

    def drop_writer(self, invalidate: bool = False) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and self._conn_pid == os.getpid():
            try:
                if invalidate:
                    conn.invalidate()
                conn.close()
            except sa.exc.SQLAlchemyError:
                pass

    def write(self, fn: Callable[[Connection], T], retries: int = 8) -> T:
        """Run ``fn`` in one write transaction, retrying lock and serialization conflicts."""
        if self.recorder is not None:
            fn = self.recorder.wrap(fn)
        delay = 0.05
        try:
            for attempt in range(retries + 1):
                try:
                    with _engine.translated_errors(self.target):
                        conn = self.writer()
                        self._writing = True
                        try:
                            return _engine.in_write_transaction(conn, fn)
                        except sa.exc.DBAPIError as exc:
                            self.drop_writer(invalidate=exc.connection_invalidated or _engine.is_outage(exc))
                            if attempt < retries and _is_transient(exc):
                                raise _Retry() from exc
                            raise
                        finally:
                            self._writing = False
                            if self._borrowing:
                                self.drop_writer()
                except _Retry:
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
        except _Rehearsed as done:
            return done.result
        raise AssertionError("unreachable")  # pragma: no cover

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one read transaction: every read of the store, the dashboard and the report."""
        if self.one_connection and not self._writing:
            return self._read_on_writer(fn)
        with self.connected() as conn, conn.begin():
            return fn(conn)

    def _read_on_writer(self, fn: Callable[[Connection], T]) -> T:
        """A read on the kept connection (a worker holds one only): ended at once, so the next write begins anew."""
        with _engine.translated_errors(self.target):
            conn = self.writer()
            try:
                with conn.begin():
                    return fn(conn)
            except sa.exc.DBAPIError as exc:
                self.drop_writer(invalidate=exc.connection_invalidated or _engine.is_outage(exc))
                raise
            finally:
                if self._borrowing:
                    self.drop_writer()

    @contextlib.contextmanager
    def connected(self) -> Iterator[Connection]:
        """A read-only connection of its own, its errors said in a sentence; for a read that sets the
        connection up around its transaction (the report) or holds it open (a streamed report)."""
        with _engine.translated_errors(self.target):
            with self.engine.connect().execution_options(jobman_readonly=True) as conn:
                yield conn

    def log(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Log status changes: each row has job_id, from_status, to_status and why, and may set the rest."""
        if rows:
            base = {"at": time.time(), "source": source_tag(), "data": None, "attempt": None}
            if len(rows) >= COPY_EVENTS and conn.dialect.name == "postgresql":
                _copy_events(conn, [{**base, **r} for r in rows])
            else:
                self.hot.event.run_many(conn, [{**base, **r} for r in rows])
            if self.recorder is not None:
                self.recorder.record(rows)

    @contextlib.contextmanager
    def recording(self, rehearse: bool) -> Iterator[Recorder]:
        """Collect the changes of the verbs run inside; with ``rehearse``, roll each one back.
        Not for a store shared between threads meanwhile."""
        self.recorder = recorder = Recorder(rehearse)
        try:
            yield recorder
        finally:
            self.recorder = None
            if rehearse:  # an experiment made in a rehearsal was rolled back with it
                self._experiment_id = None


def experiment_id(conn: Connection, target: DbTarget, *, create: bool = False) -> int:
    """The id of ``target``'s experiment; with ``create``, made if it is new. Without, a missing
    experiment is refused naming those there are."""
    name = target.experiment
    if not create:
        return find_experiment(conn, name, target.display)
    found = conn.execute(sa.select(t_exp.c.id).where(t_exp.c.name == name)).scalar()
    if found is not None:
        return found
    # Two processes may make the same new experiment at once (PostgreSQL lets both try):
    # the second waits for the first's commit, inserts nothing, and reads its row.
    from sqlalchemy.dialects import postgresql, sqlite

    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    found = conn.execute(
        dialect.insert(t_exp)
        .values(name=name, created_at=time.time())
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(t_exp.c.id)
    ).scalar()
    if found is None:
        found = conn.execute(sa.select(t_exp.c.id).where(t_exp.c.name == name)).scalar_one()
    return found


def find_experiment(conn: Connection, name: str, where: str) -> int:
    """The id of experiment ``name``, or the one sentence every read says when there is none: naming the
    database (``where``) and the experiments it has."""
    found = conn.execute(sa.select(t_exp.c.id).where(t_exp.c.name == name)).scalar()
    if found is not None:
        return found
    names = conn.execute(sa.select(t_exp.c.name).order_by(t_exp.c.name)).scalars().all()
    known = ", ".join(names) if names else "none yet"
    raise NoSuchExperiment(f"no experiment {name!r} in {where} (experiments: {known})")


class _Retry(Exception):
    pass


class _Rehearsed(Exception):
    """Carries a rehearsed transaction's answer out of the transaction it rolls back."""

    def __init__(self, result: Any) -> None:
        super().__init__("rehearsal")
        self.result = result


def _is_transient(exc: BaseException) -> bool:
    text = str(getattr(exc, "orig", exc)).lower()
    return any(t in text for t in _TRANSIENT)

"""Connecting: SQLAlchemy engines tuned per database, the schema check, and error translation.

SQLite runs in WAL mode with a busy timeout, and every write transaction starts
with BEGIN IMMEDIATE so that two writers queue on the lock instead of failing
with "database is locked" half-way through; a lock found held is tried again sooner
than SQLite's own waits would (see :func:`begin_immediate`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from . import sqlite_memory
from .connections import WORKER_APPLICATION, ConnectionTurns, refuse_past_the_spare, server_of
from .errors import DatabaseError, DatabaseUnavailable, NoSchema, SchemaError, ServerFull, UsageError
from .hot import execute_raw
from .schema import HEAD_REVISION, VERSION_TABLE, metadata
from .url import DbTarget, mask_password

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_S = 60.0
# A write lock found held is tried again this soon, before SQLite's own waits (see begin_immediate).
SQLITE_LOCK_RETRY_S = 100e-6
SQLITE_CACHE_KIB = 64 * 1024
NETWORK_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "cifs",
    "smbfs",
    "smb3",
    "lustre",
    "gpfs",
    "fuse.sshfs",
    "9p",
    "ceph",
    "fuse.glusterfs",
    "afs",
    "beegfs",
}


def make_engine(target: DbTarget, *, worker: bool = False) -> Engine:
    """An engine for ``target``, with the per-database settings jobman relies on.

    A ``worker``'s PostgreSQL engine pools nothing: the worker keeps the one connection it writes on
    itself (see ``txn.Transactions``), and one it closes is closed on the server, whose connections
    are shared by every worker of a lab. Its connections are named ``jobman-worker`` on the server;
    one that would leave the server fewer free slots than jobman spares is refused, and a machine's
    workers connect to one server a few at a time (``connections``).
    """
    if target.dialect == "sqlite":
        return _sqlite_engine(target)
    # No server-side prepared statements (psycopg prepares a query run five times): they live in one
    # server session, which a PgBouncer in transaction pooling mode does not keep between transactions.
    connect_args: dict = {
        "connect_timeout": 10,
        "application_name": WORKER_APPLICATION if worker else "jobman",
        "prepare_threshold": None,
    }
    pooling: dict[str, Any] = (
        {"poolclass": sa.pool.NullPool} if worker else {"pool_pre_ping": True, "pool_size": 2, "max_overflow": 4}
    )
    engine = sa.create_engine(target.sqlalchemy_url, connect_args=connect_args, **pooling)

    @event.listens_for(engine, "connect")
    def _json_as_text(dbapi_conn: Any, _record: Any) -> None:  # DB-API objects
        for name in ("json", "jsonb"):
            dbapi_conn.adapters.register_loader(name, _canonical_json_loader())

    if target.schema:
        _search_path_per_transaction(engine, target.schema)

    if worker:  # the many: they leave a lab's server its spare connections, and connect a few at a time
        turns = ConnectionTurns(server_of(target.sqlalchemy_url))

        @event.listens_for(engine, "do_connect")
        def _leave_spare(dialect: Any, _record: Any, cargs: Any, cparams: Any) -> Any:  # DB-API objects
            with turns.held():
                dbapi_conn = dialect.connect(*cargs, **cparams)
                refuse_past_the_spare(dbapi_conn, target.display, turns)
            return dbapi_conn

    # The pool logs through a Logger, or through SQLAlchemy's wrapper of one when echo is set per engine.
    _one_line_errors(getattr(engine.pool.logger, "logger", engine.pool.logger))  # type: ignore[arg-type]
    return engine


SCHEMA_KEY = "jobman_schema"  # a connection's info: the schema its transactions resolve tables in


def _search_path_per_transaction(engine: Engine, schema: str) -> None:
    """Every transaction, raw or not, resolves its tables in ``schema``: set at its start (``SET LOCAL``),
    not on the session, which a PgBouncer in transaction pooling mode does not keep between transactions
    (and 1.18 refuses the ``options`` startup parameter a session-wide search path would take)."""

    @event.listens_for(engine, "connect")
    def _remember(_dbapi_conn: Any, record: Any) -> None:  # DB-API objects
        record.info[SCHEMA_KEY] = schema

    @event.listens_for(engine, "begin")
    def _set_search_path(conn: Connection) -> None:
        execute_raw(conn, "SELECT set_config('search_path', %s, true)", (schema,)).close()


_LOADER: type | None = None


def _canonical_json_loader() -> type:
    """A psycopg loader giving jsonb back as jobman's canonical JSON text (keys sorted), the text
    it stored: psycopg would make dicts of it, and jsonb's own text orders keys by length."""
    global _LOADER
    if _LOADER is None:
        from psycopg.adapt import Loader

        from .canonical import dump_json, load_json

        class CanonicalJson(Loader):
            def load(self, data: Any) -> str:
                return dump_json(load_json(bytes(data).decode()))

        _LOADER = CanonicalJson
    return _LOADER


class _OneLine(logging.Filter):
    """The pool's own messages (a dead connection that could not be reset) as one line, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            cause = str(record.exc_info[1]).strip().splitlines()
            record.msg = f"{record.getMessage()}: {mask_password(cause[0] if cause else '')}"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


def _one_line_errors(logger: logging.Logger) -> None:
    if not any(isinstance(f, _OneLine) for f in logger.filters):
        logger.addFilter(_OneLine())


def _sqlite_engine(target: DbTarget) -> Engine:
    sqlite_memory.apply()
    path = target.sqlite_path
    if path:
        refuse_network_filesystem(Path(path))
    read_only = _read_only_connector(path) if path else None
    if read_only is not None:
        engine = sa.create_engine(target.sqlalchemy_url, creator=read_only, poolclass=sa.pool.NullPool)
    else:
        engine = sa.create_engine(
            target.sqlalchemy_url,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
        )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:  # DB-API objects
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
        if mode != "wal":
            try:
                cur.execute("PRAGMA journal_mode = WAL")
            except Exception:  # noqa: BLE001 - a read-only file keeps its mode; writes will say why
                pass
        cur.execute("PRAGMA synchronous = NORMAL")  # durable with WAL across process crashes
        # Up to 64 MiB of pages per connection, taken only as used (the default is 2 MiB): a
        # 100,000-job sweep's rows and indexes stay in memory until the commit writes them.
        cur.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # On the driver's cursor: going through SQLAlchemy's execute costs more than the BEGIN itself.
        # A statement run through SQLAlchemy inside ``in_write_transaction`` joins the transaction begun there.
        if not conn.connection.dbapi_connection.in_transaction:  # type: ignore[union-attr]  # None only once closed
            if conn.get_execution_options().get("jobman_readonly"):
                execute_raw(conn, "BEGIN").close()
            else:
                begin_immediate(conn)

    return engine


def _read_only_connector(path: str) -> Callable[[], Any] | None:
    """How to open a SQLite database whose folder cannot be written (a read-only mount, a folder of
    another user's), or None for any other. SQLite in WAL mode keeps its index in a file beside the
    database, which it could not make there: so the file is opened read-only, beside a writer that
    has one (its ``-shm`` file is there), else as it stands (``immutable``: no writer is at work; each
    transaction opens anew, so one that starts later is seen). A read-only *file* in a writable
    folder needs none of this: SQLite opens it read-only itself."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isfile(path) or os.access(folder, os.W_OK):
        return None
    import sqlite3
    from urllib.parse import quote

    where = quote(os.path.abspath(path))

    def connect() -> sqlite3.Connection:
        still = "" if os.path.exists(f"{path}-shm") else "&immutable=1"
        return sqlite3.connect(
            f"file:{where}?mode=ro{still}", uri=True, timeout=SQLITE_BUSY_TIMEOUT_S, check_same_thread=False
        )

    return connect


def bound_lock_waits(engine: Engine, seconds: float) -> None:
    """Make every transaction on ``engine`` stop waiting for a lock after ``seconds`` (PostgreSQL's
    ``lock_timeout``, set for each transaction alone, so that a PgBouncer's pooling carries it to no
    one else): a read a lock held elsewhere would hold without end fails with a sentence instead.
    SQLite readers in WAL mode wait for no lock; 0 leaves waits unbounded."""
    if engine.dialect.name != "postgresql" or seconds <= 0:
        return
    statement = f"SET LOCAL lock_timeout = {max(1, int(seconds * 1000))}"

    @event.listens_for(engine, "begin")
    def _bounded(conn: Connection) -> None:
        conn.connection.dbapi_connection.execute(statement)  # type: ignore[union-attr]  # None only once closed


def in_write_transaction(conn: Connection, fn: Callable[[Connection], T]) -> T:
    """``fn(conn)`` in one write transaction, begun and ended on the driver's connection.

    A worker runs one such transaction per job, and SQLAlchemy's own begin and commit cost more
    than the transaction itself on SQLite. A statement ``fn`` runs through ``conn.execute`` makes
    SQLAlchemy begin its own transaction, which is this one (see the "begin" listener on SQLite;
    psycopg begins one at a connection's first statement): it is then ended through SQLAlchemy.
    """
    if conn.dialect.name == "sqlite":
        begin_immediate(conn)
    elif SCHEMA_KEY in conn.info and not conn.in_transaction():  # SQLAlchemy's "begin" sets the search path
        conn.begin()
    driver = conn.connection.dbapi_connection
    try:
        result = fn(conn)
    except BaseException:
        try:
            conn.rollback() if conn.in_transaction() else driver.rollback()  # type: ignore[union-attr]  # None only once closed
        except Exception:  # noqa: BLE001 - the connection is gone: the caller drops it, and the database rolls back
            pass
        raise
    if conn.in_transaction():
        conn.commit()
    else:
        try:
            driver.commit()  # type: ignore[union-attr]  # None only once closed
        except conn.dialect.loaded_dbapi.Error as exc:
            raise sa.exc.DBAPIError.instance(
                "COMMIT", (), exc, conn.dialect.loaded_dbapi.Error, dialect=conn.dialect
            ) from exc
    return result


def begin_immediate(conn: Connection) -> None:
    """BEGIN IMMEDIATE on a SQLite connection; when another holds the write lock, one more try soon.

    SQLite's own busy handler sleeps 1 ms before its second try (then 2, 5, 10 ms and longer), while
    a worker's write transaction (a job recorded, the next claimed) holds the lock for about a tenth
    of a millisecond: a worker meeting another's transaction would stay asleep long after the lock
    is free. So the first try is made with the connection's busy timeout off and, should the lock
    be held, a second one ``SQLITE_LOCK_RETRY_S`` later; only then does SQLite's handler wait, up
    to the busy timeout. Shorter waits beyond that one would hand the lock from one process to
    another more often, and each hand-over makes the next writer read again the pages the other
    changed: writers that loop on transactions with nothing in between would lose more than the
    waits save.
    """
    execute_raw(conn, "PRAGMA busy_timeout = 0").close()
    try:
        try:
            execute_raw(conn, "BEGIN IMMEDIATE").close()
            return
        except sa.exc.OperationalError as exc:
            if not _is_busy(exc.orig):
                raise
        time.sleep(SQLITE_LOCK_RETRY_S)
    finally:
        execute_raw(conn, f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}").close()
    execute_raw(conn, "BEGIN IMMEDIATE").close()  # from here SQLite waits, as it would have


def _is_busy(error: BaseException | None) -> bool:
    """SQLITE_BUSY and its extended codes (Python 3.11 names them; 3.10 only says it in words)."""
    code = getattr(error, "sqlite_errorcode", None)
    return code & 0xFF == 5 if code is not None else str(error).startswith("database is locked")


def refuse_network_filesystem(path: Path, mounts: Path = Path("/proc/mounts")) -> None:
    """SQLite's WAL needs shared memory, which a network filesystem does not give: refuse it."""
    if os.environ.get("JOBMAN_ALLOW_NETWORK_SQLITE") == "1":
        return
    fstype = filesystem_type(path.resolve().parent, mounts)
    if fstype in NETWORK_FILESYSTEMS:
        raise DatabaseError(
            f"{path} is on a network filesystem ({fstype}), where SQLite's WAL mode does not work "
            "(sqlite.org/wal.html): use PostgreSQL for a database shared between machines"
        )


def filesystem_type(directory: Path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """The type of the filesystem holding ``directory``, read from ``mounts`` (the /proc/mounts format)."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    best, best_type = "", None
    text = str(directory)
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])  # \040 is a space
        if (text == mount or text.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, best_type = mount, fields[2]
    return best_type


# -- migrations ----------------------------------------------------------------


def alembic_config(connection: Connection) -> Config:
    """An alembic Config that runs the shipped migrations on ``connection``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "jobman:migrations")
    cfg.attributes["connection"] = connection
    return cfg


def _script_directory() -> ScriptDirectory:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", "jobman:migrations")
    return ScriptDirectory.from_config(cfg)


def head_revision() -> str:
    """The newest schema revision this jobman ships."""
    head = _script_directory().get_current_head()
    assert head is not None  # the shipped migrations have one head
    return head


def known_revisions() -> set[str]:
    """Every schema revision this jobman ships."""
    return {rev.revision for rev in _script_directory().walk_revisions()}


def current_revision(conn: Connection) -> str | None:
    """The schema revision stored in the database, or None for a database jobman never touched."""
    if conn.dialect.name == "postgresql":
        check_search_path(conn)
    inspector = sa.inspect(conn)
    schema = None  # the connection's search_path decides
    if not inspector.has_table(VERSION_TABLE, schema=schema):
        if inspector.has_table("job", schema=schema):
            raise SchemaError("this database has a 'job' table that jobman did not make; use another database")
        return None
    table = sa.table(VERSION_TABLE, sa.column("version_num"), schema=schema)
    found = sorted(set(conn.execute(sa.select(table.c.version_num)).scalars()))
    if len(found) > 1:  # alembic would fail on it, and no command can tell which one the tables are at
        raise SchemaError(
            f"the table {VERSION_TABLE} holds {len(found)} schema versions ({', '.join(found)}) where one "
            f"belongs: delete the rows of the versions the tables are not at, then run `jobman db upgrade`"
        )
    return found[0] if found else None


def check_search_path(conn: Connection) -> None:
    """PostgreSQL skips a search_path schema that is missing or that the role may not use, and then
    finds no tables: say which it is, rather than "no jobman tables yet"."""
    if conn.exec_driver_sql("SELECT current_schema()").scalar() is not None:
        return
    path = [p.strip().strip('"') for p in str(conn.exec_driver_sql("SHOW search_path").scalar()).split(",")]
    schema = next((p for p in path if p and p != "$user"), "public")
    if conn.execute(sa.text("SELECT to_regnamespace(:name)"), {"name": schema}).scalar() is None:
        raise SchemaError(
            f"schema {schema!r} does not exist in this database: an administrator makes it "
            f"(CREATE SCHEMA {schema}) and runs `jobman db upgrade` with ?schema={schema}"
        )
    role = conn.exec_driver_sql("SELECT current_user").scalar()
    raise DatabaseError(
        f"permission denied: role {role!r} may not use schema {schema!r} "
        f"(an administrator can GRANT USAGE ON SCHEMA {schema} TO {role}, and access to its tables)"
    )


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Bring the schema to the newest revision; return (before, after)."""
    from alembic import command

    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(4242424242)")
        before = current_revision(conn)
        if before is not None and before not in known_revisions():
            raise _newer_schema(before)
        if before is not None:
            _one_version_row(conn, before)
        command.upgrade(alembic_config(conn), "head")
        after = current_revision(conn)
    return before, after or head_revision()


def _one_version_row(conn: Connection, revision: str) -> None:
    """The same version twice (a version table made without its key) is one: alembic moves a version
    on by updating its one row, and fails on two."""
    table = sa.table(VERSION_TABLE, sa.column("version_num"))
    if conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() > 1:
        conn.execute(sa.delete(table))
        conn.execute(sa.insert(table).values(version_num=revision))


def create_schema(engine: Engine) -> None:
    """A fresh database: the declared tables at once, stamped with the newest revision.

    What ``alembic upgrade head`` would build (a test compares the two), without
    loading alembic and running every migration in turn. If another process created
    the schema meanwhile, its revision is checked instead.
    """
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(4242424242)")
        rev = current_revision(conn)
        if rev is None:
            metadata.create_all(conn)
            version = sa.Table(
                VERSION_TABLE,
                sa.MetaData(),
                sa.Column("version_num", sa.String(32), nullable=False),
                sa.PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
            )
            version.create(conn)
            conn.execute(version.insert(), {"version_num": HEAD_REVISION})
            return
    if rev != HEAD_REVISION:
        ensure_schema(engine, create=False)


def ensure_schema(engine: Engine, create: bool = True) -> None:
    """Create the schema on a fresh database (when ``create``); refuse an older or newer one."""
    with engine.connect().execution_options(jobman_readonly=True) as conn:
        rev = current_revision(conn)
    if rev == HEAD_REVISION:  # the common case, decided without loading alembic
        return
    if rev is None:
        if not create:
            raise NoSchema(
                "this database has no jobman tables yet: schedule a sweep first (or run `jobman db upgrade`)"
            )
        create_schema(engine)
        return
    head = head_revision()
    if rev == head:
        return
    if rev in known_revisions():
        raise SchemaError(
            f"the database schema is at revision {rev}, older than this jobman's {head}: run `jobman db upgrade`"
        )
    raise _newer_schema(rev)


def _newer_schema(rev: str) -> SchemaError:
    return SchemaError(
        f"the database schema is at revision {rev}, which this jobman does not know: "
        "it was made by a newer jobman, so upgrade jobman"
    )


class translated_errors:
    """Turn driver errors a user can meet into one-sentence :class:`DatabaseError` (a context manager).

    A class rather than a generator: a worker enters it once per job.
    """

    def __init__(self, target: DbTarget) -> None:
        self.target = target

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, _tb: object) -> None:
        if isinstance(exc, sa.exc.DBAPIError):
            kind = ServerFull if is_server_full(exc) else DatabaseUnavailable if is_outage(exc) else DatabaseError
            raise kind(describe_db_error(exc, self.target)) from exc
        if isinstance(exc, OverflowError):  # SQLite's driver refuses an integer past 64 bits first
            raise UsageError(f"a number is too large for {self.target.display}: {exc}") from exc


# What a server that is down, restarting or failing over says; not a bad URL, password or database.
_OUTAGE = (
    "connection refused",
    "server closed the connection",
    "terminating connection",
    "connection reset",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "the database system is not yet accepting",
    "connection timed out",
    "timeout expired",
    "no connection to the server",
    "connection is closed",
    "consuming input failed",
    "ssl connection has been closed",
    "broken pipe",
    "connection to server",
    "network is unreachable",
    "no route to host",
    "cannot connect now",
)
_NOT_OUTAGE = (
    "password",
    "does not exist",
    "no pg_hba.conf entry",
    "could not translate host name",
    "name or service not known",
)


# A server (or PgBouncer) with every connection slot taken: SQLSTATE 53300, which psycopg gives only in words
# when it is refused at connect time.
_FULL = (
    "too many clients",
    "remaining connection slots are reserved",
    "no more connections allowed",
    "too many connections for role",
    "too many connections for database",
)


def is_server_full(exc: BaseException) -> bool:
    """Whether a driver error is the server refusing a connection for want of a free slot."""
    orig = getattr(exc, "orig", exc)
    if getattr(orig, "sqlstate", None) == "53300":
        return True
    low = str(orig or "").lower()
    return any(t in low for t in _FULL)


def is_outage(exc: BaseException) -> bool:
    """Whether a driver error is the server being away for now, to be waited out rather than reported."""
    if not isinstance(exc, sa.exc.DBAPIError) or isinstance(exc.orig, _sqlite_errors()):
        return False
    low = str(getattr(exc, "orig", exc) or "").lower()
    if any(t in low for t in _NOT_OUTAGE):
        return False
    return bool(exc.connection_invalidated) or any(t in low for t in _OUTAGE)


def _sqlite_errors() -> tuple[type, ...]:
    import sqlite3

    return (sqlite3.Error,)


def _no_space_beside(path: str | None) -> bool:
    """SQLite reports a write refused for want of space as a "disk I/O error": tell it apart."""
    if not path or path == ":memory:":
        return False
    try:
        fs = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < 64 * 1024


def describe_db_error(exc: BaseException, target: DbTarget) -> str:
    """One sentence for a database error, with passwords masked."""
    text = str(getattr(exc, "orig", exc) or exc).strip().splitlines()[0] if str(exc) else type(exc).__name__
    low = text.lower()
    where = target.display
    if "readonly database" in low or "read-only" in low:
        return f"cannot write to {where}: the database file or its directory is read-only"
    if (
        "disk is full" in low
        or "no space left" in low
        or "disk full" in low
        or ("disk i/o error" in low and _no_space_beside(target.sqlite_path))
    ):
        return f"cannot write to {where}: the disk is full"
    if "unable to open database file" in low:
        path = target.sqlite_path
        if (
            path
            and os.path.exists(path)
            and not (os.access(path, os.W_OK) and os.access(os.path.dirname(os.path.abspath(path)), os.W_OK))
        ):
            return f"cannot open {where}: the database file or its directory is read-only (SQLite writes beside it)"
        return f"cannot open {where}: the file or its directory does not exist or is not accessible"
    if "password authentication failed" in low:
        return f"cannot connect to {where}: the password was refused"
    if "no password supplied" in low:
        return (
            f"cannot connect to {where}: the server asks for a password and none was given "
            "(put it in the URL, ~/.pgpass or PGPASSWORD)"
        )
    if "does not exist" in low and "role" in low:
        return f"cannot connect to {where}: that role (user) does not exist"
    if "does not exist" in low and "database" in low:
        return f"cannot connect to {where}: that database does not exist"
    if is_server_full(exc):
        return f"{where} refused a connection: the server has no free connection slot ({mask_password(text)})"
    if (
        "connection refused" in low
        or "could not connect" in low
        or "timeout" in low
        or "timed out" in low
        or "could not translate host name" in low
        or "name or service not known" in low
    ):
        return f"cannot connect to {where}: the server is unreachable ({mask_password(text)})"
    if is_outage(exc):
        return f"lost the connection to {where}: the server went away ({mask_password(text)})"
    if "permission denied" in low:
        return f"{where}: permission denied ({mask_password(text)})"
    return f"database error on {where}: {mask_password(text)}"

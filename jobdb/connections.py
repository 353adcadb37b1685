"""How a PostgreSQL server's connection slots are taken, and the share of them jobman's workers may take.

A lab's server serves more than jobman: its workers leave it its spare slots (``JOBMAN_PG_SPARE``, by
default a tenth of ``max_connections``), their looks at a full server included. Each look is a
connection, made, counted and closed: seen from the server, the looks of the workers waiting for a
slot stand on top of the connections the others hold. So a worker keeps a new connection only while
the server has, besides the spare slots, a few more free (``looking_room``) in which those looks come
and go; one past that is closed at once and refused as a full server is (:class:`ServerFull`, saying
how far past it was, which the waiting stretches), and waited for the same way. ``jobman dispatch``
reads the same figures to say, once, that the server has no connection to spare and how many of them
jobman holds.

The server's reserved slots are not kept by counting alone. Every connection attempt, one the server
then refuses included, takes a slot for its short life: a crowd of workers looking at once can take
them all, and an administrator's ``psql`` is then told "too many clients". So a machine's workers take
turns at connecting to one server (:class:`ConnectionTurns`): as many at once as half the free slots
the last of them found (outside the spare ones), two when the server is full or not yet asked, and
many through a PgBouncer, whose server has its slots free. A Slurm array's attempts, spread over many
machines, are bounded per machine.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sqlalchemy.engine import Connection, make_url

from .errors import ServerFull, UsageError

WORKER_APPLICATION = "jobman-worker"  # a worker's connections, as pg_stat_activity names them
JOBMAN_APPLICATIONS = ("jobman", WORKER_APPLICATION)  # the application names jobman's connections carry
SPARE_VARIABLE = "JOBMAN_PG_SPARE"

_USE = (
    "SELECT count(*), count(*) FILTER (WHERE application_name = ANY(%(names)s)), "
    "current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int "
    "FROM pg_stat_activity WHERE backend_type = 'client backend'"
)


@dataclass(frozen=True)
class ConnectionUse:
    """The server's client connections, jobman's among them, and its limits."""

    total: int
    jobman: int
    limit: int  # max_connections
    reserved: int  # superuser_reserved_connections: slots an ordinary role cannot take

    @property
    def spare(self) -> int:
        """The slots jobman's workers leave free for others."""
        return spare_connections(self.limit)

    @property
    def kept(self) -> int:
        """The connections past which a worker's new one is refused."""
        return kept_connections(self.limit, self.reserved)

    @property
    def full(self) -> bool:
        """Whether a worker's next connection would be refused, by the server or by the spare slots."""
        return self.total >= self.kept


def spare_connections(limit: int) -> int:
    """How many of a server's ``limit`` connections jobman's workers leave to others."""
    text = os.environ.get(SPARE_VARIABLE, "").strip()
    if not text:
        return max(2, limit // 10)
    try:
        spare = int(text)
    except ValueError:
        spare = -1
    if spare < 0:
        raise UsageError(f"{SPARE_VARIABLE} must be a whole number of connections (0 or more), not {text!r}")
    return spare


def looking_room(limit: int) -> int:
    """The slots, below the spare ones, that workers leave to their own looks at a full server: as many as
    the spare slots, so that the looks in flight seldom reach the spare slots themselves. Measured with
    150 workers starting at once on two loaded cores, a room of half the spare slots let the looks of the
    workers waiting reach 91 of a server's 100 (4 more than jobman's share of 87)."""
    return spare_connections(limit)


def kept_connections(limit: int, reserved: int) -> int:
    """How many client connections a server may have for a worker to keep a new one (counting it)."""
    return limit - reserved - spare_connections(limit) - looking_room(limit)


def connection_use(conn: Connection) -> ConnectionUse:
    """The server's connection slots as they are taken now (PostgreSQL only)."""
    row = conn.exec_driver_sql(_USE, {"names": list(JOBMAN_APPLICATIONS)}).one()
    return ConnectionUse(int(row[0]), int(row[1]), int(row[2]), int(row[3]))


def refuse_past_the_spare(dbapi_conn: Any, where: str, turns: ConnectionTurns) -> None:
    """On a worker's new connection: close it and raise :class:`ServerFull` if, with it, the server has
    fewer free slots than jobman leaves to others. The connection counts itself, so of two made at once
    the later one (or both) sees the other. What it found sets how many of this machine's ``turns``
    connect at once."""
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(_USE, {"names": list(JOBMAN_APPLICATIONS)})
        total, jobman, limit, reserved = (int(v) for v in cursor.fetchone())
    finally:
        cursor.close()
        dbapi_conn.rollback()
    kept = kept_connections(limit, reserved)
    turns.found(limit - reserved - spare_connections(limit) - total)
    if total > kept:
        dbapi_conn.close()
        raise ServerFull(
            f"{where} has no connection to spare: {total} of the {limit - reserved} it allows "
            f"ordinary roles are taken ({jobman} by jobman), and jobman leaves {spare_connections(limit)} "
            f"free for others ({SPARE_VARIABLE})",
            over=total - kept,
        )


# A machine's workers' connection attempts on one server in flight at once: half the free slots the last
# attempt found, within these bounds. Measured with 110 workers on a server of 30 slots (21 kept by
# jobman), attempts made without turns reached the spare slots a few times a run and now and then every
# slot, the superusers' too; two at a time at most, 200 workers' start through a PgBouncer cost a fifth
# of their jobs/s.
FEWEST_TURNS, MOST_TURNS = 2, 32
FOUND_FOR = 30.0  # seconds what an attempt found stands for; older, the fewest turns


def server_of(sqlalchemy_url: str) -> str:
    """The server a URL connects to (host and port), whose slots its connections share."""
    url = make_url(sqlalchemy_url)
    host = url.host or str(url.query.get("host") or "local")
    return f"{host}:{url.port or 5432}"


class ConnectionTurns:
    """This machine's turns at connecting to one server, as lock files (``flock``, let go when their
    holder ends however it ends) and a note of the free slots the last attempt found, in a directory of
    the user's own. Without such a directory (no writable temporary directory, no ``flock``) an attempt
    goes ahead at once."""

    def __init__(self, server: str) -> None:
        self.directory = Path(tempfile.gettempdir()) / f"jobman-{os.getuid()}"
        self.stem = "connect-" + hashlib.sha1(server.encode()).hexdigest()[:16]

    def _note(self) -> Path:
        return self.directory / f"{self.stem}.free"

    def turns(self) -> int:
        """How many attempts may be in flight at once, from what the last one found."""
        try:
            note = self._note()
            if time.time() - note.stat().st_mtime > FOUND_FOR:
                return FEWEST_TURNS
            free = int(note.read_text())
        except (OSError, ValueError):
            return FEWEST_TURNS
        return max(FEWEST_TURNS, min(MOST_TURNS, free // 2))

    def found(self, free: int) -> None:
        """Note the free slots (past the spare ones) an attempt found, for the attempts after it."""
        try:
            part = self.directory / f"{self.stem}.{os.getpid()}"
            part.write_text(str(free))
            os.replace(part, self._note())
        except OSError:
            pass

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold a turn: a free one if there is, else wait for one, taken at random so that the waiting
        spread over them."""
        held = None
        try:
            import fcntl

            self.directory.mkdir(mode=0o700, exist_ok=True)
            paths = [self.directory / f"{self.stem}-{i}.lock" for i in range(self.turns())]
            random.shuffle(paths)
            for path in paths:
                if (held := _locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)) is not None:
                    break
            else:
                held = _locked(paths[0], fcntl.LOCK_EX)
        except (ImportError, OSError):
            pass
        try:
            yield
        finally:
            if held is not None:
                held.close()


def _locked(path: Path, how: int) -> IO[str] | None:
    """``path`` opened and ``flock``-ed ``how``; None if a non-blocking lock is held by another."""
    import fcntl

    fh = open(path, "a")
    try:
        fcntl.flock(fh, how)
    except BlockingIOError:
        fh.close()
        return None
    except BaseException:
        fh.close()
        raise
    return fh

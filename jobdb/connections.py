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
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

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


def refuse_past_the_spare(dbapi_conn: Any, where: str) -> None:
    """On a worker's new connection: close it and raise :class:`ServerFull` if, with it, the server has
    fewer free slots than jobman leaves to others. The connection counts itself, so of two made at once
    the later one (or both) sees the other."""
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(_USE, {"names": list(JOBMAN_APPLICATIONS)})
        total, jobman, limit, reserved = (int(v) for v in cursor.fetchone())
    finally:
        cursor.close()
        dbapi_conn.rollback()
    kept = kept_connections(limit, reserved)
    if total > kept:
        dbapi_conn.close()
        raise ServerFull(
            f"{where} has no connection to spare: {total} of the {limit - reserved} it allows "
            f"ordinary roles are taken ({jobman} by jobman), and jobman leaves {spare_connections(limit)} "
            f"free for others ({SPARE_VARIABLE})",
            over=total - kept,
        )

"""The database server's clock, for the times that say whether a job is alive.

Heartbeats, claims and finishes are compared across hosts (a monitor on one host
reads what workers on others wrote), so they are stamped with one clock: the
database server's (PostgreSQL's ``clock_timestamp()``; SQLite's, which is its
one host's). It is read in the transaction being run, once and then every few
minutes, and followed in between on this host's monotonic clock: a worker whose
wall clock is wrong, or is stepped, stamps the server's time all the same, and the
hot statements cost nothing more.
"""

from __future__ import annotations

import time

from sqlalchemy.engine import Connection

from .hot import execute_raw

REREAD_AFTER = 300.0  # seconds: the monotonic clock drifts little in that time

_NOW_SQL = {
    "postgresql": "SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8",
    "sqlite": "SELECT (julianday('now') - 2440587.5) * 86400.0",
}


class ServerClock:
    """Seconds since the epoch by the database server's clock, as ``time.time()`` counts them."""

    def __init__(self, dialect: str) -> None:
        self.sql = _NOW_SQL.get(dialect)
        self._offset: float | None = None  # server time minus time.monotonic()
        self._read_at = 0.0

    def now(self, conn: Connection) -> float:
        """The server's time now; read on ``conn`` (in its transaction) when due."""
        mono, offset = time.monotonic(), self._offset
        if offset is None or mono - self._read_at > REREAD_AFTER:
            offset = self._read(conn)
            mono = time.monotonic()
        return mono + offset

    def _read(self, conn: Connection) -> float:
        """Read the server's clock and keep its offset from this host's monotonic clock; returns it."""
        if self.sql is None:  # a database we know no clock query for: this host's clock
            self._offset, self._read_at = time.time() - time.monotonic(), time.monotonic()
            return self._offset
        before = time.monotonic()
        cursor = execute_raw(conn, self.sql)
        try:
            server = float(cursor.fetchone()[0])
        finally:
            cursor.close()
        after = time.monotonic()
        self._offset, self._read_at = server - (before + after) / 2, after
        return self._offset

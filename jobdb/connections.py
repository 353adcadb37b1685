"""How a PostgreSQL server's connection slots are taken: by every client, and by jobman's own.

``jobman dispatch`` reads it to say, once, that the server is refusing connections and how many of
them jobman holds; a lab's server serves more than jobman.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Connection

from .engine import WORKER_APPLICATION

JOBMAN_APPLICATIONS = ("jobman", WORKER_APPLICATION)  # the application names jobman's connections carry


@dataclass(frozen=True)
class ConnectionUse:
    """The server's client connections, jobman's among them, and its limits."""

    total: int
    jobman: int
    limit: int  # max_connections
    reserved: int  # superuser_reserved_connections: slots an ordinary role cannot take

    @property
    def full(self) -> bool:
        """Whether an ordinary role's next connection would be refused."""
        return self.total >= self.limit - self.reserved


def connection_use(conn: Connection) -> ConnectionUse:
    """The server's connection slots as they are taken now (PostgreSQL only)."""
    row = conn.exec_driver_sql(
        "SELECT count(*), count(*) FILTER (WHERE application_name = ANY(%(names)s)), "
        "current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int "
        "FROM pg_stat_activity WHERE backend_type = 'client backend'", {"names": list(JOBMAN_APPLICATIONS)}).one()
    return ConnectionUse(int(row[0]), int(row[1]), int(row[2]), int(row[3]))

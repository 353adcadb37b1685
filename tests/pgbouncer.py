"""A real PgBouncer for the tests, in transaction pooling mode, in front of the test PostgreSQL.

Debian's ``pgbouncer`` (1.18) keeps no prepared statements across transactions in that
mode, and hands each transaction to whichever server connection is free: what jobman
runs through it must not depend on a server session. It refuses to run as root, so it
runs as ``postgres``; its configuration, auth file, log and pid file live in one
temporary directory, and it listens on a free port of 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

PGBOUNCER = shutil.which("pgbouncer", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


class PgBouncerError(Exception):
    """The test PgBouncer could not be started."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(argv: list[str]) -> list[str]:
    """``argv`` run as user postgres when we are root (PgBouncer refuses root)."""
    if os.geteuid() != 0:
        return argv
    runuser = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin")
    if runuser is None:
        raise PgBouncerError("runuser is missing: PgBouncer cannot be started as user postgres")
    return [runuser, "-u", "postgres", "--", *argv]


def start_pgbouncer(server_url: str, pool_size: int = 10) -> tuple[str, Path]:
    """Start a PgBouncer in front of ``server_url`` (``postgresql://user@host:port/db``): its address
    ``host:port`` and its directory, whose pid file :func:`stop_pgbouncer` reads."""
    if PGBOUNCER is None:
        raise PgBouncerError("pgbouncer is not installed (apt-get install pgbouncer)")
    server = urlsplit(server_url.replace("postgresql+psycopg://", "postgresql://"))
    user = server.username or "postgres"
    directory = Path(tempfile.mkdtemp(prefix="jobman-pgbouncer-"))
    port = _free_port()
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(f"""[databases]
* = host={server.hostname or "127.0.0.1"} port={server.port or 5432}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 2000
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = {directory / "pgbouncer.log"}
pidfile = {directory / "pgbouncer.pid"}
""")
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres")
        for name in ("users.txt", "pgbouncer.ini"):
            shutil.chown(directory / name, "postgres")
    proc = subprocess.run(
        _as_postgres([PGBOUNCER, "-d", str(directory / "pgbouncer.ini")]), capture_output=True, text=True, timeout=30
    )
    if proc.returncode != 0:
        raise PgBouncerError(f"pgbouncer did not start: {(proc.stderr or proc.stdout).strip()}")
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return f"127.0.0.1:{port}", directory
        except OSError:
            time.sleep(0.05)
    stop_pgbouncer(directory)
    raise PgBouncerError(f"pgbouncer did not listen on port {port} within 10 s")


def stop_pgbouncer(directory: Path) -> None:
    """Stop the PgBouncer started in ``directory`` and remove the directory."""
    pid_file = directory / "pgbouncer.pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 15)
        deadline = time.time() + 10
        while time.time() < deadline:
            os.kill(pid, 0)
            time.sleep(0.05)
    except (OSError, ValueError):
        pass
    shutil.rmtree(directory, ignore_errors=True)


def through_pgbouncer(url: str, address: str) -> str:
    """``url`` (a database on the test server) with its host and port replaced by PgBouncer's."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return parts._replace(netloc=f"{user}{address}").geturl()


def pgbouncer_fixture(server_url: str) -> Iterator[str]:
    """For a session-scoped fixture: yields PgBouncer's ``host:port``, then stops it."""
    address, directory = start_pgbouncer(server_url)
    try:
        yield address
    finally:
        stop_pgbouncer(directory)

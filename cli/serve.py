"""``jobman serve``: the web dashboard of a database, on 127.0.0.1 behind a token by default."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import secrets
import socket
import sys
import threading
import time
from urllib.parse import quote

import click

from jobman.jobdb import serving
from jobman.jobdb.errors import UsageError

from .common import Database, with_database

INSTALL_HINT = "jobman serve needs the web extra: pip install 'jobman-sql[web]'"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the server starts so that a taken port is one sentence."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        if exc.errno == 98:
            raise UsageError(f"port {port} on {host} is taken: choose another with --port") from None
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


@click.command("serve")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8787,
    show_default=True,
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--token",
    envvar="JOBMAN_TOKEN",
    default=None,
    help="The token every request needs (default: a new random one, printed in the link).",
)
@click.option("--no-token", is_flag=True, help="Serve without a token (only on 127.0.0.1).")
@click.option("--allow-actions", is_flag=True, help="Offer reset, retry, cancel and priority on job pages.")
def serve(database: Database, host: str, port: int, token: str | None, no_token: bool, allow_actions: bool) -> int:
    """Serve a live web dashboard of the database: experiments, jobs, reports, learning curves.

    \b
    Example:
      jobman serve 'sqlite:///sweeps.db'        # prints http://127.0.0.1:8787/s/<id>/?token=...
      jobman serve 'postgresql://me@dbhost/lab' --allow-actions --port 9000
    Open the printed link; every request needs its token. Actions (with --allow-actions)
    go through the same store verbs as `jobman reset`, `retry`, `cancel` and `set-priority`.
    """
    try:
        import uvicorn

        from jobman.web.app import create_app
    except ImportError:
        raise UsageError(INSTALL_HINT) from None
    if no_token and not is_loopback(host):
        raise UsageError(
            f"serving {host} without a token would open the database to the network: "
            "drop --no-token (or serve 127.0.0.1)"
        )
    if no_token and token:
        raise UsageError("--token and --no-token contradict each other: give one")
    if token is not None and len(token) < 8:
        raise UsageError("a token needs at least 8 characters")
    token = None if no_token else (token or secrets.token_urlsafe(24))
    if database.url_arg and "://" not in database.url_arg:
        raise UsageError(f"{database.url_arg!r} is not a database URL (sqlite:///file.db, postgresql://user@host/db)")
    target, raw_url = database.target, database.raw_url
    sock = listening_socket(host, port)
    port = sock.getsockname()[1]
    app = create_app(raw_url or "", token=token, allow_actions=allow_actions, host=host, port=port)
    shown = f"[{host}]" if ":" in host else host
    base = app.state.base  # the secret path the whole dashboard lives under
    path = f"/e/{quote(target.experiment)}" if database.table or (raw_url and "table=" in raw_url) else "/"
    link = f"http://{shown}:{port}{base}{path}" + (f"?token={token}" if token else "")
    click.echo(f"jobman serve: {link}")
    click.echo(f"database: {target.display}" + ("; actions on" if allow_actions else ""))
    sys.stdout.flush()
    # SIGTERM or Ctrl-C: requests under way get a few seconds, then the server stops whatever they do.
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=STOP_SECONDS
    )
    logging.getLogger("uvicorn.error").addFilter(_EndedRequests())
    listed = serving.register(target, f"http://{shown}:{port}{base}", token)  # a notebook links here
    code = 130  # what is left if Ctrl-C ends the server
    try:  # on SIGTERM the server ends the process as the signal would, once it has stopped
        uvicorn.Server(config).run(sockets=[sock])
        code = 0
    finally:
        serving.unregister(listed)
        leave_stuck_requests(code)
    return 0


STOP_SECONDS = 3


class _EndedRequests(logging.Filter):
    """A request the stopping server ended (its task cancelled past STOP_SECONDS) is one line, not a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            record.msg, record.args = "a request still under way was ended as the server stopped", ()
            record.exc_info, record.exc_text = None, None
        return True


def leave_stuck_requests(code: int) -> None:
    """Exit now if a request's thread is still stuck once the server has stopped (a read of a database
    that never answers, met by Ctrl-C): Python would wait for it at exit, and a stopped server must end."""
    deadline = time.monotonic() + STOP_SECONDS
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


COMMANDS = [serve]

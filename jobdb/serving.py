"""Which dashboards are serving which database, so that a notebook can link to the one showing its
experiment.

``jobman serve`` writes a small file while it runs (as Jupyter's server does: ``jpserver-PID.json``):
its link, token and database, readable by its user only. A reader keeps the files whose process is
still the one that wrote them (pid and start time, so a reused pid is not mistaken) and serves the
same database; a file left by a server killed with SIGKILL is ignored, and removed when found.
``$JOBMAN_DASHBOARD`` (the link such a server printed, ``http://host:8787/s/<id>/?token=...``) names a
server this host cannot see (one on another node): its host, secret path and token are used as they are.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psutil

from .url import DbTarget

PREFIX = "serve-"


def runtime_dir() -> Path:
    """Where serving dashboards are listed: ``$JOBMAN_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/jobman``,
    else ``~/.local/share/jobman/runtime``."""
    own = os.environ.get("JOBMAN_RUNTIME_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) / "jobman" if xdg else Path.home() / ".local" / "share" / "jobman" / "runtime"


def database_key(target: DbTarget) -> str:
    """The database a target names, whatever experiment: the same for every table of one file or server."""
    return target.sqlalchemy_url + (f"#{target.schema}" if target.schema else "")


def register(target: DbTarget, base: str, token: str | None) -> Path | None:
    """List this process as serving ``target``'s database at ``base`` (``http://host:port/s/<id>``, the
    secret path its pages live under); None when
    the runtime folder cannot be written (the server serves all the same, unlisted)."""
    try:
        return _write(target, base, token)
    except OSError:
        return None


def _write(target: DbTarget, base: str, token: str | None) -> Path:
    folder = runtime_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    me = psutil.Process()
    path = folder / f"{PREFIX}{me.pid}.json"
    record = {"pid": me.pid, "started": me.create_time(), "base": base, "token": token, "db": database_key(target)}
    part = path.with_name(f".{path.name}.part")  # renamed when whole: a reader never sees half a file
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the token is a key to the database
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh)
    os.replace(part, path)
    return path


def unregister(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def dashboard_link(target: DbTarget, job_id: int | None = None) -> str | None:
    """A link to ``target``'s experiment (or one of its jobs) on a dashboard serving its database,
    or None when none is known."""
    path = f"/e/{quote(target.experiment, safe='')}" + (f"/job/{job_id}" if job_id is not None else "")
    given = os.environ.get("JOBMAN_DASHBOARD", "").strip()
    if given:
        parts = urlsplit(given)
        # the printed link's path is the server's secret prefix (and maybe a page under it): keep the prefix
        prefix = parts.path.split("/e/", 1)[0].rstrip("/")
        return urlunsplit((parts.scheme, parts.netloc, prefix + path, parts.query, ""))
    for record in _live():
        if record.get("db") == database_key(target):
            token = record.get("token") if _loopback(str(record["base"])) else None
            return f"{record['base']}{path}" + (f"?token={quote(str(token))}" if token else "")
    return None


def _loopback(base: str) -> bool:
    """True for a server only this host can reach. Only its links carry the token: a notebook's
    outputs are saved and shared, and a browser that opened the link ``jobman serve`` printed
    already holds the token of a server on the network as a cookie."""
    host = urlsplit(base).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _live() -> list[dict]:
    """The records of dashboards still serving, newest first; a dead server's record is removed."""
    folder = runtime_dir()
    try:
        paths = list(folder.glob(f"{PREFIX}*.json"))
    except OSError:
        return []
    found = []
    for path in paths:
        try:
            record = json.loads(path.read_text())
            pid, started = int(record["pid"]), float(record["started"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not one of ours, or gone meanwhile
        try:
            alive = psutil.Process(pid).create_time() == started
        except psutil.NoSuchProcess:
            alive = False
        except psutil.Error:  # another user's process: not ours to judge
            continue
        if alive:
            found.append(record)
        else:
            unregister(path)
    return sorted(found, key=lambda r: -float(r["started"]))

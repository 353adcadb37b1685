"""What every command shares: how the database is named, opening the store, rendering."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import click

from jobman.jobdb.errors import UsageError
from jobman.jobdb.selection import LIST_DIGITS, format_param
from jobman.jobdb.status import Status
from jobman.jobdb.store import Job, Store
from jobman.jobdb.url import DbTarget, parse_db

if TYPE_CHECKING:
    from rich.console import Console


class LazyConsole:
    """A rich ``Console``, made on first use: a command that shows nothing through rich (a worker,
    whose log gets plain lines) starts without importing it. Attributes are the console's own;
    ``console`` is the console itself, for what rich wants one of (a live display, a progress bar)."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.console, name)


out = LazyConsole(soft_wrap=True)
err = LazyConsole(stderr=True, soft_wrap=True)

STATUS_STYLE = {
    "WAITING": "dim",
    "QUEUED": "cyan",
    "RUNNING": "bold yellow",
    "DONE": "green",
    "FAILED": "bold red",
    "CRASHED": "bold magenta",
    "CANCELED": "dim red",
    "BLOCKED": "red",
}


def db_options(fn: Callable) -> Callable:
    """``[DB]`` positional (a URL, jobman style) plus ``--db`` and ``--table`` on every command."""
    fn = click.option(
        "--table", "-t", "table", metavar="NAME", help="Experiment (jobman's table) name; overrides ?table= in the URL."
    )(fn)
    fn = click.option(
        "--db",
        "db",
        metavar="URL",
        envvar="JOBMAN_DB",
        help="Database URL (sqlite:///file.db?table=T, postgresql://user@host/db?table=T). "
        "Default: $JOBMAN_DB, else sqlite:///jobman.db.",
    )(fn)
    return fn


def split_db_arg(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take a leading database URL out of positional arguments, if there is one."""
    if args and "://" in args[0]:
        return args[0], list(args[1:])
    return None, list(args)


def target_of(db: str | None, table: str | None, url_arg: str | None = None) -> DbTarget:
    """The database and experiment: a URL given as first argument wins over --db and $JOBMAN_DB."""
    return parse_db(url_arg or db, table)


class Database:
    """The database and experiment a command was given, read and opened only when the command needs them.

    A command checks its own arguments first, so bad input is named before the database is touched
    (and nothing is created for a command that then refuses).
    """

    def __init__(self, url_arg: str | None, db: str | None, table: str | None, *, create: bool = False) -> None:
        self.url_arg, self.db, self.table, self.create = url_arg, db, table, create

    @property
    def raw_url(self) -> str | None:
        """The URL as given: the first argument, else --db (or $JOBMAN_DB)."""
        return self.url_arg or self.db

    @functools.cached_property
    def target(self) -> DbTarget:
        return target_of(self.db, self.table, self.url_arg)

    def open(self) -> Store:
        return Store(self.target, create=self.create)


def with_database(rest: str | None = None, *, create: bool = False) -> Callable[[Callable], Callable]:
    """``db_options``, and the command gets one ``database`` (a :class:`Database`) for its URL, --db and --table.

    Without ``rest`` the command's ``[DB]`` argument is named ``url``; with it, ``rest`` names its variadic
    argument, whose leading URL (if any) is taken out before the command sees it.
    """

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, db: str | None, table: str | None, **kwargs: Any) -> Any:
            if rest is None:
                url_arg = kwargs.pop("url")
            else:
                url_arg, remaining = split_db_arg(kwargs[rest])
                kwargs[rest] = tuple(remaining)
            return fn(*args, database=Database(url_arg, db, table, create=create), **kwargs)

        return db_options(wrapper)

    return decorate


class _Stderr(logging.Handler):
    """Log lines on ``err``: whatever stderr is now, and above a live progress display when one is shown."""

    def __init__(self) -> None:
        super().__init__()
        self._stream: object = None  # the stderr last written to, and whether it is a terminal
        self._terminal = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line, stream = self.format(record), sys.stderr
            if stream is not self._stream:
                self._stream, self._terminal = stream, _may_be_terminal(stream) and err.is_terminal
            if self._terminal:  # a live display may be on screen: rich writes the line above it
                err.print(line, markup=False, highlight=False, emoji=False)
            else:  # a file or a pipe (a worker's log: two lines a job): the line as it is, unrendered
                stream.write(line + "\n")
                stream.flush()
        except Exception:  # noqa: BLE001 - logging must never break the command
            self.handleError(record)


def _may_be_terminal(stream: Any) -> bool:
    """False when rich would surely not take ``stream`` for a terminal (not a tty, and no variable
    saying otherwise), told without importing rich."""
    if any(name in os.environ for name in ("FORCE_COLOR", "TTY_COMPATIBLE")):
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def log_to_stderr(fmt: str, verbose: bool = False) -> None:
    """Send the ``jobman`` loggers' lines to stderr in ``fmt`` (a ``logging`` format): info and above,
    or debug too with ``verbose``. Only the commands' entry points call this, never an import."""
    root = logging.getLogger("jobman")
    for handler in [h for h in root.handlers if isinstance(h, _Stderr)]:
        root.removeHandler(handler)
    handler = _Stderr()
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False


def verbose_option(fn: Callable) -> Callable:
    return click.option("--verbose", is_flag=True, help="Show debug lines in the log too.")(fn)


MAX_JOB_ID = 2**63 - 1  # the largest integer SQLite (and PostgreSQL's bigint) can hold
MAX_ID_RANGE = 10_000_000  # ids one range may name: more is a typo, and would fill the memory


def parse_ids(values: Iterable[str]) -> list[int]:
    """Job ids from ``12 13``, ``12,13`` or ``10-20``."""
    ids: list[int] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                if "-" in part[1:]:
                    lo, hi = part.split("-", 1)
                    first, last = int(lo), int(hi)
                    if last - first >= MAX_ID_RANGE:
                        raise UsageError(f"{part!r} spans more than {MAX_ID_RANGE:,} job ids: narrow it")
                    ids.extend(range(first, last + 1))
                else:
                    ids.append(int(part))
            except ValueError:
                raise UsageError(f"{part!r} is not a job id (use 12, 12,13 or 10-20)") from None
    huge = next((i for i in ids if abs(i) > MAX_JOB_ID), None)
    if huge is not None:
        raise UsageError(f"{huge} is not a job id: no database holds an id that large")
    return ids


def fmt_time(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def fmt_age(ts: float | None, now: float | None = None) -> str:
    if not ts:
        return "-"
    secs = max(0.0, (now or time.time()) - ts)
    if secs < 90:
        return f"{secs:.0f}s"
    if secs < 5400:
        return f"{secs / 60:.0f}m"
    if secs < 172800:
        return f"{secs / 3600:.1f}h"
    return f"{secs / 86400:.1f}d"


def plain_number(value: Any) -> Any:
    """A whole float as an int: PostgreSQL keeps priorities as doubles, users wrote 1 or 1.5."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def fmt_value(value: Any) -> str:
    """A parameter or result value in a crowded line (a job listing): four significant digits."""
    return format_param(value, LIST_DIGITS)


def fmt_params(params: dict[str, Any], skip: Iterable[str] = ()) -> str:
    skip = set(skip)
    return " ".join(f"{k}={fmt_value(v)}" for k, v in params.items() if k not in skip)


def styled_status(status: Status | str) -> str:
    name = str(status)
    return f"[{STATUS_STYLE.get(name, '')}]{name}[/]"


def job_json(job: Job) -> dict[str, Any]:
    """The stable JSON form of a job for scripts (``--format json``)."""
    return {
        "id": job.id,
        "phase": job.phase,
        "status": job.status.value,
        "target": job.target,
        "kind": job.kind,
        "params": job.params,
        "results": job.results,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "priority": plain_number(job.priority),
        "host": job.host,
        "pid": job.pid,
        "backend": job.backend,
        "backend_id": job.backend_id,
        "workdir": job.workdir,
        "log_path": job.log_path,
        "depends_on": job.depends_on,
        "error": job.error,
        "exit_code": job.exit_code,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "heartbeat_at": job.heartbeat_at,
        "finished_at": job.finished_at,
        "gpus": job.gpus,
        "ranks": job.ranks,
    }


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def confirm(question: str, yes: bool) -> None:
    """Ask before a destructive change; ``--yes`` answers for scripts."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"{question.rstrip('?')}: refusing without a terminal to confirm (add --yes)")
    if not click.confirm(question, default=False):
        raise UsageError("nothing was changed")

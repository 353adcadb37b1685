"""``jobman monitor``: watch an experiment, declare dead jobs CRASHED and relaunch them."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from jobman.dispatch.monitor import Monitor, MonitorOptions, ScanReport
from jobman.jobdb.errors import DatabaseError
from jobman.jobdb.status import DISPLAY_ORDER, Status, names_of
from jobman.jobdb.store import Store

from .common import (
    STATUS_STYLE,
    Database,
    err,
    fmt_age,
    fmt_time,
    log_to_stderr,
    out,
    print_json,
    verbose_option,
    with_database,
)

logger = logging.getLogger("jobman.monitor")

STATUS_ORDER = names_of(DISPLAY_ORDER)
RECENT_CRASHES = 8


@click.command("monitor")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
@click.option("--interval", type=click.FloatRange(0.1), default=10.0, show_default=True, help="Seconds between scans.")
@click.option("--once", is_flag=True, help="Scan once, print what was found and done, and exit (cron, scripts).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per scan (one line each when watching).",
)
@click.option(
    "--relaunch/--no-relaunch",
    default=True,
    show_default=True,
    help="Queue crashed jobs again while they have attempts left (they resume from their checkpoint).",
)
@click.option(
    "--max-attempts", type=click.IntRange(1), default=None, help="Attempts per job, overriding each job's own limit."
)
@click.option("--include-failed", is_flag=True, help="Relaunch FAILED jobs too, within the same limit.")
@click.option(
    "--heartbeat-grace",
    type=click.FloatRange(0.1),
    default=60.0,
    show_default=True,
    help="Seconds without a heartbeat before a RUNNING job is declared lost.",
)
@click.option("--dry-run", is_flag=True, help="Find and report; change nothing.")
@click.option(
    "--rows",
    type=click.IntRange(0),
    default=15,
    show_default=True,
    help="Running jobs shown (those with the oldest heartbeat first).",
)
@verbose_option
def monitor(
    database: Database,
    interval: float,
    once: bool,
    fmt: str,
    relaunch: bool,
    max_attempts: int | None,
    include_failed: bool,
    heartbeat_grace: float,
    dry_run: bool,
    rows: int,
    verbose: bool,
) -> int:
    """Find RUNNING jobs that are not, mark them CRASHED with the reason, relaunch them.

    \b
    A job is dead when its worker process is gone from this host (pid and start
    time), its Slurm allocation ended, or its heartbeat is older than the grace.
    A slow job that still heartbeats is never touched.
    \b
    Examples:
      jobman monitor 'postgresql://me@db/lab?table=dbn'
      jobman monitor 'sqlite:///sweeps.db?table=mlp' --max-attempts 3 --interval 10
      jobman monitor 'sqlite:///sweeps.db?table=mlp' --once --format json
    Watching shows jobs per phase and status, the running jobs and recent crashes; Ctrl-C stops.
    """
    store = database.open()
    log_to_stderr("jobman monitor: %(message)s", verbose)
    options = MonitorOptions(
        relaunch=relaunch,
        max_attempts=max_attempts,
        heartbeat_grace=heartbeat_grace,
        include_failed=include_failed,
        dry_run=dry_run,
    )
    watcher = Monitor(store, options)
    if once:
        report = watcher.scan()
        if fmt == "json":
            print_json(snapshot(store, report))
        else:
            out.print(render(store, report, rows, heartbeat_grace))
        return 0
    try:
        if fmt == "json":

            def json_line() -> None:
                sys.stdout.write(json.dumps(snapshot(store, watcher.scan()), default=str) + "\n")
                sys.stdout.flush()

            _watch(interval, json_line)
        elif not out.is_terminal:  # a log, one line per scan
            _watch(interval, lambda: click.echo(f"{fmt_time(time.time())} {store.experiment}: {watcher.scan().line()}"))
        else:
            with Live(Text("scanning…"), console=out.console, auto_refresh=False, transient=False) as live:
                _watch(
                    interval,
                    lambda: live.update(render(store, watcher.scan(), rows, heartbeat_grace, interval), refresh=True),
                )
    except KeyboardInterrupt:
        err.print("[dim]monitor stopped[/]")
    return 0


@click.command("condor_check", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[DB] [MONITOR OPTIONS]")
def condor_check(args: tuple[str, ...]) -> int:
    """The original's check that RUNNING jobs are still running: `jobman monitor --once --dry-run`.

    \b
    Example:
      jobman condor_check postgres://me@dbhost/lab/mlp_dumi
    """
    click.echo(
        "condor_check: jobman runs no Condor; this is `jobman monitor --once --dry-run`, which checks each "
        "RUNNING job's process, heartbeat and Slurm job (run `jobman monitor` to mark the dead ones CRASHED)",
        err=True,
    )
    return monitor.main(args=[*args, "--once", "--dry-run"], prog_name="jobman condor_check", standalone_mode=False)


def _watch(interval: float, tick: Callable[[], object]) -> None:
    """Call ``tick`` every ``interval`` seconds until Ctrl-C; a database that is away is waited for."""
    while True:
        try:
            tick()
        except DatabaseError as exc:
            logger.warning("%s %s: trying again in %g s", fmt_time(time.time()), exc, interval)
        time.sleep(interval)


# -- what is shown ------------------------------------------------------------------------


def snapshot(store: Store, report: ScanReport) -> dict[str, Any]:
    """The experiment as one scan left it: counts, running jobs, recent crashes, and the scan itself."""
    now = time.time()
    counts: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for (phase, status), n in sorted(store.counts().items()):
        counts.setdefault(str(phase), {})[status] = n
        totals[status] = totals.get(status, 0) + n
    running = [
        {
            "id": j.id,
            "phase": j.phase,
            "attempt": j.attempt,
            "max_attempts": j.max_attempts,
            "host": j.host,
            "pid": j.pid,
            "backend": j.backend,
            "backend_id": j.backend_id,
            "started_at": j.started_at,
            "heartbeat_at": j.heartbeat_at,
            "age_s": _age(j.started_at, now),
            "heartbeat_age_s": _age(j.heartbeat_at, now),
            "stop_requested": j.stop_requested,
        }
        for j in store.running_brief()
    ]
    crashes = [
        {"job_id": e.job_id, "at": e.at, "attempt": e.attempt, "why": e.why, "source": e.source}
        for e in store.recent_events(to_status=[Status.CRASHED], limit=RECENT_CRASHES)
    ]
    return {
        "experiment": store.experiment,
        "database": store.target.display,
        "at": now,
        "scan": report.to_dict(),
        "counts": counts,
        "totals": totals,
        "running": running,
        "recent_crashes": crashes,
    }


def render(store: Store, report: ScanReport, rows: int, grace: float, interval: float | None = None) -> Group:
    """The monitor's screen: counts per phase and status, running jobs, recent crashes, this scan."""
    now = time.time()
    data = snapshot(store, report)
    title = Text.assemble(
        (f"{store.experiment}", "bold"),
        f"  {store.target.display}  ",
        (f"scanned {fmt_time(report.at)} in {report.elapsed:.2f} s", "dim"),
        (f", next in {interval:g} s" if interval else "", "dim"),
    )
    parts: list[Any] = [title, _counts_table(data["counts"], data["totals"])]
    running: list[dict[str, Any]] = sorted(data["running"], key=lambda j: j["heartbeat_at"] or 0)
    if running and rows:
        grid = Table(title=f"running ({len(running)})", title_justify="left", box=None, header_style="bold")
        for col in ("id", "phase", "try", "where", "backend", "running for", "heartbeat"):
            grid.add_column(col, overflow="fold")
        for j in running[:rows]:
            beat = fmt_age(j["heartbeat_at"], now) + " ago"
            late = j["heartbeat_age_s"] is not None and j["heartbeat_age_s"] > grace
            grid.add_row(
                str(j["id"]),
                str(j["phase"]),
                f"{j['attempt']}/{j['max_attempts']}",
                f"{j['host']}:{j['pid']}",
                f"{j['backend'] or '-'} {j['backend_id'] or ''}".strip(),
                fmt_age(j["started_at"], now),
                f"[red]{beat}[/]" if late else beat,
            )
        parts.append(grid)
        if len(running) > rows:
            parts.append(Text(f"… and {len(running) - rows} more running", style="dim"))
    if data["recent_crashes"]:
        crashes = Table(title="recent crashes", title_justify="left", box=None, header_style="bold")
        for col in ("when", "job", "try", "why"):
            crashes.add_column(col, overflow="fold")
        for c in data["recent_crashes"]:
            crashes.add_row(fmt_time(c["at"]), str(c["job_id"]), str(c["attempt"] or ""), c["why"])
        parts.append(crashes)
    parts.append(
        Text(("dry run: " if report.dry_run else "") + report.line(), style="bold magenta" if report.crashed else "dim")
    )
    return Group(*parts)


def _counts_table(counts: dict[str, dict[str, int]], totals: dict[str, int]) -> Table:
    present = [s for s in STATUS_ORDER if totals.get(s)]
    grid = Table(box=None, header_style="bold", pad_edge=False)
    grid.add_column("phase")
    for s in present:
        grid.add_column(Text(s, style=STATUS_STYLE.get(s, "")), justify="right")
    grid.add_column("total", justify="right")
    for phase, by_status in counts.items():
        grid.add_row(phase, *[str(by_status.get(s, "")) for s in present], str(sum(by_status.values())))
    if len(counts) > 1:
        grid.add_row("all", *[str(totals[s]) for s in present], str(sum(totals.values())), style="bold")
    if not counts:
        grid.add_row("no jobs")
    return grid


def _age(ts: float | None, now: float) -> float | None:
    return round(now - ts, 3) if ts else None


COMMANDS = [monitor, condor_check]

"""Running jobs: ``jobman worker``, jobman's ``jobman sql``, ``jobman dispatch`` and ``jobman cmdline``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jobman.dispatch.runner import RunLimits
from jobman.dispatch.worker import Worker, WorkerOptions
from jobman.jobdb.errors import UsageError

from .common import db_options, err, open_store, split_db_arg

DEFAULT_EXPROOT = "jobman_runs"


def limit_options(fn):
    """The options every command that runs jobs shares."""
    fn = click.option("--grace", type=click.FloatRange(0), default=30.0, show_default=True,
                      help="Seconds between asking a job to stop (should_stop) and killing it.")(fn)
    fn = click.option("--heartbeat", type=click.FloatRange(0.05), default=10.0, show_default=True,
                      help="Seconds between heartbeats of a running job.")(fn)
    fn = click.option("--timeout", type=click.FloatRange(0.01), default=None,
                      help="Wall-time limit of each job, in seconds; an overrunning job is FAILED.")(fn)
    fn = click.option("--exproot", type=click.Path(file_okay=False), envvar="JOBMAN_EXPROOT",
                      default=DEFAULT_EXPROOT, show_default=True,
                      help="Where job workdirs go: EXPROOT/EXPERIMENT/JOB_ID.")(fn)
    return fn


def _run_worker(url: str | None, db: str | None, table: str | None, exproot: str, timeout: float | None,
                heartbeat: float, grace: float, max_jobs: int | None, wait: bool, idle_timeout: float | None) -> int:
    store = open_store(db, table, url)
    options = WorkerOptions(workdir_root=Path(exproot), limits=RunLimits(timeout, heartbeat, grace),
                            max_jobs=max_jobs, wait=wait, idle_timeout=idle_timeout)
    worker = Worker(store, options)
    worker.install_signal_handlers()
    summary = worker.run()
    click.echo(summary.line(), err=True)
    return 0


@click.command("worker")
@click.argument("url", required=False, metavar="[DB]")
@db_options
@limit_options
@click.option("--max-jobs", "-n", type=click.IntRange(1), default=None, help="Exit after this many jobs.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="When nothing is ready, wait while other jobs run (they may unlock more).")
@click.option("--idle-timeout", type=click.FloatRange(0), default=None, help="Stop waiting after this many seconds.")
def worker(url, db, table, exproot, timeout, heartbeat, grace, max_jobs, wait, idle_timeout) -> int:
    """Claim a ready job, run it, record it; repeat until nothing is ready.

    \b
    Example:
      jobman worker 'sqlite:///sweeps.db?table=mlp' --timeout 3600
    SIGTERM (or Ctrl-C) lets the running job checkpoint, puts it back in the
    queue without counting an attempt, and exits.
    """
    return _run_worker(url, db, table, exproot, timeout, heartbeat, grace, max_jobs, wait, idle_timeout)


@click.command("sql")
@click.argument("args", nargs=-1, metavar="DB [EXPROOT]")
@db_options
@click.option("-n", "count", type=click.IntRange(0), default=1, show_default=True,
              help="Run this many jobs, then exit; 0: until none is ready.")
@click.option("--timeout", type=click.FloatRange(0.01), default=None, help="Wall-time limit of each job (s).")
def sql(args, db, table, count, timeout) -> int:
    """The original jobman worker: run N jobs of an experiment, workdirs under EXPROOT.

    \b
    Example:
      jobman sql -n0 'sqlite:///sweeps.db?table=mlp' ~/exp
    """
    url, rest = split_db_arg(args)
    if len(rest) > 1:
        raise UsageError("jobman sql takes a database URL and at most one EXPROOT")
    exproot = rest[0] if rest else os.environ.get("JOBMAN_EXPROOT", DEFAULT_EXPROOT)
    return _run_worker(url, db, table, exproot, timeout, 10.0, 30.0, count or None, False, None)


@click.command("dispatch")
@click.argument("url", required=False, metavar="[DB]")
@db_options
@limit_options
@click.option("-j", "--workers", "workers", type=click.IntRange(1), default=None,
              help="How many workers at once (default: the number of cores).")
@click.option("--backend", type=click.Choice(["local", "slurm"]), default="local", show_default=True)
@click.option("--progress/--no-progress", default=None, help="Live progress (default: when on a terminal).")
def dispatch(url, db, table, exproot, timeout, heartbeat, grace, workers, backend, progress) -> int:
    """Start workers on a backend and show progress until the experiment is finished.

    \b
    Example:
      jobman dispatch 'sqlite:///sweeps.db?table=mlp' -j 8
    Exits 0 when every job is DONE, 1 when some FAILED, CRASHED or are BLOCKED.
    Ctrl-C stops the workers cleanly: their jobs go back to the queue.
    """
    from jobman.dispatch.backends.local import LocalBackend
    from jobman.dispatch.dispatcher import Dispatcher, DispatchOptions

    if backend != "local":
        raise UsageError("the slurm backend is not available in this version of jobman")
    store = open_store(db, table, url)
    n = workers or os.cpu_count() or 1
    worker_args = ["--exproot", str(Path(exproot).resolve()), "--heartbeat", str(heartbeat), "--grace", str(grace)]
    if timeout:
        worker_args += ["--timeout", str(timeout)]
    log_dir = Path(exproot).resolve() / store.experiment / "_workers"
    local = LocalBackend(log_dir)
    show = sys.stderr.isatty() if progress is None else progress
    watcher = _watcher(store, local)
    with _ProgressView(show) as view:
        tally = Dispatcher(store, local, DispatchOptions(n, tuple(worker_args)), watcher=watcher,
                           on_tick=view.update).run()
    summary = tally.line() or "no jobs"
    click.echo(f"{store.experiment}: {summary} ({view.elapsed():.1f} s)", err=True)
    if tally["BLOCKED"]:
        click.echo(f"{tally['BLOCKED']} job(s) are BLOCKED by a failed dependency: see `jobman list --status "
                   f"BLOCKED,FAILED,CRASHED`, fix, then `jobman retry`", err=True)
    if tally["WAITING"] and not tally.active:
        click.echo(f"{tally['WAITING']} job(s) are still WAITING on jobs that will not run", err=True)
    return 1 if tally.bad else 0


def _watcher(store, backend):
    """The crash detection dispatch runs for its own workers, if the monitor is installed."""
    try:
        from jobman.dispatch.monitor import Monitor, MonitorOptions
    except ImportError:
        return None
    return Monitor(store, MonitorOptions(relaunch=True), backends={"local": backend})


class _ProgressView:
    """A rich progress bar of finished jobs, with running/waiting counts and a rate."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self.start = time.time()
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=err,
                                 transient=False) if show else None
        self.task = None
        self._first_done: tuple[float, int] | None = None

    def __enter__(self) -> "_ProgressView":
        if self.progress:
            self.progress.start()
            self.task = self.progress.add_task("jobs", total=None, detail="")
        return self

    def __exit__(self, *exc) -> None:
        if self.progress:
            self.progress.stop()

    def elapsed(self) -> float:
        return time.time() - self.start

    def update(self, tally, alive: int) -> None:
        if not self.progress:
            return
        done = tally.finished
        if self._first_done is None:
            self._first_done = (time.time(), done)
        t0, d0 = self._first_done
        rate = (done - d0) / max(1e-9, time.time() - t0)
        left = tally.total - done
        eta = f" eta {left / rate:.0f}s" if rate > 0 and left else ""
        detail = (f"[green]{tally['DONE']} done[/] [red]{tally['FAILED'] + tally['CRASHED']} failed[/] "
                  f"[yellow]{tally['RUNNING']} running[/] {tally['QUEUED']} queued {tally['WAITING']} waiting "
                  f"· {alive} workers · {rate:.1f} jobs/s{eta}")
        self.progress.update(self.task, total=tally.total, completed=done, detail=detail)


@click.command("cmdline")
@click.argument("args", nargs=-1, required=True, metavar="TARGET [k=v]...")
@click.option("--workdir", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Where the run keeps its files and checkpoint (state.json).")
def cmdline(args, workdir) -> int:
    """Run one experiment here, without a database (jobman's cmdline); resumes from workdir.

    \b
    Example:
      jobman cmdline jobman.models.mlp:train dataset=digits nhid=64 epochs=5 --workdir /tmp/run1
    """
    from jobman.dispatch.experiment import TargetError, run_direct
    from jobman.jobdb.sweep import parse_sweep

    parsed = parse_sweep(list(args))
    if len(parsed.phases) > 1 or any(a.grid for a in parsed.phases[0].assignments):
        raise UsageError("cmdline runs one job: no grids and no '--' phases (schedule a sweep for that)")
    params = {a.key: a.values[0] for a in parsed.phases[0].assignments}
    try:
        outcome = run_direct(parsed.phases[0].target, params, Path(workdir))
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    click.echo(json.dumps({"status": outcome.status, "results": outcome.results}, indent=2))
    if outcome.error:
        click.echo(outcome.error, err=True)
    return 0 if outcome.status == "DONE" else 1


COMMANDS = [worker, sql, dispatch, cmdline]

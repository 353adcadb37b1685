"""Running jobs: ``jobman worker``, jobman's ``jobman sql`` and ``jobman dispatch``."""

from __future__ import annotations

import functools
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from jobman.dispatch.backends.base import BackendError
from jobman.dispatch.launch import SLURM_DEFAULT_WORKERS, Launch, LaunchPlan
from jobman.dispatch.machine import JobProcesses, parse_gpus
from jobman.dispatch.worker import WorkerOptions, WorkerSummary
from jobman.dispatch.worker_process import run_worker
from jobman.dispatch.worker_settings import DEFAULT_EXPROOT, WorkerSettings
from jobman.jobdb.errors import JobmanError, UsageError
from jobman.jobdb.status import RAN_BADLY
from jobman.jobdb.store import Store
from jobman.jobdb.url import mask_password

from .common import Database, err, log_to_stderr, verbose_option, with_database

if TYPE_CHECKING:
    from jobman.dispatch.dispatcher import Tally


def limit_options(fn: Callable) -> Callable:
    """The options every command that runs jobs shares."""
    fn = click.option(
        "--grace",
        type=click.FloatRange(0),
        default=30.0,
        show_default=True,
        help="Seconds between asking a job to stop (should_stop) and killing it.",
    )(fn)
    fn = click.option(
        "--heartbeat",
        type=click.FloatRange(0.05),
        default=10.0,
        show_default=True,
        help="Seconds between heartbeats of a running job.",
    )(fn)
    fn = click.option(
        "--timeout",
        type=click.FloatRange(0.01),
        default=None,
        help="Wall-time limit of each job, in seconds; an overrunning job is FAILED.",
    )(fn)
    fn = click.option(
        "--exproot",
        type=click.Path(file_okay=False),
        envvar="JOBMAN_EXPROOT",
        default=DEFAULT_EXPROOT,
        show_default=True,
        help="Where job workdirs go: EXPROOT/EXPERIMENT/JOB_ID.",
    )(fn)
    return fn


def outage_option(fn: Callable) -> Callable:
    """How long a database outage is waited out (worker and dispatch)."""
    return click.option(
        "--outage-wait",
        type=click.FloatRange(0),
        envvar="JOBMAN_OUTAGE_WAIT",
        default=None,
        metavar="SECONDS",
        help="Wait this long for a database that went away (a server restart, a failover) "
        "before giving up; a running job goes on meanwhile. Default: 600.",
    )(fn)


def process_options(fn: Callable) -> Callable:
    """How a worker's jobs are run on this machine: given to ``fn`` as one ``processes`` argument."""

    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        jobs_per_process: int,
        threads_per_job: int | None,
        gpus: str | None,
        gpus_per_job: int,
        slots: int,
        slot_dir: str | None,
        **kwargs: Any,
    ) -> Any:
        processes = JobProcesses(
            jobs_per_process, threads_per_job, parse_gpus(gpus, gpus_per_job), gpus_per_job, slots, slot_dir
        )
        return fn(*args, processes=processes, **kwargs)

    options = [
        click.option(
            "--jobs-per-process",
            type=click.IntRange(1),
            default=1,
            show_default=True,
            metavar="K",
            envvar="JOBMAN_JOBS_PER_PROCESS",
            help="Function jobs one job process runs in turn before a fresh one replaces it: "
            "faster for many tiny jobs; a job then sees the global state of those before "
            "it, a crash still takes down only its own job.",
        ),
        click.option(
            "--threads-per-job",
            type=click.IntRange(1),
            default=None,
            metavar="T",
            help="BLAS/OpenMP threads of each job (OMP_NUM_THREADS, MKL, OpenBLAS, ...). Default: 1.",
        ),
        click.option(
            "--gpus",
            default=None,
            metavar="LIST|all",
            help="GPUs the jobs may use, e.g. 0,1,2,3, or all (nvidia-smi -L, or CUDA_VISIBLE_DEVICES): "
            "each job gets its own (CUDA_VISIBLE_DEVICES), never one in use by another job.",
        ),
        click.option(
            "--gpus-per-job",
            type=click.IntRange(1),
            default=1,
            show_default=True,
            metavar="G",
            help='GPUs of each job, unless its `resources` parameter asks otherwise ({"gpus": 2}).',
        ),
        # A dispatch's -j, shared by its workers: a job of N ranks holds N slots while it runs.
        click.option("--slots", type=click.IntRange(0), default=0, hidden=True),
        click.option("--slot-dir", default=None, hidden=True),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def _run_worker(database: Database, settings: WorkerSettings) -> WorkerSummary:
    return run_worker(database.target, settings, log_to_stderr=log_to_stderr)


@click.command("worker")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
@limit_options
@click.option("--max-jobs", "-n", type=click.IntRange(1), default=None, help="Exit after this many jobs.")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="When nothing is ready, wait while other jobs run (they may unlock more).",
)
@click.option("--idle-timeout", type=click.FloatRange(0), default=None, help="Stop waiting after this many seconds.")
@outage_option
@process_options
@verbose_option
def worker(
    database: Database,
    exproot: str,
    timeout: float | None,
    heartbeat: float,
    grace: float,
    max_jobs: int | None,
    wait: bool,
    idle_timeout: float | None,
    outage_wait: float | None,
    processes: JobProcesses,
    verbose: bool,
) -> int:
    """Claim a ready job, run it, record it; repeat until nothing is ready.

    \b
    Example:
      jobman worker 'sqlite:///sweeps.db?table=mlp' --timeout 3600
    SIGTERM (or Ctrl-C) lets the running job checkpoint, puts it back in the
    queue without counting an attempt, and exits. A database that goes away is
    waited for (--outage-wait); the running job goes on meanwhile.
    """
    _run_worker(
        database,
        WorkerSettings(
            exproot,
            timeout,
            heartbeat,
            grace,
            max_jobs=max_jobs,
            wait=wait,
            idle_timeout=idle_timeout,
            outage_wait=outage_wait,
            processes=processes,
            verbose=verbose,
        ),
    )
    return 0


@click.command("sql")
@click.argument("args", nargs=-1, metavar="DB [EXPROOT]")
@with_database("args")
@click.option(
    "-n",
    "count",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Run this many jobs, then exit; 0: until none is ready.",
)
@click.option("--timeout", type=click.FloatRange(0.01), default=None, help="Wall-time limit of each job (s).")
@click.option(
    "--finish-up-after",
    "finish_up_after",
    type=click.FloatRange(0.01),
    default=None,
    metavar="SECONDS",
    help="After this long a job's channel.switch() says 'finish-up' (should_stop() turns true): it "
    "should save and return INCOMPLETE; one still running --grace seconds later is FAILED.",
)
@click.option(
    "--save-every",
    "save_every",
    type=click.FloatRange(0),
    default=None,
    metavar="SECONDS",
    help="Every SECONDS, a job's channel.switch() says 'save': checkpoint and go on.",
)
@click.option(
    "-w",
    "--workdir",
    "workdir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Where job workdirs go (DIR/EXPERIMENT/JOB_ID); the same as EXPROOT.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0),
    default=30.0,
    show_default=True,
    help="Seconds between asking a job to stop and killing it.",
)
@verbose_option
def sql(
    args: tuple[str, ...],
    database: Database,
    count: int,
    timeout: float | None,
    finish_up_after: float | None,
    save_every: float | None,
    workdir: str | None,
    grace: float,
    verbose: bool,
) -> int:
    """The original jobman worker: run N jobs of an experiment, workdirs under EXPROOT.

    Exits 1 when a job it ran ended FAILED or CRASHED, else 0.

    \b
    Example:
      jobman sql -n0 'sqlite:///sweeps.db?table=mlp' ~/exp
      jobman sql -n0 postgres://me@dbhost/lab/mlp . --finish-up-after 3600 --save-every 600
    """
    if args == ("help",):  # the original's `jobman sql help`
        click.echo(click.get_current_context().get_help())
        return 0
    if len(args) > 1:
        raise UsageError("jobman sql takes a database URL and at most one EXPROOT")
    if args and workdir and args[0] != workdir:
        raise UsageError(f"EXPROOT {args[0]!r} and --workdir {workdir!r} disagree; give one of them")
    if args and args[0].startswith("ssh://"):
        raise UsageError(
            "jobman does not copy workdirs over ssh: give a directory every worker can reach "
            "(a shared filesystem), or run 'jobman dispatch' where the files should be"
        )
    exproot = (args[0] if args else workdir) or os.environ.get("JOBMAN_EXPROOT", DEFAULT_EXPROOT)
    if timeout and finish_up_after and timeout != finish_up_after:
        raise UsageError("--timeout and --finish-up-after are the same limit here; give one of them")
    summary = _run_worker(
        database,
        WorkerSettings(
            exproot,
            timeout or finish_up_after,
            grace=grace,
            max_jobs=count or None,
            wait=False,
            save_every=save_every,
            verbose=verbose,
        ),
    )
    bad = {s: n for s, n in summary.by_status.items() if s in RAN_BADLY}
    if bad:
        click.echo(
            f"{', '.join(f'{n} {s}' for s, n in sorted(bad.items()))}: see `jobman list --status "
            "FAILED,CRASHED`, fix, then `jobman retry`",
            err=True,
        )
        return 1
    return 0


@click.command("dispatch")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
@limit_options
@click.option(
    "-j",
    "--workers",
    "workers",
    type=click.IntRange(1),
    default=None,
    help="How many workers at once (default: local, the number of cores; slurm, one per ready job "
    f"up to {SLURM_DEFAULT_WORKERS}). With --one-job-per-task: how many Slurm jobs may be "
    "submitted and unfinished at once (default: no limit).",
)
@click.option("--backend", type=click.Choice(["local", "slurm"]), default="local", show_default=True)
@click.option("--progress/--no-progress", default=None, help="Live progress (default: when on a terminal).")
@click.option(
    "--sbatch",
    "sbatch",
    default="",
    metavar="OPTIONS",
    help="slurm: sbatch options for every Slurm job, as one string, e.g. "
    "'--partition=gpu --time=4:00:00 --mem=8G --gres=gpu:1'.",
)
@click.option(
    "--array-parallelism",
    type=click.IntRange(1),
    default=None,
    metavar="N",
    help="slurm: at most N workers of the job array run at once (sbatch --array=...%N).",
)
@click.option(
    "--one-job-per-task",
    is_flag=True,
    help="slurm: one Slurm job per jobman job, each with its own resources (see above).",
)
@click.option(
    "--sbatch-phase",
    "sbatch_phase",
    multiple=True,
    metavar="PHASE=OPTIONS",
    help="slurm, --one-job-per-task: more sbatch options for the jobs of one phase, e.g. "
    "--sbatch-phase 1='--mem=4G --gres=gpu:1'. Repeatable.",
)
@click.option(
    "--follow/--detach",
    default=None,
    help="slurm: stay, submitting as phases unlock, relaunching crashed jobs and showing progress "
    "until the experiment is finished (--follow), or submit and return (--detach, the default).",
)
@click.option(
    "--requeue/--no-requeue",
    default=None,
    help="slurm: let Slurm requeue a preempted or failed-node job (sbatch --requeue), or forbid it. "
    "Default: the cluster's setting.",
)
@click.option(
    "--allow-sqlite",
    is_flag=True,
    help="slurm: accept a SQLite database (safe only when every Slurm job runs on this host).",
)
@outage_option
@process_options
@verbose_option
def dispatch(
    database: Database,
    exproot: str,
    timeout: float | None,
    heartbeat: float,
    grace: float,
    workers: int | None,
    backend: str,
    progress: bool | None,
    sbatch: str,
    array_parallelism: int | None,
    one_job_per_task: bool,
    sbatch_phase: tuple[str, ...],
    follow: bool | None,
    requeue: bool | None,
    allow_sqlite: bool,
    outage_wait: float | None,
    processes: JobProcesses,
    verbose: bool,
) -> int:
    """Start workers on a backend and show progress until the experiment is finished.

    \b
    Examples:
      jobman dispatch 'sqlite:///sweeps.db?table=mlp' -j 8
      jobman dispatch 'postgresql://me@dbhost/lab?table=dbn' --backend slurm -j 32 \\
          --sbatch '--partition=gpu --time=4:00:00 --mem=8G --gres=gpu:1'
      jobman dispatch 'postgresql://me@dbhost/lab?table=dbn' --backend slurm --one-job-per-task \\
          --sbatch '--time=1:00:00' --sbatch-phase 1='--gres=gpu:1' --follow

    Local: exits 0 when every job is DONE, 1 when some FAILED, CRASHED or are
    BLOCKED. Ctrl-C stops the workers cleanly: their jobs go back to the queue.
    A database that goes away (a server restart) is waited for, up to
    --outage-wait. Workers that fail at once (a full disk, a read-only
    database) are started again with backoff, 5 in a row at most; then
    dispatch stops with their error. However dispatch ends, its workers
    stop with it and put their jobs back.

    \b
    Slurm, pull workers (the default): one job array whose tasks each run
    `jobman worker` until nothing is ready, one task per ready job up to -j.
    Slurm, --one-job-per-task: each QUEUED job is its own Slurm job running
    `jobman run-job DB ID`, with the options of --sbatch, then --sbatch-phase
    for its phase, then its own `resources` parameter (a string of sbatch
    options, a list, or a dict like {"mem": "4G"}), later ones winning.
    Later phases, and jobs relaunched after a crash, are submitted when they
    become QUEUED: use --follow, or run dispatch again (it never submits a
    job twice, and resubmits a job whose Slurm job ended before starting it).
    Command jobs (--cmd) get `resources` as an argument too: give them
    --sbatch-phase, or name only the parameters they take ({placeholders}).
    --detach prints the Slurm job ids on stdout and returns; watch with
    `jobman monitor`. --follow exits like a local dispatch; Ctrl-C then stops
    following and leaves the Slurm jobs running. Every Slurm job gets SIGTERM
    60 s before its time limit (override with --sbatch '--signal=B:TERM@120'):
    the running job checkpoints (channel.should_stop()) and is put back in the
    queue without counting an attempt. Each task's log (stdout and stderr) is
    EXPROOT/EXPERIMENT/_slurm/ID.out, shown by `jobman show`. The database must
    be reachable from the nodes: PostgreSQL, not SQLite.
    """
    slurm_only = {
        "--sbatch": sbatch,
        "--array-parallelism": array_parallelism,
        "--one-job-per-task": one_job_per_task,
        "--sbatch-phase": sbatch_phase,
        "--follow/--detach": follow is not None,
        "--requeue/--no-requeue": requeue is not None,
        "--allow-sqlite": allow_sqlite,
    }
    given = [name for name, value in slurm_only.items() if value]
    if backend == "local" and given:
        raise UsageError(f"{given[0]} is for --backend slurm")
    if sbatch_phase and not one_job_per_task:
        raise UsageError("--sbatch-phase is for --one-job-per-task (pull workers run jobs of every phase)")
    if array_parallelism and one_job_per_task:
        raise UsageError("--array-parallelism is for pull workers; with --one-job-per-task, use -j")
    if one_job_per_task and processes.jobs_per_process > 1:
        raise UsageError("--jobs-per-process is for pull workers: with --one-job-per-task each Slurm job runs one job")
    if backend == "slurm" and processes.gpus:
        raise UsageError(
            "--gpus is for the local backend: on Slurm, ask for GPUs with --sbatch '--gres=gpu:N' "
            "(Slurm sets each job's CUDA_VISIBLE_DEVICES)"
        )
    if backend == "slurm" and database.target.dialect == "sqlite" and not allow_sqlite:
        raise UsageError(
            "Slurm jobs on other nodes cannot share a SQLite file safely: use a PostgreSQL "
            "database (postgresql://user@host/db?table=T), or --allow-sqlite if every job "
            "runs on this host"
        )
    store = database.open()
    log_to_stderr("jobman dispatch: %(message)s", verbose)
    settings = WorkerSettings(
        exproot, timeout, heartbeat, grace, outage_wait=outage_wait, processes=processes, verbose=verbose
    )
    plan = LaunchPlan(backend, settings, workers, sbatch=sbatch, array_parallelism=array_parallelism, requeue=requeue)
    show = sys.stderr.isatty() if progress is None else progress
    if backend == "local":
        return _dispatch_local(store, plan, show)
    try:
        return _dispatch_slurm(store, plan, show, one_job_per_task, sbatch_phase, bool(follow))
    except BackendError as exc:
        raise SlurmError(str(exc)) from None


class SlurmError(JobmanError):
    """Slurm could not do what was asked."""


def _dispatch_local(store: Store, plan: LaunchPlan, show: bool) -> int:
    launch = Launch(store, plan)
    with _ProgressView(show) as view, _terminate_as_interrupt():
        tally = launch.run(on_tick=view.update)
    return _report_end(store, tally, view)


class _terminate_as_interrupt:
    """SIGTERM and SIGHUP end a dispatch as Ctrl-C does: its workers are stopped and put their jobs back."""

    def __enter__(self) -> None:
        import signal

        def interrupt(_signum: int, _frame: object) -> NoReturn:
            raise KeyboardInterrupt

        self.saved = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def _report_end(store: Store, tally: Tally, view: _ProgressView) -> int:
    summary = tally.line() or "no jobs"
    click.echo(f"{store.experiment}: {summary} ({view.elapsed():.1f} s)", err=True)
    if tally["BLOCKED"]:
        click.echo(
            f"{tally['BLOCKED']} job(s) are BLOCKED by a failed dependency: see `jobman list --status "
            f"BLOCKED,FAILED,CRASHED`, fix, then `jobman retry`",
            err=True,
        )
    if tally["WAITING"] and not tally.active:
        click.echo(f"{tally['WAITING']} job(s) are still WAITING on jobs that will not run", err=True)
    return 1 if tally.bad else 0


def _dispatch_slurm(
    store: Store, plan: LaunchPlan, show: bool, one_job_per_task: bool, sbatch_phase: tuple[str, ...], follow: bool
) -> int:
    launch = Launch(store, plan)
    watch = f"jobman monitor {shlex.quote(mask_password(launch.spec.db_url))}"
    if one_job_per_task:
        return _dispatch_one_per_task(store, launch, show, sbatch_phase, follow, watch)
    if follow:
        return _follow(store, launch, show, watch, lambda tick: launch.dispatcher(tick).run())
    tally, ids = launch.submit_array()
    if not ids:
        click.echo(
            f"{store.experiment}: no job is ready ({tally.line() or 'no jobs'}); nothing was submitted", err=True
        )
        return 0
    array_id = ids[0].split("_")[0]
    click.echo(array_id)
    click.echo(
        f"{store.experiment}: submitted Slurm job array {array_id} of {len(ids)} worker(s) for "
        f"{tally['QUEUED']} ready job(s)\n  logs:  {launch.log_dir}/{array_id}_*.out\n  watch: {watch}"
        f"   (or squeue -j {array_id})",
        err=True,
    )
    return 0


def _dispatch_one_per_task(
    store: Store, launch: Launch, show: bool, sbatch_phase: tuple[str, ...], follow: bool, watch: str
) -> int:
    from jobman.dispatch.slurm_dispatch import parse_phase_options

    per_phase = parse_phase_options(sbatch_phase)
    if follow:
        return _follow(store, launch, show, watch, lambda tick: launch.job_per_task(per_phase, on_tick=tick).run())
    dispatcher = launch.job_per_task(per_phase, on_submit=lambda s: click.echo(f"{s.slurm_id}\tjob {s.job_id}"))
    dispatcher.release_ended()
    submitted = dispatcher.submit_ready()
    waiting = store.outstanding()["WAITING"]
    click.echo(
        f"{store.experiment}: submitted {len(submitted)} Slurm job(s), one per ready job"
        + (
            f"; {waiting} job(s) still WAITING on others: dispatch again (or use --follow) to submit them"
            if waiting
            else ""
        )
        + f"\n  watch: {watch}",
        err=True,
    )
    return 0


def _follow(store: Store, launch: Launch, show: bool, watch: str, run: Callable[..., Tally]) -> int:
    """--follow: run a dispatch loop under a progress view; Ctrl-C stops following, not the Slurm jobs."""
    with _ProgressView(show) as view:
        try:
            tally = run(view.update)
        except KeyboardInterrupt:
            ids = launch.slurm_jobs()
            if ids:
                click.echo(
                    f"stopped following; the Slurm jobs go on (scancel {' '.join(ids)} to stop them); watch: {watch}",
                    err=True,
                )
            raise
    return _report_end(store, tally, view)


@click.command("run-job")
@click.argument("args", nargs=-1, metavar="[DB] JOB_ID")
@with_database("args")
@limit_options
@click.option(
    "--assignment-wait",
    type=click.FloatRange(0),
    default=60.0,
    show_default=True,
    help="Inside Slurm: how long to wait for the dispatch to record this Slurm job on the job.",
)
@click.option(
    "--threads-per-job",
    type=click.IntRange(1),
    default=None,
    metavar="T",
    help="BLAS/OpenMP threads of the job (OMP_NUM_THREADS, MKL, OpenBLAS, ...). Default: the libraries' own.",
)
@outage_option
@verbose_option
def run_job(
    args: tuple[str, ...],
    database: Database,
    exproot: str,
    timeout: float | None,
    heartbeat: float,
    grace: float,
    assignment_wait: float,
    threads_per_job: int | None,
    outage_wait: float | None,
    verbose: bool,
) -> int:
    """Run exactly one job: what each Slurm job of `dispatch --one-job-per-task` runs.

    \b
    Example:
      jobman run-job 'postgresql://me@dbhost/lab?table=dbn' 42
    Inside a Slurm job it runs the job only if the job was submitted as this
    Slurm job (so a job is never run twice); elsewhere, if the job is QUEUED.
    A job that returns INCOMPLETE, or crashes and is relaunched, runs again here.
    Exits 1 when the job ended FAILED or CRASHED, else 0.
    """
    from jobman.dispatch.runner import RunLimits
    from jobman.dispatch.slurm_dispatch import RunJob

    if len(args) != 1 or not args[0].isdigit():
        raise UsageError("run-job takes a database URL and one job id, like: jobman run-job DB 42")
    store = database.open()
    log_to_stderr("[jobman run-job %(process)d] %(message)s", verbose)
    JobProcesses(threads_per_job=threads_per_job).set_threads()
    options = WorkerOptions(
        workdir_root=Path(exproot), limits=RunLimits(timeout, heartbeat, grace), outage_wait=outage_wait
    )
    runner = RunJob(store, int(args[0]), options, assignment_wait=assignment_wait)
    runner.install_signal_handlers()
    status = runner.run()
    return 1 if status in RAN_BADLY else 0


class _ProgressView:
    """A rich progress bar of finished jobs, with running/waiting counts and a rate."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self.start = time.time()
        if show:  # imported for a terminal only: workers and a --no-progress dispatch start without it
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.progress = (
            Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[detail]}"),
                TimeElapsedColumn(),
                console=err.console,
                transient=False,
            )
            if show
            else None
        )
        self.task: Any = None  # rich's TaskID, once the bar is shown
        self._first_done: tuple[float, int] | None = None

    def __enter__(self) -> _ProgressView:
        if self.progress:
            self.progress.start()
            self.task = self.progress.add_task("jobs", total=None, detail="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress:
            self.progress.stop()

    def elapsed(self) -> float:
        return time.time() - self.start

    def update(self, tally: Tally, alive: int) -> None:
        if not self.progress:
            return
        done = tally.finished
        if self._first_done is None:
            self._first_done = (time.time(), done)
        t0, d0 = self._first_done
        rate = (done - d0) / max(1e-9, time.time() - t0)
        left = tally.total - done
        eta = f" eta {left / rate:.0f}s" if rate > 0 and left else ""
        detail = (
            f"[green]{tally['DONE']} done[/] [red]{tally['FAILED'] + tally['CRASHED']} failed[/] "
            f"[yellow]{tally['RUNNING']} running[/] {tally['QUEUED']} queued {tally['WAITING']} waiting "
            f"· {alive} workers · {rate:.1f} jobs/s{eta}"
        )
        self.progress.update(self.task, total=tally.total, completed=done, detail=detail)


COMMANDS = [worker, sql, dispatch, run_job]

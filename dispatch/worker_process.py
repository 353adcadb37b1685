"""A worker process from start to end: ``jobman worker``'s body, and a worker forked by the zygote.

The order of the start is measured, not arbitrary: thread variables before the fork server (its
jobs inherit them), the fork server before the database is opened (its imports overlap the
connection), signal handlers before the first claim.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobman.jobdb.errors import JobmanError, ServerFull
from jobman.jobdb.store import Store
from jobman.jobdb.url import DbTarget, mask_password, parse_db

from .forkhandle import ForkServer
from .machine import GpuPool, SlotPool
from .outage import Outage
from .runner import RunLimits
from .worker import Worker, WorkerOptions, WorkerSummary, one_blas_thread
from .worker_settings import WorkerSettings

LOG_FORMAT = "[jobman worker %(process)d] %(message)s"


def plain_log_to_stderr(fmt: str, verbose: bool = False) -> None:
    """The ``jobman`` loggers' lines on stderr as plain lines: a worker whose stderr is its log file."""
    root = logging.getLogger("jobman")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    root.propagate = False


def run_worker(
    target: DbTarget,
    settings: WorkerSettings,
    log_to_stderr: Callable[[str, bool], None] = plain_log_to_stderr,
    fork_server: bool = False,
) -> WorkerSummary:
    """Run one worker over ``target``'s experiment until nothing is ready or a limit is hit; its summary,
    also written to stderr. ``log_to_stderr(format, verbose)`` routes the log lines (the CLI's renders
    them above a live display). ``fork_server``: its fork server is a fork of this process (one the
    zygote forked, whose modules are all imported), not a new interpreter."""
    processes = settings.processes
    limits = RunLimits(
        settings.timeout,
        settings.heartbeat,
        settings.grace,
        jobs_per_process=processes.jobs_per_process,
        save_every=settings.save_every,
    )
    options = WorkerOptions(
        workdir_root=Path(settings.exproot),
        limits=limits,
        max_jobs=settings.max_jobs,
        wait=settings.wait,
        idle_timeout=settings.idle_timeout,
        outage_wait=settings.outage_wait,
    )
    processes.set_threads()
    one_blas_thread()
    server = ForkServer(limits.jobs_per_process, fork_first=fork_server)
    server.warm()  # the jobs' server starts while the database is opened, not after
    log_to_stderr(LOG_FORMAT, settings.verbose)
    # A worker never makes a database: a wrong path is named. A server away at the start is an error at
    # once, but one whose connection slots are all taken is waited for, as it would be later.
    store = Outage(logging.getLogger("jobman.worker").info, settings.outage_wait).call(
        lambda: Store(target, create=False, worker=True),
        "opening the database",
        waits=lambda exc: isinstance(exc, ServerFull),
    )
    worker = Worker(store, options, server=server)
    if processes.gpus:
        worker.runner.gpus = GpuPool(processes.gpus, processes.gpus_per_job)
    if processes.slots and processes.slot_dir:
        worker.runner.slots = SlotPool(processes.slots, processes.slot_dir)
    worker.install_signal_handlers()
    summary = worker.run()
    sys.stderr.write(summary.line() + "\n")
    sys.stderr.flush()
    return summary


def worker_main(request: dict[str, Any]) -> int:
    """A worker the zygote forked: run it from the dispatch's request; its exit code. A failure is one
    line on stderr, the last of its log, which the dispatch quotes when it counts failed workers."""
    try:
        run_worker(
            parse_db(request["url"], None),
            WorkerSettings.from_message(request["settings"]),
            fork_server=True,
        )
        return 0
    except JobmanError as exc:
        if _debug():
            traceback.print_exc()
        _say(f"jobman: {mask_password(str(exc))}")
        return exc.exit_code
    except KeyboardInterrupt:
        _say("jobman: interrupted")
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: one sentence, as the command line says it
        if _debug():
            traceback.print_exc()
        message = mask_password(f"{type(exc).__name__}: {exc}".splitlines()[0])
        _say(f"jobman: internal error ({message}); rerun with --debug for the traceback")
        return 3


def _debug() -> bool:
    """``JOBMAN_DEBUG`` as ``jobman --debug`` reads it: tracebacks instead of one-line errors."""
    return os.environ.get("JOBMAN_DEBUG", "").strip().lower() not in ("", "0", "false", "f", "no", "n", "off")


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()

"""The local backend: N worker processes on this host, forked from one warm interpreter (``zygote``)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import psutil

from ..lifetime import DIE_WITH_VARIABLE  # for each worker: the pid of the dispatch it must not outlive
from .base import AllocationState, WorkerSpec
from .zygote import Forked, Zygote


def last_line(path: Path, tail: int = 2000) -> str:
    """The last non-empty line of a log file ("" if none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - tail))
            lines = fh.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def worker_command(spec: WorkerSpec) -> list[str]:
    """The argv that starts one ``jobman worker`` with this interpreter."""
    return [sys.executable, "-m", "jobman.cli.main", "worker", *spec.argv()]


class LocalBackend:
    """Starts workers as child processes in their own sessions, so Ctrl-C reaches only the dispatcher."""

    name = "local"

    def __init__(self, log_dir: Path, environment: dict[str, str] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.environment = dict(environment or {})  # set for the workers, over this process's own
        self.procs: list[subprocess.Popen | Forked] = []
        self.zygote = Zygote.ready()  # workers are forked from it: a warm start instead of a new interpreter each
        weakref.finalize(self, self.zygote.close)
        self.logs: dict[int, Path] = {}
        self._seen_exits: set[int] = set()

    def start_workers(self, spec: WorkerSpec, count: int) -> list[str]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        request = {"url": spec.db_url, "settings": spec.settings.to_message()}
        asked = []
        for index in range(len(self.procs), len(self.procs) + count):
            log_path = self.log_dir / f"worker-{os.getpid()}-{index}.log"
            env = {
                **os.environ,
                **self.environment,
                "JOBMAN_WORKER_LOG": str(log_path),
                DIE_WITH_VARIABLE: str(os.getpid()),
            }
            asked.append((log_path, env))
        try:  # forked in one burst
            procs: list[subprocess.Popen | Forked] = list(
                self.zygote.start_workers([(request, str(log_path), env) for log_path, env in asked])
            )
        except (OSError, AttributeError):  # no zygote (or no pidfd here): a fresh interpreter, as always
            procs = []
        for log_path, env in asked[len(procs) :]:
            with open(log_path, "ab") as log:
                procs.append(
                    subprocess.Popen(
                        worker_command(spec),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env=env,
                    )
                )
        for proc, (log_path, _env) in zip(procs, asked, strict=True):
            self.procs.append(proc)
            self.logs[proc.pid] = log_path
        return [str(proc.pid) for proc in procs]

    def close(self) -> None:
        """Stop the zygote (once the workers are gone; it would stop with this process anyway)."""
        self.zygote.close()

    def started_ids(self) -> set[str]:
        """The backend ids (pids) of every worker this backend started."""
        return {str(p.pid) for p in self.procs}

    def running_workers(self) -> int:
        return sum(p.poll() is None for p in self.procs)

    def exited(self) -> list[tuple[str, int, str]]:
        """Workers that exited since the last call: pid, exit code (negative: a signal), last log line."""
        out = []
        for p in self.procs:
            code = p.poll()
            if code is not None and p.pid not in self._seen_exits:
                self._seen_exits.add(p.pid)
                out.append((str(p.pid), code, last_line(self.logs[p.pid])))
        return out

    def wait(self, seconds: float) -> None:
        """Sleep, waking the moment one of our workers exits (the end of a dispatch is seen at once)."""
        fds = []
        try:
            for p in self.procs:
                if p.poll() is None:
                    try:
                        fds.append(os.pidfd_open(p.pid))
                    except (AttributeError, OSError):  # no pidfd here: a plain sleep
                        time.sleep(seconds)
                        return
            if fds:
                select.select(fds, [], [], seconds)
            else:
                time.sleep(seconds)
        finally:
            for fd in fds:
                os.close(fd)

    def stop_workers(self, grace: float = 60.0) -> None:
        """SIGTERM every worker (each puts its job back), then SIGKILL what is left after ``grace``."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline and self.running_workers():
            time.sleep(0.1)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def allocation_states(self, backend_ids: Sequence[str]) -> dict[str, AllocationState]:
        out = {}
        for bid in backend_ids:
            try:
                alive = psutil.Process(int(bid)).status() != psutil.STATUS_ZOMBIE
            except (psutil.NoSuchProcess, ValueError):
                alive = False
            out[bid] = AllocationState(
                bid, alive, "RUNNING" if alive else "GONE", "" if alive else f"worker process {bid} is gone"
            )
        return out

"""How a worker runs its jobs on this machine: job processes reused or not, threads, GPUs.

Options shared by ``jobman worker`` and ``jobman dispatch`` (which hands them to
each worker it starts, as worker arguments).

GPUs are shared by every worker of a host through one lock file per device
(``flock``): a worker takes the devices a job needs before starting it, sets the
job's ``CUDA_VISIBLE_DEVICES``, and gives them back when the job has ended, however it
ended. The kernel drops the locks of a worker that dies, so no device is ever lost to
a crash. Two running jobs therefore never share a device.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobman.jobdb.errors import JobmanError, UsageError

# The thread pools a job's libraries size from the environment: OpenMP, OpenBLAS, MKL, Accelerate,
# BLIS, numexpr. Read when the library loads, so they are set before the fork server imports anything.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)
GPU_LOCKS_ENV = "JOBMAN_GPU_LOCKS"  # where the device lock files are (default: a directory under /tmp)


@dataclass(frozen=True)
class JobProcesses:
    """What the job processes of one worker are given."""

    jobs_per_process: int = 1  # function jobs one process runs in turn before a fresh one replaces it
    threads_per_job: int | None = None  # None: one thread per job (workers are the parallelism)
    gpus: tuple[str, ...] = ()  # the devices this worker's jobs may use; () for none
    gpus_per_job: int = 1
    slots: int = 0  # the dispatch's -j, shared by its workers' jobs by ranks; 0: not counted
    slot_dir: str | None = None  # where the slots' lock files are (one folder per dispatch)

    def worker_args(self) -> list[str]:
        """The ``jobman worker`` options that say the same."""
        args = ["--jobs-per-process", str(self.jobs_per_process)] if self.jobs_per_process > 1 else []
        if self.threads_per_job is not None:
            args += ["--threads-per-job", str(self.threads_per_job)]
        if self.gpus:
            args += ["--gpus", ",".join(self.gpus), "--gpus-per-job", str(self.gpus_per_job)]
        if self.slots and self.slot_dir:
            args += ["--slots", str(self.slots), "--slot-dir", self.slot_dir]
        return args

    def set_threads(self) -> None:
        """Size every thread pool of the worker's jobs (they inherit its environment)."""
        if self.threads_per_job is not None:
            for name in THREAD_VARIABLES:
                os.environ[name] = str(self.threads_per_job)

    @property
    def gpu_workers(self) -> int:
        """How many jobs can hold their devices at once."""
        return len(self.gpus) // self.gpus_per_job


def parse_gpus(spec: str | None, per_job: int) -> tuple[str, ...]:
    """``--gpus``: a comma-separated list of device ids, or ``all`` (what this machine has)."""
    if spec is None:
        return ()
    if spec.strip().lower() == "all":
        devices = visible_gpus()
        if not devices:
            raise UsageError(
                "--gpus all: this machine has no GPU (nvidia-smi lists none and CUDA_VISIBLE_DEVICES is not set)"
            )
    else:
        devices = tuple(d.strip() for d in spec.split(","))
        if not all(re.fullmatch(r"[A-Za-z0-9_:.-]+", d) for d in devices):
            raise UsageError(f"--gpus {spec!r}: give device ids separated by commas, like 0,1,2,3, or 'all'")
        if len(set(devices)) != len(devices):
            raise UsageError(f"--gpus {spec!r} names a device twice")
    if per_job > len(devices):
        raise UsageError(f"--gpus-per-job {per_job} is more than the {len(devices)} GPU(s) given ({','.join(devices)})")
    return devices


def visible_gpus() -> tuple[str, ...]:
    """The GPUs of this machine: ``CUDA_VISIBLE_DEVICES`` when set, else what ``nvidia-smi -L`` lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return tuple(d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if listing.returncode != 0:
        return ()
    return tuple(m.group(1) for m in re.finditer(r"^GPU (\d+):", listing.stdout, re.MULTILINE))


def gpus_asked(params: dict[str, Any], default: int) -> int:
    """How many GPUs a job asks for: its ``resources`` parameter ({"gpus": 2}, or Slurm's gres
    "gpu:2" as a string, list or dict), else ``default``."""
    resources = params.get("resources")
    if resources is None:  # a nested parameter is stored flat: resources.gpus, resources.gres
        resources = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith("resources.")} or None
    if isinstance(resources, dict):
        if "gpus" in resources:
            value = resources["gpus"]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise JobmanError(f"the job's resources ask for gpus={value!r}: give a whole number")
            return value
        resources = [f"--gres={resources['gres']}"] if "gres" in resources else []
    text = " ".join(resources) if isinstance(resources, list) else resources if isinstance(resources, str) else ""
    found = re.search(r"gpu(?::[A-Za-z0-9_-]+)?:(\d+)", text)
    return int(found.group(1)) if found else default


class GpuPool:
    """This host's devices, taken and given back by the workers through one lock file each."""

    LOCK_FILE = "gpu-{}.lock"

    def __init__(self, devices: tuple[str, ...], per_job: int, lock_dir: Path | None = None) -> None:
        self.devices = devices
        self.per_job = per_job
        default = Path(tempfile.gettempdir()) / f"jobman-gpu-locks-{os.getuid()}"
        self.lock_dir = Path(lock_dir or os.environ.get(GPU_LOCKS_ENV) or default)
        self.held: list[tuple[str, int]] = []

    def take(self, count: int, waiting: Callable[[], bool]) -> list[str] | None:
        """``count`` free devices, locked; waits while ``waiting()`` says so, else None."""
        if count > len(self.devices):
            raise JobmanError(self.too_many(count))
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        while True:
            for device in self.devices:
                if len(self.held) == count:
                    return [d for d, _fd in self.held]
                fd = os.open(
                    self.lock_dir / self.LOCK_FILE.format(device.replace("/", "_")), os.O_RDWR | os.O_CREAT, 0o644
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self.held.append((device, fd))
            if len(self.held) == count:
                return [d for d, _fd in self.held]
            self.give_back()  # not enough free: hold none while waiting, so two waiters never deadlock
            if not waiting():
                return None
            time.sleep(0.1)

    def give_back(self) -> None:
        for _device, fd in self.held:
            os.close(fd)  # closing the descriptor drops its lock
        self.held = []

    def too_many(self, count: int) -> str:
        return f"the job asks for {count} GPU(s); this worker has {len(self.devices)} ({','.join(self.devices)})"


class SlotPool(GpuPool):
    """The ``-j`` slots of one dispatch, shared by its workers: a job of N ranks holds N of them while
    it runs, so a gang never runs beside more processes than the dispatch was given. Taken all at once
    or not at all (as devices are), so two waiting gangs never hold each other's slots."""

    LOCK_FILE = "slot-{}.lock"

    def __init__(self, slots: int, lock_dir: str | Path) -> None:
        super().__init__(tuple(str(i) for i in range(slots)), 1, Path(lock_dir))

    def too_many(self, count: int) -> str:
        return f"the job has {count} ranks, more than the {len(self.devices)} slots of its dispatch (-j)"

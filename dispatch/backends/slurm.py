"""The Slurm backend: workers as one sbatch job array, and what Slurm says became of them.

``start_workers`` submits ONE job array whose tasks each run ``jobman worker``
with this interpreter (``sys.executable``), so the nodes use the submitter's
environment; ``submit_job`` submits one job running one command line (the
one-job-per-task mode). Commands go through a script file handed to sbatch, and
options go to sbatch as an argv list: nothing passes through a shell unquoted.
The script exports ``JOBMAN_WORKER_LOG``, the task's own log file, which the
worker records on every job it claims (``jobman show`` prints it).

Time limits: every job asks for ``--signal=B:TERM@<grace>``, a SIGTERM to the
worker ``grace`` seconds (default 60) before its time limit. SIGTERM, not a
signal of its own, because the worker already treats SIGTERM as "stop soon, put
your job back" (as it must for ``scancel``); a time limit means the same to it.
The script ``exec``s the command, so the signal reaches it and not a shell.

States: one ``squeue -t all`` call per scan for every id asked about (it keeps
finished jobs for ``MinJobAge``). Ids squeue no longer knows are then looked up
with one ``sacct`` call, if the cluster keeps accounting (found out on first
use, then remembered); what neither knows is reported ended, state ``UNKNOWN``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from jobman.dispatch.backends.base import AllocationState, BackendError, WorkerSpec

#: States in which a job still holds, or waits for, its allocation.
ALIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "STOPPED",
    }
)
WORKER_COMMAND = (sys.executable, "-m", "jobman.cli.main", "worker")
JOB_ID = re.compile(r"\d+(_\d+)?")
SQUEUE_FORMAT = "JobArrayID:|,JobID:|,State:|,exit_code:|,Reason:"
COMMAND_TIMEOUT = 60.0


class SlurmBackend:
    """Runs workers (and single jobs) on Slurm through sbatch; reads their fate from squeue/sacct.

    ``sbatch_options`` is the user's ``--sbatch`` string or an argv list; it comes
    after our defaults (job name, signal) so it can override them, and before
    ``--array``/``--output``/``--error``, which this backend owns. Logs go to
    ``log_dir/<id>.out`` and ``.err``, next to the submitted script ``<job>.sh``;
    with ``merge_output`` stderr goes into the ``.out`` file too, one log per task.
    ``requeue`` (True/False) passes ``--requeue``/``--no-requeue``; None keeps
    the cluster's default.
    """

    name = "slurm"

    def __init__(
        self,
        sbatch_options: str | Sequence[str] = (),
        array_parallelism: int | None = None,
        log_dir: Path | str = Path("slurm-logs"),
        job_name: str = "jobman",
        signal_grace: int = 60,
        worker_command: Sequence[str] = WORKER_COMMAND,
        merge_output: bool = False,
        requeue: bool | None = None,
        environment: dict[str, str] | None = None,
    ) -> None:
        self.sbatch_options = parse_sbatch_options(sbatch_options)
        self.array_parallelism = array_parallelism
        self.log_dir = Path(log_dir).resolve()
        self.job_name = job_name
        self.signal_grace = signal_grace
        self.worker_command = tuple(worker_command)
        self.merge_output = merge_output
        self.requeue = requeue
        # Exported by every batch script (mode 0600), so that a secret such as PGPASSWORD reaches the
        # job without being on any command line, and whatever --export the user gives sbatch.
        self.environment = dict(environment or {})
        self.submitted: list[str] = []
        self._sacct_usable: bool | None = None

    # -- the Backend protocol ----------------------------------------------------

    def start_workers(self, spec: WorkerSpec, count: int) -> list[str]:
        """Submit one array of ``count`` workers; return the task ids ``N_0`` .. ``N_(count-1)``."""
        if count < 1:
            return []
        array = f"0-{count - 1}" + (f"%{self.array_parallelism}" if self.array_parallelism else "")
        argv = [*self.worker_command, *spec.argv()]
        job_id = self._submit(argv, (), [f"--array={array}", *self._owned_options("%A_%a")])
        ids = [f"{job_id}_{task}" for task in range(count)]
        self.submitted.extend(ids)
        return ids

    def running_workers(self) -> int:
        """How many jobs submitted by this object are pending or running (one squeue call)."""
        if not self.submitted:
            return 0
        return sum(state.alive for state in self.allocation_states(self.submitted).values())

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def stop_workers(self) -> None:
        """scancel all this object submitted: running workers get SIGTERM, SIGKILL after KillWait."""
        self.cancel(sorted({job_id.split("_")[0] for job_id in self.submitted}))

    def cancel(self, backend_ids: Sequence[str]) -> None:
        """scancel these jobs (or array tasks ``N_i``), in one call."""
        if backend_ids:
            proc = _run(["scancel", *backend_ids])
            if proc.returncode != 0:
                raise BackendError(f"scancel failed: {_message(proc)}")

    def allocation_states(self, backend_ids: Sequence[str]) -> dict[str, AllocationState]:
        """The state of each id (``N`` or ``N_i``, or a task's own job id) in one squeue call.

        Ids squeue has forgotten are looked up with one sacct call when accounting
        is on; ids nobody knows are reported ended with state ``UNKNOWN``.
        """
        ids = list(dict.fromkeys(str(job_id) for job_id in backend_ids))
        if not ids:
            return {}
        wellformed = [job_id for job_id in ids if JOB_ID.fullmatch(job_id)]
        found = self._squeue(wellformed) if wellformed else {}
        missing = [job_id for job_id in wellformed if job_id not in found]
        if missing and self._sacct_usable is not False:
            found.update(self._sacct(missing))
        return {
            job_id: found.get(job_id)
            or AllocationState(job_id, False, "UNKNOWN", f"Slurm does not know job {job_id} (any more).")
            for job_id in ids
        }

    # -- single jobs -------------------------------------------------------------

    def submit_job(self, argv: Sequence[str], sbatch_options: str | Sequence[str] = ()) -> str:
        """Submit one Slurm job running ``argv`` (no shell); return its job id."""
        job_id = self._submit(list(argv), parse_sbatch_options(sbatch_options), self._owned_options("%j"))
        self.submitted.append(job_id)
        return job_id

    def log_paths(self, backend_id: str) -> tuple[Path, Path]:
        """Where the job's (or array task's) stdout and stderr go (the same file with ``merge_output``)."""
        out = self.log_dir / f"{backend_id}.out"
        return out, out if self.merge_output else self.log_dir / f"{backend_id}.err"

    # -- internals -----------------------------------------------------------------

    def _owned_options(self, pattern: str) -> list[str]:
        """The options this backend sets itself: logs named by ``pattern`` (``%j``, ``%A_%a``), requeue."""
        options = [f"--output={self.log_dir / pattern}.out"]
        if not self.merge_output:
            options.append(f"--error={self.log_dir / pattern}.err")
        options.append("--open-mode=append")  # a requeued task keeps the log of its earlier run
        if self.requeue is not None:
            options.append("--requeue" if self.requeue else "--no-requeue")
        return options

    def _script(self, argv: list[str], array: bool) -> str:
        """The batch script: name the task's log for the worker, then become the command."""
        task = "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" if array else "${SLURM_JOB_ID}"
        log = shlex.quote(f"{self.log_dir}/") + f'"{task}.out"'
        exports = "".join(f"{name}={shlex.quote(value)}\nexport {name}\n" for name, value in self.environment.items())
        return (
            "#!/bin/sh\n# Submitted by jobman.\n"
            f"JOBMAN_WORKER_LOG={log}\nexport JOBMAN_WORKER_LOG\n{exports}"
            "exec " + shlex.join(argv) + "\n"
        )

    def _submit(self, argv: list[str], call_options: Sequence[str], owned_options: list[str]) -> str:
        """Write the script, run sbatch once, keep the script as ``<job id>.sh``; return the id."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        fd, script_name = tempfile.mkstemp(prefix="submit-", suffix=".sh", dir=self.log_dir)
        script = Path(script_name)
        with os.fdopen(fd, "w") as handle:
            handle.write(self._script(argv, any(o.startswith("--array=") for o in owned_options)))
        command = [
            "sbatch",
            "--parsable",
            f"--job-name={self.job_name}",
            f"--signal=B:TERM@{self.signal_grace}",
            *self.sbatch_options,
            *call_options,
            *owned_options,
            str(script),
        ]
        try:
            proc = _run(command)
            if proc.returncode != 0:
                raise BackendError(f"sbatch refused the job: {_message(proc)}")
            job_id = proc.stdout.strip().split(";")[0]
            if not job_id.isdigit():
                raise BackendError(f"sbatch answered {proc.stdout.strip()!r} instead of a job id.")
        except BackendError:
            script.unlink(missing_ok=True)
            raise
        script.rename(self.log_dir / f"{job_id}.sh")
        return job_id

    def _squeue(self, ids: list[str]) -> dict[str, AllocationState]:
        proc = _run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(ids), "-O", SQUEUE_FORMAT])
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:  # every id asked about is unknown
                return {}
            raise BackendError(f"squeue failed: {_message(proc)}")
        rows = [line.split("|", 4) for line in proc.stdout.splitlines() if line.count("|") >= 4]
        found: dict[str, AllocationState] = {}
        for array_id, _job_id, state, status, reason in rows:
            code, sig = _decode_wait_status(status)
            found[array_id] = _state(array_id, state, code, sig, reason.strip())
        for array_id, job_id, *_ in rows:  # a task may also be asked about by its own job id
            found.setdefault(job_id, found[array_id])
        return {job_id: _rename(found[job_id], job_id) for job_id in ids if job_id in found}

    def _sacct(self, ids: list[str]) -> dict[str, AllocationState]:
        """States from accounting, for ids squeue has forgotten; turns itself off if there is none."""
        fields = "JobID,JobIDRaw,State,ExitCode"
        try:
            proc = _run(["sacct", "-X", "-P", "-n", "-j", ",".join(ids), f"--format={fields}"])
        except BackendError:
            proc = None
        if proc is None or proc.returncode != 0:
            self._sacct_usable = False
            return {}
        self._sacct_usable = True
        found: dict[str, AllocationState] = {}
        for line in proc.stdout.splitlines():
            parts = line.split("|")
            if len(parts) != 4:
                continue
            array_id, raw_id, state, exit_code = parts
            code, _, sig = exit_code.partition(":")
            entry = _state(array_id, state.split(" ")[0], _int(code), _int(sig), "")
            found.setdefault(array_id, entry)
            found.setdefault(raw_id, entry)
        return {job_id: _rename(found[job_id], job_id) for job_id in ids if job_id in found}


def parse_sbatch_options(options: str | Sequence[str]) -> list[str]:
    """The user's ``--sbatch`` string split as a shell would (quotes kept together), or a list as is."""
    if not isinstance(options, str):
        return list(options)
    try:
        return shlex.split(options)
    except ValueError as exc:
        raise BackendError(f"The sbatch options {options!r} cannot be parsed: {exc}.") from None


def _state(job_id: str, state: str, code: int | None, sig: int | None, reason: str) -> AllocationState:
    """An AllocationState with a one-sentence reason for ended jobs."""
    if state in ALIVE_STATES:
        return AllocationState(job_id, True, state, "")
    how = f"killed by signal {sig}" if sig else f"exit code {code}" if code is not None else ""
    detail = ", ".join(part for part in (how, reason if reason not in ("", "None") else "") if part)
    sentence = f"Slurm job {job_id} ended {state}" + (f" ({detail})." if detail else ".")
    return AllocationState(job_id, False, state, sentence)


def _rename(state: AllocationState, job_id: str) -> AllocationState:
    """The same state under the id the caller asked about (a task's own id, say)."""
    if state.backend_id == job_id:
        return state
    return AllocationState(job_id, state.alive, state.state, state.reason)


def _decode_wait_status(text: str) -> tuple[int | None, int | None]:
    """squeue's exit_code is a raw wait status: exit code in the high byte, signal in the low bits."""
    status = _int(text)
    if status is None:
        return None, None
    return status >> 8, status & 0x7F


def _int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a Slurm command; a missing binary or a hang is a BackendError."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise BackendError(f"{argv[0]} was not found on PATH: is Slurm installed on this host?") from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"{argv[0]} did not answer within {COMMAND_TIMEOUT:.0f} s.") from None


def _message(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line Slurm printed (not its "Try --help" hint), without its ``sbatch: error:`` prefix."""
    lines = [line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
    lines = [line for line in lines if not (line.startswith("Try ") and "--help" in line)] or lines
    last = lines[-1] if lines else f"exit status {proc.returncode}"
    last = last.split("error: ", 1)[-1]
    command = proc.args[0] if isinstance(proc.args, list) and proc.args else ""
    return last[len(command) + 2 :] if command and last.startswith(f"{command}: ") else last

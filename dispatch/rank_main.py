"""A rank of a gang job started by a launcher (``python -m jobman.dispatch.rank_main REQUEST``): the
job's process wrote the request into the job's workdir and started ``srun`` (every rank, SLURM_PROCID)
or ``mpiexec`` (every rank, PMI_RANK); rank 0 talks to its worker through the job's process; see
``dispatch.gang``."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

from .forkserver import function_of, job_main, parents_of, run_other_rank
from .gang import RANK_END, RANK_ERROR, RANK_PID, note_where, rank_env, rank_process
from .lifetime import die_with_parent
from .messages import send_msg


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's SLURM_STEP_TASKS_PER_NODE (``2(x3),1``) as one count per node."""
    out: list[int] = []
    for part in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found:
            out += [int(found.group(1))] * int(found.group(2) or 1)
    return out


def place(request: dict) -> tuple[int, tuple[int, int]]:
    """This process's rank, and its LOCAL_RANK and LOCAL_WORLD_SIZE (its place among the gang's ranks
    on its node)."""
    if request["launch"] == "mpiexec":
        rank = int(os.environ["PMI_RANK"])
        return rank, (int(os.environ.get("MPI_LOCALRANKID", rank)), int(os.environ.get("MPI_LOCALNRANKS", 1)))
    local_id = int(os.environ.get("SLURM_LOCALID", "0"))
    per_node = tasks_per_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
    node = int(os.environ.get("SLURM_NODEID", "0"))
    here = per_node[node] if node < len(per_node) else 1
    return int(os.environ["SLURM_PROCID"]), (local_id, here)


def main(argv: list[str]) -> None:
    request = json.loads(Path(argv[0]).read_text())
    rank, local = place(request)
    world = request["ranks"]
    os.chdir(request["workdir"])
    if "path" in request:
        sys.path[:] = request["path"]
    os.environ.update(request.get("env", {}))
    _watched(rank)
    fn = function_of({}, request)
    if rank == 0:  # the launcher's rank 0: the job's own call, its requests and report relayed to the worker
        os.environ.update(rank_env(0, world, request["port"], request["addr"], local))
        note_where(0)
        link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        link.connect("\0" + request["relay"])
        report = job_main(fn, {**request, "rank": 0}, link, set())
        send_msg(link, report)
        sys.stdout.flush()
        sys.stderr.flush()
        if report.get("status") != "FAILED":
            _finish_mpi()
        os._exit(0)
    errors = os.open(RANK_ERROR.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    parents = parents_of(request)

    def run(r: int) -> None:
        run_other_rank(fn, request, parents, set(), r)
        os.close(errors)
        os.unlink(RANK_ERROR.format(rank=r))  # it returned: nothing to tell
        _finish_mpi()

    rank_process(rank, world, request["port"], request["addr"], errors, run, local)


def _finish_mpi() -> None:
    """A rank whose call returned, and used MPI, waits in ``MPI_Finalize`` for the others: MPICH's launcher
    ends every rank at once when one exits without it (a rank done early would end rank 0 before its report)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()


def _watched(rank: int) -> None:
    """Go on in a child, while this process waits for it and writes down how it ended (``rank-R.end``)
    before exiting the same way. MPICH's launcher names no rank when one is killed, and ends the others
    at once (srun, with --kill-on-bad-exit, too); the first end written is the culprit's."""
    child = os.fork()
    if child == 0:
        die_with_parent()
        return
    Path(RANK_PID.format(rank=rank)).write_text(f"{child} {socket.gethostname()}")
    for sig in (signal.SIGTERM, signal.SIGUSR1):  # stops are the rank's own to answer
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    status = os.waitpid(child, 0)[1]
    Path(RANK_END.format(rank=rank)).write_text(json.dumps({"at": time.time(), "status": status}))
    if os.WIFSIGNALED(status):  # ended the same way, so the launcher sees a killed process
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main(sys.argv[1:])

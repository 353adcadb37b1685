"""A rank of a gang job started by srun (``python -m jobman.dispatch.rank_main REQUEST``): rank 0, the
job's process, wrote the request into the job's workdir and runs ``srun`` for ranks 1..N-1 (see
``dispatch.gang``); each task is one of them, its rank its SLURM_PROCID + 1."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path

from .forkserver import function_of, parents_of, run_other_rank
from .gang import RANK_ERROR, rank_process


def tasks_per_node(spec: str) -> list[int]:
    """Slurm's SLURM_STEP_TASKS_PER_NODE (``2(x3),1``) as one count per node."""
    out: list[int] = []
    for part in spec.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found:
            out += [int(found.group(1))] * int(found.group(2) or 1)
    return out


def local_of(addr: str) -> tuple[int, int]:
    """This task's LOCAL_RANK and LOCAL_WORLD_SIZE: its place among the gang's ranks on its node (rank 0,
    the job's process, counts on its own node)."""
    local_id = int(os.environ.get("SLURM_LOCALID", "0"))
    per_node = tasks_per_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
    node = int(os.environ.get("SLURM_NODEID", "0"))
    here = per_node[node] if node < len(per_node) else 1
    with_rank_0 = socket.gethostname() == addr
    return (local_id + 1, here + 1) if with_rank_0 else (local_id, here)


def main(argv: list[str]) -> None:
    request = json.loads(Path(argv[0]).read_text())
    rank = int(os.environ["SLURM_PROCID"]) + 1
    os.chdir(request["workdir"])
    if "path" in request:
        sys.path[:] = request["path"]
    os.environ.update(request.get("env", {}))
    errors = os.open(RANK_ERROR.format(rank=rank), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fn = function_of({}, request)
    parents = parents_of(request)

    def run(r: int) -> None:
        run_other_rank(fn, request, parents, set(), r)
        os.close(errors)
        os.unlink(RANK_ERROR.format(rank=r))  # it returned: nothing to tell

    rank_process(rank, request["ranks"], request["port"], request["addr"], errors, run, local_of(request["addr"]))


if __name__ == "__main__":
    main(sys.argv[1:])

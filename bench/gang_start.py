"""A gang's start: from the claim of a job of N ranks to every rank running its function.

    python bench/gang_start.py [--jobs 8] [--no-write]
    python bench/gang_start.py --slurm [--jobs 8]    # SLURM_CONF set (python tests/slurm_cluster.py up)

One ``jobman worker`` runs ``--jobs`` jobs of each kind in turn, on SQLite, in the same invocation:
jobs of one process (the baseline: a claim to the function running, as every job pays it), then jobs
of 2 and 3 ranks forked by the job's process, then the same started by the ``ps`` extra's mpiexec
(``JOBMAN_GANG_LAUNCH=mpiexec``). Each rank writes the time its function began; a job's start is its
last rank's time minus the job's ``started_at`` (the claim's time, stamped by the same clock on
SQLite). The median of each kind is printed beside the baseline's.

With ``--slurm``, the same on the Slurm cluster ``SLURM_CONF`` names, through ``jobman dispatch --backend
slurm --one-job-per-task`` on PostgreSQL (whose clock stamps the claim; the ranks run on this host's
clock, the one-node test cluster's): each job its own Slurm job of ``--ntasks`` N, its ranks one srun
step (an MPI world), beside jobs of one process dispatched the same way. The claim is made inside the
allocation, so the allocation's own wait is left out; srun's start of the step is in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, fresh_pg_database, grid, machine, say

from jobman.jobdb.store import Store

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS-gangs.md"
JOBMAN = [sys.executable, "-m", "jobman.cli.main"]

JOBS = textwrap.dedent("""
    import json, time

    def started(state, channel):
        (channel.workdir / f"began-{channel.rank}.json").write_text(json.dumps(time.time()))
""")


def schedule(url: str, ranks: int, jobs: int, env: dict[str, str]) -> None:
    """``jobs`` jobs of ``ranks`` ranks, each writing when its ranks began."""
    subprocess.run(
        [*JOBMAN, "sqlschedule", url, "gang_bench:started", f"i={grid(jobs)}", "--ranks", str(ranks)],
        env=env,
        check=True,
        capture_output=True,
    )


def claim_to_last_rank(url: str, name: str, ranks: int) -> list[float]:
    """Each job's seconds from its claim to its last rank's start; every job must be DONE."""
    store = Store.open(url)
    try:
        starts = []
        for job in store.jobs():
            assert job.status.value == "DONE", (name, job.id, job.error)
            began = [json.loads((Path(job.workdir) / f"began-{r}.json").read_text()) for r in range(ranks)]
            starts.append(max(began) - job.started_at)
        return starts
    finally:
        store.dispose()


def run_kind(tmp: Path, name: str, ranks: int, launch: str, jobs: int) -> list[float]:
    """``jobs`` jobs of ``ranks`` ranks through one worker: each job's claim-to-last-rank seconds."""
    url = f"sqlite:///{tmp / name}.db?table=t"
    env = {**os.environ, "PYTHONPATH": str(tmp), "JOBMAN_GANG_LAUNCH": launch}
    schedule(url, ranks, jobs, env)
    subprocess.run(
        [*JOBMAN, "worker", url, "--exproot", str(tmp / f"runs-{name}")], env=env, check=True, capture_output=True
    )
    return claim_to_last_rank(url, name, ranks)


def slurm_kind(tmp: Path, name: str, ranks: int, jobs: int) -> list[float]:
    """``jobs`` jobs of ``ranks`` ranks, each its own Slurm job: each job's claim-to-last-rank seconds."""
    database, drop = fresh_pg_database()
    try:
        url = f"{database}?table={name}"
        env = {**os.environ, "PYTHONPATH": str(tmp)}
        schedule(url, ranks, jobs, env)
        subprocess.run(
            [*JOBMAN, "dispatch", url, "--backend", "slurm", "--one-job-per-task"]
            + ["--exproot", str(tmp / f"runs-{name}"), "--follow", "-j", "2"],
            env=env,
            check=True,
            capture_output=True,
            cwd=tmp,
        )
        return claim_to_last_rank(url, name, ranks)
    finally:
        drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs of each kind")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    parser.add_argument("--slurm", action="store_true", help="on the Slurm cluster SLURM_CONF names")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="jobman-gang-bench-"))
    (tmp / "gang_bench.py").write_text(JOBS)
    if args.slurm:
        slurm(tmp, args)
        return
    kinds = [("one process", 1, "fork"), ("2 ranks, forked", 2, "fork"), ("3 ranks, forked", 3, "fork")]
    kinds += [("2 ranks, mpiexec", 2, "mpiexec"), ("3 ranks, mpiexec", 3, "mpiexec")]
    medians: dict[str, float] = {}
    spreads: dict[str, tuple[float, float]] = {}
    for name, ranks, launch in kinds:
        starts = run_kind(tmp, name.replace(" ", "_").replace(",", ""), ranks, launch, args.jobs)
        medians[name] = statistics.median(starts) * 1000
        spreads[name] = (min(starts) * 1000, max(starts) * 1000)
    base = medians["one process"]
    for name, _r, _l in kinds[1:]:
        say(Figure(f"claim to every rank running, {name}", medians[name], "ms", base, "measured, no target"))
    if args.no_write:
        return
    lines = [
        "# A gang's start",
        "",
        f"Written by `bench/gang_start.py --jobs {args.jobs}` ({machine()['cpu']}, {machine()['date']}, "
        f"load {os.getloadavg()[0]:.1f} at the end). From a job's claim to its last rank's function running, "
        "on SQLite, one worker; the median of each kind, beside jobs of one process in the same run.",
        "",
        "| kind | median ms | fastest ms | slowest ms | / one process |",
        "|---|---|---|---|---|",
    ]
    for name, _r, _l in kinds:
        low, high = spreads[name]
        lines.append(f"| {name} | {medians[name]:.1f} | {low:.1f} | {high:.1f} | {medians[name] / base:.2f}x |")
    RESULTS.write_text("\n".join(lines) + "\n")


def slurm(tmp: Path, args: argparse.Namespace) -> None:
    """The Slurm figures, appended to the results beside the local ones."""
    if not os.environ.get("SLURM_CONF"):
        sys.exit("gang_start.py --slurm: set SLURM_CONF (python tests/slurm_cluster.py up prints it)")
    kinds = [("one process, Slurm", 1), ("2 ranks, srun", 2), ("3 ranks, srun", 3)]
    found = {name: slurm_kind(tmp, name.split(",")[0].replace(" ", "_"), ranks, args.jobs) for name, ranks in kinds}
    medians = {name: statistics.median(starts) * 1000 for name, starts in found.items()}
    base = medians["one process, Slurm"]
    for name, _r in kinds[1:]:
        say(Figure(f"claim to every rank running, {name}", medians[name], "ms", base, "measured, no target"))
    if args.no_write:
        return
    lines = [
        "",
        "## On Slurm",
        "",
        f"Written by `bench/gang_start.py --slurm --jobs {args.jobs}` ({machine()['cpu']}, {machine()['date']},"
        f" load {os.getloadavg()[0]:.1f} at the end), on the one-node test cluster (`tests/slurm_cluster.py`):"
        " `jobman dispatch --backend slurm --one-job-per-task -j 2` on PostgreSQL, each job its own Slurm job of"
        " `--ntasks` N; from the claim inside the allocation to the last rank's function running, beside jobs"
        " of one process dispatched the same way in the same run.",
        "",
        "| kind | median ms | fastest ms | slowest ms | / one process |",
        "|---|---|---|---|---|",
    ]
    for name, _r in kinds:
        starts = [s * 1000 for s in found[name]]
        lines.append(
            f"| {name} | {medians[name]:.1f} | {min(starts):.1f} | {max(starts):.1f} | {medians[name] / base:.2f}x |"
        )
    RESULTS.write_text(RESULTS.read_text() + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""A gang's start: from the claim of a job of N ranks to every rank running its function.

    python bench/gang_start.py [--jobs 8] [--no-write]

One ``jobman worker`` runs ``--jobs`` jobs of each kind in turn, on SQLite, in the same invocation:
jobs of one process (the baseline: a claim to the function running, as every job pays it), then jobs
of 2 and 3 ranks forked by the job's process, then the same started by the ``ps`` extra's mpiexec
(``JOBMAN_GANG_LAUNCH=mpiexec``). Each rank writes the time its function began; a job's start is its
last rank's time minus the job's ``started_at`` (the claim's time, stamped by the same clock on
SQLite). The median of each kind is printed beside the baseline's. On Slurm a gang's start adds the
allocation's and srun's; that is not measured here.
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
from common import Figure, machine, say

from jobman.jobdb.store import Store

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS-gangs.md"

JOBS = textwrap.dedent("""
    import json, time

    def started(state, channel):
        (channel.workdir / f"began-{channel.rank}.json").write_text(json.dumps(time.time()))
""")


def run_kind(tmp: Path, name: str, ranks: int, launch: str, jobs: int) -> list[float]:
    """``jobs`` jobs of ``ranks`` ranks through one worker: each job's claim-to-last-rank seconds."""
    url = f"sqlite:///{tmp / name}.db?table=t"
    env = {**os.environ, "PYTHONPATH": str(tmp), "JOBMAN_GANG_LAUNCH": launch}
    jobman = [sys.executable, "-m", "jobman.cli.main"]
    subprocess.run(
        [*jobman, "sqlschedule", url, "gang_bench:started", f"i={{{{{','.join(map(str, range(jobs)))}}}}}"]
        + ["--ranks", str(ranks)],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*jobman, "worker", url, "--exproot", str(tmp / f"runs-{name}")], env=env, check=True, capture_output=True
    )
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8, help="jobs of each kind")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="jobman-gang-bench-"))
    (tmp / "gang_bench.py").write_text(JOBS)
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


if __name__ == "__main__":
    main()

"""The cost of running a job: no-op function jobs through ``jobman dispatch -j 2`` beside one process per call.

    python bench/dispatch_overhead.py [--jobs 2000] [--quick] [--profile] [--no-write]

jobman forks every job from its worker's warm fork server (one process per job, so
a crash stays in its job); the baseline starts a fresh interpreter per call, two at a time:
``xargs -P 2 python -c "import mod; mod.noop(i)"``. Both run in the same
invocation on the same machine. jobman's figure is the wall time of the whole
``jobman dispatch`` command (start-up included); the steady rate is measured
from the jobs' own start and finish times. ``--profile`` runs one worker in this
process with every step of a job timed, and prints where the time goes.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, machine, say

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS-dispatch.md"
MODULE = "jm_bench_noop"
TARGET_RATIO = 20.0


def prepare(tmp: Path, jobs: int, name: str) -> tuple[str, dict[str, str]]:
    """A SQLite database with ``jobs`` no-op jobs, and the environment that finds their module."""
    (tmp / f"{MODULE}.py").write_text(
        textwrap.dedent('''
        def noop(i):
            """Nothing at all: what is measured is the cost of starting and recording a call."""
            return None
    ''')
    )
    url = f"sqlite:///{tmp / name}.db?table=noop"
    store = Store.open(url)
    store.schedule([JobSpec(0, "fn", f"{MODULE}:noop", {"i": i}, None) for i in range(jobs)])
    store.dispose()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp), os.environ.get("PYTHONPATH")) if p)}
    return url, env


def children_cpu() -> float:
    """CPU seconds used so far by this process's finished children and everything they waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_dispatch(tmp: Path, jobs: int, name: str, *extra: str) -> tuple[str, float, float]:
    """``jobman dispatch -j 2`` of ``jobs`` no-op jobs made by :func:`prepare`: the database URL,
    and the wall and CPU seconds it took (every process counted: dispatcher, workers, jobs)."""
    url, env = prepare(tmp, jobs, name)
    argv = [
        sys.executable,
        "-m",
        "jobman.cli.main",
        "dispatch",
        url,
        "-j",
        "2",
        "--no-progress",
        "--exproot",
        str(tmp / f"runs-{name}"),
        *extra,
    ]
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    cpu = children_cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"jobman dispatch failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return url, seconds, cpu


def run_dispatch(tmp: Path, jobs: int) -> tuple[float, float, float]:
    """``jobman dispatch -j 2`` over every job: wall seconds, CPU seconds of every process it took
    (dispatcher, workers, jobs), and the steady jobs/s between the first job's start and the last one's end."""
    url, seconds, cpu = timed_dispatch(tmp, jobs, "dispatch")
    store = Store.open(url)
    done = store.jobs(status=[Status.DONE], with_deps=False)
    store.dispose()
    if len(done) != jobs:
        raise SystemExit(f"only {len(done)} of {jobs} jobs are DONE")
    first = min(j.started_at for j in done)
    last = max(j.finished_at for j in done)
    return seconds, cpu, jobs / max(1e-9, last - first)


def run_processes(tmp: Path, jobs: int) -> tuple[float, float]:
    """Wall and CPU seconds of the same calls, each in a fresh interpreter, two at a time."""
    _url, env = prepare(tmp, 0, "xargs")
    code = f"import {MODULE} as m; m.noop({{}})"
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(
        ["xargs", "-P", "2", "-I{}", sys.executable, "-c", code],
        input="".join(f"{i}\n" for i in range(jobs)),
        env=env,
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    cpu = children_cpu() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"xargs failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return seconds, cpu


# -- where a job's time goes ------------------------------------------------------------------

Row = tuple[str, float, float | None]  # step, wall ms per job, CPU ms per job


def profile(tmp: Path, jobs: int) -> list[Row]:
    """Run one worker here with each step timed, wall and CPU; rows slowest first."""
    from jobman.dispatch.runner import RunLimits, Runner
    from jobman.dispatch.worker import Worker, WorkerOptions

    url, _env = prepare(tmp, jobs, "profile")
    sys.path.insert(0, str(tmp))
    store = Store.open(url)
    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)

    def timed(owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                wall[label] += time.perf_counter() - t0
                cpu[label] += time.process_time() - c0

        setattr(owner, name, wrapper)

    for name, label in (
        ("claim", "store.claim (write txn)"),
        ("parents", "store.parents (read txn)"),
        ("finish", "store.finish (write txn)"),
        ("finish_and_claim", "store.finish_and_claim (write txn: record, claim the next)"),
        ("heartbeat", "store.heartbeat"),
        ("outstanding", "store.outstanding"),
    ):
        timed(store, name, label)
    timed(Runner, "_start_function", "start (request to the fork server, the job's pid back)")
    timed(Runner, "_supervise", "waiting for the job process (worker side)")
    timed(Runner, "_record", "_record (decode the report; the store apart)")
    options = WorkerOptions(workdir_root=tmp / "runs", limits=RunLimits(None, 10.0, 30.0), wait=False)
    worker = Worker(store, options, log=lambda _m: None)
    timed(worker, "log", "worker log lines")
    t0, c0, k0 = time.perf_counter(), time.process_time(), children_cpu()
    summary = worker.run()
    total, total_cpu, jobs_cpu = time.perf_counter() - t0, time.process_time() - c0, children_cpu() - k0
    store.dispose()
    assert summary.ran == jobs, summary.line()
    for d in (wall, cpu):
        d["_record (decode the report; the store apart)"] -= (
            d["store.finish (write txn)"] + d["store.finish_and_claim (write txn: record, claim the next)"]
        )
    rows: list[Row] = [(label, 1000 * wall[label] / jobs, 1000 * cpu[label] / jobs) for label in wall]
    rows.append(
        (
            "everything else in the worker loop",
            1000 * (total - sum(wall.values())) / jobs,
            1000 * (total_cpu - sum(cpu.values())) / jobs,
        )
    )
    rows.sort(key=lambda r: -r[1])
    rows.append(("the fork server and its job processes (CPU from rusage)", 0.0, 1000 * jobs_cpu / jobs))
    rows.append(("total per job, one worker", 1000 * total / jobs, 1000 * (total_cpu + jobs_cpu) / jobs))
    return rows


def write_results(lines: list[str]) -> None:
    header = "# jobman dispatch: the cost of a job\n\nFigures from `python bench/dispatch_overhead.py`, newest last.\n"
    old = RESULTS.read_text() if RESULTS.exists() else header
    RESULTS.write_text(old.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="300 jobs, for a quick look")
    parser.add_argument("--profile", action="store_true", help="also time each step of a job in one worker")
    parser.add_argument("--no-write", action="store_true", help=f"do not append to {RESULTS.name}")
    parser.add_argument("--note", default="", help="a word on what changed, for the results file")
    args = parser.parse_args(argv)
    jobs = 300 if args.quick else args.jobs

    with tempfile.TemporaryDirectory(prefix="jobman-bench-") as tmp_name:
        tmp = Path(tmp_name)
        load_before = os.getloadavg()[0]
        jm_seconds, jm_cpu, steady = run_dispatch(tmp, jobs)
        px_seconds, px_cpu = run_processes(tmp, jobs)
        jm_rate, px_rate = jobs / jm_seconds, jobs / px_seconds
        figures = [
            say(
                Figure(
                    f"jobman dispatch -j 2, {jobs:,} no-op jobs, wall",
                    jm_rate,
                    "jobs/s",
                    px_rate,
                    f">= {TARGET_RATIO:g}x one process per call (xargs -P 2)",
                    jm_rate >= TARGET_RATIO * px_rate,
                    f"({jm_seconds:.2f} s against {px_seconds:.2f} s)",
                )
            ),
            say(
                Figure(
                    "jobman, steady rate between the first and last job",
                    steady,
                    "jobs/s",
                    px_rate,
                    "start-up left out",
                    None,
                    f"(~{2000 / steady:.1f} ms of one worker per job)",
                )
            ),
            # CPU per job hardly depends on what else the machine runs, unlike wall time
            say(
                Figure(
                    "CPU per job, every process counted",
                    1000 * jm_cpu / jobs,
                    "ms",
                    1000 * px_cpu / jobs,
                    "lower is better; start-up included",
                    None,
                    f"(jobs per CPU-second: {jobs / jm_cpu:.0f} against {jobs / px_cpu:.0f}, {px_cpu / jm_cpu:.1f}x)",
                )
            ),
        ]
        rows = profile(tmp, jobs) if args.profile else []
        load_after = os.getloadavg()[0]

    def ms(value: float | None) -> str:
        return "-" if not value else f"{value:.3f}"

    if rows:
        print(f"  {'step (ms per job)':<48} {'wall':>8} {'CPU':>8}")
    for label, w, c in rows:
        print(f"  {label:<48} {ms(w):>8} {ms(c):>8}")
    m = machine()
    lines = [
        f"## {m['date']}" + (f": {args.note}" if args.note else ""),
        "",
        f"{m['cpu']}, {m['memory']}, Python {m['python']}, SQLite {m['sqlite']}, SQLAlchemy {m['sqlalchemy']}; "
        f"load average {load_before:.1f} before, {load_after:.1f} after.",
        "",
    ]
    lines += [f"- {f.line()}" for f in figures]
    lines.append(f"- ratio: {figures[0].ratio:.2f}x (target {TARGET_RATIO:g}x)")
    if rows:
        lines += [
            "",
            "Where a job's time goes (one worker in the benchmark's process), ms per job:",
            "",
            "| step | wall | CPU |",
            "| --- | ---: | ---: |",
        ]
        lines += [f"| {label} | {ms(w)} | {ms(c)} |" for label, w, c in rows]
    if not args.no_write:
        write_results(lines)
        print(f"written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

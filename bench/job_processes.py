"""Thousands of tiny jobs: a fresh process per job, reused job processes, Optuna, side by side.

    python bench/job_processes.py [--quick] [--no-write]

Every figure is measured in the same invocation on the same machine:

- default mode (a fresh fork per job): CPU per job of ``jobman dispatch -j 2``, every
  process counted, beside a bare fork-and-exit of the same interpreter with the experiment
  API imported (what a fork server's child costs at the least);
- ``--jobs-per-process 1000``: no-op jobs through ``jobman dispatch -j 2`` in wall time,
  start-up included, beside one interpreter per call two at a time (``xargs -P 2 python -c``);
- against Optuna (``pip install '.[bench]'``): the same number of evaluations of a trivial
  objective by two processes sharing an Optuna RDB storage on SQLite, beside ``jobman
  dispatch -j 2`` of as many jobs, in both modes; and the same dispatch of two jobs, to show how
  much of a fiftieth of Optuna's time the start-up takes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, machine, say
from dispatch_overhead import children_cpu, run_processes, timed_dispatch

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS-dispatch.md"

FORKS = textwrap.dedent("""
    import os, sys, time
    import jobman.dispatch.forkserver  # what a fork server holds: the experiment API
    n = int(sys.argv[1])
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
""")

OPTUNA_WORKER = textwrap.dedent("""
    import sys
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="bench", storage=sys.argv[1])
    study.optimize(lambda trial: trial.suggest_float("x", -1, 1) ** 2, n_trials=int(sys.argv[2]))
""")


def dispatch(tmp: Path, jobs: int, name: str, *extra: str) -> tuple[float, float]:
    """``jobman dispatch -j 2`` of ``jobs`` no-op jobs: wall and CPU seconds (every process counted)."""
    url, seconds, cpu = timed_dispatch(tmp, jobs, name, *extra)
    store = Store.open(url)
    done = store.counts()
    store.dispose()
    if sum(n for (_phase, status), n in done.items() if status == Status.DONE.value) != jobs:
        raise SystemExit(f"not every job of {name} is DONE: {done}")
    return seconds, cpu


def bare_forks(n: int) -> float:
    """CPU seconds of ``n`` forks and exits of an interpreter holding the experiment API."""
    probe = subprocess.run([sys.executable, "-c", "import jobman.dispatch.forkserver"], capture_output=True)
    assert probe.returncode == 0
    cpu = children_cpu()
    subprocess.run([sys.executable, "-c", "import jobman.dispatch.forkserver"], check=True)
    start_cpu = children_cpu() - cpu  # the interpreter's own start, left out below
    cpu = children_cpu()
    subprocess.run([sys.executable, "-c", FORKS, str(n)], check=True)
    return children_cpu() - cpu - start_cpu


def workdir_files(tmp: Path, n: int) -> float:
    """CPU seconds of what every job costs the file system at the least: its workdir, with its
    stdout.txt and stderr.txt, made ``n`` times beside the benchmark's own workdirs."""
    root = tmp / "workdirs"
    root.mkdir()
    cpu = time.process_time()
    for i in range(n):
        os.mkdir(root / str(i))
        for name in ("stdout.txt", "stderr.txt"):
            os.close(os.open(root / str(i) / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    return time.process_time() - cpu


def optuna_run(tmp: Path, trials: int) -> float | None:
    """Wall seconds of ``trials`` evaluations by two processes on one Optuna SQLite storage; None without Optuna."""
    try:
        import optuna
    except ImportError:
        return None
    storage = f"sqlite:///{tmp / 'optuna.db'}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="bench", storage=storage)
    start = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, "-c", OPTUNA_WORKER, storage, str(trials // 2 + (i < trials % 2))])
        for i in range(2)
    ]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit("an Optuna process failed")
    seconds = time.perf_counter() - start
    done = len(optuna.load_study(study_name="bench", storage=storage).trials)
    if done != trials:
        raise SystemExit(f"Optuna ran {done} trials, not {trials}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer jobs (2,000 reused, 500 otherwise)")
    parser.add_argument("--no-write", action="store_true", help=f"do not append to {RESULTS.name}")
    parser.add_argument("--dir", default=None, help="where the databases and workdirs go (default: the temp dir)")
    args = parser.parse_args(argv)
    many = 2000 if args.quick else 10000  # reused processes
    few = 500 if args.quick else 2000  # a fresh process per job, and the baselines
    trials = 500 if args.quick else 2000

    figures = []
    with tempfile.TemporaryDirectory(prefix="jobman-bench-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        load_before = os.getloadavg()[0]
        fresh_s, fresh_cpu = dispatch(tmp, few, "fresh")
        fork_cpu = bare_forks(few)
        figures.append(
            say(
                Figure(
                    f"default mode (fresh fork per job), CPU per job, {few:,} jobs",
                    1000 * fresh_cpu / few,
                    "ms",
                    1000 * fork_cpu / few,
                    "<= 2x a bare fork-and-exit",
                    fresh_cpu <= 2 * fork_cpu,
                    "(every process counted, start-up included; lower is better)",
                )
            )
        )
        files_cpu = workdir_files(tmp, few)
        print(
            f"  of which the file system's part: a workdir and its two output files, "
            f"{1000 * files_cpu / few:.2f} ms of CPU per job here"
        )
        reused_s, reused_cpu = dispatch(tmp, many, "reused", "--jobs-per-process", "1000")
        px_s, px_cpu = run_processes(tmp, few)
        px_rate = few / px_s
        figures.append(
            say(
                Figure(
                    f"--jobs-per-process 1000, {many:,} no-op jobs, wall",
                    many / reused_s,
                    "jobs/s",
                    px_rate,
                    ">= 20x one process per call (xargs -P 2)",
                    many / reused_s >= 20 * px_rate,
                    f"({reused_s:.2f} s, start-up included; CPU per job {1000 * reused_cpu / many:.2f} ms "
                    f"against {1000 * px_cpu / few:.2f} ms)",
                )
            )
        )
        opt_s = optuna_run(tmp, trials)
        if opt_s is not None:
            reuse_s, _ = dispatch(tmp, trials, "vs-optuna-reused", "--jobs-per-process", "1000")
            default_s, _ = dispatch(tmp, trials, "vs-optuna-fresh")
            figures.append(
                say(
                    Figure(
                        f"{trials:,} evaluations, 2 processes, --jobs-per-process 1000, wall",
                        trials / reuse_s,
                        "evals/s",
                        trials / opt_s,
                        ">= 50x Optuna (RDB storage on SQLite)",
                        trials / reuse_s >= 50 * trials / opt_s,
                        f"({reuse_s:.2f} s against {opt_s:.2f} s)",
                    )
                )
            )
            figures.append(
                say(
                    Figure(
                        f"{trials:,} evaluations, 2 processes, a fresh process per job, wall",
                        trials / default_s,
                        "evals/s",
                        trials / opt_s,
                        "Optuna (RDB storage on SQLite)",
                        None,
                        f"({default_s:.2f} s against {opt_s:.2f} s)",
                    )
                )
            )
            start_s, _ = dispatch(tmp, 2, "start-up", "--jobs-per-process", "1000")
            figures.append(
                say(
                    Figure(
                        "start-up: the same dispatch of 2 no-op jobs, wall",
                        start_s,
                        "s",
                        None,
                        f"what is left of {opt_s / 50:.2f} s (Optuna's time / 50) for the {trials:,} evaluations "
                        f"themselves: {opt_s / 50 - start_s:.2f} s",
                        None,
                    )
                )
            )
        else:
            print("Optuna is not installed (pip install '.[bench]'): its comparison is left out")
        load_after = os.getloadavg()[0]

    m = machine()
    lines = [
        f"## {m['date']}: job processes (`bench/job_processes.py{' --quick' if args.quick else ''}`)",
        "",
        f"{m['cpu']}, {m['memory']}, Python {m['python']}, SQLite {m['sqlite']}, SQLAlchemy {m['sqlalchemy']}; "
        f"load average {load_before:.1f} before, {load_after:.1f} after (a machine shared with other work); "
        f"databases and workdirs in {Path(tmp_name).parent}.",
        "",
    ]
    lines += [f"- {f.line()}" for f in figures]
    lines.append(
        f"- what every job costs the file system here (its workdir, stdout.txt and stderr.txt made, "
        f"nothing written): {1000 * files_cpu / few:.2f} ms of CPU per job"
    )
    if not args.no_write:
        old = RESULTS.read_text()
        RESULTS.write_text(old.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
        print(f"written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

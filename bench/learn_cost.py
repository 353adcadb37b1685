"""Benchmark: what a learning sampler costs where a job's end is recorded.

    python bench/learn_cost.py                       # 1,000 ended jobs, 60 tiny jobs on 2 workers
    python bench/learn_cost.py --ended 200 --jobs 30  # quicker

1. CPU ms per recorded end, on SQLite, of a ``--sampler tpe --parallel 1`` search (each end
   rebuilds the study from the table and asks TPE for the next point, in the finishing transaction)
   against the same ends of a ``--sampler random`` search (no proposal), measured in this process
   with ``time.process_time`` around ``Store.finish``, averaged over the ten ends before 100 and
   before ``--ended`` ended jobs. The difference is the proposal's cost.
2. Jobs per second of a tiny-function search (a quadratic, no sleep) of ``--jobs`` configurations
   run by ``jobman dispatch -j 2``, ``--sampler tpe --parallel 2`` against ``--sampler random``,
   wall clock from ``sqlschedule`` to the end of ``dispatch``.

Both methods run in the same invocation, one after the other; on a shared machine the seconds are
noisy, so compare the two columns of one run, not runs of different days.
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

from jobman.jobdb.distributions import Distribution
from jobman.jobdb.halving import Halving, sampled
from jobman.jobdb.learn import Plan
from jobman.jobdb.records import WorkerInfo
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import Expansion, parse_sweep

SPACE = {"x": Distribution("uniform", (-2.0, 2.0)), "y": Distribution("uniform", (0.0, 4.0))}
TOKENS = ["bench_learn_mod:quad", "x=uniform(-2,2)", "y=uniform(0,4)"]
MODULE = textwrap.dedent("""
    def quad(x, y):
        return {"loss": (x - 0.3) ** 2 + (y - 2) ** 2}
""")


def loss(params: dict) -> float:
    return (params["x"] - 0.3) ** 2 + (params["y"] - 2) ** 2


def ends(store: Store, count: int) -> list[float]:
    """Claim and finish ``count`` jobs in this process: the CPU ms of each finish, in order."""
    worker = WorkerInfo.here()
    out = []
    for _ in range(count):
        claimed = store.claim(worker)
        if claimed is None:
            break
        started = time.process_time()
        store.finish(claimed.job.id, claimed.lease, "DONE", results={"loss": loss(claimed.job.params)})
        out.append((time.process_time() - started) * 1000)
    return out


def cost(root: Path, ended: int) -> dict[str, list[float]]:
    out = {}
    for method in ("random", "tpe"):
        store = Store.open(f"sqlite:///{root / f'cost_{method}.db'}?table=t", create=True)
        if method == "tpe":
            plan = Plan("tpe", ended, 1, 0, (("loss", "min"),), "fn", TOKENS[0], ({},))
            store.start_search(sampled(SPACE, Halving("", (), 0, "loss")), plan)  # type: ignore[arg-type]
        else:
            store.schedule(Expansion(parse_sweep(TOKENS), samples=ended, seed=0))
        out[method] = ends(store, ended)
        store.dispose()
    return out


def throughput(root: Path, jobs: int) -> dict[str, float]:
    mods = root / "mods"
    mods.mkdir(exist_ok=True)
    (mods / "bench_learn_mod.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(mods), os.environ.get("PYTHONPATH")) if p)}
    out = {}
    for method in ("random", "tpe"):
        url = f"sqlite:///{root / f'run_{method}.db'}?table=t"
        extra = ["--sampler", "tpe", "--metric", "loss", "--parallel", "2"] if method == "tpe" else []
        started = time.perf_counter()
        for command in (
            ["sqlschedule", url, *TOKENS, "--samples", str(jobs), *extra],
            ["dispatch", url, "-j", "2", "--exproot", str(root / f"runs_{method}")],
        ):
            subprocess.run(
                [sys.executable, "-m", "jobman.cli.main", *command], env=env, check=True, capture_output=True
            )
        seconds = time.perf_counter() - started
        store = Store.open(url)
        done = sum(j.status.name == "DONE" for j in store.jobs())
        store.dispose()
        assert done == jobs, f"{method}: {done} of {jobs} jobs DONE"
        out[method] = jobs / seconds
    return out


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ended", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        times = cost(root, args.ended)
        rate = throughput(root, args.jobs)
    print(
        f"CPU ms per recorded end (SQLite, one process), mean of the 10 ends before N ended jobs; {os.cpu_count()} CPUs"
    )
    print(f"{'ended':>8} {'random':>10} {'tpe':>10} {'proposal':>10}")
    for n in sorted({min(100, args.ended), args.ended}):
        r, t = mean(times["random"][n - 10 : n]), mean(times["tpe"][n - 10 : n])
        print(f"{n:>8} {r:>10.1f} {t:>10.1f} {t - r:>10.1f}")
    print(f"\njobs/s of {args.jobs} tiny jobs, jobman dispatch -j 2 (sqlschedule to the end of dispatch)")
    print(f"{'random':>10} {'tpe':>10}")
    print(f"{rate['random']:>10.2f} {rate['tpe']:>10.2f}")


if __name__ == "__main__":
    main()

"""The cost of a call from Python: a cache hit, and ``call(...).result()`` run inline, beside a plain call.

    python bench/python_api.py [--quick]

The experiment first holds ``--jobs`` DONE calls (so a hit is found by index among many), then:
- a cache hit: ``exp.call(fn, x=i).result()`` of a DONE call (one read transaction), per call;
- inline: ``exp.call(fn, x=new).result()`` with ``backend="inline"`` (schedule, claim, run, finish), per call;
- the baseline: ``fn(x=i)`` called directly, in the same run.
On SQLite and PostgreSQL. The machine is shared: read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, fresh_pg_database, say

import jobman


def work(x: int) -> dict:
    """The benchmark's function: trivial, so what is measured is jobman's part."""
    return {"y": x * x}


def per_call(fn, args: list[int], rounds: int = 3) -> tuple[float, float]:
    """The best, over ``rounds``, of the mean seconds per ``fn(arg)``: wall-clock, and this process's CPU
    (on a shared machine the wall time also counts the waits for a core)."""
    wall, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        for a in args:
            fn(a)
        wall.append((time.perf_counter() - start) / len(args))
        cpu.append((time.process_time() - start_cpu) / len(args))
    return min(wall), min(cpu)


def measure(url: str, engine: str, jobs: int, calls: int, workdir: Path) -> list[Figure]:
    exp = jobman.Experiment(url, backend="inline", exproot=workdir / "runs")
    # Prefill: DONE calls, as a finished sweep leaves them (scheduled and finished through the store).
    futures = exp.map(work, [{"x": i} for i in range(jobs)])
    assert all(f.result() == {"y": i * i} for i, f in enumerate(futures))
    plain, _ = per_call(lambda i: work(x=i), list(range(calls)), rounds=5)
    hit, hit_cpu = per_call(lambda i: exp.call(work, x=i).result(), list(range(calls)))
    fresh = iter(range(jobs, jobs + 10 * calls))
    inline, inline_cpu = per_call(lambda _i: exp.call(work, x=next(fresh)).result(), list(range(calls)), rounds=1)
    exp.close()
    us = 1e6
    return [
        say(
            Figure(
                f"cache hit, exp.call(fn, x=i).result() of a DONE call among {jobs:,}, {engine}",
                hit * us,
                "µs",
                plain * us,
                "< 1 ms on SQLite",
                hit < 1e-3 if engine == "SQLite" else None,
                f"(CPU {hit_cpu * us:,.0f} µs; baseline: the plain call fn(x=i))",
            )
        ),
        say(
            Figure(
                f"inline, exp.call(fn, x=new).result() (schedule, claim, run, finish), {engine}",
                inline * us,
                "µs",
                plain * us,
                "",
                None,
                f"(CPU {inline_cpu * us:,.0f} µs; baseline: the plain call fn(x=i))",
            )
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--jobs", type=int, default=None, help="DONE calls in the experiment first")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args(argv)
    jobs = args.jobs or (1_000 if args.quick else 10_000)
    calls = 300 if args.quick else 2_000
    with tempfile.TemporaryDirectory() as tmp:
        measure(f"sqlite:///{tmp}/bench.db?table=calls", "SQLite", jobs, calls, Path(tmp))
        if not args.no_pg:
            url, drop = fresh_pg_database()
            try:
                measure(f"{url}?table=calls", "PostgreSQL", jobs, calls, Path(tmp))
            finally:
                drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

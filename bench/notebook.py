"""How long a notebook waits to show an experiment: ``Experiment._repr_html_`` (status counts, the
best so far as the dashboard picks it, the dashboard's link) on many finished jobs, beside
``jobman report``'s table on the same jobs in the same run (the report is what the view computes
its best from), and ``results()`` as a DataFrame beside reading the same jobs with ``Store.jobs``.

    python bench/notebook.py                              # 20,000 jobs in a temporary SQLite file
    python bench/notebook.py --db postgresql://postgres@127.0.0.1/postgres --jobs 100000

The jobs are made DONE in one bulk UPDATE, as bench/report_bench.py makes them.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time
import uuid
from pathlib import Path

from common import Figure, say
from report_bench import make_jobs

import jobman
from jobman.cli.report import run_report


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each; the fastest is printed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'bench.db'}"
        table = f"notebook_bench_{uuid.uuid4().hex[:8]}"
        exp = jobman.Experiment(f"{url}?table={table}" if "?" not in url else url, backend=None)
        make_jobs(exp.store, args.jobs)
        print(f"{args.jobs:,} DONE jobs ({exp.store.target.display})")
        view = best_of(args.repeat, exp._repr_html_)
        report = best_of(
            args.repeat, lambda: run_report(exp.store, metric="valid_error", fmt="table", stream=io.StringIO())
        )
        say(Figure("the experiment's HTML view", view * 1000, "ms", report * 1000, note="baseline: jobman report"))
        frame = best_of(args.repeat, exp.results)
        read = best_of(args.repeat, lambda: exp.store.jobs(with_deps=False))
        say(Figure("results() as a DataFrame", frame * 1000, "ms", read * 1000, note="baseline: Store.jobs alone"))
        exp.close()


if __name__ == "__main__":
    main()

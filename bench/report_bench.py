"""How long ``jobman report`` takes on 100,000 finished jobs.

Makes 20,000 configurations × 5 folds of DONE jobs with two metrics, then times the
function the ``report`` command runs (one query, JSON decoding, grouping, NumPy
aggregation, rendering) in this process, for the table and the JSON formats.

    python bench/report_bench.py                       # a fresh SQLite file in a temporary directory
    python bench/report_bench.py --db postgresql://postgres@127.0.0.1/bench --jobs 100000

The jobs are scheduled with ``Store.schedule``; their results are then written in one
bulk UPDATE through the store's engine, because finishing 100,000 jobs one claim at a
time (what workers do, measured by the worker benchmarks) would take most of an hour.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from jobman.cli.report import run_report
from jobman.jobdb.schema import job as t_job
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

FOLDS = 5


def make_jobs(store: Store, n_jobs: int, seed: int = 0) -> None:
    """``n_jobs`` DONE jobs: n_jobs / FOLDS configurations of (lr, nhid, l2, act), each over FOLDS folds."""
    rng = random.Random(seed)
    acts = ["tanh", "relu", "sigmoid", "elu"]
    specs = []
    for c in range(n_jobs // FOLDS):
        params = {
            "lr": 10 ** -(1 + c % 5),
            "nhid": 2 ** (5 + (c // 5) % 5),
            "l2": round(1e-5 * (c // 25 + 1), 8),
            "act": acts[c % 4],
            "nb_cross_fold": FOLDS,
            "epochs": 20,
        }
        for fold in range(FOLDS):
            specs.append(JobSpec(0, "fn", "bench.model:train", {**params, "id_cross_fold": fold}, None))
    ids = store.schedule(specs).job_ids
    now = time.time()
    rows = [
        {"jid": i, "res": json.dumps({"valid_error": rng.uniform(0.01, 0.2), "train_error": rng.uniform(0, 0.1)})}
        for i in ids
    ]
    update = (
        sa.update(t_job)
        .where(t_job.c.id == sa.bindparam("jid"))
        .values(status=Status.DONE.value, results=sa.bindparam("res"), attempt=1, finished_at=now)
    )
    with store.engine.begin() as conn:
        conn.execute(update, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database URL (default: a temporary SQLite file)")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each format; the fastest is printed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db or f"sqlite:///{Path(tmp) / 'bench.db'}"
        store = Store.open(url, f"report_bench_{uuid.uuid4().hex[:8]}")
        t0 = time.perf_counter()
        make_jobs(store, args.jobs)
        print(f"made {args.jobs:,} DONE jobs in {time.perf_counter() - t0:.1f} s ({store.target.display})")

        t0 = time.perf_counter()
        rows = store.report_rows()
        print(f"  the query alone:             {time.perf_counter() - t0:6.2f} s for {len(rows):,} rows")
        for fmt in ("table", "json"):
            wall, cpu = [], []
            for _ in range(args.repeat):
                sink = io.StringIO()
                t0, c0 = time.perf_counter(), time.process_time()
                report = run_report(store, metric="valid_error", fmt=fmt, stream=sink)
                wall.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            print(
                f"  jobman report --format {fmt:<5} {min(wall):6.2f} s  (this process's CPU: {min(cpu):.2f} s; "
                f"{len(report.rows):,} configurations of {report.jobs:,} jobs, {len(sink.getvalue()):,} bytes)"
            )
        print(report.summary_lines()[0])
        store.dispose()


if __name__ == "__main__":
    main()

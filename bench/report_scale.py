"""``jobman report`` at a million jobs: time and peak memory, table and json, SQLite and PostgreSQL.

Two sweeps of 1,000,000 DONE jobs each: 1,000,000 configurations of one run, and 200,000
configurations × 5 folds. Each report is a real ``jobman report`` process writing to /dev/null,
timed from start to exit; its peak memory is the process's maximum resident set (wait4).
Baseline, in the same run: the in-Python path (every job read into Python, as ``jobman report``
did before the database grouped them) on the folds sweep, table format.

    python bench/report_scale.py                         # both engines, 1,000,000 jobs
    python bench/report_scale.py --jobs 100000 --engines sqlite
    python bench/report_scale.py --no-baseline           # skip the slow in-Python run
    python bench/report_scale.py --database URL          # on the experiments an earlier make() left there

Writes bench/RESULTS-report-scale.md. The machine is shared: the load average is printed with
each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sqlalchemy as sa
from common import HERE, Figure, fresh_pg_database, machine, say

from jobman.jobdb.schema import job as t_job
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

SECONDS, MIB = 10.0, 300  # the targets: each report under 10 s and 300 MB
BASELINE = """
import sys
from jobman.cli.report import write_table
from jobman.jobdb.report import from_store_in_python
from jobman.jobdb.store import Store
store = Store.open(sys.argv[1], sys.argv[2])
rep = from_store_in_python(store, "valid_error")
write_table(rep, sys.stdout, top=30, experiment=store.experiment)
"""


def make(url: str, name: str, configs: int, folds: int, seed: int = 0) -> float:
    """``configs`` × ``folds`` DONE jobs with two results; the seconds it took."""
    t0 = time.perf_counter()
    store = Store.open(url, name)
    rng = random.Random(seed)
    acts = ["tanh", "relu", "sigmoid", "elu"]

    def specs():
        for c in range(configs):
            params = {
                "lr": round(rng.uniform(1e-5, 0.3), 5),
                "nhid": 2 ** (5 + c % 5),
                "act": acts[c % 4],
                "l2": round(1e-5 * (c // 20 + 1), 8),
                "epochs": 20,
            }
            if folds > 1:
                for fold in range(folds):
                    yield JobSpec(
                        0, "fn", "bench.model:train", {**params, "nb_cross_fold": folds, "id_cross_fold": fold}, None
                    )
            else:
                yield JobSpec(0, "fn", "bench.model:train", params, None)

    ids = store.schedule(list(specs())).job_ids
    update = (
        sa.update(t_job)
        .where(t_job.c.id == sa.bindparam("jid"))
        .values(status=Status.DONE.value, results=sa.bindparam("res"), attempt=1, finished_at=time.time())
    )
    with store.engine.begin() as conn:
        for k in range(0, len(ids), 100_000):
            conn.execute(
                update,
                [
                    {
                        "jid": i,
                        "res": json.dumps({"train_error": rng.uniform(0, 0.1), "valid_error": rng.uniform(0.01, 0.2)}),
                    }
                    for i in ids[k : k + 100_000]
                ],
            )
    if store.engine.dialect.name == "postgresql":
        # What autovacuum does within a minute of such a change (it is off on some servers, this
        # machine's among them): the dead row versions the update left are let go, the planner's
        # statistics read. Without it every report reads twice the pages. VACUUM runs outside a transaction.
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE job")
    store.dispose()
    return time.perf_counter() - t0


def timed(argv: list[str]) -> tuple[float, float, int]:
    """(seconds, peak MiB, bytes written) of a process. Its peak is read by /usr/bin/time, a small
    process: the peak of a child forked from this one would count this one's memory at the fork."""
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile("r") as peak:
        t0 = time.perf_counter()
        proc = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", peak.name, *argv], stdout=out, stderr=subprocess.PIPE)
        seconds = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(f"{' '.join(argv[:4])} failed: {proc.stderr.decode()[-500:]}")
        return seconds, int(peak.read().split()[-1]) / 1024, out.tell()


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def bench(
    engine: str, url: str, jobs: int, baseline: bool, skip_flat_table: bool = False, made: bool = False
) -> list[Figure]:
    figures = []
    shapes = [("flat", jobs, 1), ("folds", jobs // 5, 5)]
    for name, configs, folds in shapes if not made else ():
        seconds = make(url, name, configs, folds)
        print(
            f"{engine}: made {configs * folds:,} DONE jobs ({configs:,} configurations × {folds}) in {seconds:.0f} s",
            flush=True,
        )
    base = None
    if baseline:
        t, mib, _ = timed([sys.executable, "-c", BASELINE, url, "folds"])
        base = (t, mib)
        say(
            Figure(
                f"{engine} in-Python path, {jobs:,} jobs in {jobs // 5:,} × 5, table",
                t,
                "s",
                note=f"peak {mib:,.0f} MiB; {load()}",
            )
        )
    for name, configs, folds in shapes:
        for fmt in ("table", "json"):
            if skip_flat_table and name == "flat" and fmt == "table":
                continue
            t, mib, size = timed(
                [sys.executable, "-m", "jobman.cli.main", "report", url, "--table", name, "--format", fmt]
            )
            what = f"{engine} report, {configs * folds:,} jobs in {configs:,}" + (f" × {folds}" if folds > 1 else "")
            figures.append(
                say(
                    Figure(
                        f"{what}, {fmt}",
                        t,
                        "s",
                        baseline=base[0] if base and name == "folds" and fmt == "table" else None,
                        target=f"< {SECONDS:.0f} s and < {MIB} MB",
                        met=t < SECONDS and mib * 2**20 < MIB * 1e6,
                        note=f"peak {mib:,.0f} MiB, {size / 2**20:,.0f} MiB written; {load()}",
                    )
                )
            )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--no-baseline", action="store_true", help="skip the in-Python baseline")
    parser.add_argument(
        "--database",
        metavar="URL",
        help="time the reports on this database, whose experiments flat and folds make() filled "
        "before (with --jobs), rather than on fresh ones",
    )
    parser.add_argument(
        "--beside-scale",
        action="store_true",
        help="run from `run_all.py --scale`: leave out the flat table (bench/scale.py times it) and write no file",
    )
    args = parser.parse_args()
    info = machine()
    figures = []
    for engine in args.engines.split(",") if not args.database else ():
        if engine == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                figures += bench(
                    engine, f"sqlite:///{Path(tmp) / 'scale.db'}", args.jobs, not args.no_baseline, args.beside_scale
                )
        else:
            url, drop = fresh_pg_database()
            try:
                figures += bench(engine, url, args.jobs, not args.no_baseline, args.beside_scale)
            finally:
                drop()
    if args.database:
        engine = "postgresql" if args.database.startswith(("postgres", "postgresql")) else "sqlite"
        figures += bench(engine, args.database, args.jobs, not args.no_baseline, made=True)
    if args.beside_scale:
        return
    lines = [
        "# jobman report at scale",
        "",
        f"`python bench/report_scale.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        f"{info['date']}, {info['cpu']}, {info['memory']}, SQLite {info['sqlite']}, "
        f"PostgreSQL {info['postgresql']}. The machine is shared: the load average is given with each figure.",
        "",
        "```text",
        *(f.line() for f in figures),
        "```",
        "",
    ]
    (HERE / "RESULTS-report-scale.md").write_text("\n".join(lines))
    print(f"wrote {HERE / 'RESULTS-report-scale.md'}")


if __name__ == "__main__":
    main()

"""Many workers on one PostgreSQL: jobs/s, peak server connections, and how long workers outlive the work.

    python bench/connections.py [--workers 50 100 200] [--jobs 600] [--seconds 0.2] [--direct] [--pgbouncer]

Starts N ``jobman worker`` processes at once (as a Slurm array would) on a fresh database of the
local server (``JOBMAN_TEST_PG`` or postgres@127.0.0.1:5432), directly and through a PgBouncer in
transaction pooling mode with a pool of 10 server connections (the tests' set-up, run as user
postgres). Each job sleeps ``--seconds`` and notes when it ended. Reported per run: jobs/s from
the workers' start to the last job's end, the peak of the database's server connections (sampled
every 20 ms), the peak memory of the workers and their fork servers, and the time from the last
job's end to the last worker's exit.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psutil
import psycopg

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from pgbouncer import start_pgbouncer, stop_pgbouncer, through_pgbouncer  # noqa: E402

from jobman.jobdb.store import Store  # noqa: E402
from jobman.jobdb.sweep import JobSpec  # noqa: E402

ADMIN = os.environ.get("JOBMAN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
MODULE = """
import os, time

def nap(state, channel):
    time.sleep(state["seconds"])
    with open(os.environ["JM_ENDS"], "a") as fh:
        fh.write(f"{time.time()}\\n")
"""


class Sampler:
    """Peak server connections to ``database`` and peak memory of ``procs`` and their children."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.procs: list[subprocess.Popen] = []
        self.peak_connections = 0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            last_rss = 0.0
            while not self._stop.is_set():
                (n,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
                    (self.database,),
                ).fetchone()
                self.peak_connections = max(self.peak_connections, n)
                if time.monotonic() - last_rss > 1:
                    last_rss = time.monotonic()
                    self.peak_rss = max(self.peak_rss, self._rss())
                time.sleep(0.02)

    def _rss(self) -> int:
        total = 0
        for proc in list(self.procs):
            try:
                p = psutil.Process(proc.pid)
                total += sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
            except psutil.Error:
                pass
        return total

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def one_run(workers: int, jobs: int, seconds: float, bouncer: str | None, tmp: Path) -> dict[str, float]:
    """``workers`` workers on ``jobs`` jobs of ``seconds``, directly or through ``bouncer`` (host:port)."""
    name = f"jobman_bench_conn_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"{ADMIN.rsplit('/', 1)[0]}/{name}?table=bench"
        store = Store.open(url)
        store.schedule(
            [
                JobSpec(
                    phase=0, kind="fn", target="jm_bench_conn:nap", params={"seconds": seconds, "i": i}, parent=None
                )
                for i in range(jobs)
            ]
        )
        store.dispose()
        ends = tmp / f"ends-{name}.txt"
        ends.touch()
        env = {
            **os.environ,
            "JM_ENDS": str(ends),
            "PYTHONPATH": os.pathsep.join(p for p in (str(tmp), os.environ.get("PYTHONPATH")) if p),
        }
        run_url = through_pgbouncer(url, bouncer) if bouncer else url
        argv = [sys.executable, "-m", "jobman.cli.main", "worker", run_url, "--exproot", str(tmp / "runs")]
        with Sampler(name) as sampler:
            began = time.time()
            procs = [
                subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(workers)
            ]
            sampler.procs = procs
            exits: list[float] = []
            waiting = list(procs)
            while waiting:
                for proc in list(waiting):
                    if proc.poll() is not None:
                        exits.append(time.time())
                        waiting.remove(proc)
                time.sleep(0.05)
        times = sorted(float(x) for x in ends.read_text().split())
        failed = sum(p.returncode != 0 for p in procs)
        return {
            "done": len(times),
            "jobs_per_s": len(times) / (times[-1] - began) if times else 0.0,
            "peak_connections": sampler.peak_connections,
            "peak_rss_gib": sampler.peak_rss / 2**30,
            "outlived_s": max(exits) - times[-1] if times else float("nan"),
            "failed_workers": failed,
        }
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=0.2)
    parser.add_argument("--direct", action="store_true", help="only directly (default: both ways)")
    parser.add_argument("--pgbouncer", action="store_true", help="only through PgBouncer (default: both ways)")
    args = parser.parse_args()
    ways = [w for w, on in (("direct", args.direct), ("pgbouncer", args.pgbouncer)) if on] or ["direct", "pgbouncer"]
    with tempfile.TemporaryDirectory(prefix="jobman-bench-conn-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "jm_bench_conn.py").write_text(MODULE)
        bouncer, directory = start_pgbouncer(ADMIN, pool_size=10) if "pgbouncer" in ways else (None, None)
        try:
            print(
                f"{'way':<10} {'workers':>7} {'done':>5} {'jobs/s':>7} {'peak conn':>9} {'peak GiB':>8} "
                f"{'outlived s':>10} {'failed':>6}"
            )
            for n in args.workers:
                for way in ways:
                    r = one_run(n, args.jobs, args.seconds, bouncer if way == "pgbouncer" else None, tmp)
                    print(
                        f"{way:<10} {n:>7} {r['done']:>5} {r['jobs_per_s']:>7.1f} {r['peak_connections']:>9} "
                        f"{r['peak_rss_gib']:>8.2f} {r['outlived_s']:>10.1f} {r['failed_workers']:>6}",
                        flush=True,
                    )
        finally:
            if directory is not None:
                stop_pgbouncer(directory)


if __name__ == "__main__":
    main()

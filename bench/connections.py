"""Many workers on one PostgreSQL: jobs/s, peak server connections, and how long workers outlive the work.

    python bench/connections.py [--workers 50 100 200] [--jobs 600] [--seconds 0.2] [--direct] [--pgbouncer]
                                [--baseline 50]

Starts N ``jobman worker`` processes at once (as a Slurm array would) on a fresh database of the
local server (``JOBMAN_TEST_PG`` or postgres@127.0.0.1:5432), directly and through a PgBouncer in
transaction pooling mode with a pool of 10 server connections (the tests' set-up, run as user
postgres). Each job sleeps ``--seconds`` and notes when it ended. Reported per run: jobs/s from
the workers' start to the last job's end, the peak of the database's server connections (sampled
every 20 ms), the peak memory of the workers and their fork servers, and the time from the last
job's end to the last worker's exit. ``--baseline N`` first runs N workers directly, whose jobs/s
each run is set beside ("vs base"); "load" is the machine's load average at the run's end.
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
        fh.write(f"{state['i']} {time.time()}\\n")
"""


class Sampler:
    """Peak server connections to ``database`` and peak memory of ``procs`` and their children, each
    sampled by a thread of its own: a scan of the machine's processes (slow under load) never delays
    a count of connections."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.procs: list[subprocess.Popen] = []
        self.peak_connections = 0
        self.peak_rss = 0
        self.samples = 0
        self.missed = 0  # samples the server refused
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._count, self._measure)]

    def _count(self) -> None:
        # Connected before the workers start, and again should the server drop it: a sampler that
        # could not count would report a peak of 0.
        conn = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(ADMIN, autocommit=True)
                (n,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
                    (self.database,),
                ).fetchone()
                self.peak_connections = max(self.peak_connections, n)
                self.samples += 1
            except psycopg.Error:
                self.missed += 1
                if conn is not None:
                    conn.close()
                conn = None
            time.sleep(0.02)
        if conn is not None:
            conn.close()

    def _measure(self) -> None:
        while not self._stop.wait(1.0):
            self.peak_rss = max(self.peak_rss, self._rss())

    def _rss(self) -> int:
        """The resident memory of the workers and everything under them, from one scan of the processes."""
        children: dict[int, list[int]] = {}
        rss: dict[int, int] = {}
        for proc in psutil.process_iter(["ppid", "memory_info"]):
            if proc.info["memory_info"] is not None:
                children.setdefault(proc.info["ppid"], []).append(proc.pid)
                rss[proc.pid] = proc.info["memory_info"].rss
        total, todo = 0, [p.pid for p in list(self.procs)]
        while todo:
            pid = todo.pop()
            total += rss.get(pid, 0)
            todo.extend(children.get(pid, ()))
        return total

    def __enter__(self) -> Sampler:
        for thread in self._threads:
            thread.start()
        while not (self.samples or self.missed):  # counting before the first worker starts
            time.sleep(0.01)
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


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
        ran = [line.split() for line in ends.read_text().splitlines()]
        times = sorted(float(end) for _i, end in ran)
        once = len({i for i, _end in ran}) == len(ran) == jobs  # every job ran, none twice
        store = Store.open(url)
        once = once and {j.status.value for j in store.jobs()} == {"DONE"}
        store.dispose()
        failed = sum(p.returncode != 0 for p in procs)
        return {
            "done": len(times),
            "once": once,
            "jobs_per_s": len(times) / (times[-1] - began) if times else 0.0,
            "peak_connections": sampler.peak_connections,
            "peak_rss_gib": sampler.peak_rss / 2**30,
            "outlived_s": max(exits) - times[-1] if times else float("nan"),
            "failed_workers": failed,
            "missed_samples": sampler.missed,
            "samples": sampler.samples,
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
    parser.add_argument(
        "--baseline", type=int, default=0, help="first run this many workers directly, the jobs/s set beside"
    )
    args = parser.parse_args()
    ways = [w for w, on in (("direct", args.direct), ("pgbouncer", args.pgbouncer)) if on] or ["direct", "pgbouncer"]
    runs = [(args.baseline, "direct")] if args.baseline else []
    runs += [(n, way) for n in args.workers for way in ways]
    with tempfile.TemporaryDirectory(prefix="jobman-bench-conn-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "jm_bench_conn.py").write_text(MODULE)
        bouncer, directory = start_pgbouncer(ADMIN, pool_size=10) if "pgbouncer" in ways else (None, None)
        try:
            print(
                f"{'way':<10} {'workers':>7} {'done':>5} {'jobs/s':>7} {'vs base':>7} {'peak conn':>9} {'peak GiB':>8} "
                f"{'outlived s':>10} {'failed':>6} {'once':>5} {'samples':>7} {'missed':>6} {'load':>5}"
            )
            base = None
            for n, way in runs:
                r = one_run(n, args.jobs, args.seconds, bouncer if way == "pgbouncer" else None, tmp)
                base = base or r["jobs_per_s"]
                print(
                    f"{way:<10} {n:>7} {r['done']:>5} {r['jobs_per_s']:>7.1f} {r['jobs_per_s'] / base:>7.2f} "
                    f"{r['peak_connections']:>9} {r['peak_rss_gib']:>8.2f} {r['outlived_s']:>10.1f} "
                    f"{r['failed_workers']:>6} {'yes' if r['once'] else 'NO':>5} {r['samples']:>7} "
                    f"{r['missed_samples']:>6} {os.getloadavg()[0]:>5.1f}",
                    flush=True,
                )
        finally:
            if directory is not None:
                stop_pgbouncer(directory)


if __name__ == "__main__":
    main()

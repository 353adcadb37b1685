"""Many workers on one PostgreSQL: jobs/s, peak server connections, and how long workers outlive the work.

    python bench/connections.py [--workers 50 100 200] [--jobs 600] [--seconds 2] [--direct] [--pgbouncer]
                                [--start workers dispatch] [--baseline 50] [--server private|shared]
                                [--claim-rate]

Starts N workers on a fresh database, in one of two ways a lab would: N ``jobman worker`` processes
at once (``--start workers``, as a Slurm array's tasks each start one), or one ``jobman dispatch -j N``
(``--start dispatch``, which forks its workers from one warm interpreter, its zygote); directly and
through a PgBouncer in transaction pooling mode with a pool of 10 server connections (the tests'
set-up, run as user postgres). The server is by default a private PostgreSQL 15 (``initdb`` into a
temporary directory, its ``max_connections`` 100 and durability settings at their defaults), so that
the workers filling it never fill the server others share; ``--server shared`` uses
``JOBMAN_TEST_PG`` (or postgres@127.0.0.1:5432). Each job sleeps ``--seconds`` and notes when it ended.
Reported per run: jobs/s from the start to the last job's end, the peak of the database's server
connections (sampled every 20 ms), the peak resident memory of every process started (summed: shared
pages of forked workers are counted in each, so an upper bound), and the time from the last job's end
to the last worker's exit (for a dispatch, to the dispatch's exit). ``--baseline N`` first runs N
workers directly, whose jobs/s each run is set beside ("vs base"); "load" is the machine's load
average at the run's end. ``--claim-rate`` first measures, on the same server, how many jobs a second
the store claims and records (1, 2, 4 and 8 processes, each a claim-and-finish loop with no job), and
how long a worker's connect with one heartbeat, and one with a record-and-claim, take.
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
from test_faults import PrivatePostgres  # noqa: E402

from jobman.jobdb.store import Store, WorkerInfo  # noqa: E402
from jobman.jobdb.sweep import JobSpec  # noqa: E402

SHARED = os.environ.get("JOBMAN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
ADMIN = SHARED  # the server the runs use: the private one once it is started
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


def private_server() -> PrivatePostgres:
    """A PostgreSQL 15 of this bench alone, as installed (``max_connections`` 100, fsync on) but on a free
    port: the connections its workers take are no other user's."""
    server = PrivatePostgres()
    server.init()
    server._run(
        "pg_ctl",
        "-D",
        str(server.data),
        "-o",
        f"-p {server.port} -c listen_addresses=127.0.0.1 -k {server.dir} -c max_connections=100",
        "-l",
        str(server.dir / "log"),
        "-w",
        "start",
    )
    return server


def one_run(
    workers: int, jobs: int, seconds: float, bouncer: str | None, tmp: Path, start: str = "workers"
) -> dict[str, float]:
    """``workers`` workers on ``jobs`` jobs of ``seconds``, directly or through ``bouncer`` (host:port),
    started as ``start`` says: N ``jobman worker`` processes, or one ``jobman dispatch -j N``."""
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
        if start == "dispatch":
            argv = [sys.executable, "-m", "jobman.cli.main", "dispatch", run_url, "-j", str(workers), "--no-progress"]
            argv += ["--exproot", str(tmp / "runs")]
            count = 1
        else:
            argv = [sys.executable, "-m", "jobman.cli.main", "worker", run_url, "--exproot", str(tmp / "runs")]
            count = workers
        with Sampler(name) as sampler:
            began = time.time()
            procs = [
                subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(count)
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


def claim_rate(procs_list: list[int], jobs: int) -> None:
    """The store's claim-and-record rate on the bench's server, and the time of a worker's connect with
    one heartbeat or one record-and-claim (a worker of long jobs makes one of each per heartbeat, and per
    job), each the median of 200."""
    import claim  # bench/claim.py: the same loop as its figures

    with psycopg.connect(ADMIN, autocommit=True) as conn:
        (fsync,) = conn.execute("SHOW fsync").fetchone()
        (sync,) = conn.execute("SHOW synchronous_commit").fetchone()
    print(f"server: fsync={fsync}, synchronous_commit={sync}")
    for procs in procs_list:
        url, drop = fresh_database()
        try:
            rate, dup, lost = claim.measure(claim.jobman_loop, url + "?table=bench", procs, jobs)
        finally:
            drop()
        print(
            f"claim+record, {procs} process(es), {jobs} jobs: {rate:,.0f} jobs/s "
            f"(duplicates {dup}, lost {lost}) load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    url, drop = fresh_database()
    try:
        url += "?table=bench"
        store = Store.open(url)
        store.schedule([JobSpec(phase=0, kind="fn", target="m:f", params={"i": i}, parent=None) for i in range(202)])
        store.dispose()
        from jobman.jobdb.url import parse_db

        worker = Store(parse_db(url, None), create=False, worker=True)
        me = WorkerInfo.here()
        claimed = worker.claim(me)
        assert claimed is not None
        beats, records = [], []
        for _ in range(200):
            worker.keep_connection(False)  # a long job's worker: a connect per heartbeat and per record
            t = time.perf_counter()
            worker.heartbeat(claimed.job.id, claimed.lease)
            worker.keep_connection(True)
            worker.keep_connection(False)
            beats.append(time.perf_counter() - t)
            t = time.perf_counter()
            _, claimed = worker.finish_and_claim(claimed.job.id, claimed.lease, "DONE", me, results={"ok": 1})
            worker.keep_connection(True)
            worker.keep_connection(False)
            records.append(time.perf_counter() - t)
            assert claimed is not None
        worker.dispose()
    finally:
        drop()
    print(
        f"a worker's connect + heartbeat: median {1000 * sorted(beats)[100]:.1f} ms; connect + record-and-claim: "
        f"median {1000 * sorted(records)[100]:.1f} ms; load {os.getloadavg()[0]:.1f}",
        flush=True,
    )


def fresh_database() -> tuple[str, object]:
    name = f"jobman_bench_conn_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"{ADMIN.rsplit('/', 1)[0]}/{name}", drop


def main() -> None:
    global ADMIN
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--direct", action="store_true", help="only directly (default: both ways)")
    parser.add_argument("--pgbouncer", action="store_true", help="only through PgBouncer (default: both ways)")
    parser.add_argument(
        "--baseline", type=int, default=0, help="first run this many workers directly, the jobs/s set beside"
    )
    parser.add_argument("--start", nargs="+", choices=["workers", "dispatch"], default=["workers", "dispatch"])
    parser.add_argument("--server", choices=["private", "shared"], default="private")
    parser.add_argument("--claim-rate", action="store_true", help="first measure the store's claim rate here")
    args = parser.parse_args()
    ways = [w for w, on in (("direct", args.direct), ("pgbouncer", args.pgbouncer)) if on] or ["direct", "pgbouncer"]
    runs = [(args.baseline, "direct", args.start[0])] if args.baseline else []
    runs += [(n, way, start) for start in args.start for n in args.workers for way in ways]
    server = private_server() if args.server == "private" else None
    if server is not None:
        ADMIN = server.url
    try:
        if args.claim_rate:
            claim_rate([1, 2, 4, 8], 4000)
        with tempfile.TemporaryDirectory(prefix="jobman-bench-conn-") as tmp_name:
            tmp = Path(tmp_name)
            (tmp / "jm_bench_conn.py").write_text(MODULE)
            bouncer, directory = start_pgbouncer(ADMIN, pool_size=10) if "pgbouncer" in ways else (None, None)
            try:
                print(
                    f"{'start':<8} {'way':<10} {'workers':>7} {'done':>5} {'jobs/s':>7} {'vs base':>7} "
                    f"{'peak conn':>9} {'peak GiB':>8} {'outlived s':>10} {'failed':>6} {'once':>5} "
                    f"{'samples':>7} {'missed':>6} {'load':>5}"
                )
                base = None
                for n, way, start in runs:
                    r = one_run(n, args.jobs, args.seconds, bouncer if way == "pgbouncer" else None, tmp, start)
                    base = base or r["jobs_per_s"]
                    print(
                        f"{start:<8} {way:<10} {n:>7} {r['done']:>5} {r['jobs_per_s']:>7.1f} "
                        f"{r['jobs_per_s'] / base:>7.2f} {r['peak_connections']:>9} {r['peak_rss_gib']:>8.2f} "
                        f"{r['outlived_s']:>10.1f} {r['failed_workers']:>6} {'yes' if r['once'] else 'NO':>5} "
                        f"{r['samples']:>7} {r['missed_samples']:>6} {os.getloadavg()[0]:>5.1f}",
                        flush=True,
                    )
            finally:
                if directory is not None:
                    stop_pgbouncer(directory)
    finally:
        if server is not None:
            server.teardown()


if __name__ == "__main__":
    main()

"""N processes claiming and finishing no-op jobs through the store, beside the bare SQL loop.

    python bench/claim.py [--jobs 20000] [--procs 1,2,4,8] [--repeat 3] [--quick]

The bare loop is the same claim (BEGIN IMMEDIATE + UPDATE ... RETURNING on SQLite,
FOR UPDATE SKIP LOCKED on PostgreSQL) and finish, with no events, leases or checks.
Every run also counts duplicates and lost jobs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, fresh_pg_database, grid, say

from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import expand, parse_sweep

PICK = (
    "SELECT id FROM job WHERE experiment_id = {p} AND status = 'QUEUED' ORDER BY priority DESC, queue_order, id LIMIT 1"
)


def jobman_loop(url: str, out: mp.Queue) -> None:
    store = Store.open(url)
    me = WorkerInfo.here()
    got = []
    claimed = store.claim(me)
    while claimed is not None:  # as a worker does: the record of one job claims the next
        got.append(claimed.job.id)
        _, claimed = store.finish_and_claim(claimed.job.id, claimed.lease, "DONE", me, results={"ok": 1})
    out.put(got)


def bare_loop(url: str, out: mp.Queue) -> None:
    got = []
    if url.startswith("sqlite"):
        import sqlite3

        con = sqlite3.connect(url.split("///", 1)[1].split("?")[0], isolation_level=None, timeout=60)
        con.execute("PRAGMA synchronous=NORMAL")
        claim = f"UPDATE job SET status='RUNNING', lease=lease+1 WHERE id = ({PICK.format(p='?')}) RETURNING id"
        while True:
            con.execute("BEGIN IMMEDIATE")
            row = con.execute(claim, (1,)).fetchone()
            con.execute("COMMIT")
            if row is None:
                break
            con.execute("BEGIN IMMEDIATE")
            con.execute("UPDATE job SET status='DONE', results='{\"ok\": 1}' WHERE id=? AND status='RUNNING'", row)
            con.execute("COMMIT")
            got.append(row[0])
    else:
        import psycopg

        with psycopg.connect(url.split("?")[0], autocommit=False) as con:
            claim = (
                f"UPDATE job SET status='RUNNING', lease=lease+1 WHERE id = ({PICK.format(p='%s')} "
                "FOR UPDATE SKIP LOCKED) RETURNING id"
            )
            while True:
                row = con.execute(claim, (1,)).fetchone()
                con.commit()
                if row is None:
                    break
                con.execute("UPDATE job SET status='DONE', results='{\"ok\": 1}' WHERE id=%s AND status='RUNNING'", row)
                con.commit()
                got.append(row[0])
    out.put(got)


def measure(loop, url: str, procs: int, jobs: int) -> tuple[float, int, int]:
    """Jobs/s, duplicates and lost jobs of ``procs`` processes running ``loop`` on a fresh experiment."""
    store = Store.open(url)
    store.schedule(expand(parse_sweep(["bench:noop", f"i={grid(jobs)}"])))
    store.dispose()
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    workers = [ctx.Process(target=loop, args=(url, queue)) for _ in range(procs)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    claimed = [i for _ in workers for i in queue.get()]
    seconds = time.perf_counter() - start
    for w in workers:
        w.join()
    duplicates = len(claimed) - len(set(claimed))
    lost = jobs - len(set(claimed))
    return jobs / seconds, duplicates, lost


def run(jobs: int, procs_list: list[int], repeat: int) -> list[Figure]:
    """Each SQLite figure is the best of ``repeat`` runs of each side, taken in turns; PostgreSQL's
    runs take a minute each at one process, and are run once."""
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("SQLite", "PostgreSQL"):
            runs = repeat if engine == "SQLite" else 1
            for procs in procs_list:
                ours, base, dup, lost, bdup, blost = 0.0, 0.0, 0, 0, 0, 0
                for i in range(runs):  # each run on fresh databases, where the experiment has id 1
                    if engine == "PostgreSQL":
                        url_j, drop_j = fresh_pg_database()
                        url_b, drop_b = fresh_pg_database()
                        url_j, url_b = url_j + "?table=bench", url_b + "?table=bench"
                    else:
                        url_j = f"sqlite:///{Path(tmp) / f'j{procs}_{i}'}.db?table=bench"
                        url_b = f"sqlite:///{Path(tmp) / f'b{procs}_{i}'}.db?table=bench"
                        drop_j = drop_b = lambda: None
                    try:
                        rate, d, n = measure(jobman_loop, url_j, procs, jobs)
                        ours, dup, lost = max(ours, rate), dup + d, lost + n
                        rate, d, n = measure(bare_loop, url_b, procs, jobs)
                        base, bdup, blost = max(base, rate), bdup + d, blost + n
                    finally:
                        drop_j()
                        drop_b()
                ok = ours >= 0.5 * base and dup == 0 and lost == 0
                best = f", best of {runs}" if runs > 1 else ""
                figures.append(
                    say(
                        Figure(
                            f"claim+finish {jobs:,} jobs, {procs} process(es), {engine}{best}",
                            ours,
                            "jobs/s",
                            base,
                            ">= 50% of bare loop, 0 duplicates, 0 lost",
                            ok,
                            f"duplicates {dup}, lost {lost} (bare: {bdup}, {blost})",
                        )
                    )
                )
    return figures


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--procs", default="1,2,4,8")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each side on SQLite, the best kept")
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 1 and 4 processes, one run")
    args = parser.parse_args(argv)
    if args.quick:
        return run(2_000, [1, 4], 1)
    return run(args.jobs, [int(p) for p in args.procs.split(",")], args.repeat)


if __name__ == "__main__":
    main()

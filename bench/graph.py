"""The monitor's scan over 100,000 jobs with 10,000 RUNNING, and a cascading reset of 10,000 descendants.

    python bench/graph.py [--quick]

Both on SQLite and PostgreSQL. Running jobs are made by claiming them through the
store from this process, so the monitor finds every worker alive and only scans.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, Timer, fresh_pg_database, grid, say

from jobman.dispatch.monitor import Monitor, MonitorOptions
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import expand, parse_sweep


def monitor_scan(url: str, jobs: int, running: int) -> float:
    store = Store.open(url)
    store.schedule(expand(parse_sweep(["bench:noop", f"a={grid(jobs // 100)}", f"b={grid(100)}"])))
    me = WorkerInfo.here()
    for _ in range(running):
        store.claim(me)
    monitor = Monitor(store, MonitorOptions(relaunch=True))
    monitor.scan()  # warm: the first scan pays for imports and the connection
    with Timer() as t:
        report = monitor.scan()
    assert not report.to_dict().get("crashed"), "the scan must find every worker of this process alive"
    return t.seconds


def cascade(url: str, width: int) -> tuple[float, int]:
    """A root, ``width`` children, ``width`` grandchildren each: all DONE, then the root is reset."""
    store = Store.open(url)
    result = store.schedule(
        expand(parse_sweep(["bench:noop", "root=1", "--", f"c={grid(width)}", "--", f"g={grid(width)}"]))
    )
    store.set_status(result.job_ids, Status.DONE)
    root = min(result.job_ids)
    with Timer() as t:
        changed = store.reset([root], cascade=True)
    waiting = sum(n for (_p, s), n in store.counts().items() if s == "WAITING")
    assert waiting == len(result.job_ids) - 1, "every descendant must be back to WAITING"
    return t.seconds, len(changed) - 1


def run(quick: bool) -> list[Figure]:
    jobs, running, width = (10_000, 1_000, 30) if quick else (100_000, 10_000, 100)
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in ("SQLite", "PostgreSQL"):
            if engine == "SQLite":
                url_m, url_c, drops = f"sqlite:///{tmp}/m.db?table=m", f"sqlite:///{tmp}/c.db?table=c", []
            else:
                (m, dm), (c, dc) = fresh_pg_database(), fresh_pg_database()
                url_m, url_c, drops = f"{m}?table=m", f"{c}?table=c", [dm, dc]
            try:
                seconds = monitor_scan(url_m, jobs, running)
                figures.append(
                    say(
                        Figure(
                            f"monitor scan, {jobs:,} jobs of which {running:,} RUNNING, {engine}",
                            seconds,
                            "s",
                            None,
                            "< 1 s",
                            seconds < 1,
                        )
                    )
                )
                seconds, n = cascade(url_c, width)
                figures.append(
                    say(
                        Figure(
                            f"reset --cascade of a root with {n:,} DONE descendants, {engine}",
                            seconds,
                            "s",
                            None,
                            "< 2 s, one transaction",
                            seconds < 2,
                        )
                    )
                )
            finally:
                for drop in drops:
                    drop()
    return figures


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 jobs, 1,000 running, 930 descendants")
    return run(parser.parse_args(argv).quick)


if __name__ == "__main__":
    main()

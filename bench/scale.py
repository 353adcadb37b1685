"""A million jobs on both engines: what scheduling, listing, monitoring, a cascade and a report cost.

    python bench/scale.py [--jobs 1000000] [--engines sqlite,postgresql] [--ten-million]

One experiment of a 1,000 x 1,000 grid per engine. Each command runs as a user runs it (the CLI, process
start included) and its peak memory is the process's own (wait4's ru_maxrss); the read paths are also
timed as the store's call alone, in this process, which is what an index decides. The schedule is
printed beside one raw-driver executemany of the same rows into the same schema, in the same run.
Then: 10,000 jobs are claimed (RUNNING, their worker alive: this process), the rest are made DONE
with a result, and a root with 100,000 descendants is reset in another experiment of the database.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sqlalchemy as sa
from common import Figure, Timer, fresh_pg_database, grid, say
from schedule import raw_pg, raw_sqlite

from jobman.dispatch.monitor import Monitor, MonitorOptions
from jobman.jobdb.scheduling import params_hashes
from jobman.jobdb.schema import job as t_job
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import Expansion, parse_sweep

RUNNING = 10_000
TIME = shutil.which("time", path="/usr/bin:/bin") or "/usr/bin/time"  # GNU time (Debian: apt install time)


def tokens(jobs: int, extra: int = 0) -> list[str]:
    """A two-key grid of ``jobs`` jobs (1,000 x jobs/1,000); ``extra`` more values of the second key."""
    return ["bench_noop:run", f"a={grid(1000)}", f"b={grid(max(1, jobs // 1000) + extra)}"]


def cli(*args: str, timeout: float = 1800) -> tuple[float, float, str]:
    """Run ``jobman ARGS``: (seconds, peak MB of that process, its output).

    The peak is measured by GNU time around the command: a process started straight from this one
    would count this one's memory, which it shares until it execs.
    """
    with tempfile.NamedTemporaryFile(mode="r") as peak:
        start = time.perf_counter()
        proc = subprocess.run(
            [TIME, "-f", "%M", "-o", peak.name, sys.executable, "-m", "jobman.cli.main", *args],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
        )
        seconds = time.perf_counter() - start
        kb = float(peak.read().strip().splitlines()[-1])
    if proc.returncode:
        said = (proc.stdout + proc.stderr)[-500:]
        raise RuntimeError(f"jobman {' '.join(args[:2])} exited {proc.returncode}: {said}")
    return seconds, kb / 1024, proc.stdout


def raw_rows(jobs: int, experiment_id: int) -> list[tuple]:
    """The rows sqlschedule writes for the grid, made here for the raw driver."""
    specs = list(Expansion(parse_sweep(tokens(jobs))))
    hashes = params_hashes(specs, [s.params_json for s in specs])
    now = time.time()
    return [
        (experiment_id, 0, "fn", s.target, s.params_json, h, "QUEUED", 0, 3, now, now) for s, h in zip(specs, hashes)
    ]


def raw_insert(url: str, rows: list[tuple], engine: str) -> float:
    """One executemany of ``rows`` through the bare driver, in one transaction, into jobman's schema."""
    Store.open(url + "raw").schedule([])  # the schema, made by jobman
    if engine == "sqlite":
        return raw_sqlite(Path(url[len("sqlite:///") :].split("?")[0]), rows)
    return raw_pg(url.split("?")[0], rows)


def best_ms(fn, repeat: int = 5) -> float:
    fn()  # warm: the connection and the statement's first compile
    times = []
    for _ in range(repeat):
        with Timer() as t:
            fn()
        times.append(t.seconds)
    return min(times) * 1000


def disk_mb(store: Store, url: str) -> float:
    if store.engine.dialect.name == "sqlite":
        import sqlite3

        path = Path(url[len("sqlite:///") :].split("?")[0])
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL's pages into the file, as an idle database has
        con.close()
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 2**20
    with store.engine.connect() as conn:
        return conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar() / 2**20


def finish_all_but(store: Store, running: int) -> None:
    """The jobs past the first ``running`` DONE with a result, as a finished sweep leaves them."""
    exp = store.jobs(limit=1)[0].experiment_id
    first = store.jobs(limit=1)[0].id
    results_sql = (
        "json_object('valid_error', (id % 997) / 997.0)"
        if store.engine.dialect.name == "sqlite"
        else "jsonb_build_object('valid_error', (id % 997) / 997.0)"
    )
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(t_job)
            .where(t_job.c.experiment_id == exp, t_job.c.id >= first + running)
            .values(status=Status.DONE.value, results=sa.text(results_sql), attempt=1, finished_at=time.time())
        )
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE job")


def report_only(engine: str, jobs: int, base: str, figures: list[Figure]) -> None:
    """The report row alone: the grid scheduled, all but 10,000 jobs DONE, ``jobman report`` timed."""
    url = f"{base}?table=scale"
    cli("sqlschedule", url, "--no-check", *tokens(jobs))
    store = Store.open(url)
    try:
        finish_all_but(store, RUNNING)
    finally:
        store.dispose()
    seconds, mb, _ = cli("report", url, "--metric", "valid_error", timeout=900)
    figures.append(
        say(
            Figure(
                f"report --metric valid_error, {jobs - RUNNING:,} DONE in as many configurations (CLI), {engine}",
                seconds,
                "s",
                None,
                "< 10 s, < 300 MB",
                seconds < 10 and mb < 300,
                note=f"peak {mb:.0f} MB",
            )
        )
    )


def run_engine(engine: str, jobs: int, base: str, figures: list[Figure]) -> None:
    url = f"{base}?table=scale"
    n = f"{jobs:,}"

    def fig(
        name: str,
        value: float,
        unit: str,
        target: str = "",
        met: bool | None = None,
        baseline: float | None = None,
        note: str = "",
    ) -> None:
        figures.append(say(Figure(f"{name}, {engine}", value, unit, baseline, target, met, note)))

    rows = raw_rows(jobs, 1)
    raw_base = base.replace("scale.db", "raw.db") if engine == "sqlite" else None
    if engine == "sqlite":
        raw = raw_insert(f"{raw_base}?table=", rows, engine)
    else:
        raw_url, drop_raw = fresh_pg_database()
        try:
            raw = raw_insert(f"{raw_url}?table=", rows, engine)
        finally:
            drop_raw()
    del rows
    seconds, mb, _ = cli("sqlschedule", url, "--no-check", *tokens(jobs))
    fig(f"sqlschedule {n} jobs (CLI)", seconds, "s", "<= 2x raw executemany", seconds <= 2 * raw, raw)
    fig(f"sqlschedule {n} jobs, peak memory", mb, "MB", "< 200 MB", mb < 200)
    seconds, mb, out = cli("sqlschedule", url, "--no-check", *tokens(jobs))
    assert "nothing added" in out, out
    fig(f"sqlschedule the same {n} again (adds nothing)", seconds, "s", note=f"peak {mb:.0f} MB")
    seconds, mb, out = cli("sqlschedule", url, "--no-check", *tokens(jobs, extra=1))
    assert "added 1000 jobs" in out, out
    fig("sqlschedule a sweep 1,000 larger (adds only those)", seconds, "s", note=f"peak {mb:.0f} MB")

    store = Store.open(url)
    try:
        fig(f"database on disk, {n} jobs", disk_mb(store, url), "MB")
        finish_all_but(store, RUNNING)
        me = WorkerInfo.here()
        for _ in range(RUNNING):
            store.claim(me)
        middle = store.jobs(limit=1)[0].id + jobs // 2
        reads = [
            ("list, first page of 50", ["--limit", "50"], lambda: store.jobs(limit=50)),
            (
                "list --status RUNNING, 50",
                ["--status", "RUNNING", "--limit", "50"],
                lambda: store.jobs(status=[Status.RUNNING], limit=50),
            ),
            (
                "list --phase 0 --status DONE,FAILED, 50",
                ["--phase", "0", "--status", "DONE,FAILED", "--limit", "50"],
                lambda: store.jobs(phase=0, status=[Status.DONE, Status.FAILED], limit=50),
            ),
            (
                "list --param b=7 (every 1,000th job), 50",
                ["--param", "b=7", "--limit", "50"],
                lambda: store.jobs(params={"b": 7}, limit=50),
            ),
            ("show ID", [str(middle)], lambda: (store.job(middle), store.children(middle), store.events(middle))),
        ]
        for name, args, call in reads:
            ms = best_ms(call)
            command = "show" if name == "show ID" else "list"
            seconds, mb, _ = cli(command, url, *args)
            fig(
                f"{name} (store call)",
                ms,
                "ms",
                "< 100 ms",
                ms < 100,
                note=f"the CLI, process start included: {seconds:.2f} s, peak {mb:.0f} MB",
            )
        monitor = Monitor(store, MonitorOptions(relaunch=True))
        with store.engine.begin() as conn:  # the claims' heartbeats are fresh
            conn.execute(
                sa.update(t_job).where(t_job.c.status == Status.RUNNING.value).values(heartbeat_at=store.server_time())
            )
        scan = best_ms(lambda: monitor.scan(), repeat=3)
        fig(
            f"monitor scan, {RUNNING:,} of {n} RUNNING (store and liveness checks)",
            scan / 1000,
            "s",
            "< 1 s",
            scan < 1000,
        )
        seconds, mb, _ = cli("monitor", url, "--once")
        fig("monitor --once (CLI)", seconds, "s", note=f"peak {mb:.0f} MB")
        try:
            seconds, mb, _ = cli("report", url, "--metric", "valid_error", timeout=900)
            fig(
                f"report --metric valid_error, {jobs - RUNNING:,} DONE in as many configurations (CLI)",
                seconds,
                "s",
                "< 10 s, < 300 MB",
                seconds < 10 and mb < 300,
                note=f"peak {mb:.0f} MB",
            )
        except RuntimeError as exc:
            print(f"report: {exc}", flush=True)
    finally:
        store.dispose()

    tree = Store.open(f"{base}?table=tree")
    try:
        result = tree.schedule(
            Expansion(parse_sweep(["bench_noop:run", "root=1", "--", f"c={grid(100)}", "--", f"g={grid(1000)}"])),
            keep_ids=False,
        )
        exp_root = tree.jobs(limit=1)[0]
        with tree.engine.begin() as conn:
            conn.execute(
                sa.update(t_job)
                .where(t_job.c.experiment_id == exp_root.experiment_id)
                .values(status=Status.DONE.value, results='{"valid_error": 0.5}', attempt=1)
            )
        with Timer() as t:
            changed = tree.reset([exp_root.id], cascade=True)
        fig(
            f"reset --cascade of a root with {len(changed) - 1:,} DONE descendants (one transaction)",
            t.seconds,
            "s",
            "< 10 s",
            t.seconds < 10,
            note=f"{result.added:,} jobs in the tree",
        )
    finally:
        tree.dispose()


def ten_million(tmp: str, figures: list[Figure]) -> None:
    """Only the schedule, SQLite, at 10,000,000 jobs: the memory must not grow with the sweep."""
    url = f"sqlite:///{tmp}/ten.db?table=ten"
    seconds, mb, _ = cli("sqlschedule", url, "--no-check", *tokens(10_000_000), timeout=3600)
    figures.append(
        say(
            Figure(
                "sqlschedule 10,000,000 jobs (CLI), SQLite",
                seconds,
                "s",
                note=f"peak {mb:.0f} MB (target < 200 MB: {'met' if mb < 200 else 'MISSED'})",
            )
        )
    )
    os.unlink(f"{tmp}/ten.db")


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--ten-million", action="store_true", help="also schedule 10,000,000 jobs (SQLite)")
    parser.add_argument("--report-only", action="store_true", help="only the report row (after a change to it)")
    args = parser.parse_args(argv)
    run = report_only if args.report_only else run_engine
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("JOBMAN_BENCH_TMP")) as tmp:
        for engine in filter(None, args.engines.split(",")):  # --engines '' --ten-million: that alone
            if engine == "sqlite":
                run("SQLite", args.jobs, f"sqlite:///{tmp}/scale.db", figures)
            else:
                url, drop = fresh_pg_database()
                try:
                    run("PostgreSQL", args.jobs, url, figures)
                finally:
                    drop()
        if args.ten_million:
            ten_million(tmp, figures)
    return figures


if __name__ == "__main__":
    main()

"""Scheduling a 100,000-job grid with `jobman sqlschedule`, beside one raw-driver executemany of the same rows.

python bench/schedule.py [--jobs 100000] [--quick]
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, Timer, fresh_pg_database, grid, say

from jobman.jobdb.store import Store, params_hash
from jobman.jobdb.sweep import expand, parse_sweep


def sweep_tokens(jobs: int) -> list[str]:
    """A 4-key grid of about ``jobs`` jobs: 10 x 10 x 10 x jobs/1000."""
    return ["bench_noop:run", f"a={grid(10)}", f"b={grid(10)}", f"c={grid(10)}", f"d={grid(max(1, jobs // 1000))}"]


def rows_for(tokens: list[str], experiment_id: int) -> list[tuple]:
    import json

    now = time.time()
    out = []
    for s in expand(parse_sweep(tokens)):
        encoded = json.dumps(s.params, sort_keys=True)
        out.append(
            (
                experiment_id,
                s.phase,
                s.kind,
                s.target,
                encoded,
                params_hash(s.phase, s.kind, s.target, encoded),
                "QUEUED",
                0,
                3,
                now,
                now,
            )
        )
    return out


INSERT = (
    "INSERT INTO job (experiment_id, phase, kind, target, params, params_hash, status, priority, max_attempts, "
    "created_at, queued_at) VALUES ({})"
)


def raw_sqlite(path: Path, rows: list[tuple]) -> float:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    with Timer() as t:
        con.execute("BEGIN IMMEDIATE")
        con.executemany(INSERT.format(",".join("?" * 11)), rows)
        con.execute("COMMIT")
    con.close()
    return t.seconds


def raw_pg(url: str, rows: list[tuple]) -> float:
    import psycopg

    with psycopg.connect(url) as con:
        with Timer() as t:
            with con.cursor() as cur:
                cur.executemany(INSERT.format(",".join(["%s"] * 11)), rows)
            con.commit()
    return t.seconds


def jobman_cli(url: str, tokens: list[str]) -> float:
    with Timer() as t:
        subprocess.run(
            [sys.executable, "-m", "jobman.cli.main", "sqlschedule", url, "--no-check", *tokens],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return t.seconds


def run(jobs: int, repeat: int = 3) -> list[Figure]:
    """Each side runs ``repeat`` times on a fresh database; the best of each is the figure."""
    tokens = sweep_tokens(jobs)
    n = len(expand(parse_sweep(tokens)))
    rows = rows_for(tokens, 1)
    figures = []
    bases, ours = [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            # Same schema for both: the baseline's database is made by jobman's migrations, then emptied.
            raw_path = Path(tmp) / "raw.db"
            Store.open(f"sqlite:///{raw_path}?table=raw").schedule([])
            bases.append(raw_sqlite(raw_path, rows))
            ours.append(jobman_cli(f"sqlite:///{Path(tmp) / 'jobman.db'}?table=bench", tokens))
    figures.append(
        say(
            Figure(
                f"schedule {n:,} jobs, SQLite (CLI, process start included; best of {repeat})",
                min(ours),
                "s",
                min(bases),
                "<= 2x raw, < 5 s",
                min(ours) <= 2 * min(bases) and min(ours) < 5,
            )
        )
    )
    bases, ours = [], []
    for _ in range(repeat):
        url, drop = fresh_pg_database()
        try:
            Store.open(url + "?table=raw").schedule([])
            bases.append(raw_pg(url, rows))
            ours.append(jobman_cli(url + "?table=bench", tokens))
        finally:
            drop()
    figures.append(
        say(
            Figure(
                f"schedule {n:,} jobs, PostgreSQL (CLI, process start included; best of {repeat})",
                min(ours),
                "s",
                min(bases),
                "<= 2x raw",
                min(ours) <= 2 * min(bases),
            )
        )
    )
    return figures


def main(argv: list[str] | None = None) -> list[Figure]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="10,000 jobs")
    args = parser.parse_args(argv)
    return run(10_000 if args.quick else args.jobs)


if __name__ == "__main__":
    main()

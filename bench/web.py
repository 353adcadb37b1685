"""How fast ``jobman serve`` answers on an experiment of 100,000 jobs, on SQLite and PostgreSQL.

Makes 20,000 configurations × 5 folds of DONE jobs (as ``report_bench.py`` does), starts a real
``jobman serve`` process and times its answers over HTTP: each page's first paint (what the browser
shows before the first live update), the report view the first update brings (built once, then
kept until the experiment changes: its first build is timed in ``--repeat`` fresh servers, each
after the page's first paint, as a browser asks), and job-table pages deep, sorted and filtered.
Baselines, in the same run: a static file from the same server (the cost of a request without the
database) and, for the report, the same report built the way it was before the database grouped it
(every job read into Python). The server's memory is read after all of it. The figures are
appended to bench/RESULTS-web.md with the machine and its load (``--no-write``: not).

    python bench/web.py                           # SQLite and PostgreSQL, 100,000 jobs
    python bench/web.py --jobs 20000 --engines sqlite
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, Figure, fresh_pg_database, machine, say
from report_bench import make_jobs

from jobman.jobdb import report
from jobman.jobdb.store import Store

TARGET = 0.5  # seconds: the bound set for a first paint and the report view
RESULTS = HERE / "RESULTS-web.md"


def fetch(url: str, token: str) -> tuple[float, int]:
    """Seconds to the whole answer, and its size."""
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def best_of(url: str, token: str, repeat: int) -> tuple[float, int]:
    runs = [fetch(url, token) for _ in range(repeat)]
    return min(t for t, _ in runs), runs[0][1]


def serve(url: str) -> tuple[subprocess.Popen, str, str]:
    """A real ``jobman serve`` process: (process, its root URL, its token)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobman.cli.main", "serve", url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    link = re.search(r"(http://[^/]+/s/[\w-]+)/\S*token=(\S+)", proc.stdout.readline())  # root: its secret path
    return proc, link.group(1), link.group(2)


def first_build(proc: subprocess.Popen, url: str, token: str) -> tuple[float, int, float]:
    """The report view's first build: seconds, size, and the server's CPU seconds for it (what the
    load of a shared machine changes least; the database server's own CPU is not in it)."""
    cpu = psutil.Process(proc.pid)
    before = sum(cpu.cpu_times()[:2])
    t, size = fetch(url, token)
    return t, size, sum(cpu.cpu_times()[:2]) - before


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=10)


def bench(engine: str, url: str, n_jobs: int, repeat: int) -> list[Figure]:
    name = f"web_{uuid.uuid4().hex[:6]}"
    store = Store.open(url, name)
    t0 = time.perf_counter()
    make_jobs(store, n_jobs)
    print(f"{engine}: made {n_jobs:,} DONE jobs in {time.perf_counter() - t0:.1f} s", flush=True)
    if engine == "postgresql":
        # The planner's statistics of the jobs and the map of pages every transaction sees (what lets
        # a count read an index alone), as autovacuum leaves them within a minute of such a change
        # (it is off on some servers, this machine's among them). VACUUM runs outside a transaction.
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE job")
    query = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        report.from_store_in_python(store, "valid_error", allow_incomplete=True)
        query.append(time.perf_counter() - t0)
    store.dispose()

    first_builds = []
    for _ in range(repeat - 1):  # the last server times it below, then every other page
        proc, root, token = serve(url)
        try:
            fetch(f"{root}/e/{name}", token)
            first_builds.append(first_build(proc, f"{root}/e/{name}?part=report", token))
        finally:
            stop(proc)
    proc, root, token = serve(url)
    try:
        static, _ = best_of(root + "/static/style.css", token, repeat)
        rss0 = psutil.Process(proc.pid).memory_info().rss
        exp = f"{root}/e/{name}"
        figures = []
        t, size = best_of(root + "/", token, repeat)
        figures.append(("experiments page, first paint", t, size, static))
        t, size = best_of(exp, token, repeat)
        figures.append(("experiment page, first paint", t, size, static))
        first_builds.append(first_build(proc, exp + "?part=report", token))
        t, size, _ = min(first_builds)
        cpu = min(c for _, _, c in first_builds) * 1000
        figures.append(
            (
                f"report view, first build (fastest of {len(first_builds)} fresh servers; server CPU at "
                f"least {cpu:.0f} ms)",
                t,
                size,
                min(query),
            )
        )
        t, size = best_of(exp + "?part=report", token, repeat)
        figures.append(("report view, later updates", t, size, static))
        t, size = fetch(root + "/?part=list", token)
        figures.append(("experiments page, first update (its best from that report)", t, size, static))
        for what, query_string in (
            ("job table, last page", f"part=jobs&page={n_jobs // 50 - 1}"),
            ("job table, by finish time", "part=jobs&sort=-finished_at"),
            ("job table, a status", "part=jobs&status=DONE&page=100"),
            ("job table, a parameter filter", "part=jobs&where=lr%3C%3D0.001,act%3D%3Dtanh"),
        ):
            t, size = best_of(f"{exp}?{query_string}", token, repeat)
            figures.append((what, t, size, static))
        rss = psutil.Process(proc.pid).memory_info().rss
    finally:
        stop(proc)
    out = []
    for what, t, size, base in figures:
        bound = "first paint" in what or "report view" in what
        out.append(
            say(
                Figure(
                    f"{engine} {what}",
                    t * 1000,
                    "ms",
                    baseline=base * 1000,
                    target=f"< {TARGET * 1000:.0f} ms" if bound else "no target",
                    met=(t < TARGET) if bound else None,
                    note=f"{size // 1024} KiB",
                )
            )
        )
    memory = (
        f"{engine}: the server's memory {rss0 / 2**20:.0f} MiB after start, {rss / 2**20:.0f} MiB after "
        f"every page above ({n_jobs:,} jobs; the report of them is kept)"
    )
    print(memory, flush=True)
    out.append(Figure(memory, rss / 2**20, "MiB"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--repeat", type=int, default=3, help="timed requests of each page; the fastest is printed")
    parser.add_argument("--no-write", action="store_true", help=f"do not append to {RESULTS.name}")
    args = parser.parse_args()
    print(
        "baselines: a static file from the same server (a request without the database); "
        "for the report, the same report built from every job in Python",
        flush=True,
    )
    load_before = os.getloadavg()[0]
    figures: list[Figure] = []
    for engine in args.engines.split(","):
        if engine == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                figures += bench(engine, f"sqlite:///{Path(tmp) / 'web.db'}", args.jobs, args.repeat)
        else:
            url, drop = fresh_pg_database()
            try:
                figures += bench(engine, url, args.jobs, args.repeat)
            finally:
                drop()
    if not args.no_write:
        m = machine()
        lines = [
            f"## {m['date']}",
            "",
            f"`python bench/web.py --jobs {args.jobs} --engines {args.engines} --repeat {args.repeat}`; "
            f"{m['cpu']}, {m['memory']}, Python {m['python']}, SQLite {m['sqlite']}, PostgreSQL "
            f"{m['postgresql']}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after.",
            "",
            "```text",
            *(f.line() if f.unit != "MiB" else f.name for f in figures),
            "```",
        ]
        header = (
            "# jobman serve at scale\n\nFigures from `python bench/web.py` (a real server over HTTP), "
            "newest last. The machine is shared: the load average is given with each run.\n"
        )
        old = RESULTS.read_text() if RESULTS.exists() else header
        RESULTS.write_text(old.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
        print(f"written to {RESULTS}")


if __name__ == "__main__":
    main()

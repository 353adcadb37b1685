"""How fast ``jobman serve`` answers on an experiment of 100,000 jobs, on SQLite and PostgreSQL.

Makes 20,000 configurations × 5 folds of DONE jobs (as ``report_bench.py`` does), starts a real
``jobman serve`` process and times its answers over HTTP: each page's first paint (what the browser
shows before the first live update), the report view the first update brings (built once, then
kept until the experiment changes), and job-table pages deep, sorted and filtered. Baselines, in
the same run: a static file from the same server (the cost of a request without the database) and,
for the report, the same report built the way it was before the database grouped it (every job
read into Python). The server's memory is read after all of it.

    python bench/web.py                           # SQLite and PostgreSQL, 100,000 jobs
    python bench/web.py --jobs 20000 --engines sqlite
"""

from __future__ import annotations

import argparse
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
from common import Figure, fresh_pg_database, say  # noqa: E402
from report_bench import make_jobs  # noqa: E402

from jobman.jobdb import report  # noqa: E402
from jobman.jobdb.store import Store  # noqa: E402

TARGET = 0.5  # seconds: the bound set for a first paint and the report view


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


def bench(engine: str, url: str, n_jobs: int, repeat: int) -> None:
    name = f"web_{uuid.uuid4().hex[:6]}"
    store = Store.open(url, name)
    t0 = time.perf_counter()
    make_jobs(store, n_jobs)
    print(f"{engine}: made {n_jobs:,} DONE jobs in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    report.from_store_in_python(store, "valid_error", allow_incomplete=True)
    query = time.perf_counter() - t0
    store.dispose()

    proc = subprocess.Popen([sys.executable, "-m", "jobman.cli.main", "serve", url, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        link = re.search(r"(http://[^/]+)/\S*token=(\S+)", proc.stdout.readline())
        root, token = link.group(1), link.group(2)
        static, _ = best_of(root + "/static/style.css", token, repeat)
        rss0 = psutil.Process(proc.pid).memory_info().rss
        exp = f"{root}/e/{name}"
        figures = []
        t, size = best_of(root + "/", token, repeat)
        figures.append(("experiments page, first paint", t, size, static))
        t, size = best_of(exp, token, repeat)
        figures.append(("experiment page, first paint", t, size, static))
        t, size = fetch(exp + "?part=report", token)
        figures.append(("report view, first build", t, size, query))
        t, size = best_of(exp + "?part=report", token, repeat)
        figures.append(("report view, later updates", t, size, static))
        t, size = fetch(root + "/?part=list", token)
        figures.append(("experiments page, first update (its best from that report)", t, size, static))
        for what, query_string in (("job table, last page", f"part=jobs&page={n_jobs // 50 - 1}"),
                                   ("job table, by finish time", "part=jobs&sort=-finished_at"),
                                   ("job table, a status", "part=jobs&status=DONE&page=100"),
                                   ("job table, a parameter filter", "part=jobs&where=lr%3C%3D0.001,act%3D%3Dtanh")):
            t, size = best_of(f"{exp}?{query_string}", token, repeat)
            figures.append((what, t, size, static))
        rss = psutil.Process(proc.pid).memory_info().rss
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    for what, t, size, base in figures:
        bound = "first paint" in what or "report view" in what
        say(Figure(f"{engine} {what}", t * 1000, "ms", baseline=base * 1000,
                   target=f"< {TARGET * 1000:.0f} ms" if bound else "no target",
                   met=(t < TARGET) if bound else None, note=f"{size // 1024} KiB"))
    print(f"{engine}: the server's memory {rss0 / 2**20:.0f} MiB after start, {rss / 2**20:.0f} MiB after "
          f"every page above ({n_jobs:,} jobs; the report of them is kept)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--repeat", type=int, default=3, help="timed requests of each page; the fastest is printed")
    args = parser.parse_args()
    print("baselines: a static file from the same server (a request without the database); "
          "for the report, the same report built from every job in Python", flush=True)
    for engine in args.engines.split(","):
        if engine == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                bench(engine, f"sqlite:///{Path(tmp) / 'web.db'}", args.jobs, args.repeat)
        else:
            url, drop = fresh_pg_database()
            try:
                bench(engine, url, args.jobs, args.repeat)
            finally:
                drop()


if __name__ == "__main__":
    main()

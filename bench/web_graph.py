"""How fast ``jobman serve`` draws an experiment's graph of calls, on SQLite and PostgreSQL.

Makes a graph of calls through the store (one ``load``, N ``train`` calls taking it, a ``score`` taking
each, one ``summary`` taking every score: a fan-out then a fan-in, 2N + 2 jobs), starts a real
``jobman serve`` process and times, over HTTP, the graph's live part (``?part=graph``) and the whole
experiment page's first paint. Baselines, in the same run and from the same server: a static file (a
request without the database) and the phases' part (``?part=progress``), which already reads every
dependency of the experiment in one grouped query. The load average is printed beside every figure.

    python bench/web_graph.py                             # 48 calls (drawn one by one), 1,000 and 100,000
    python bench/web_graph.py --widths 500 --engines sqlite
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import Figure, fresh_pg_database, say
from web_data import schedule_calls

from jobman.jobdb.store import Store
from web import best_of, fetch, serve, stop


def make_graph(store: Store, width: int) -> int:
    """The fan-out then fan-in of ``width`` trains (the dashboard tests' graph): 2 * width + 2 jobs, all
    waiting on the load."""
    schedule_calls(store, width)
    return 2 * width + 2


def bench(engine: str, url: str, width: int, repeat: int) -> list[Figure]:
    name = f"graph_{uuid.uuid4().hex[:6]}"
    store = Store.open(url, name)
    jobs = make_graph(store, width)
    if engine == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE job")
            conn.exec_driver_sql("VACUUM ANALYZE job_dep")
    store.dispose()
    proc, root, token = serve(url)
    try:
        page = f"{root}/e/{name}"
        fetch(page, token)  # warm: imports and the first connection
        static, _ = best_of(root + "/static/style.css", token, repeat)
        phases, _ = best_of(page + "?part=progress", token, repeat)
        graph, size = best_of(page + "?part=graph", token, repeat)
        whole, whole_size = best_of(page, token, repeat)
        drawn = "one by one" if jobs <= 60 else "grouped"
    finally:
        stop(proc)
    load = os.getloadavg()
    note = f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    return [
        say(
            Figure(
                f"{engine} {jobs:,} calls, the graph's part ({drawn}; baseline: the phases' part)",
                graph * 1000,
                "ms",
                baseline=phases * 1000,
                target="no target",
                note=f"{size // 1024} KiB; {note}",
            )
        ),
        say(
            Figure(
                f"{engine} {jobs:,} calls, the experiment page's first paint (baseline: a static file)",
                whole * 1000,
                "ms",
                baseline=static * 1000,
                target="no target",
                note=f"{whole_size // 1024} KiB; {note}",
            )
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default="23,499,49999", help="trains per graph (jobs: 2 * width + 2)")
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--repeat", type=int, default=3, help="timed requests of each page; the fastest is printed")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for engine in args.engines.split(","):
        for width in (int(w) for w in args.widths.split(",")):
            if engine == "sqlite":
                with tempfile.TemporaryDirectory() as tmp:
                    bench(engine, f"sqlite:///{Path(tmp) / 'graph.db'}", width, args.repeat)
            else:
                url, drop = fresh_pg_database()
                try:
                    bench(engine, url, width, args.repeat)
                finally:
                    drop()


if __name__ == "__main__":
    main()

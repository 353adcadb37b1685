"""A large array returned by a job and read back by ``future.result()``: bytes moved and peak memory.

    python bench/artifacts.py [--mb 100] [--postgresql]

A job run by a real ``jobman worker`` returns ``{"x": numpy.ones(N)}`` (``--mb`` megabytes); a fresh
Python process then reads it back with ``Experiment(url).call(...).result()``. Measured:
- the worker's side: the peak resident memory of its largest process (the job's: ``RUSAGE_CHILDREN``,
  which covers every process below the worker once waited for) and the bytes its processes wrote
  (the kernel's ``write_bytes``, counted as pages are dirtied);
- the caller's side: its peak resident memory above what it held before the call, and the bytes it
  read (``rchar`` of ``/proc/self/io``: every read, from the page cache or not).
The baselines, in the same run: the same array made and written with ``numpy.save`` by a plain
process, and read back with ``numpy.load`` by another. Targets: each side's peak at most about
twice the array, the array's bytes written once and read once.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, fresh_pg_database, say

MODULE = """
import numpy as np

def big(mb):
    return {"x": np.ones(mb * 1000 * 1000 // 8), "mb": mb}
"""

CALLER = """
import json, os, resource, sys
import numpy as np
import jobman

def io():
    fields = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    return int(fields["rchar"]), int(fields["read_bytes"])

def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

exp = jobman.Experiment(sys.argv[1], backend=None, exproot=sys.argv[3])
before_rss, (before_rchar, _) = rss_kb(), io()
value = exp.call("bigmod:big", mb=int(sys.argv[2])).result(timeout=600)["x"]
rchar, _ = io()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert value.nbytes == int(sys.argv[2]) * 1000 * 1000 and float(value.sum()) == value.size
print(json.dumps({"peak_above_kb": peak - before_rss, "read": rchar - before_rchar}))
exp.close()
"""

BASELINE_SAVE = """
import json, resource, sys
import numpy as np
x = np.ones(int(sys.argv[2]) * 1000 * 1000 // 8)
np.save(sys.argv[1], x)
print(json.dumps({"peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""

BASELINE_LOAD = """
import json, resource, sys
import numpy as np

def io():
    fields = dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())
    return int(fields["rchar"])

def rss_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

before_rss, before = rss_kb(), io()
x = np.load(sys.argv[1])
print(json.dumps({"peak_above_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_rss,
                  "read": io() - before}))
"""


def children_usage() -> resource.struct_rusage:
    return resource.getrusage(resource.RUSAGE_CHILDREN)


def run_measured(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[str, int, int]:
    """Run a process to its end: its output, the peak memory (kB) of the largest process of its tree, and the
    bytes its tree wrote (``ru_oublock``, 512-byte blocks charged as pages are dirtied)."""
    before = children_usage()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    after = children_usage()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout, after.ru_maxrss, (after.ru_oublock - before.ru_oublock) * 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="the array's size in megabytes (10^6 bytes)")
    parser.add_argument("--postgresql", action="store_true", help="on PostgreSQL (its store a folder named in the URL)")
    args = parser.parse_args()
    size = args.mb * 1000 * 1000
    with tempfile.TemporaryDirectory(prefix="jobman-bench-artifacts-", dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        (root / "bigmod.py").write_text(textwrap.dedent(MODULE))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        if args.postgresql:
            base, drop = fresh_pg_database()
            url = f"{base}?table=big&artifacts={root / 'store'}"
        else:
            url = f"sqlite:///{root / 'runs.db'}?table=big"
        py = sys.executable

        # The baselines first: a plain process writes the array with numpy.save, another reads it back.
        out, _peak, _written = run_measured([py, "-c", BASELINE_SAVE, str(root / "plain.npy"), str(args.mb)], root, env)
        base_save_peak = json.loads(out)["peak_kb"] * 1000
        out, _p, _w = run_measured([py, "-c", BASELINE_LOAD, str(root / "plain.npy")], root, env)
        base_load = json.loads(out)

        run_measured([py, "-m", "jobman.cli.main", "sqlschedule", url, "bigmod:big", f"mb={args.mb}"], root, env)
        _out, worker_peak_kb, written = run_measured(
            [py, "-m", "jobman.cli.main", "worker", url, "--exproot", str(root / "runs")], root, env
        )
        stored = sorted(p.stat().st_size for p in root.rglob("sha256/*/*") if p.is_file())
        out, _p, _w = run_measured([py, "-c", CALLER, url, str(args.mb), str(root / "runs")], root, env)
        caller = json.loads(out)
        if args.postgresql:
            drop()

    engine = "PostgreSQL" if args.postgresql else "SQLite"
    print(f"# a {args.mb} MB array returned by a job and read back by future.result() ({engine})")
    print(f"stored: {len(stored)} artifact(s), {sum(stored):,} bytes")
    say(
        Figure(
            "worker side: peak memory of its largest process",
            worker_peak_kb * 1000 / 1e6,
            "MB",
            base_save_peak / 1e6,
            "about 2x the array at most",
            worker_peak_kb * 1000 <= 2.2 * size,
            "(baseline: numpy.save of the same array by a plain process)",
        )
    )
    say(
        Figure(
            "worker side: bytes written",
            written / 1e6,
            "MB",
            size / 1e6,
            "the array once",
            written <= 1.2 * size,
            "(baseline: the array's own size)",
        )
    )
    say(
        Figure(
            "caller side: peak memory above what it held before the call",
            caller["peak_above_kb"] * 1000 / 1e6,
            "MB",
            base_load["peak_above_kb"] * 1000 / 1e6,
            "about 2x the array at most",
            caller["peak_above_kb"] * 1000 <= 2.2 * size,
            "(baseline: numpy.load of the same array by a plain process)",
        )
    )
    say(
        Figure(
            "caller side: bytes read",
            caller["read"] / 1e6,
            "MB",
            base_load["read"] / 1e6,
            "the array once",
            caller["read"] <= 1.2 * size,
            "(baseline: numpy.load's reads)",
        )
    )


if __name__ == "__main__":
    main()

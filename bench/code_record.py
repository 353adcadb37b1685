"""The cost of recording the code and environment each job ran, measured in turns beside the code before it.

    python bench/code_record.py [--jobs 1000] [--turns 3] [--before REF] [--after REF]

Each turn runs ``jobman dispatch -j 2`` over no-op function jobs (``bench/dispatch_overhead.py``'s
``timed_dispatch``) twice: once with the commit before code records (``--before``, default: the
parent of the commit that added them), once with ``--after`` (default HEAD: commit first), each
exported with ``git archive`` and put first on ``PYTHONPATH``, so both are imported the same way
(an editable install's import hook costs CPU of its own). The jobs' module sits in a git working
tree with uncommitted changes, so every fact is captured: source digest, commit, diff, package
list. The figure is CPU per job, every process counted (dispatcher, workers, fork servers, jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGET = 1.05  # at most 5% more CPU per job

DRIVER = """
import json, subprocess, sys
from pathlib import Path
sys.path.insert(0, {bench!r})
from dispatch_overhead import timed_dispatch
import jobman.jobdb.schema as schema
tmp = Path({tmp!r})
git = lambda *a: subprocess.run(["git", *a], cwd=tmp, check=True, capture_output=True)
git("init", "-q"); git("config", "user.email", "b@example.org"); git("config", "user.name", "bench")
(tmp / "notes.txt").write_text("first\\n"); git("add", "notes.txt"); git("commit", "-q", "-m", "first")
(tmp / "notes.txt").write_text("first\\nchanged\\n")  # uncommitted changes: a diff to keep
url, seconds, cpu = timed_dispatch(tmp, {jobs}, "run")
print(json.dumps({{"cpu": cpu, "seconds": seconds, "schema": schema.HEAD_REVISION}}))
"""


def export(ref: str, into: Path) -> Path:
    """The tree of ``ref`` as an importable ``jobman`` package under ``into``."""
    package = into / "jobman"
    package.mkdir(parents=True)
    archive = into / "tree.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, stdout=fh)
    with tarfile.open(archive) as tar:
        tar.extractall(package, filter="data")
    return into


def commit_before_code_records() -> str:
    """The commit before the one that added code records (``dispatch/provenance.py``)."""
    git = ["git", "log", "--diff-filter=A", "--format=%H", "--", "dispatch/provenance.py"]
    added = subprocess.run(git, cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    if not added:
        raise SystemExit("no commit adds dispatch/provenance.py here: give --before REF")
    parent = ["git", "rev-parse", f"{added[-1]}^"]
    return subprocess.run(parent, cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def one_run(jobs: int, pythonpath: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="jobman-code-bench-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = pythonpath
        code = DRIVER.format(bench=str(HERE), tmp=tmp, jobs=jobs)
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"a run failed: {proc.stderr[-2000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--before", help="the commit to compare with (default: the one before code records)")
    parser.add_argument("--after", default="HEAD", help="the commit measured (default: HEAD; commit first)")
    args = parser.parse_args(argv)
    before = args.before or commit_before_code_records()
    after = args.after
    per_job: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="jobman-before-") as scratch:
        trees = {
            "before": str(export(before, Path(scratch) / "before")),
            "after": str(export(after, Path(scratch) / "after")),
        }
        print(f"{args.jobs} no-op jobs, dispatch -j 2, {args.turns} turns; before {before[:12]}, after {after}")
        for turn in range(1, args.turns + 1):
            for label, path in trees.items():
                got = one_run(args.jobs, path)
                ms = 1000 * got["cpu"] / args.jobs
                per_job[label].append(ms)
                wall = f"{got['seconds']:.2f} s"
                print(f"  turn {turn} {label:<6} schema {got['schema']}: {ms:.3f} ms CPU per job ({wall})")
    b, a = statistics.median(per_job["before"]), statistics.median(per_job["after"])
    print(f"median CPU per job: before {b:.3f} ms, after {a:.3f} ms: {a / b:.3f}x (target <= {TARGET:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

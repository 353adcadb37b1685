"""SQLite's memory statistics are off in the processes jobman starts, and left alone elsewhere.

The statistics cost every allocation a mutex of the whole process (see ``jobdb/sqlite_memory.py``).
Once they are off, SQLite reports no memory in use at all, which is what these tests read.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import experiment_module

engine_name = pytest.fixture(lambda: "sqlite")

# Python that reads how many bytes SQLite counts as in use, as ``used()``.
MEMORY_USED = (
    "import ctypes, _sqlite3\n"
    "used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used\n"
    "used.restype = ctypes.c_int64\n"
)

PROBE = (
    MEMORY_USED
    + """
def memory_counted(state, channel):
    state["counted"] = used()
    return channel.COMPLETE
"""
)


def sqlite_memory_counted_after(code: str) -> int:
    """Bytes SQLite counts as in use once ``code`` ran in a fresh interpreter."""
    script = code + "\n" + MEMORY_USED + "print(used())\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


def test_a_process_that_allows_it_opens_its_store_without_the_statistics_and_works(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    work = (
        "from jobman.jobdb.store import Store\nfrom jobman.jobdb.sweep import JobSpec\n"
        f"s = Store.open({url!r})\n"
        "s.schedule([JobSpec(0, 'fn', 'm:f', {'lr': lr}, None) for lr in (1, 2, 3)])\n"
        "assert len(s.jobs()) == 3\n"
    )
    allowed = "from jobman.jobdb import sqlite_memory\nsqlite_memory.allow()\n"
    assert sqlite_memory_counted_after(allowed + work) == 0
    # A program that imports jobman with connections of its own keeps SQLite as it was.
    assert sqlite_memory_counted_after(work) > 0


def test_the_jobman_command_and_the_jobs_its_workers_run_go_without_the_statistics(jobman, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    env = {"PYTHONPATH": experiment_module(tmp_path, "probe", PROBE)}
    assert jobman("sqlschedule", url, "probe:memory_counted", "seed={{1,2}}", env=env).code == 0
    done = jobman("dispatch", url, "-j", "2", "--exproot", str(tmp_path / "runs"), env=env)
    assert done.code == 0, done.err
    shown = jobman("list", url, "--format", "json", env=env)
    assert shown.code == 0, shown.err
    jobs = json.loads(shown.out)
    assert len(jobs) == 2 and all(j["status"] == "DONE" for j in jobs)
    assert [j["results"]["counted"] for j in jobs] == [0, 0]
    # The pytest process, which imported jobman and opened databases, still counts.
    names: dict = {}
    exec(MEMORY_USED, names)
    conn = sqlite3.connect(":memory:")
    try:
        assert names["used"]() > 0
    finally:
        conn.close()

"""Load: sixteen real ``jobman worker`` processes drain thousands of short jobs on each engine.

What was run, and why not more: 16 workers × 500 jobs each (8,000 jobs) on SQLite and 16 workers ×
250 jobs each (4,000 jobs) on PostgreSQL. On the two cores the test machines have, shared with the
rest of the suite, short jobs (claim, fork, run, record) go at about 110 per second on either engine
(measured: 70 s for the 8,000 on SQLite, 37 s for the 4,000 on PostgreSQL), so the 80,000 jobs per
engine of 16 × 5,000 would take some twelve minutes per engine: the counts were scaled to about a
minute each. The contention is the same: sixteen processes claim and finish against one
database at once, which is what exactly-once claiming and the busy timeout have to survive.

Every job appends ``id attempt`` to one side file opened with O_APPEND (one write per line, so lines
never interleave): no line may appear twice, none may be missing, no worker may print "database is
locked" or a serialization error, and nothing may be left RUNNING.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobman.jobdb.schema import job_event as t_event
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

WORKERS = 16
JOBS = {"sqlite": 16 * 500, "postgresql": 16 * 250}
MODULE = "jm_load_exp"
TICK = textwrap.dedent('''
    import os


    def tick(state, channel):
        """One short job: append its id and attempt to the side file in a single write."""
        fd = os.open(os.environ["JM_LOAD_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{channel.job_id} {channel.attempt}\\n".encode())
        finally:
            os.close(fd)
        state.square = state.i * state.i
''')
# What a worker must never print under load.
FORBIDDEN = re.compile(r"database is locked|database table is locked|could not serialize|deadlock detected|"
                       r"Traceback|internal error", re.I)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_sixteen_workers_run_every_job_exactly_once(db_url, engine_name, tmp_path: Path):
    count = JOBS[engine_name]
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{MODULE}.py").write_text(TICK)
    side = tmp_path / "ran.txt"
    side.touch()
    store = Store.open(db_url)
    ids = store.schedule([JobSpec(0, "fn", f"{MODULE}:tick", {"i": i}, None) for i in range(count)]).job_ids
    assert len(ids) == count

    env = {**os.environ, "JM_LOAD_LOG": str(side),
           "PYTHONPATH": os.pathsep.join(p for p in (str(mods), os.environ.get("PYTHONPATH")) if p)}
    logs = [tmp_path / f"worker{i}.log" for i in range(WORKERS)]
    procs = []
    started = time.monotonic()
    try:
        for log in logs:  # output to files: a full pipe would stall a worker and prove nothing
            with open(log, "wb") as fh:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "jobman.cli.main", "worker", db_url, "--exproot", str(tmp_path / "runs")],
                    stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env))
        for p in procs:
            p.wait(timeout=max(1.0, 1100 - (time.monotonic() - started)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    elapsed = time.monotonic() - started

    problems = []
    ran_per_worker = []
    for p, log in zip(procs, logs):
        text = log.read_text(errors="replace")
        if p.returncode != 0:
            problems.append(f"{log.name} exited {p.returncode}: {text[-2000:]}")
        for line in text.splitlines():
            if FORBIDDEN.search(line):
                problems.append(f"{log.name}: {line}")
        summary = re.findall(r"^worker ran (\d+) job", text, re.M)
        ran_per_worker.append(int(summary[-1]) if summary else 0)
    assert problems == [], "\n".join(problems[:20])

    lines = side.read_text().splitlines()
    runs = Counter(tuple(int(x) for x in line.split()) for line in lines)
    twice = [run for run, n in runs.items() if n > 1]
    assert twice == [], f"(id, attempt) ran more than once: {twice[:10]}"
    missing = sorted(set(ids) - {job_id for job_id, _ in runs})
    assert missing == [], f"{len(missing)} jobs never ran, e.g. {missing[:10]}"
    assert len(lines) == count and {attempt for _, attempt in runs} == {1}, "nothing crashed, so one run each"
    assert sum(ran_per_worker) == count
    assert sum(1 for n in ran_per_worker if n) >= WORKERS // 2, f"the work was not shared: {ran_per_worker}"

    jobs = store.jobs(with_deps=False)
    assert Counter(j.status for j in jobs) == {Status.DONE: count}
    assert all(j.attempt == 1 and j.lease == 1 and j.results == {"square": j.params["i"] ** 2} for j in jobs)
    assert store.running() == []
    with store.engine.connect() as conn:
        claims = dict(conn.execute(sa.select(t_event.c.job_id, sa.func.count()).where(
            t_event.c.job_id.in_(ids), t_event.c.to_status == Status.RUNNING.value).group_by(t_event.c.job_id)).all())
    assert len(claims) == count and set(claims.values()) == {1}, "one claim (one lease) per job"
    store.dispose()
    print(f"{engine_name}: {WORKERS} workers ran {count} jobs in {elapsed:.1f} s ({count / elapsed:.0f} jobs/s)")

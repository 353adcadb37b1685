"""Load: sixteen real ``jobman worker`` processes drain thousands of short jobs on each engine.

The full size is 16 workers × 5,000 jobs (80,000 jobs per engine): set
``JOBMAN_LOAD_JOBS_PER_WORKER=5000``. Measured on two cores: 80,000 jobs in 236 s on SQLite
(338 jobs/s) and in 347 s on PostgreSQL (231 jobs/s): ten minutes for both, half the time the
whole suite may take, so the suite runs 16 × 2,000 on SQLite and 16 × 1,000 on PostgreSQL
(about a minute and a half each): the contention is the same, sixteen processes claiming and
finishing against one database at once, which is what exactly-once claiming and the busy
timeout have to survive.

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
PER_WORKER = {"sqlite": 2000, "postgresql": 1000}  # JOBMAN_LOAD_JOBS_PER_WORKER=5000 for the full size
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
FORBIDDEN = re.compile(
    r"database is locked|database table is locked|could not serialize|deadlock detected|"
    r"Traceback|internal error",
    re.I,
)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_sixteen_workers_run_every_job_exactly_once(db_url, engine_name, tmp_path: Path):
    count = WORKERS * int(os.environ.get("JOBMAN_LOAD_JOBS_PER_WORKER") or PER_WORKER[engine_name])
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{MODULE}.py").write_text(TICK)
    side = tmp_path / "ran.txt"
    side.touch()
    store = Store.open(db_url)
    ids = store.schedule([JobSpec(0, "fn", f"{MODULE}:tick", {"i": i}, None) for i in range(count)]).job_ids
    assert len(ids) == count

    env = {
        **os.environ,
        "JM_LOAD_LOG": str(side),
        "PYTHONPATH": os.pathsep.join(p for p in (str(mods), os.environ.get("PYTHONPATH")) if p),
    }
    logs = [tmp_path / f"worker{i}.log" for i in range(WORKERS)]
    procs = []
    started = time.monotonic()
    try:
        for log in logs:  # output to files: a full pipe would stall a worker and prove nothing
            with open(log, "wb") as fh:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "jobman.cli.main",
                            "worker",
                            db_url,
                            "--exproot",
                            str(tmp_path / "runs"),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
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
        claims = dict(
            conn.execute(
                sa.select(t_event.c.job_id, sa.func.count())
                .where(
                    t_event.c.job_id.between(min(ids), max(ids)),  # not IN: 80,000 ids are past PostgreSQL's bind limit
                    t_event.c.to_status == Status.RUNNING.value,
                )
                .group_by(t_event.c.job_id)
            ).all()
        )
    assert set(claims) == set(ids) and set(claims.values()) == {1}, "one claim (one lease) per job"
    store.dispose()
    print(f"{engine_name}: {WORKERS} workers ran {count} jobs in {elapsed:.1f} s ({count / elapsed:.0f} jobs/s)")

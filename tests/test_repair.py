"""Repairs by hand, on real SQLite and PostgreSQL: reset, retry, cancel, set-status, set-priority, rm.

The cascade semantics (a reset puts everything downstream back to WAITING with its results in the
event log; a final failure or a cancel BLOCKS dependents; a reset releases them), previews that
change nothing, confirmation before losing work, and a remote stop of a running job through a real
worker. Commands run in-process through ``jobman.cli.main.main``, except the end-to-end stop.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobman.cli.main import main
from jobman.jobdb.errors import UsageError
from jobman.jobdb.schema import job as t_job
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec

S = Status
W = WorkerInfo(host="node-elsewhere", pid=4242, pid_started_at=1.0)


@pytest.fixture
def cli(capsys):
    """Run a jobman command in this process: (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([str(a) for a in args])
        gc.collect()  # the command's engine, and its pooled connections, go now rather than later
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def tree(store: Store, *, roots: int = 1, children: int = 2, max_attempts: int = 3) -> list[list[int]]:
    """``roots`` phase-0 jobs, each with ``children`` phase-1 jobs; returns [[root, child, ...], ...]."""
    specs, shape = [], []
    for r in range(roots):
        shape.append([len(specs)])
        specs.append(JobSpec(0, "fn", "pkg.mod:fn", {"r": r}, None))
        for c in range(children):
            shape[-1].append(len(specs))
            specs.append(JobSpec(1, "fn", "pkg.mod:fn", {"r": r, "c": c}, shape[-1][0]))
    ids = store.schedule(specs, max_attempts=max_attempts).job_ids
    return [[ids[i] for i in group] for group in shape]


def run_all(store: Store, outcome: str = "DONE") -> list[int]:
    """Claim every ready job (and those it unlocks) and finish it with ``outcome``; return their ids."""
    done = []
    while (c := store.claim(W)) is not None:
        store.finish(c.job.id, c.lease, outcome, results={"score": c.job.id * 10})
        done.append(c.job.id)
    return done


def status(store: Store, *ids: int) -> list[Status]:
    return [store.job(i).status for i in ids]


def snapshot(store: Store) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(t_job).order_by(t_job.c.id))]


# -- reset ------------------------------------------------------------------------------------------


def test_reset_of_a_phase0_job_puts_its_done_children_back_to_waiting_keeping_results_in_the_log(store, db_url, cli):
    [[root, a, b]] = tree(store)
    run_all(store)
    before = snapshot(store)

    code, _, err = cli("reset", db_url, root)  # DONE jobs would lose their status: asks, and cannot here
    assert code == 2 and "3 DONE job(s)" in err and "--yes" in err
    code, out, _ = cli("reset", db_url, root, "--dry-run")
    assert code == 0 and "dry run" in out and "2 downstream: 2 WAITING" in out
    assert snapshot(store) == before  # neither changed anything

    code, out, err = cli("reset", db_url, root, "--yes")
    assert code == 0, err
    assert "1 job(s) reset: 1 QUEUED; 2 downstream: 2 WAITING" in out
    assert status(store, root, a, b) == [S.QUEUED, S.WAITING, S.WAITING]
    for job_id in (root, a, b):
        job = store.job(job_id)
        assert job.results is None and job.attempt == 0
        [cleared] = [e for e in store.events(job_id) if e.from_status == "DONE"]
        assert cleared.data == {"results": {"score": job_id * 10}}  # the old results, kept in the log
    assert run_all(store) == [root, a, b]  # and the graph runs again in order


def test_reset_without_cascade_keeps_done_children(store, db_url, cli):
    [[root, a, b]] = tree(store)
    run_all(store)
    code, out, err = cli("reset", db_url, root, "--no-cascade", "--yes")
    assert code == 0, err
    assert status(store, root, a, b) == [S.QUEUED, S.DONE, S.DONE]
    assert store.job(a).results == {"score": a * 10}


def test_reset_refuses_a_running_job_unless_forced(store, db_url, cli):
    [[root, a, _b]] = tree(store)
    c = store.claim(W)
    code, _, err = cli("reset", db_url, root)
    assert code == 2 and f"job {root} is RUNNING" in err
    code, _, err = cli("reset", db_url, root, "--force")
    assert code == 0, err
    assert status(store, root, a) == [S.QUEUED, S.WAITING] and store.job(root).lease == c.lease


# -- final failure, BLOCKED, retry ----------------------------------------------------------------


def test_a_final_crash_blocks_dependents_and_retry_releases_them(store, db_url, cli):
    [[root, a, b], [other, *_]] = tree(store, roots=2, max_attempts=1)
    c = store.claim(W)
    assert store.crash(root, c.lease, "node lost", relaunch=True) is S.CRASHED  # its one attempt is spent
    assert status(store, a, b) == [S.BLOCKED, S.BLOCKED]
    assert store.events(a)[-1].why == f"job {root} is CRASHED"

    code, out, _ = cli("retry", db_url, "--failed")
    assert code == 0 and "no FAILED job matches" in out
    code, out, _ = cli("retry", db_url, "--dry-run")
    assert "1 job(s) would be retried: 1 QUEUED; 2 downstream: 2 WAITING" in out
    assert status(store, root, a, b) == [S.CRASHED, S.BLOCKED, S.BLOCKED]

    code, out, err = cli("retry", db_url)  # CRASHED by default, whatever the attempt limit
    assert code == 0, err
    assert status(store, root, a, b, other) == [S.QUEUED, S.WAITING, S.WAITING, S.QUEUED]
    assert store.job(root).attempt == 1  # a retry keeps the count and the checkpoint; --fresh starts over
    assert "retried by hand" in store.events(root)[-2].why


def test_retry_selects_by_status_phase_and_ids_and_fresh_starts_over(store, db_url, cli):
    groups = tree(store, roots=3, children=1)
    run_all(store, "FAILED")  # the roots fail; their children are BLOCKED
    roots = [g[0] for g in groups]
    with store.engine.begin() as conn:  # a checkpoint to keep, or not
        conn.execute(sa.update(t_job).where(t_job.c.id.in_(roots)).values(results='{"step": 7}'))

    code, out, err = cli("retry", db_url, "--failed", "--ids", f"{roots[0]},{roots[1]}", "--phase", "0")
    assert code == 0, err
    assert status(store, *roots) == [S.QUEUED, S.QUEUED, S.FAILED]
    assert store.job(roots[0]).results == {"step": 7}
    code, out, err = cli("retry", db_url, roots[2], "--failed", "--fresh")
    assert code == 0, err
    assert store.job(roots[2]).status is S.QUEUED and store.job(roots[2]).results is None
    assert store.job(roots[2]).attempt == 0
    assert [store.job(g[1]).status for g in groups] == [S.WAITING] * 3


# -- cancel, set-status, set-priority, rm ----------------------------------------------------------


def test_cancel_blocks_dependents_and_asks_for_running_to_be_named(store, db_url, cli):
    [[r0, a0, _], [r1, a1, b1]] = tree(store, roots=2)
    store.claim(W)  # r0 runs
    code, _, err = cli("cancel", db_url, f"{r0},{r1}")
    assert code == 2 and f"job {r0} is RUNNING: add --running" in err
    assert status(store, r1) == [S.QUEUED]  # all or nothing

    code, out, err = cli("cancel", db_url, r1)
    assert code == 0, err
    assert status(store, r1, a1, b1) == [S.CANCELED, S.BLOCKED, S.BLOCKED]
    code, out, err = cli("cancel", db_url, "--status", "CANCELED")
    assert "had already finished" in out

    code, out, err = cli("cancel", db_url, r0, "--running")
    assert code == 0 and "asked 1 running job(s) to stop" in out
    assert store.job(r0).stop_requested and store.job(r0).status is S.RUNNING

    code, out, _ = cli("reset", db_url, r1)  # a reset undoes a cancel, and releases the dependents
    assert status(store, r1, a1, b1) == [S.QUEUED, S.WAITING, S.WAITING]


def test_set_status_keeps_the_graph_consistent_and_speaks_jobman_codes(store, db_url, cli):
    [[root, a, b]] = tree(store)
    code, out, err = cli("set-status", db_url, root, "DONE")
    assert code == 0, err
    assert status(store, root, a, b) == [S.DONE, S.QUEUED, S.QUEUED]
    code, out, err = cli("set-status", db_url, root, "5")  # jobman's ERR_RUN
    assert status(store, root, a, b) == [S.FAILED, S.BLOCKED, S.BLOCKED]
    code, out, err = cli("set-status", db_url, root, "START")
    assert status(store, root, a, b) == [S.QUEUED, S.WAITING, S.WAITING]
    code, _, err = cli("set-status", db_url, root, "RUNNING")
    assert code == 2 and "only when a worker claims it" in err
    code, _, err = cli("set-status", db_url, root, "SLEEPING")
    assert code == 2 and "unknown status" in err
    code, out, err = cli("set-status", db_url, "--phase", "1", "CANCELED", "--dry-run")
    assert "would be set: 2 CANCELED" in out and status(store, a) == [S.WAITING]


def test_set_priority_takes_negative_numbers_and_selectors(store, db_url, cli):
    [[root, a, b]] = tree(store)
    code, out, err = cli("set-priority", db_url, f"{a}-{b}", "-5")
    assert code == 0, err
    assert [store.job(i).priority for i in (root, a, b)] == [0, -5, -5]
    code, out, err = cli("set-priority", db_url, "--phase", "0", "7")
    assert store.job(root).priority == 7 and "1 job(s) now have priority 7" in out
    code, out, err = cli("set-priority", db_url, str(a), "1.5")
    assert code == 0 and store.job(a).priority == 1.5, err
    assert [e.why for e in store.events(a)][-1] == "priority set to 1.5 by hand"
    code, _, err = cli("set-priority", db_url, root, "high")
    assert code == 2 and "a priority is a number" in err


def test_rm_asks_first_previews_and_releases_dependents(store, db_url, cli):
    [[root, a, b], [other, *_]] = tree(store, roots=2)
    store.cancel([root])
    code, _, err = cli("rm", db_url, root)
    assert code == 2 and "--yes" in err
    code, out, _ = cli("rm", db_url, "--status", "CANCELED", "--dry-run")
    assert f"would delete 1 job(s): {root}" in out
    assert status(store, root) == [S.CANCELED]

    code, out, err = cli("rm", db_url, "--status", "CANCELED", "--yes")
    assert code == 0, err
    assert "deleted 1 job(s); their dependents: 2 QUEUED" in out
    assert root not in {j.id for j in store.jobs()} and other in {j.id for j in store.jobs()}
    assert status(store, a, b) == [S.QUEUED, S.QUEUED]


def test_a_choice_of_no_jobs_or_unknown_jobs_is_one_sentence(store, db_url, cli):
    [[root, *_]] = tree(store)
    missing = root + 10**6  # ids come from a sequence the earlier tests' jobs advanced: 99 may be one of ours
    for args, words in (
        (("reset",), "name the jobs"),
        (("reset", str(missing)), f"no job {missing}"),
        (("cancel", "--status", "FAILED"), "no job matches"),
        (("rm", "1-x"), "not a job id"),
    ):
        code, out, err = cli(args[0], db_url, *args[1:])
        assert code == 2 and words in err and "Traceback" not in err, (args, err)
        assert len(err.strip().splitlines()) == 1


# -- remote stop, end to end ----------------------------------------------------------------------

STUBBORN = '''
    import signal
    import time
    from pathlib import Path


    def stubborn(state, channel):
        """Sees should_stop() turn true on SIGTERM, notes it, and goes on: only a kill ends it."""
        Path(state.marker).write_text("started")
        while not channel.should_stop():
            time.sleep(0.02)
        Path(state.marker).write_text(f"asked to stop: {channel.stop_reason}")
        while True:
            time.sleep(0.05)
'''


def test_cancel_running_stops_the_job_through_its_worker(store, db_url, cli, tmp_path: Path):
    (tmp_path / "jm_stop_exp.py").write_text(textwrap.dedent(STUBBORN))
    marker = tmp_path / "marker.txt"
    [job_id] = store.schedule([JobSpec(0, "fn", "jm_stop_exp:stubborn", {"marker": str(marker)}, None)]).job_ids
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobman.cli.main",
            "worker",
            db_url,
            "--exproot",
            str(tmp_path / "runs"),
            "--heartbeat",
            "0.2",
            "--grace",
            "1",
            "--max-jobs",
            "1",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 30
    while not (marker.exists() and marker.read_text() == "started"):
        assert time.time() < deadline and worker.poll() is None, "the job did not start"
        time.sleep(0.05)

    asked = time.time()
    code, out, err = cli("cancel", db_url, job_id, "--running")
    assert code == 0, err
    output, _ = worker.communicate(timeout=30)
    took = time.time() - asked

    assert worker.returncode == 0, output
    assert marker.read_text() == "asked to stop: received SIGTERM"  # should_stop() turned true
    assert 1.0 <= took < 10, f"stopped {took:.1f} s after the cancel (grace 1 s)"  # killed after its grace
    job = store.job(job_id)
    assert job.status is S.CANCELED and "SIGKILL" in (job.error or "")
    whys = [(e.from_status, e.to_status, e.why) for e in store.events(job_id) if e.to_status]
    assert whys[-2:] == [
        ("RUNNING", "RUNNING", "cancelled by hand: stop requested"),
        ("RUNNING", "CANCELED", "cancelled while running"),
    ]


def test_reset_of_many_jobs_finds_a_running_one_past_the_first_chunk(store):
    ids = store.schedule([JobSpec(0, "fn", "pkg.mod:fn", {"i": i}, None) for i in range(1000)]).job_ids
    with store.engine.begin() as conn:
        conn.execute(sa.update(t_job).where(t_job.c.id == ids[-1]).values(status="RUNNING"))
    with pytest.raises(UsageError, match=f"job {ids[-1]} is RUNNING"):
        store.reset(ids)
    assert store.job(ids[0]).status is S.QUEUED


def test_set_status_done_of_a_failed_job_releases_everything_downstream(store):
    ids = store.schedule(
        [
            JobSpec(0, "fn", "pkg.mod:fn", {"i": 0}, None),
            JobSpec(1, "fn", "pkg.mod:fn", {"i": 0}, 0),
            JobSpec(2, "fn", "pkg.mod:fn", {"i": 0}, 1),
        ]
    ).job_ids
    run_all(store, "FAILED")
    assert status(store, *ids) == [S.FAILED, S.BLOCKED, S.BLOCKED]
    store.set_status([ids[0]], S.DONE)
    # The grandchild's parent can run again: it waits for it, rather than staying BLOCKED for good.
    assert status(store, *ids) == [S.DONE, S.QUEUED, S.WAITING]
    assert [(e.from_status, e.to_status, e.why) for e in store.events(ids[2])][-1] == (
        "BLOCKED",
        "WAITING",
        f"job {ids[0]} is DONE",
    )


def test_cancel_and_set_status_of_many_jobs_move_them_all_in_one_verb(store):
    """Past one chunk of ids, a chain of parents and children given together: each job moves once,
    from the status it had, and what is downstream of the set follows."""
    n = 1000
    specs = [JobSpec(0, "fn", "pkg.mod:fn", {"i": i}, None) for i in range(n)]
    specs += [JobSpec(1, "fn", "pkg.mod:fn", {"i": i}, i) for i in range(n)]
    specs += [JobSpec(2, "fn", "pkg.mod:fn", {"i": i}, n + i) for i in range(n)]
    ids = store.schedule(specs).job_ids
    roots, kids, grandkids = ids[:n], ids[n : 2 * n], ids[2 * n :]
    c = store.claim(W)  # one root runs: asked to stop, not cancelled
    changes = store.changes_of(lambda: store.cancel(roots + kids, running=True))[1]
    assert store.counts() == {(0, "CANCELED"): n - 1, (0, "RUNNING"): 1, (1, "CANCELED"): n, (2, "BLOCKED"): n}
    assert store.job(c.job.id).stop_requested
    moved = [(ch["job_id"], ch["from_status"], ch["to_status"]) for ch in changes]
    assert len(moved) == 3 * n and len({m[0] for m in moved}) == 3 * n  # each job once
    assert {m[1:] for m in moved if m[0] in kids} == {("WAITING", "CANCELED")}
    assert {m[1:] for m in moved if m[0] in grandkids} == {("WAITING", "BLOCKED")}

    store.finish(c.job.id, c.lease, "DONE")  # it finished before it heard: its result is kept
    assert store.set_status(roots + kids, S.DONE) == sorted(set(roots + kids) - {c.job.id})
    assert store.counts() == {(0, "DONE"): n, (1, "DONE"): n, (2, "QUEUED"): n}
    store.set_status(roots, S.QUEUED)  # their DONE dependents stay DONE: the grandchildren still run
    assert store.counts() == {(0, "QUEUED"): n, (1, "DONE"): n, (2, "QUEUED"): n}
    store.set_status(kids, S.QUEUED)  # their parents are not DONE: they wait, and so do theirs
    assert store.counts() == {(0, "QUEUED"): n, (1, "WAITING"): n, (2, "WAITING"): n}

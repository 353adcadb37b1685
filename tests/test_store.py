"""The store's verbs on real SQLite and real PostgreSQL: scheduling, the status machine, fencing, repairs."""

from __future__ import annotations

import json
import re
import time

import pytest
import sqlalchemy as sa

from jobman.jobdb.canonical import dump_json, load_json
from jobman.jobdb.errors import DatabaseError, LeaseLost, NoSuchJob, UsageError
from jobman.jobdb.schema import job as t_job
from jobman.jobdb.schema import job_event as t_event
from jobman.jobdb.schema import metadata
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec, expand, parse_sweep

W = WorkerInfo(host="testhost", pid=4242, pid_started_at=1.0)
S = Status


def sweep(*tokens: str) -> list[JobSpec]:
    return expand(parse_sweep(["pkg.mod:fn", *tokens]))


def statuses(store: Store) -> dict[int, Status]:
    return {j.id: j.status for j in store.jobs()}


def by_params(store: Store, **params) -> int:
    [job_id] = [
        j.id
        for j in store.jobs()
        if all(j.params.get(k) == v for k, v in params.items()) and len(j.params) == len(params)
    ]
    return job_id


def dump(store: Store) -> dict[str, list[tuple]]:
    """Every row of every jobman table, for before/after comparisons."""
    out = {}
    with store.engine.connect() as conn:
        for table in metadata.sorted_tables:
            out[table.name] = [tuple(r) for r in conn.execute(sa.select(table).order_by(*table.primary_key))]
    return out


def run_done(store: Store, results: dict | None = None) -> int:
    """Claim the next job and finish it DONE; return its id."""
    c = store.claim(W)
    assert c is not None
    assert store.finish(c.job.id, c.lease, "DONE", results=results or {"ok": c.job.id}) is S.DONE
    return c.job.id


def assert_events_explain_statuses(store: Store) -> None:
    """Every status change is in job_event: each job's events chain from status to status up to its current one."""
    for job in store.jobs():
        changes = [e for e in store.events(job.id) if e.to_status is not None]
        current = None
        for e in changes:
            assert e.why and e.source and ":" in e.source, e
            if current is not None:
                assert e.from_status == current, (job.id, [(x.from_status, x.to_status, x.why) for x in changes])
            current = e.to_status
        if current is None:
            assert job.status in (S.QUEUED, S.WAITING), job
        else:
            assert current == job.status.value, (job.id, job.status, [(x.from_status, x.to_status) for x in changes])


def commits_during(store: Store, fn):
    """Run ``fn`` and count the transactions it committed."""
    seen = []
    listener = lambda conn: seen.append(1)  # noqa: E731
    sa.event.listen(store.engine, "commit", listener)
    try:
        result = fn()
    finally:
        sa.event.remove(store.engine, "commit", listener)
    return result, len(seen)


# -- schedule ----------------------------------------------------------------------------------


def test_schedule_is_idempotent(store):
    specs = sweep("lr={{0.1,0.01}}", "n={{1,2,3}}", "--", "e={{5,6}}")
    first = store.schedule(specs)
    assert (first.added, first.existing) == (18, 0)
    before = dump(store)
    again = store.schedule(sweep("lr={{0.1,0.01}}", "n={{1,2,3}}", "--", "e={{5,6}}"))
    assert (again.added, again.existing) == (0, 18)
    assert again.job_ids == first.job_ids
    assert dump(store) == before
    # A wider sweep adds only its new points.
    wider = store.schedule(sweep("lr={{0.1,0.01,0.5}}", "n={{1,2,3}}", "--", "e={{5,6}}"))
    assert (wider.added, wider.existing) == (9, 18)
    assert len(store.jobs()) == 27


def test_schedule_makes_roots_queued_and_children_waiting_with_their_dependency(store):
    store.schedule(sweep("n={{1,2}}", "--", "lr={{0.1,0.2}}"))
    jobs = store.jobs()
    roots = {j.id: j for j in jobs if j.phase == 0}
    assert all(j.status is S.QUEUED and j.depends_on == [] and j.queued_at for j in roots.values())
    children = [j for j in jobs if j.phase == 1]
    assert len(children) == 4
    for c in children:
        assert c.status is S.WAITING and c.queued_at is None
        [parent] = c.depends_on
        assert roots[parent].params["n"] == c.params["n"]


@pytest.mark.parametrize(
    "how",
    [
        "unstorable parameter",
        "parent after its child",
        "a parent of its own",
        "number too large",
        "unknown --after job",
    ],
)
def test_a_failed_schedule_leaves_nothing(store, how):
    store.schedule(sweep("seed=1"))
    before = dump(store)
    specs = sweep("lr={{0.1,0.2,0.3}}", "--", "e={{1,2}}")
    after, limit = (), 3
    if how == "unstorable parameter":
        specs.append(JobSpec(0, "fn", "pkg.mod:fn", {"lr": object()}, None))
        error = UsageError
    elif how == "parent after its child":
        specs.append(JobSpec(1, "fn", "pkg.mod:fn", {"lr": 9, "e": 9}, 999))
        error = UsageError
    elif how == "a parent of its own":  # would wait for itself forever
        specs.append(JobSpec(1, "fn", "pkg.mod:fn", {"lr": 9, "e": 9}, len(specs)))
        error = UsageError
    elif how == "number too large":  # fails in the insert itself, inside the transaction
        limit = 10**20
        error = (UsageError, DatabaseError)
    else:  # the experiment row is made first, then the selector fails
        after = [10**9]
        error = NoSuchJob
    with pytest.raises(error):
        store.schedule(specs, after=after, max_attempts=limit)
    assert dump(store) == before


def test_a_failed_first_schedule_does_not_create_the_experiment(db_url):
    s = Store.open(db_url)
    try:
        with pytest.raises(NoSuchJob):
            s.schedule(sweep("a=1"), after=[123456])
        assert s.experiment not in s.experiments()
    finally:
        s.dispose()


# -- phases and claiming ------------------------------------------------------------------------


def test_done_promotes_children_in_the_same_commit(store):
    store.schedule(sweep("n={{1,2}}", "--", "lr={{0.1,0.2}}"))
    c = store.claim(W)
    kids = store.children(c.job.id)
    assert len(kids) == 2 and all(statuses(store)[k] is S.WAITING for k in kids)
    status, commits = commits_during(store, lambda: store.finish(c.job.id, c.lease, "DONE", results={"x": 1}))
    assert status is S.DONE and commits == 1
    now = statuses(store)
    assert now[c.job.id] is S.DONE and all(now[k] is S.QUEUED for k in kids)
    other = [j for j in store.jobs() if j.phase == 1 and j.id not in kids]
    assert all(j.status is S.WAITING for j in other)
    if store.engine.dialect.name == "postgresql":  # one transaction wrote both rows
        with store.engine.connect() as conn:
            xmins = (
                conn.execute(
                    sa.text("SELECT DISTINCT xmin::text FROM job WHERE id = ANY(:ids)"), {"ids": [c.job.id, *kids]}
                )
                .scalars()
                .all()
            )
        assert len(xmins) == 1
    for k in kids:
        [e] = [e for e in store.events(k) if e.to_status == "QUEUED"]
        assert e.from_status == "WAITING" and str(c.job.id) in e.why
    assert_events_explain_statuses(store)


def test_finish_and_claim_records_then_claims_in_one_commit(store):
    """A worker's loop: the transaction that marks a job DONE claims the next one, which may be
    a dependent that the same commit has just queued."""
    [root] = store.schedule(sweep("n=1")).job_ids
    [kid] = store.schedule(sweep("n=1", "--", "lr=0.1")).job_ids[1:]
    c = store.claim(W)
    (status, nxt), commits = commits_during(
        store, lambda: store.finish_and_claim(root, c.lease, "DONE", W, "/runs", results={"w": 3})
    )
    assert status is S.DONE and commits == 1
    assert nxt.job.id == kid and nxt.job.depends_on == [root] and nxt.job.workdir == f"/runs/{kid}"
    assert statuses(store) == {root: S.DONE, kid: S.RUNNING}
    assert [(e.from_status, e.to_status) for e in store.events(kid)] == [("WAITING", "QUEUED"), ("QUEUED", "RUNNING")]
    # The last job: nothing left to claim.
    assert store.finish_and_claim(kid, nxt.lease, "FAILED", W, error="boom") == (S.FAILED, None)
    assert_events_explain_statuses(store)


def test_a_claimed_job_is_the_row_the_claim_left(store):
    """A claim returns only the columns it did not set: the job handed over, filled from the claiming
    worker, equals the stored row, for a first run, a dependent, and a resumed job with a checkpoint."""
    slurm = WorkerInfo(
        host="node7", pid=99, pid_started_at=12.5, backend="slurm", backend_id="4711", log_path="/logs/4711.out"
    )
    [root] = store.schedule(sweep("n=1")).job_ids
    [kid] = store.schedule(sweep("n=1", "--", "lr=0.1")).job_ids[1:]
    first = store.claim(slurm, "/runs")
    assert first.job == store.job(root)
    _, nxt = store.finish_and_claim(root, first.lease, "DONE", W, results={"w": 3})
    assert nxt.job == store.job(kid) and nxt.job.depends_on == [root]
    store.finish(kid, nxt.lease, "INCOMPLETE", results={"epoch": 2})
    again = store.claim(slurm)
    assert again.job == store.job(kid) and again.job.results == {"epoch": 2} and again.job.attempt == 1


def test_finish_and_claim_with_a_lost_lease_claims_nothing(store):
    [a, b] = store.schedule(sweep("i={{1,2}}")).job_ids
    old = store.claim(W)
    store.reset([a], force_running=True)
    before = dump(store)
    with pytest.raises(LeaseLost, match=f"job {a}"):
        store.finish_and_claim(a, old.lease, "DONE", W, results={"stale": True})
    after = dump(store)
    assert statuses(store) == {a: S.QUEUED, b: S.QUEUED}
    assert after["job"] == before["job"]  # only the refusal was logged
    assert [e.why for e in store.events(a)][-1].startswith("refused a stale finish")


def test_claim_order_priority_then_incomplete_then_id(store):
    [a, b, c, d] = store.schedule(sweep("i={{1,2,3,4}}")).job_ids
    [h] = store.schedule(sweep("i=9"), priority=5).job_ids
    store.set_priority([d], 7)
    claimed = [store.claim(W) for _ in range(4)]
    assert [x.job.id for x in claimed] == [d, h, a, b]
    cd, ch, ca, cb = claimed
    store.finish(d, cd.lease, "DONE")
    store.finish(h, ch.lease, "DONE")
    # b asks to be re-queued: first in line, ahead of a (older, requeued after a crash) and c.
    assert store.finish(b, cb.lease, "INCOMPLETE", results={"epoch": 3}) is S.QUEUED
    assert store.crash(a, ca.lease, "node lost") is S.QUEUED
    again = [store.claim(W) for _ in range(3)]
    assert [x.job.id for x in again] == [b, a, c]
    assert store.claim(W) is None
    rb, ra = again[0], again[1]
    # INCOMPLETE resumes the same attempt with its checkpoint; a crash starts a new attempt.
    assert (rb.job.attempt, rb.job.results, rb.lease) == (1, {"epoch": 3}, cb.lease + 1)
    assert ra.job.attempt == 2


def test_priority_beats_first_in_line(store):
    [a, b] = store.schedule(sweep("i={{1,2}}")).job_ids
    ca = store.claim(W)
    store.finish(a, ca.lease, "INCOMPLETE")
    store.set_priority([b], 1)
    assert store.claim(W).job.id == b
    assert store.claim(W).job.id == a


def test_claim_records_the_worker_and_returns_none_when_nothing_is_ready(store):
    store.schedule(sweep("n=1", "--", "m=2"))
    c = store.claim(
        WorkerInfo(host="nodeA", pid=77, pid_started_at=5.0, backend="slurm", backend_id="12_3"),
        workdir_root="/scratch/runs",
    )
    j = store.job(c.job.id)
    assert (j.status, j.host, j.pid, j.pid_started_at, j.backend, j.backend_id) == (
        S.RUNNING,
        "nodeA",
        77,
        5.0,
        "slurm",
        "12_3",
    )
    assert j.attempt == 1 and j.lease == 1 and j.workdir == f"/scratch/runs/{j.id}"
    assert j.started_at and j.heartbeat_at
    assert store.claim(W) is None  # the child waits for its running parent
    [e] = store.events(j.id)
    assert (e.from_status, e.to_status, e.attempt) == ("QUEUED", "RUNNING", 1) and "nodeA:77" in e.why


# -- lease fencing --------------------------------------------------------------------------------


def test_stale_leases_are_refused_and_logged(store):
    [jid] = store.schedule(sweep("a=1")).job_ids
    old = store.claim(W)
    store.heartbeat(jid, old.lease)
    store.reset([jid], force_running=True)
    new = store.claim(W)
    assert new.job.id == jid and new.lease == old.lease + 1
    for call in (
        lambda: store.heartbeat(jid, old.lease),
        lambda: store.save(jid, old.lease, {"stale": True}),
        lambda: store.log_metrics(jid, old.lease, [(1, "loss", 0.5)]),
        lambda: store.finish(jid, old.lease, "DONE", results={"stale": True}),
    ):
        with pytest.raises(LeaseLost, match=f"job {jid}"):
            call()
    j = store.job(jid)
    assert j.status is S.RUNNING and j.results is None and j.lease == new.lease
    assert store.metrics([jid]) == []
    refused = [e.why for e in store.events(jid) if e.to_status is None]
    assert len(refused) == 4 and all(f"lease {old.lease}" in w for w in refused)
    assert {w.split("stale ")[1].split(" ")[0] for w in refused} == {"heartbeat", "checkpoint", "metrics", "finish"}
    # The owner is not disturbed.
    assert store.heartbeat(jid, new.lease) is False
    store.save(jid, new.lease, {"epoch": 1})
    store.log_metrics(jid, new.lease, [(1, "loss", 0.5), (2, "loss", 0.25)])
    assert store.finish(jid, new.lease, "DONE", results={"epoch": 2}) is S.DONE
    assert store.job(jid).results == {"epoch": 2}
    assert store.metrics([jid]) == [(jid, 1, "loss", 0.5), (jid, 2, "loss", 0.25)]
    with pytest.raises(LeaseLost):  # a finished job is owned by nobody
        store.heartbeat(jid, new.lease)
    assert_events_explain_statuses(store)


def test_heartbeat_refreshes_a_time_moved_back(store):
    [jid] = store.schedule(sweep("a=1")).job_ids
    c = store.claim(W)
    with store.engine.begin() as conn:
        conn.execute(sa.update(t_job).where(t_job.c.id == jid).values(heartbeat_at=t_job.c.heartbeat_at - 3600))
    [running] = store.running()
    assert running.id == jid and time.time() - running.heartbeat_at > 3500
    store.heartbeat(jid, c.lease)
    [running] = store.running()
    assert time.time() - running.heartbeat_at < 60


def test_cancel_running_is_a_stop_request_seen_by_heartbeat(store):
    [jid, child] = store.schedule(sweep("a=1", "--", "b=2")).job_ids
    c = store.claim(W)
    with pytest.raises(UsageError, match="RUNNING"):
        store.cancel([jid])
    assert store.heartbeat(jid, c.lease) is False
    assert store.cancel([jid], running=True) == [jid]
    assert store.job(jid).status is S.RUNNING
    assert store.heartbeat(jid, c.lease) is True
    assert store.finish(jid, c.lease, "INCOMPLETE") is S.CANCELED
    assert statuses(store) == {jid: S.CANCELED, child: S.BLOCKED}
    assert_events_explain_statuses(store)


# -- failures and crashes ----------------------------------------------------------------------------


def test_failed_blocks_descendants_transitively(store):
    store.schedule(sweep("n={{1,2}}", "--", "m={{1,2}}", "--", "k=1"))
    c = store.claim(W)
    assert store.finish(c.job.id, c.lease, "FAILED", error="Traceback: boom", exit_code=1) is S.FAILED
    j = store.job(c.job.id)
    assert j.error == "Traceback: boom" and j.exit_code == 1 and j.finished_at
    now = statuses(store)
    mine = [d for d in now if d != c.job.id and store.job(d).params["n"] == c.job.params["n"]]
    others = [d for d in now if store.job(d).params["n"] != c.job.params["n"]]
    assert len(mine) == 4 and all(now[d] is S.BLOCKED for d in mine)
    assert {now[d] for d in others} == {S.QUEUED, S.WAITING}
    assert store.claim(W).job.params["n"] != c.job.params["n"]
    assert_events_explain_statuses(store)


def test_crashed_relaunches_within_max_attempts_then_stays_crashed(store):
    [jid, child] = store.schedule(sweep("a=1", "--", "b=2"), max_attempts=2).job_ids
    c1 = store.claim(W)
    assert store.crash(jid, c1.lease, "heartbeat lost") is S.QUEUED
    assert statuses(store) == {jid: S.QUEUED, child: S.WAITING}
    c2 = store.claim(W)
    assert c2.job.attempt == 2
    assert store.crash(jid, c2.lease, "killed by signal 9") is S.CRASHED
    assert statuses(store) == {jid: S.CRASHED, child: S.BLOCKED}
    assert store.claim(W) is None
    moves = [(e.from_status, e.to_status, e.attempt) for e in store.events(jid)]
    assert moves == [
        ("QUEUED", "RUNNING", 1),
        ("RUNNING", "CRASHED", 1),
        ("CRASHED", "QUEUED", 1),
        ("QUEUED", "RUNNING", 2),
        ("RUNNING", "CRASHED", 2),
    ]
    assert any("killed by signal 9" in e.why for e in store.events(jid))
    # The monitor's relaunch respects the budget; a retry by hand resumes it whatever the limit.
    assert store.relaunch_due() == []
    assert store.retry([jid]) == [jid]
    assert statuses(store) == {jid: S.QUEUED, child: S.WAITING}
    assert_events_explain_statuses(store)


def test_a_crash_reported_by_its_worker_and_one_found_by_the_monitor_are_one_move(store):
    """finish(CRASHED) and crash_many relaunch and block through the same moves: same events, same rows."""
    [by_worker, by_monitor] = store.schedule(sweep("a={{1,2}}"), max_attempts=2).job_ids
    first, second = store.claim(W), store.claim(W)
    reason = "killed by SIGKILL"
    assert store.finish(by_worker, first.lease, "CRASHED", error=reason, why=reason) is S.QUEUED
    assert store.crash_many([(by_monitor, second.lease, "killed by SIGKILL")]) == {by_monitor: S.QUEUED}
    whys = [[(e.from_status, e.to_status, e.why) for e in store.events(j)][1:] for j in (by_worker, by_monitor)]
    assert (
        whys[0]
        == whys[1]
        == [
            ("RUNNING", "CRASHED", "killed by SIGKILL"),
            ("CRASHED", "QUEUED", "relaunch after crash (killed by SIGKILL), attempt 1 of 2"),
        ]
    )
    jobs = {j.id: j for j in store.jobs()}
    assert {(j.status, j.error, j.finished_at, j.resume) for j in jobs.values()} == {
        (S.QUEUED, "killed by SIGKILL", None, False)
    }
    with pytest.raises(ValueError, match="unknown outcome"):
        store.finish(by_worker, first.lease, "EXPLODED")


# -- repairs -----------------------------------------------------------------------------------------


def test_reset_cascades_and_keeps_old_results_in_the_event_log(store):
    [root, mid, leaf] = store.schedule(sweep("a=1", "--", "b=2", "--", "c=3")).job_ids
    for expected in (root, mid, leaf):
        assert run_done(store, {"score": expected}) == expected
    assert store.reset([root]) == [root, mid, leaf]
    now = {j.id: j for j in store.jobs()}
    assert [now[i].status for i in (root, mid, leaf)] == [S.QUEUED, S.WAITING, S.WAITING]
    assert all(now[i].results is None and now[i].attempt == 0 for i in (root, mid, leaf))
    for i in (root, mid, leaf):
        reset = [e for e in store.events(i) if e.from_status == "DONE" and e.to_status == "WAITING"]
        assert len(reset) == 1 and reset[0].data == {"results": {"score": i}}
    assert "upstream" in [e for e in store.events(leaf) if e.from_status == "DONE"][0].why
    assert_events_explain_statuses(store)


def test_reset_refuses_running_without_force(store):
    [jid] = store.schedule(sweep("a=1")).job_ids
    store.claim(W)
    with pytest.raises(UsageError, match="RUNNING"):
        store.reset([jid])
    assert store.job(jid).status is S.RUNNING


def test_reset_without_cascade_unblocks_blocked_dependents_only(store):
    [a, b, a1, b1] = store.schedule(sweep("p={{1,2}}", "--", "q=1")).job_ids
    [fan] = store.schedule(sweep("f=1"), after=[a, b]).job_ids
    c = store.claim(W)
    assert c.job.id == a
    store.finish(a, c.lease, "FAILED", error="x")
    assert run_done(store, {"r": 1}) == b
    assert run_done(store, {"kept": True}) == b1
    assert statuses(store) == {a: S.FAILED, b: S.DONE, a1: S.BLOCKED, b1: S.DONE, fan: S.BLOCKED}
    changed = store.reset([a], cascade=False)
    assert sorted(changed) == sorted([a, a1, fan])
    assert statuses(store) == {a: S.QUEUED, b: S.DONE, a1: S.WAITING, b1: S.DONE, fan: S.WAITING}
    assert store.job(b1).results == {"kept": True} and store.job(b).results == {"r": 1}
    # With the default cascade, b's DONE descendants go back to WAITING too.
    assert sorted(store.reset([b])) == sorted([b, b1])
    assert statuses(store) == {a: S.QUEUED, b: S.QUEUED, a1: S.WAITING, b1: S.WAITING, fan: S.WAITING}
    assert_events_explain_statuses(store)


def test_cancel_blocks_dependents(store):
    [a, b, a1, b1] = store.schedule(sweep("p={{1,2}}", "--", "q=1")).job_ids
    assert store.cancel([a]) == [a]
    assert statuses(store) == {a: S.CANCELED, b: S.QUEUED, a1: S.BLOCKED, b1: S.WAITING}
    assert store.job(a).finished_at
    assert store.cancel([a]) == []  # already finished: nothing to do
    with pytest.raises(NoSuchJob):
        store.cancel([10**9])
    assert_events_explain_statuses(store)


def test_set_status_done_promotes_children_and_queued_requeues(store):
    [a, a1] = store.schedule(sweep("p=1", "--", "q=1")).job_ids
    assert store.set_status([a], S.DONE) == [a]
    assert statuses(store) == {a: S.DONE, a1: S.QUEUED}
    assert store.set_status([a], S.FAILED) == [a]
    assert statuses(store) == {a: S.FAILED, a1: S.BLOCKED}
    assert store.set_status([a], S.QUEUED) == [a]
    assert statuses(store) == {a: S.QUEUED, a1: S.WAITING}
    assert store.set_status([a], S.QUEUED) == []
    assert_events_explain_statuses(store)


def test_delete_removes_job_and_unblocks_its_dependents(store):
    [a, b] = store.schedule(sweep("p={{1,2}}")).job_ids
    [fan] = store.schedule(sweep("f=1"), after=[a, b]).job_ids
    run_done(store)  # a
    c = store.claim(W)
    store.log_metrics(c.job.id, c.lease, [(1, "loss", 1.0)])
    store.cancel([b], running=True)
    assert store.delete([b]) == 1
    assert set(statuses(store)) == {a, fan}
    assert statuses(store)[fan] is S.QUEUED  # its only open dependency is gone
    assert store.job(fan).depends_on == [a]
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(t_event).where(t_event.c.job_id == b)).scalar() == 0
    assert store.metrics([b]) == []
    with pytest.raises(NoSuchJob):
        store.job(b)


def test_after_fans_in_when_every_parent_is_done(store):
    folds = store.schedule(sweep("fold={{0,1,2}}")).job_ids
    [retrain] = store.schedule(sweep("retrain=True"), after=folds).job_ids
    assert store.job(retrain).status is S.WAITING and store.job(retrain).depends_on == sorted(folds)
    for n in range(3):
        assert run_done(store) == folds[n]
        assert store.job(retrain).status is (S.QUEUED if n == 2 else S.WAITING)
    # Scheduling after parents that are already DONE queues at once.
    [late] = store.schedule(sweep("late=1"), after=folds).job_ids
    assert store.job(late).status is S.QUEUED
    # ... and after a failed one, blocks at once.
    [x] = store.schedule(sweep("x=1")).job_ids
    c = store.claim(W)
    while c.job.id != x:
        store.finish(c.job.id, c.lease, "DONE")
        c = store.claim(W)
    store.finish(x, c.lease, "FAILED")
    [blocked] = store.schedule(sweep("after_x=1"), after=[x, folds[0]]).job_ids
    assert store.job(blocked).status is S.BLOCKED
    assert_events_explain_statuses(store)


def test_select_ids_matches_the_after_selectors(store):
    store.schedule(sweep("lr={{0.1,0.2}}", "--", "e={{1,2}}"))
    assert len(store.select_ids(phase=1)) == 4
    assert len(store.select_ids(params={"lr": 0.1})) == 3
    assert len(store.select_ids(phase=1, params={"lr": 0.2, "e": 2})) == 1
    assert store.select_ids(status=[S.DONE]) == []


def test_results_round_trip_and_oversized_state_is_refused(store):
    [jid] = store.schedule(sweep("a=1")).job_ids
    c = store.claim(W)
    from jobman.jobdb.errors import StateTooLarge
    from jobman.jobdb.store import MAX_STATE_BYTES

    with pytest.raises(StateTooLarge):
        store.save(jid, c.lease, {"w": "x" * (MAX_STATE_BYTES + 1)})
    store.save(jid, c.lease, {"nested": {"list": [1, 2.5, None, "é"]}})
    assert store.job(jid).results == {"nested": {"list": [1, 2.5, None, "é"]}}
    # Results too large at the end make the job FAILED with a reason, not a crash of the worker.
    assert store.finish(jid, c.lease, "DONE", results={"w": "x" * (MAX_STATE_BYTES + 1)}) is S.FAILED
    assert "bytes" in store.job(jid).error


def test_experiments_are_separate(db_url):
    a = Store.open(db_url)
    b = Store.open(db_url, table=a.experiment + "_other")
    try:
        a.schedule(sweep("x={{1,2}}"))
        b.schedule(sweep("x={{1,2}}"))
        assert len(a.jobs()) == len(b.jobs()) == 2
        assert {j.id for j in a.jobs()}.isdisjoint({j.id for j in b.jobs()})
        assert b.claim(W).job.id in {j.id for j in b.jobs()}
        assert all(j.status is S.QUEUED for j in a.jobs())
        with pytest.raises(NoSuchJob):
            b.job(a.jobs()[0].id)
        assert {a.experiment, b.experiment} <= set(a.experiments())
    finally:
        a.dispose()
        b.dispose()


def test_event_data_is_json_and_sources_name_this_process(store):
    import os

    store.schedule(sweep("a=1"))
    c = store.claim(W)
    store.finish(c.job.id, c.lease, "DONE")
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(t_event.c.source, t_event.c.data).where(t_event.c.job_id == c.job.id)).all()
    assert rows and all(r.source.endswith(f":{os.getpid()}") for r in rows)
    assert all(r.data is None or isinstance(json.loads(r.data), dict) for r in rows)


def test_set_status_queued_waits_for_open_dependencies(store):
    [a, a1] = store.schedule(sweep("p=1", "--", "q=1")).job_ids
    assert store.set_status([a1], S.QUEUED) == [a1]
    assert statuses(store) == {a: S.QUEUED, a1: S.WAITING}
    assert run_done(store) == a  # the child never runs before its parent
    assert statuses(store) == {a: S.DONE, a1: S.QUEUED}
    assert_events_explain_statuses(store)


def test_a_wider_sweep_attaches_new_children_to_finished_parents(store):
    [root, child] = store.schedule(sweep("n=1", "--", "e={{1}}")).job_ids
    run_done(store)
    added = store.schedule(sweep("n=1", "--", "e={{1,2}}"))
    assert added.added == 1
    new = added.job_ids[-1]
    assert statuses(store) == {root: S.DONE, child: S.QUEUED, new: S.QUEUED}
    c = store.claim(W)
    store.finish(c.job.id, c.lease, "FAILED")
    deeper = store.schedule(sweep("n=1", "--", "e={{1,2}}", "--", "z=1"))
    assert deeper.added == 2
    by_parent = {store.job(j).depends_on[0]: store.job(j).status for j in deeper.job_ids[-2:]}
    assert by_parent == {c.job.id: S.BLOCKED, ({child, new} - {c.job.id}).pop(): S.WAITING}
    assert_events_explain_statuses(store)


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": [1.5, None, True, 'é ü \u2603 "quoted" \\back'], "c": {"z": {}, "y": []}},
        {"lr": 0.1, "n": 10**20, "name": "x", "flag": False, "nested": {"k": [{"b": 2, "a": 1}]}},
        {},
        [3, {"b": 1, "a": 2}],
        "text",
        7,
    ],
)
def test_canonical_json_is_json_dumps_with_sorted_keys(value):
    """The fast encoder of a sweep's parameters gives what json.dumps(sort_keys=True) gives."""
    assert dump_json(value) == json.dumps(value, sort_keys=True)


@pytest.mark.parametrize(
    "text",
    [
        '{"b": 1, "a": [1.5, null, true, "\\u00e9 \\"q\\""]}',
        "{}",
        "[3, {}]",
        '"text"',
        "7",
        "null",
        ' {"a": 1} ',
        '{"a": NaN}',
        "",
        "{",
        '{"a": 1} extra',
        "nan",
        "[1,]",
    ],
)
def test_stored_json_is_read_back_as_json_loads_reads_it(text):
    """The decoder of claimed jobs gives what json.loads gives, and refuses what it refuses, alike."""
    try:
        expected = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError, match=re.escape(exc.msg)):
            load_json(text)
    else:
        assert json.dumps(load_json(text)) == json.dumps(expected)


@pytest.mark.parametrize("value", [{"a": float("nan")}, {"a": float("inf")}, {"a": object()}, {"a": {1, 2}}])
def test_values_json_cannot_hold_are_refused_with_a_sentence(value):
    with pytest.raises(UsageError, match="cannot be stored as JSON"):
        dump_json(value, "parameters")


def test_a_parameter_that_contains_itself_is_refused_not_a_crash():
    looped: dict = {"a": 1}
    looped["self"] = looped
    with pytest.raises(UsageError, match="cannot be stored as JSON"):
        dump_json(looped, "parameters")

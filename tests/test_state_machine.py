"""Random sequences of the store's verbs, with the status machine's invariants checked after every step.

Each example gets a fresh experiment. Hypothesis drives schedule, claim, finish (DONE, FAILED,
INCOMPLETE, REQUEUE), crash (alone and in batches), relaunch, reset, cancel and set-status; after
every step:

* a QUEUED job has every parent DONE, a WAITING one has a parent not yet DONE, and neither has a
  parent that blocks it;
* no job is RUNNING twice: every RUNNING job is owned by exactly one claim the machine holds, and
  a claim that does not own its job is refused;
* every status change is in the event log: replaying each job's events chains from status to
  status and ends at the status the job has.

SQLite runs 40 examples of 25 steps; PostgreSQL the same machine with 12 (it is slower per step;
JOBMAN_STATEFUL_PG=0 skips it); the slow-marked run goes 200 examples of 40 steps deep on SQLite.
"""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from jobman.jobdb.errors import LeaseLost, UsageError
from jobman.jobdb.schema import job as t_job
from jobman.jobdb.schema import job_dep as t_dep
from jobman.jobdb.schema import job_event as t_event
from jobman.jobdb.status import BLOCKING, Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec

S = Status
BLOCKING_VALUES = {s.value for s in BLOCKING}
W = WorkerInfo(host="machine", pid=1, pid_started_at=1.0)


class StoreMachine(RuleBasedStateMachine):
    """A store under random verbs; ``url_base`` is set by each concrete subclass."""

    url_base: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.store: Store | None = None
        self.claims: list[tuple[int, int]] = []  # (job id, lease) handed out by claim
        self.counter = 0

    @initialize()
    def open_store(self) -> None:
        self.store = Store.open(f"{self.url_base}?table=m{uuid.uuid4().hex[:10]}")
        self.schedule(roots=1, depth=1, fan_in=False)  # the experiment exists from the first step

    def teardown(self) -> None:
        if self.store is not None:
            self.store.dispose()

    # -- helpers ------------------------------------------------------------------------
    def _rows(self) -> dict[int, tuple[str, int]]:
        with self.store.engine.connect() as conn:
            exp = self.store._exp(conn)
            rows = conn.execute(
                sa.select(t_job.c.id, t_job.c.status, t_job.c.lease).where(t_job.c.experiment_id == exp)
            ).all()
        return {r.id: (r.status, r.lease) for r in rows}

    def _ids(self) -> list[int]:
        return sorted(self._rows())

    def _owned(self, job_id: int, lease: int) -> bool:
        status, current = self._rows().get(job_id, (None, None))
        return status == S.RUNNING.value and current == lease

    # -- rules --------------------------------------------------------------------------
    @rule(roots=st.integers(1, 3), depth=st.integers(0, 2), fan_in=st.booleans())
    def schedule(self, roots: int, depth: int, fan_in: bool) -> None:
        specs = []
        for _ in range(roots):
            self.counter += 1
            specs.append(JobSpec(0, "fn", "pkg.mod:fn", {"n": self.counter}, None))
            for phase in range(1, depth + 1):
                specs.append(JobSpec(phase, "fn", "pkg.mod:fn", {"n": self.counter, "phase": phase}, len(specs) - 1))
        after = self._ids()[-2:] if fan_in else []
        if after:  # fan-in: the new roots depend on the last jobs already there
            specs = [s for s in specs if s.phase == 0]
        self.store.schedule(specs, after=after, max_attempts=2)

    @rule()
    def claim(self) -> None:
        claimed = self.store.claim(W)
        if claimed is not None:
            assert claimed.job.status is S.RUNNING
            assert all(lease < claimed.lease for job_id, lease in self.claims if job_id == claimed.job.id)
            self.claims.append((claimed.job.id, claimed.lease))

    @precondition(lambda self: self.claims)
    @rule(
        data=st.data(),
        outcome=st.sampled_from(["DONE", "FAILED", "INCOMPLETE", "REQUEUE", "CRASHED"]),
        relaunch=st.booleans(),
    )
    def finish(self, data, outcome: str, relaunch: bool) -> None:
        job_id, lease = data.draw(st.sampled_from(self.claims))
        owned = self._owned(job_id, lease)
        try:
            new = self.store.finish(job_id, lease, outcome, results={"by": lease}, relaunch=relaunch)
        except LeaseLost:
            assert not owned, "an owner's finish was refused"
        else:
            assert owned, "a finish without the lease was accepted"
            assert self._rows()[job_id][0] == new.value, "finish answered a status the job does not have"

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def heartbeat(self, data) -> None:
        job_id, lease = data.draw(st.sampled_from(self.claims))
        owned = self._owned(job_id, lease)
        try:
            self.store.heartbeat(job_id, lease)
        except LeaseLost:
            assert not owned
        else:
            assert owned

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), relaunch=st.booleans())
    def crash(self, data, relaunch: bool) -> None:
        job_id, lease = data.draw(st.sampled_from(self.claims))
        owned = self._owned(job_id, lease)
        try:
            self.store.crash(job_id, lease, "found dead", relaunch=relaunch)
        except LeaseLost:
            assert not owned
        else:
            assert owned

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), relaunch=st.booleans(), limit=st.sampled_from([None, 1, 3]))
    def crash_many(self, data, relaunch: bool, limit: int | None) -> None:
        chosen = data.draw(st.lists(st.sampled_from(self.claims), min_size=1, max_size=4, unique=True))
        owned = {job_id for job_id, lease in chosen if self._owned(job_id, lease)}
        done = self.store.crash_many(
            [(j, lease, "monitor: found dead") for j, lease in chosen], relaunch=relaunch, max_attempts=limit
        )
        assert set(done) == owned
        rows = self._rows()
        assert {j: rows[j][0] for j in done} == {j: s.value for j, s in done.items()}, "the answer is not the truth"

    @precondition(lambda self: self._ids())
    @rule(data=st.data(), fresh=st.booleans())
    def retry(self, data, fresh: bool) -> None:
        ids = data.draw(st.lists(st.sampled_from(self._ids()), min_size=1, max_size=3, unique=True))
        self.store.retry(ids, "retried", fresh=fresh)

    @rule(include_failed=st.booleans(), limit=st.sampled_from([None, 3]))
    def relaunch_due(self, include_failed: bool, limit: int | None) -> None:
        self.store.relaunch_due(include_failed=include_failed, max_attempts=limit, why="monitor relaunch")

    @precondition(lambda self: self._ids())
    @rule(data=st.data(), cascade=st.booleans(), force=st.booleans())
    def reset(self, data, cascade: bool, force: bool) -> None:
        ids = data.draw(st.lists(st.sampled_from(self._ids()), min_size=1, max_size=3, unique=True))
        try:
            self.store.reset(ids, cascade=cascade, force_running=force)
        except UsageError:
            assert not force and any(self._rows()[i][0] == S.RUNNING.value for i in ids)

    @precondition(lambda self: self._ids())
    @rule(data=st.data(), running=st.booleans())
    def cancel(self, data, running: bool) -> None:
        ids = data.draw(st.lists(st.sampled_from(self._ids()), min_size=1, max_size=3, unique=True))
        try:
            self.store.cancel(ids, running=running)
        except UsageError:
            assert not running and any(self._rows()[i][0] == S.RUNNING.value for i in ids)

    @precondition(lambda self: self._ids())
    @rule(data=st.data(), status=st.sampled_from([S.DONE, S.FAILED, S.QUEUED, S.WAITING, S.CANCELED, S.CRASHED]))
    def set_status(self, data, status: Status) -> None:
        job_id = data.draw(st.sampled_from(self._ids()))
        self.store.set_status([job_id], status)

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def ready_means_parents_done(self) -> None:
        if self.store is None:
            return
        with self.store.engine.connect() as conn:
            exp = self.store._exp(conn)
            p = t_job.alias("p")
            rows = conn.execute(
                sa.select(t_job.c.id, t_job.c.status, p.c.id, p.c.status)
                .join(t_dep, t_dep.c.job_id == t_job.c.id)
                .join(p, p.c.id == t_dep.c.depends_on)
                .where(t_job.c.experiment_id == exp)
            ).all()
        open_parents: dict[int, int] = {}
        for child, status, parent, parent_status in rows:
            open_parents[child] = open_parents.get(child, 0) + (parent_status != S.DONE.value)
            if status == S.QUEUED.value:
                assert parent_status == S.DONE.value, f"job {child} is QUEUED; its parent {parent} is {parent_status}"
            if status in (S.WAITING.value, S.QUEUED.value):
                assert parent_status not in BLOCKING_VALUES, (
                    f"job {child} is {status} under parent {parent}, which is {parent_status}"
                )
        for job_id, (status, _lease) in self._rows().items():
            if status == S.WAITING.value:  # waiting for nothing would be waiting forever
                assert open_parents.get(job_id, 0) > 0, f"job {job_id} is WAITING with every parent DONE"

    @invariant()
    def one_owner_per_running_job(self) -> None:
        if self.store is None:
            return
        for job_id, (status, lease) in self._rows().items():
            owners = [c for c in self.claims if c == (job_id, lease)]
            if status == S.RUNNING.value:
                assert len(owners) == 1, f"RUNNING job {job_id} at lease {lease} has owners {owners}"
            leases = [le for j, le in self.claims if j == job_id]
            assert len(leases) == len(set(leases)), f"job {job_id} was handed the same lease twice"

    @invariant()
    def events_replay_to_the_current_status(self) -> None:
        if self.store is None:
            return
        rows = self._rows()
        with self.store.engine.connect() as conn:
            events = (
                conn.execute(
                    sa.select(t_event.c.job_id, t_event.c.from_status, t_event.c.to_status)
                    .where(t_event.c.job_id.in_(list(rows)), t_event.c.to_status.is_not(None))
                    .order_by(t_event.c.id)
                ).all()
                if rows
                else []
            )
        last: dict[int, str] = {}
        for job_id, before, after in events:
            if job_id in last:
                assert before == last[job_id], f"job {job_id}: event {before}->{after} after {last[job_id]}"
            last[job_id] = after
        for job_id, (status, _lease) in rows.items():
            if job_id in last:
                assert last[job_id] == status, f"job {job_id} is {status}; its events end at {last[job_id]}"
            else:
                assert status in (S.QUEUED.value, S.WAITING.value), f"job {job_id} is {status} with no event"


FAST = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_status_machine_on_sqlite(tmp_path):
    class OnSqlite(StoreMachine):
        url_base = f"sqlite:///{tmp_path / 'machine.db'}"

    OnSqlite.TestCase.settings = FAST
    OnSqlite.TestCase().runTest()


@pytest.mark.skipif(os.environ.get("JOBMAN_STATEFUL_PG") == "0", reason="JOBMAN_STATEFUL_PG=0")
def test_status_machine_on_postgresql(request):
    base = request.getfixturevalue("pg_database")

    class OnPostgres(StoreMachine):
        url_base = base

    OnPostgres.TestCase.settings = settings(FAST, max_examples=12)
    OnPostgres.TestCase().runTest()


@pytest.mark.slow
def test_status_machine_on_sqlite_deeply(tmp_path):
    class Deep(StoreMachine):
        url_base = f"sqlite:///{tmp_path / 'deep.db'}"

    Deep.TestCase.settings = settings(FAST, max_examples=200, stateful_step_count=40)
    Deep.TestCase().runTest()

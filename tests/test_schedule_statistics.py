"""A large schedule on PostgreSQL reads the planner's statistics again inside its transaction, so that
each chunk's identities are looked up by the identity index, not by reading the whole experiment."""

from __future__ import annotations

import random
import threading
import uuid

import psycopg
import pytest
from sqlalchemy import event

from jobman.jobdb import scheduling
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec


def random_specs(n: int, seed: int = 0) -> list[JobSpec]:
    """Not a grid (the same value may come twice), so every chunk is checked against the index."""
    rng = random.Random(seed)
    return [JobSpec(0, "fn", "pkg.mod:train", {"lr": round(rng.uniform(0, 1), 2), "i": i // 2}, None) for i in range(n)]


@pytest.fixture
def pg_store(pg_database, monkeypatch):
    monkeypatch.setattr(scheduling, "ANALYZE_AFTER", 300)
    monkeypatch.setattr(scheduling, "SCHEDULE_CHUNK", 250)
    store = Store.open(pg_database, f"stats_{uuid.uuid4().hex[:6]}")
    seen: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda c, cur, stmt, *a: seen.append(stmt))
    store.seen = seen
    yield store
    store.dispose()


def test_statistics_are_read_again_as_the_sweep_grows_and_the_sweep_is_whole(pg_store):
    specs = random_specs(2000)
    result = pg_store.schedule(specs)
    analyzed = [s for s in pg_store.seen if s == "ANALYZE job"]
    assert len(analyzed) >= 2  # past 300 jobs added, then past twice as many as at the last reading
    distinct = {(s.params["lr"], s.params["i"]) for s in specs}
    assert result.added == len(distinct) and sum(pg_store.counts().values()) == len(distinct)
    again = pg_store.schedule(specs)
    assert again.added == 0 and again.existing == len(distinct)
    # The schedule's own lock timeout is back to what it was for the rest of its transaction.
    assert "SELECT set_config('lock_timeout', %(t)s, true)" in pg_store.seen


def test_a_table_held_by_another_analyze_is_not_waited_for(pg_store, pg_database):
    pg_store.schedule(random_specs(10, seed=1))  # the experiment exists
    with psycopg.connect(pg_database) as other:
        other.execute("LOCK TABLE job IN SHARE UPDATE EXCLUSIVE MODE")  # what ANALYZE and VACUUM take
        done = threading.Event()
        result = {}

        def schedule():
            result["r"] = pg_store.schedule(random_specs(1500, seed=2))
            done.set()

        thread = threading.Thread(target=schedule)
        thread.start()
        assert done.wait(60), "the schedule waited for the lock"
        other.rollback()
    thread.join()
    assert result["r"].added > 1000 and "ANALYZE job" in pg_store.seen
    assert sum(pg_store.counts().values()) == 10 + result["r"].added

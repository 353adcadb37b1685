"""A schedule read as a stream, a chunk at a time in one transaction: the same jobs, dependencies and
statuses as one read whole, duplicates found across chunks by the identity index, idempotent, and a
larger sweep adds only its new jobs. Chunks of a few jobs stand in for chunks of ten thousand."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from jobman.jobdb import scheduling as store_module
from jobman.jobdb.status import Status
from jobman.jobdb.sweep import Expansion, JobSpec, expand, parse_sweep


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(store_module, "SCHEDULE_CHUNK", 7)


def grid(n: int) -> str:
    return "{{" + ",".join(map(str, range(n))) + "}}"


def shape(store) -> list[tuple]:
    """Every job as (phase, params, status, its parents' params): comparable across databases."""
    jobs = store.jobs()
    by_id = {j.id: j for j in jobs}
    return sorted(
        (
            j.phase,
            sorted(j.params.items()),
            j.status.value,
            sorted(sorted(by_id[p].params.items()) for p in j.depends_on),
        )
        for j in jobs
    )


def test_a_streamed_sweep_with_phases_keeps_every_parent(store):
    sweep = parse_sweep(["pkg.mod:fn", f"a={grid(5)}", f"b={grid(3)}", "--", f"c={grid(2)}", "--", "d={{1,2}}"])
    result = store.schedule(Expansion(sweep), keep_ids=False)
    assert (result.added, result.existing, result.job_ids) == (15 + 30 + 60, 0, [])
    streamed = shape(store)
    again = store.schedule(Expansion(sweep))
    assert (again.added, again.existing, len(again.job_ids)) == (0, 105, 105)
    assert again.job_ids == [j.id for j in store.jobs()]  # every job, in the sweep's order
    assert streamed == sorted(streamed)
    children = [s for s in streamed if s[0] > 0]
    assert all(s[2] == Status.WAITING.value and len(s[3]) == 1 for s in children)
    assert all(s[2] == Status.QUEUED.value for s in streamed if s[0] == 0)


def test_a_sweep_naming_one_job_twice_across_chunks_adds_it_once(store):
    specs = [JobSpec(0, "fn", "pkg.mod:fn", {"x": i % 10}, None) for i in range(30)]  # each x three times
    result = store.schedule(specs)
    assert (result.added, result.existing) == (10, 0)
    assert len(result.job_ids) == 10 and sorted(j.params["x"] for j in store.jobs()) == list(range(10))


def test_a_larger_sweep_adds_only_its_new_jobs(store):
    small = store.schedule(Expansion(parse_sweep(["pkg.mod:fn", f"a={grid(4)}", f"b={grid(5)}"])), keep_ids=False)
    assert small.added == 20
    larger = store.schedule(Expansion(parse_sweep(["pkg.mod:fn", f"a={grid(4)}", f"b={grid(6)}"])), keep_ids=False)
    assert (larger.added, larger.existing) == (4, 20)
    assert len(store.jobs()) == 24


def test_children_of_jobs_already_there_are_derived_from_their_parents(store):
    """A second sweep whose parents were scheduled (and some finished) before: its new children start
    QUEUED under a DONE parent and BLOCKED under a FAILED one, even in a chunk after the first."""
    first = store.schedule(Expansion(parse_sweep(["pkg.mod:fn", f"a={grid(10)}"])))
    done, failed = first.job_ids[:5], first.job_ids[5:7]
    store.set_status(done, Status.DONE)
    store.set_status(failed, Status.FAILED)
    more = store.schedule(Expansion(parse_sweep(["pkg.mod:fn", f"a={grid(10)}", "--", f"e={grid(3)}"])))
    assert (more.added, more.existing) == (30, 10)
    kids = [j for j in store.jobs() if j.phase == 1]
    for j in kids:
        parent = j.depends_on[0]
        want = Status.QUEUED if parent in done else Status.BLOCKED if parent in failed else Status.WAITING
        assert j.status is want, (j.id, parent, j.status)


def test_a_streamed_schedule_that_fails_half_way_writes_nothing(store):
    """A bad parent index in the third chunk: the first two chunks, inserted, are rolled back with it."""
    specs = [JobSpec(0, "fn", "pkg.mod:fn", {"x": i}, None) for i in range(20)]
    specs.append(JobSpec(1, "fn", "pkg.mod:fn", {"x": 0, "y": 1}, 25))
    from jobman.jobdb.errors import UsageError

    with pytest.raises(UsageError, match="job 20 of the sweep names job 25"):
        store.schedule(specs)
    with store.engine.connect() as conn:
        assert (
            conn.execute(
                sa.text("SELECT count(*) FROM job JOIN experiment e ON e.id = experiment_id WHERE e.name = :n"),
                {"n": store.experiment},
            ).scalar()
            == 0
        )


def test_the_expansion_is_made_as_it_is_read():
    """Iterating a million-job expansion holds one job at a time; it is the list of ``expand`` again."""
    sweep = parse_sweep(["pkg.mod:fn", f"a={grid(1000)}", f"b={grid(1000)}"])
    jobs = Expansion(sweep)
    assert len(jobs) == 1_000_000 and jobs.distinct and not jobs.parents
    it = iter(jobs)
    first = next(it)
    assert first.params == {"a": 0, "b": 0} and first.params_json == '{"a": 0, "b": 0}'
    small = parse_sweep(["pkg.mod:fn", f"a={grid(3)}", "--", "b={{1,1}}"])
    assert list(Expansion(small)) == expand(small) and not Expansion(small).distinct

"""Copies made with ``sqlschedule -r N`` in a successive-halving search: runs of one configuration,
ranked by their mean once all of them are finished at a rung, each promoted copy continuing its own
parent's workdir."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from search_helpers import by_phase, experiment_module

from jobman.jobdb.halving import allowed
from jobman.jobdb.status import Status

MODULE = "jm_repeat_exp"
# A run's own offset is drawn once, at rung 0, in the order the runs of its configuration start
# (the first run of lr=1 is far better than its copy), and carried in its workdir from rung to rung.
TRAINER = textwrap.dedent("""
    import os
    from pathlib import Path

    BASE = {1: 0.3, 2: 0.3, 3: 0.6}
    OFFSET = {(1, 0): -0.3, (1, 1): 0.7}


    def noisy(state, channel):
        count = channel.workdir / "epochs.txt"
        start = int(count.read_text()) if count.exists() else 0
        mine = channel.workdir / "run.txt"
        if not mine.exists():
            order = Path(os.environ["JM_SHARED"]) / f"lr{state.lr}"
            index = len(order.read_text().split()) if order.exists() else 0
            order.write_text((order.read_text() if order.exists() else "") + f"{channel.job_id} ")
            mine.write_text(f"{channel.job_id} {index}")
        origin, index = map(int, mine.read_text().split())
        for epoch in range(start, state.epochs):
            count.write_text(str(epoch + 1))
        state.origin = origin
        state.start = start
        key = round(state.lr) if state.lr >= 1 else 3
        state.err = BASE[key] + OFFSET.get((key, index), 0.0) + 0.01 / state.epochs
""")
FAST = ("--heartbeat", "0.2", "--grace", "2")


@pytest.fixture
def exp(tmp_path: Path):
    made = experiment_module(tmp_path, MODULE, TRAINER)
    shared = tmp_path / "shared"
    shared.mkdir()
    made.env = {**made.env, "JM_SHARED": str(shared)}
    return made


def work(jobman, url, exp):
    result = jobman("worker", url, "--exproot", str(exp.runs), *FAST, env=exp.env, timeout=180)
    assert result.code == 0, result.err


def test_copies_are_runs_of_one_configuration_ranked_by_their_mean(jobman, db_url, store, exp):
    args = (
        "sqlschedule",
        db_url,
        f"{MODULE}:noisy",
        "lr={{1,2,3}}",
        "--halving",
        "epochs=1:3",
        "--eta",
        "3",
        "--metric",
        "err",
        "-r",
        "2",
    )
    dry = jobman(*args, "--dry-run", env=exp.env)
    assert dry.code == 0 and "6 jobs" in dry.out and "6 at epochs=1, 2 at epochs=3" in dry.out, dry.out
    made = jobman(*args, env=exp.env)
    assert made.code == 0 and "added 6 jobs" in made.out, made.out + made.err
    assert "6 at epochs=1, 2 at epochs=3" in made.out
    work(jobman, db_url, exp)
    rungs = by_phase(store)
    assert sorted(rungs) == [0, 1] and len(rungs[0]) == 6
    assert all(j.status is Status.DONE for js in rungs.values() for j in js)
    # lr=1 has the best single run (0.0) but the worse mean (0.5 against 0.3): lr=2 goes on, both its runs.
    assert sorted(j.params["lr"] for j in rungs[1]) == [2, 2]
    last_end = max(j.finished_at for j in rungs[0])
    for child in rungs[1]:
        [parent] = store.parents(child.id)
        assert parent.params == {**child.params, "epochs": 1}
        assert child.created_at >= last_end
        # Each copy continues its own parent: the run it started as, from the epoch it reached.
        assert (child.results["origin"], child.results["start"]) == (parent.id, 1)
    assert len({store.parents(c.id)[0].id for c in rungs[1]}) == 2
    report = jobman("report", db_url, "--metric", "err", "--phase", "0")
    assert report.code == 0 and "copies of a job (equal parameters, sqlschedule -r) are averaged" in report.out, (
        report.out + report.err
    )
    again = jobman(*args, env=exp.env)
    assert "nothing added" in again.out and "not repeated" in again.err
    assert len(store.jobs()) == 8


def test_asynchronous_promotion_waits_for_every_copy_of_a_configuration(jobman, db_url, store, exp):
    lrs = "lr={{1,2,3,0.1,0.2,0.3,0.4,0.5,0.6}}"
    made = jobman(
        "sqlschedule",
        db_url,
        f"{MODULE}:noisy",
        lrs,
        "--halving",
        "epochs=1:9",
        "--eta",
        "3",
        "--metric",
        "err",
        "-r",
        "2",
        "--async",
        env=exp.env,
    )
    assert made.code == 0 and "added 18 jobs" in made.out, made.out + made.err
    work(jobman, db_url, exp)
    rungs = by_phase(store)
    assert [len(rungs[k]) for k in sorted(rungs)][:2] == [18, 6]
    assert all(j.status is Status.DONE for js in rungs.values() for j in js)
    for rung in sorted(rungs)[1:]:
        below = rungs[rung - 1]
        configs = {j.params["lr"] for j in below}
        for child in rungs[rung]:
            runs = [j for j in below if j.params["lr"] == child.params["lr"]]
            assert len(runs) == 2 and child.created_at >= max(j.finished_at for j in runs)
            # never more configurations promoted than the top 1/eta of the configurations finished by then
            finished = {
                lr for lr in configs if all(j.finished_at <= child.created_at for j in below if j.params["lr"] == lr)
            }
            promoted = {j.params["lr"] for j in rungs[rung] if j.created_at <= child.created_at}
            assert len(promoted) <= allowed(len(finished), len(configs), 3)
        assert sorted(
            len([c for c in rungs[rung] if c.params["lr"] == lr]) for lr in {c.params["lr"] for c in rungs[rung]}
        ) == [2] * (len(rungs[rung]) // 2)
    assert all(j.results["origin"] == j.id for j in rungs[0])
    for child in (c for rung in sorted(rungs)[1:] for c in rungs[rung]):
        [parent] = store.parents(child.id)  # each copy continues its own parent's run
        assert (child.results["origin"], child.results["start"]) == (parent.results["origin"], parent.params["epochs"])

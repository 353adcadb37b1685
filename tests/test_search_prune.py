"""Pruning: a running job whose logged curve is worse than the median of the finished jobs at the
same step is asked to stop, and ends DONE with ``pruned=True`` and its partial curve kept."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from search_helpers import experiment_module

from jobman.jobdb.halving import PRUNE_MIN_FINISHED, median_says_stop
from jobman.jobdb.status import Status

MODULE = "jm_prune_exp"
TRAINER = textwrap.dedent('''
    """Logs a flat curve at ``x`` for ``steps`` steps, stopping when asked as the bundled loop does."""


    def flat(state, channel):
        for step in range(1, state.steps + 1):
            channel.log(step, err=state.x)
            if channel.should_stop():
                state.stopped_at = step
                return channel.INCOMPLETE
        state.err = state.x
''')


def test_the_median_rule():
    assert PRUNE_MIN_FINISHED == 3
    assert median_says_stop(5.0, [1.0, 2.0], "min") is None  # too few to judge
    assert median_says_stop(5.0, [1.0, 2.0, 3.0], "min") == 2.0
    assert median_says_stop(1.5, [1.0, 2.0, 3.0], "min") is None
    assert median_says_stop(2.5, [1.0, 2.0, 3.0, 4.0], "min") is None  # the median of an even count: 2.5
    assert median_says_stop(0.5, [1.0, 2.0, 3.0], "max") == 2.0


def test_the_median_rule_counts_a_diverged_value_as_the_worst():
    nan = float("nan")
    assert median_says_stop(nan, [1.0, 2.0, 3.0], "min") == 2.0  # a NaN is stopped, never kept running
    assert median_says_stop(nan, [1.0, 2.0, 3.0], "max") == 2.0
    assert median_says_stop(1.5, [nan, nan, 1.0], "min") is None  # the others' NaN are worst, not best
    assert median_says_stop(1.5, [nan, nan, 1.0], "max") is None
    assert median_says_stop(float("inf"), [1.0, 2.0, 3.0], "min") == 2.0


@pytest.fixture
def exp(tmp_path: Path):
    return experiment_module(tmp_path, MODULE, TRAINER)


def test_a_hopeless_job_is_pruned_and_ends_done_with_its_partial_curve(jobman, db_url, store, exp):
    # One worker runs them in order: 1, 2, 3 finish; 1.5 is better than their median (2) and
    # finishes; 9 is worse than the median of the four (1.75) from its first step.
    scheduled = jobman(
        "sqlschedule",
        db_url,
        f"{MODULE}:flat",
        "x={{1,2,3,1.5,9}}",
        "steps=6",
        "--prune",
        "median",
        "--metric",
        "err",
        env=exp.env,
    )
    assert scheduled.code == 0 and "pruning by err" in scheduled.out, scheduled
    worker = jobman("worker", db_url, "--exproot", str(exp.runs), "--heartbeat", "0.2", env=exp.env, timeout=120)
    assert worker.code == 0, worker.err
    jobs = {j.params["x"]: j for j in store.jobs()}
    assert all(j.status is Status.DONE for j in jobs.values())
    hopeless = jobs[9]
    assert hopeless.results["pruned"] is True and hopeless.results["stopped_at"] == 1
    assert hopeless.results["pruned_why"] == (
        "pruned at step 1: err 9 is worse than 1.75, the median of 4 finished jobs at that step"
    )
    curve = [(step, value) for job_id, step, name, value in store.metrics([hopeless.id])]
    assert curve == [(1, 9.0)]  # the partial curve is kept
    for x in (1, 2, 3, 1.5):
        assert "pruned" not in jobs[x].results and jobs[x].results["err"] == x
        assert len(store.metrics([jobs[x].id])) == 6
    assert hopeless.attempt == 1  # not requeued, not a failure

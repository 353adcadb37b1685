"""Successive halving through phases: rung sizes, the promotion rules (synchronous and ASHA), and
real searches run by real workers, where a promoted job continues its parent's training, a killed
rung job is relaunched without breaking the promotions, and a reset re-runs without promoting twice."""

from __future__ import annotations

import json
import random
import re
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search_helpers import by_phase, experiment_module

from jobman.jobdb.halving import allowed, choose, rung_sizes, rung_values
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store

MODULE = "jm_halving_exp"
TRAINER = textwrap.dedent('''
    """A trainer that counts epochs in its workdir: a continued job starts where its parent stopped."""
    import math
    import os
    import signal


    def counter(state, channel):
        count = channel.workdir / "epochs.txt"
        start = int(count.read_text()) if count.exists() else 0
        kill = os.environ.get("JM_KILL_LR")
        for epoch in range(start, state.epochs):
            count.write_text(str(epoch + 1))
            channel.log(epoch + 1, err=abs(math.log10(state.lr) + 2) + 1.0 / (epoch + 1))
            if kill and float(kill) == state.lr and channel.attempt == 1 and epoch + 1 == state.epochs:
                os.kill(os.getpid(), signal.SIGKILL)  # after its work, before its end: a crash to relaunch
        state.start = start
        state.trained = state.epochs - start
        state.err = abs(math.log10(state.lr) + 2) + 1.0 / state.epochs


    def checkpointed(state, channel):
        """Written the README's way: no file of its own, it resumes from the state it saved."""
        start = state.get("epoch", 0)
        for epoch in range(start, state.epochs):
            state.epoch = epoch + 1
            channel.log(epoch + 1, err=abs(math.log10(state.lr) + 2) + 1.0 / (epoch + 1))
            channel.save()
        state.start = start
        state.trained = state.epochs - start
        state.err = abs(math.log10(state.lr) + 2) + 1.0 / state.epochs
''')
FAST = ("--heartbeat", "0.2", "--grace", "2")


# -- rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "low, high, eta, values",
    [
        (3, 27, 3, [3, 9, 27]),
        (1, 10, 3, [1, 3, 10]),
        (1, 16, 2, [1, 2, 4, 8, 16]),
        (1, 2, 3, [1, 2]),
        (0.5, 4.5, 3, [0.5, 1.5, 4.5]),
        (5, 81, 3, [5, 15, 81]),
    ],
)
def test_rungs_go_from_min_by_eta_and_end_at_max(low, high, eta, values):
    assert rung_values(low, high, eta) == values


@pytest.mark.parametrize(
    "configs, eta, rungs, sizes",
    [
        (27, 3, 3, [27, 9, 3]),
        (32, 3, 3, [32, 10, 3]),
        (81, 3, 5, [81, 27, 9, 3, 1]),
        (16, 2, 5, [16, 8, 4, 2, 1]),
        (5, 4, 3, [5, 1, 1]),
        (2, 3, 2, [2, 1]),
    ],
)
def test_rung_sizes(configs, eta, rungs, sizes):
    assert rung_sizes(configs, eta, rungs) == sizes


def test_synchronous_promotion_waits_for_the_whole_rung_then_takes_the_best():
    scores = {f"c{i}": float(i) for i in range(9)}
    assert choose({k: scores[k] for k in list(scores)[:8]}, 9, [], 3, "min", False) == []
    assert choose(scores, 9, [], 3, "min", False) == ["c0", "c1", "c2"]
    assert choose(scores, 9, [], 3, "max", False) == ["c8", "c7", "c6"]
    assert choose(scores, 9, ["c0", "c1", "c2"], 3, "min", False) == []  # promotions made stand
    assert choose({**scores, "c0": None}, 9, [], 3, "min", False) == ["c1", "c2", "c3"]  # a failed one never goes on


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(2, 5), st.integers(0, 10**6))
def test_asha_never_promotes_more_than_the_top_fraction_of_the_finished(total, eta, seed):
    rnd = random.Random(seed)
    order = list(range(total))
    rnd.shuffle(order)
    score = {f"c{i}": rnd.random() for i in range(total)}
    finished: dict[str, float] = {}
    promoted: list[str] = []
    for i in order:
        finished[f"c{i}"] = score[f"c{i}"]
        new = choose(finished, total, promoted, eta, "min", True)
        top = sorted(finished, key=finished.get)[: allowed(len(finished), total, eta)]
        assert set(new) <= set(top) and not set(new) & set(promoted)
        promoted += new
        assert len(promoted) <= allowed(len(finished), total, eta)
    assert len(promoted) == max(1, total // eta)  # once all are in, as many as the synchronous rule


def test_asha_waits_while_configurations_may_still_join_a_rung():
    assert choose({"a": 1.0}, 1, [], 3, "min", True, closed=False) == []
    assert choose({"a": 1.0}, 1, [], 3, "min", True, closed=True) == ["a"]
    assert choose({"a": 1.0}, 1, [], 3, "min", False, closed=False) == []


# -- real searches --------------------------------------------------------------------------------


@pytest.fixture
def exp(tmp_path: Path):
    return experiment_module(tmp_path, MODULE, TRAINER)


def search(jobman, url, exp, *extra, target="counter"):
    result = jobman(
        "sqlschedule",
        url,
        f"{MODULE}:{target}",
        "lr={{1e-4,1e-3,1e-2,1e-1,1,3e-5,3e-3,3e-1,3}}",
        "--halving",
        "epochs=1:9",
        "--eta",
        "3",
        "--metric",
        "err",
        *extra,
        env=exp.env,
    )
    assert result.code == 0, result.err
    return result


def work(jobman, url, exp, env=None):
    result = jobman("worker", url, "--exproot", str(exp.runs), *FAST, env={**exp.env, **(env or {})}, timeout=120)
    assert result.code == 0, result.err


def best_of(jobs, n):
    return sorted(jobs, key=lambda j: j.results["err"])[:n]


def check_search(store: Store, killed_lr: float | None = None) -> dict[int, list]:
    """Nine configurations at 1 epoch, the best three at 3, the best one at 9; each continued its parent
    (and a job killed after its work, ``killed_lr``, resumed from its own count when relaunched)."""
    phases = by_phase(store)
    assert [len(phases[p]) for p in sorted(phases)] == [9, 3, 1]
    assert all(j.status is Status.DONE for js in phases.values() for j in js)
    for rung, (low, high) in enumerate([(0, 1), (1, 3), (3, 9)]):
        for job in phases[rung]:
            start = high if job.params["lr"] == killed_lr else low
            assert (job.params["epochs"], job.results["start"], job.results["trained"]) == (high, start, high - start)
    for rung in (1, 2):
        parents = {store.parents(j.id)[0].id for j in phases[rung]}
        assert parents == {j.id for j in best_of(phases[rung - 1], len(phases[rung]))}
        for job in phases[rung]:
            [parent] = store.parents(job.id)
            assert {k: v for k, v in parent.params.items() if k != "epochs"} == {
                k: v for k, v in job.params.items() if k != "epochs"
            }
    assert phases[2][0].params["lr"] == 1e-2
    return phases


def test_a_synchronous_search_promotes_the_best_and_continues_their_training(jobman, db_url, store, exp):
    out = search(jobman, db_url, exp)
    assert "9 at epochs=1, 3 at epochs=3, 1 at epochs=9" in out.out
    work(jobman, db_url, exp)
    phases = check_search(store)
    rung0_last_end = max(j.finished_at for j in phases[0])
    assert all(j.created_at >= rung0_last_end for j in phases[1])  # decided once the whole rung was finished
    assert any("promoted to rung 1" in e.why for e in store.events(phases[1][0].id))
    again = search(jobman, db_url, exp)
    assert "nothing added" in again.out
    assert [len(v) for v in by_phase(store).values()] == [9, 3, 1]


def test_a_promoted_job_continues_the_state_its_parent_saved(jobman, db_url, store, exp):
    """A function that checkpoints only with channel.save() does not start over at every rung: a promoted
    job starts from its parent's saved state, its own resource (epochs) taking precedence."""
    search(jobman, db_url, exp, target="checkpointed")
    work(jobman, db_url, exp)
    phases = check_search(store)
    assert all(j.results["epoch"] == j.params["epochs"] for js in phases.values() for j in js)
    # Each rung logged only its own epochs: a promoted job's curve goes on from its parent's.
    steps = [step for _, step, name, _ in store.metrics([phases[2][0].id]) if name == "err"]
    assert steps == list(range(4, 10)), steps
    shown = jobman("show", db_url, str(phases[2][0].id), env={"COLUMNS": "400"})
    [parent] = store.parents(phases[2][0].id)
    assert f"continues job {parent.id} from its workdir" in shown.out and "and the state it saved" in shown.out


@pytest.mark.slow
def test_a_killed_rung_job_is_relaunched_and_the_promotions_hold(jobman, db_url, store, exp):
    search(jobman, db_url, exp)
    work(jobman, db_url, exp, env={"JM_KILL_LR": "0.01"})  # the best configuration dies at each rung, once
    phases = check_search(store, killed_lr=1e-2)
    killed = [j for js in phases.values() for j in js if j.params["lr"] == 1e-2]
    assert len(killed) == 3 and all(j.attempt == 2 for j in killed)
    assert all(any(e.to_status == "CRASHED" for e in store.events(j.id)) for j in killed)


@pytest.mark.slow
def test_a_reset_rung_job_reruns_without_promoting_twice(jobman, db_url, store, exp):
    search(jobman, db_url, exp)
    work(jobman, db_url, exp)
    root = next(j for j in by_phase(store)[0] if j.params["lr"] == 1e-2)
    reset = jobman("reset", db_url, str(root.id), "--yes")
    assert reset.code == 0, reset.err
    assert {j.status for j in by_phase(store)[2]} == {Status.WAITING}
    work(jobman, db_url, exp)
    phases = by_phase(store)
    assert [len(phases[p]) for p in sorted(phases)] == [9, 3, 1]
    assert all(j.status is Status.DONE for js in phases.values() for j in js)


def test_asynchronous_promotions_start_before_the_rung_is_finished(jobman, db_url, store, exp):
    search(jobman, db_url, exp, "--async")
    work(jobman, db_url, exp)
    phases = by_phase(store)
    rung0_ends = sorted(j.finished_at for j in phases[0])
    first_promotion = min(j.created_at for j in phases[1])
    assert first_promotion < rung0_ends[-1]
    for rung in (1, 2):
        for job in phases[rung]:  # never more promoted than the top 1/eta of those finished by then
            finished = sum(1 for j in phases[rung - 1] if j.finished_at <= job.created_at)
            made = sum(1 for j in phases[rung] if j.created_at <= job.created_at)
            assert made <= allowed(finished, len(phases[rung - 1]), 3)
        assert len(phases[rung]) <= max(1, len(phases[rung - 1]) // 3)
    for job in phases[1]:
        assert (job.results["start"], job.results["trained"]) == (1, 2)


def test_halving_options_are_refused_in_one_sentence(jobman, tmp_path):
    db = tmp_path / "never.db"
    url = f"sqlite:///{db}?table=t"
    for extra, words in [
        (["--halving", "epochs=3"], "RESOURCE=MIN:MAX"),
        (["--halving", "epochs=9:3", "--metric", "err"], "below MAX"),
        (["--halving", "epochs=1:9", "--eta", "1", "--metric", "err"], "eta is 2 or more"),
        (["--halving", "epochs=1:9"], "--metric"),
        (["--halving", "lr=1:9", "--metric", "err"], "leave it out"),
        (["--metric", "err"], "go with --halving"),
        (["--halving", "epochs=1:9", "--metric", "err", "--", "x=1"], "without '--'"),
    ]:
        result = jobman("sqlschedule", url, "jobman.models.mlp:train", "lr=uniform(0.1,1)", "--samples", "3", *extra)
        assert result.code != 0 and words in result.err and "Traceback" not in result.err, (extra, result)
    assert not db.exists()


def test_the_bundled_mlp_continues_a_shorter_run_rather_than_restarting(tmp_path):
    import shutil

    from jobman.dispatch.runner import run_direct

    params = {"dataset": "digits", "nhid": 16, "eval_every": 0, "progress_every": 0, "seed": 3}
    run_direct("jobman.models.mlp:train", {**params, "epochs": 2}, tmp_path / "short")
    shutil.copytree(tmp_path / "short", tmp_path / "long")
    longer = run_direct("jobman.models.mlp:train", {**params, "epochs": 4}, tmp_path / "long")
    fresh = run_direct("jobman.models.mlp:train", {**params, "epochs": 4}, tmp_path / "fresh")
    steps = [json.loads(line)["step"] for line in (tmp_path / "long" / "metrics.jsonl").read_text().splitlines()]
    assert sorted(set(steps)) == [1, 2, 3, 4]  # 1-2 copied from the short run, 3-4 trained here: no restart
    assert steps.count(1) == steps.count(3)
    # Continuing 2 epochs to 4 computes what 4 epochs in one go compute.
    assert longer.results["valid_error"] == pytest.approx(fresh.results["valid_error"])


def test_the_folds_of_a_configuration_are_one_configuration_at_every_rung():
    from jobman.jobdb.halving import config_of

    a = config_of({"lr": 0.1, "nhid": 64, "id_cross_fold": 0, "epochs": 3}, "epochs")
    assert a == config_of({"lr": 0.1, "nhid": 64, "id_cross_fold": 2, "epochs": 9}, "epochs")
    assert a == config_of({"lr": 0.1, "nhid": 64, "seed": 5, "epochs": 3}, "epochs")
    assert a != config_of({"lr": 0.2, "nhid": 64, "id_cross_fold": 0, "epochs": 3}, "epochs")


def test_more_samples_grow_the_same_search_even_after_its_first_promotions(jobman, db_url, store, exp):
    def schedule(samples: int):
        result = jobman(
            "sqlschedule",
            db_url,
            f"{MODULE}:counter",
            "lr=loguniform(1e-4,3)",
            "--samples",
            str(samples),
            "--seed",
            "3",
            "--halving",
            "epochs=1:9",
            "--eta",
            "3",
            "--metric",
            "err",
            env=exp.env,
        )
        assert result.code == 0, result.err
        return result

    schedule(6)
    work(jobman, db_url, exp)
    assert [len(js) for _, js in sorted(by_phase(store).items())] == [6, 2, 1]
    first = {j.id for j in by_phase(store)[1]}
    assert "added 3 jobs" in schedule(9).out
    assert "nothing added" in schedule(9).out
    assert len(store.search_summaries()) == 1  # one search, grown, not a second one beside it
    report = jobman("report", db_url, "--metric", "err")  # mid-search: jobs without results yet
    assert report.code == 0, report.err
    assert re.search(
        r"search \d+: successive halving by err: configurations reaching each rung: 9 at epochs=1,", report.out
    )
    work(jobman, db_url, exp)
    phases = by_phase(store)
    assert [len(phases[p]) for p in sorted(phases)] == [9, 3, 1]
    assert first < {j.id for j in phases[1]}  # promotions are never taken back
    assert all(j.status is Status.DONE for js in phases.values() for j in js)
    best = best_of(phases[0], 3)
    assert best_of(phases[0], 1)[0].params["lr"] == phases[2][0].params["lr"] or phases[2][0].params["lr"] in {
        j.params["lr"] for j in best
    }
    assert store.search_summaries()[0].endswith("9 at epochs=1, 3 at epochs=3, 1 at epochs=9")

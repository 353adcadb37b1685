"""Model-based multi-fidelity search: ``--sampler tpe --halving epochs=1:9 [--async]``.

New configurations are proposed by TPE fit on every configuration that ended, ranked by how far it
got (the rung it reached, then its result there: Optuna's TPE under its HyperbandPruner), once d + 3
have ended (BOHB's N_min + 2, N_min = d + 1, d the parameters drawn), at random before; each goes
to one of Hyperband's brackets, starting at its rung (the last bracket at the full budget), and each
bracket is halved on its own (``--async``: each configuration judged once, as its runs at a rung
end, by Optuna's successive-halving rule). Real workers on SQLite and PostgreSQL: exactly
``--samples`` configurations, never the same one twice, each promoted job the child of its
configuration's job one rung below, with concurrent workers and with workers SIGKILLed at random
moments (some while proposing).
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import textwrap
from pathlib import Path

import pytest
from search_helpers import experiment_module
from test_search_learn import kill_workers_until, start_worker

from jobman.jobdb.halving import bracket_of, bracket_shares, goes_on, rung_sizes
from jobman.jobdb.status import Status

MODULE = "jm_bohb_exp"
TRAINER = textwrap.dedent('''
    """A function of two parameters trained for ``epochs``: a promoted job goes on from its parent's count."""
    import time


    def train(state, channel):
        done = channel.workdir / "epochs.txt"
        start = int(done.read_text()) if done.exists() else 0
        time.sleep(state.get("pause", 0.0) * (state.epochs - start))
        done.write_text(str(state.epochs))
        state.start = start
        state.loss = (state.x - 0.3) ** 2 + (state.y - 2) ** 2 + 1.0 / state.epochs
''')
SPACE = ["x=uniform(-2,2)", "y=uniform(0,4)"]
MINIMUM = len(SPACE) + 3  # BOHB's N_min + 2, N_min = d + 1
PROPOSED = re.compile(
    r"proposed by tpe: configuration (\d+) of (\d+), "
    r"(?:from a model of the (\d+) configurations? that ended, ranked by how far they got"
    r"|at random: (\d+) configurations? ended, the model needs (\d+))"
    r"; Hyperband bracket (\d+) of 3, from epochs=(\d+)"
)


@pytest.fixture
def exp(tmp_path: Path):
    return experiment_module(tmp_path, MODULE, TRAINER)


def schedule(jobman, db_url, exp, *extra: str):
    return jobman(
        "sqlschedule", db_url, f"{MODULE}:train", *SPACE, "--metric", "loss", "--sampler", "tpe", *extra, env=exp.env
    )


def run_out(jobman, db_url, exp, store, tmp_path: Path, workers: int) -> None:
    procs = [start_worker(db_url, exp, tmp_path / f"w{i}.log") for i in range(workers)]
    for p in procs:
        p.wait(timeout=300)
    for _ in range(5):  # a worker that found nothing queued for a moment exits: run another
        jobs = store.jobs()
        if jobs and all(j.status is Status.DONE for j in jobs):
            break
        jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=300)
    logs = "".join(p.read_text() for p in tmp_path.glob("w*.log"))
    assert "Traceback" not in logs and "locked" not in logs


def starters(store) -> list:
    """The jobs a proposal made (each configuration's first), as against those a promotion made."""
    return [j for j in store.jobs() if not j.depends_on]


def first_rung_points(store) -> list[tuple[float, float]]:
    return [(j.params["x"], j.params["y"]) for j in starters(store)]


def check_promotions(
    store, n: int, rungs: list[int], eta: int, judged: str | None = None
) -> dict[int, dict[int, list]]:
    """Every job DONE; exactly ``n`` distinct configurations; each promoted job continues its
    configuration's job one rung below. Synchronously, each bracket's rungs as large as halving makes
    them once all ended; asynchronously (``judged``), each configuration judged once as it ended, by
    Optuna's successive-halving rule (:func:`goes_on`): the best of each bracket's rung always goes
    on, and with ``judged="in order"`` (one worker: the order they ended in is the order they were
    judged in) each went on exactly when it was within the best ``len // eta`` of those ended by then.
    The jobs by bracket (the rung their configuration started at), then by rung."""
    jobs = store.jobs()
    assert jobs and all(j.status is Status.DONE for j in jobs), [(j.id, j.status) for j in jobs]
    by_id = {j.id: j for j in jobs}
    assert len(starters(store)) == n and len(set(first_rung_points(store))) == n

    def bracket(job) -> int:
        while job.depends_on:
            (job,) = [by_id[p] for p in job.depends_on]
        return rungs.index(job.params["epochs"])

    by_bracket: dict[int, dict[int, list]] = {}
    for job in jobs:
        by_bracket.setdefault(bracket(job), {}).setdefault(rungs.index(job.params["epochs"]), []).append(job)
    for start, by_rung in by_bracket.items():
        for rung, members in by_rung.items():
            for job in members:
                # A job killed after its last save but before its end was recorded goes on from its own
                # count when relaunched: the work since the checkpoint is all that may be lost.
                own = (job.params["epochs"],) if job.attempt > 1 else ()
                if rung == start:
                    assert job.depends_on == [] and job.results["start"] in (0, *own)
                    continue
                (parent,) = [by_id[p] for p in job.depends_on]
                assert parent.params["epochs"] == rungs[rung - 1]
                assert {k: v for k, v in parent.params.items() if k != "epochs"} == {
                    k: v for k, v in job.params.items() if k != "epochs"
                }
                assert job.results["start"] in (rungs[rung - 1], *own)  # it went on from its parent's workdir
        if judged is None:
            # Once every job ended, synchronous halving has promoted max(1, n // eta) of each bracket's rung.
            sizes = rung_sizes(len(by_rung[start]), eta, len(rungs) - start)
            assert [len(by_rung.get(k, [])) for k in range(start, len(rungs))] == sizes, (start, by_rung)
            continue
        for rung in range(start, len(rungs) - 1):
            members = by_rung.get(rung, [])
            went_on = {(j.params["x"], j.params["y"]) for j in by_rung.get(rung + 1, [])}
            if not members:
                continue
            best = min(members, key=lambda j: j.results["loss"])
            assert (best.params["x"], best.params["y"]) in went_on, (start, rung, by_rung)
            if judged == "in order":
                ordered = sorted(members, key=lambda j: (j.finished_at, j.id))
                for i, job in enumerate(ordered):
                    before = [m.results["loss"] for m in ordered[: i + 1]]
                    expected = goes_on(job.results["loss"], before, eta, "min")
                    assert ((job.params["x"], job.params["y"]) in went_on) == expected, (start, rung, i, before)
    return by_bracket


def proposals(store) -> list[tuple[int, bool, int, int]]:
    """Each configuration's proposal as recorded: (its number, whether the model made it, the
    configurations that had ended, the resource its bracket starts at)."""
    out = []
    for job in starters(store):
        why = next(e.why for e in store.events(job.id) if e.from_status is None)
        m = PROPOSED.fullmatch(why)
        assert m, why
        start = int(m.group(7))
        assert start == job.params["epochs"]
        if m.group(3) is not None:
            out.append((int(m.group(1)), True, int(m.group(3)), start))
        else:
            assert int(m.group(5)) == MINIMUM
            out.append((int(m.group(1)), False, int(m.group(4)), start))
    return sorted(out)


@pytest.mark.parametrize("mode", [[], ["--async"]], ids=["sync", "async"])
def test_bohb_runs_exactly_n_configurations_and_promotes_the_best(jobman, db_url, store, exp, tmp_path, mode):
    n = 18
    done = schedule(jobman, db_url, exp, "--samples", str(n), "--halving", "epochs=1:9", "--parallel", "3", *mode)
    assert done.code == 0 and "tpe proposed 3 configurations" in done.out and "halving epochs 1 to 9" in done.out
    again = schedule(jobman, db_url, exp, "--samples", str(n), "--halving", "epochs=1:9", "--parallel", "3", *mode)
    assert again.code == 0 and "nothing added" in again.out and len(store.jobs()) == 3, again
    run_out(jobman, db_url, exp, store, tmp_path, 3)
    by_bracket = check_promotions(store, n, [1, 3, 9], 3, "as they ended" if mode else None)
    if not mode:  # synchronous: each rung's promoted are the best of its bracket there
        for by_rung in by_bracket.values():
            for rung in sorted(by_rung)[:-1]:
                ranked = sorted(by_rung[rung], key=lambda j: j.results["loss"])
                best = {(j.params["x"], j.params["y"]) for j in ranked[: len(by_rung[rung + 1])]}
                assert best == {(j.params["x"], j.params["y"]) for j in by_rung[rung + 1]}
    # The model was used, and only once enough configurations had ended.
    made = proposals(store)
    assert [p[0] for p in made] == list(range(1, n + 1))
    assert all(count < MINIMUM for _, modelled, count, _ in made if not modelled)
    assert all(count >= MINIMUM for _, modelled, count, _ in made if modelled)
    assert not made[0][1] and made[-1][1]
    # Hyperband's brackets: configurations start at more than one rung.
    assert len({start for *_, start in made}) > 1
    # The report names the search's best at its highest rung.
    shown = jobman("report", db_url, "--metric", "loss", env=exp.env)
    assert shown.code == 0 and "best (loss lowest best)" in shown.out, shown


def test_the_model_sees_every_configuration_that_ended_once_it_has_enough(jobman, tmp_path, exp):
    url = f"sqlite:///{tmp_path / 'up.db'}?table=t"
    from jobman.jobdb.store import Store

    done = schedule(jobman, url, exp, "--samples", "30", "--halving", "epochs=1:9", "--async", "--parallel", "1")
    assert done.code == 0, done
    ran = jobman("worker", url, "--exproot", str(exp.runs), env=exp.env, timeout=300)
    assert ran.code == 0, ran
    store = Store.open(url)
    made = proposals(store)
    # One worker, one pending: each proposal comes after every earlier configuration ended (its
    # promotions too), so the k-th sees k - 1; the first d + 3 at random, every one after from the model.
    assert [count for _, _, count, _ in made] == list(range(30))
    assert [modelled for _, modelled, _, _ in made] == [k >= MINIMUM for k in range(30)]
    check_promotions(store, 30, [1, 3, 9], 3, "in order")
    store.dispose()


@pytest.mark.slow
def test_exactly_n_when_workers_are_sigkilled_while_proposing(jobman, db_url, store, exp, tmp_path):
    n = 24
    extra = ["--parallel", "2", "pause=0.3", "--max-attempts", "100", "--async"]
    done = schedule(jobman, db_url, exp, "--samples", str(n), "--halving", "epochs=1:9", *extra)
    assert done.code == 0, done

    def finished() -> bool:
        return len(first_rung_points(store)) >= n and all(j.status is Status.DONE for j in store.jobs())

    kills = kill_workers_until(jobman, db_url, exp, tmp_path, finished, random.Random(11), (0.6, 1.8))
    assert kills >= 4
    check_promotions(store, n, [1, 3, 9], 3, "as they ended")
    assert "Traceback" not in (tmp_path / "w.log").read_text()


def test_optimize_with_halving_from_python(tmp_path, exp, monkeypatch):
    import sys

    import jobman

    monkeypatch.syspath_prepend(exp.env["PYTHONPATH"].split(os.pathsep)[0])
    sys.modules.pop(MODULE, None)
    ex = jobman.Experiment(f"sqlite:///{tmp_path / 'py.db'}?table=t", backend="inline", exproot=tmp_path / "runs")
    futures, best = ex.optimize(
        f"{MODULE}:train",
        {"x": jobman.uniform(-2, 2), "y": jobman.uniform(0, 4)},
        samples=9,
        metric="loss",
        parallel=1,
        halving="epochs=1:9",
        asynchronous=True,
    )
    jobs = [ex.store.job(f.job_id) for f in futures]
    assert all(f.result()["loss"] > 0 for f in futures)
    assert len([j for j in jobs if not j.depends_on]) == 9  # the budget, in configurations
    assert {j.params["epochs"] for j in jobs} <= {1, 3, 9}
    for job in jobs:  # a promoted job went on from its parent's workdir; a proposed one from nothing
        assert job.results["start"] == (ex.store.job(job.depends_on[0]).params["epochs"] if job.depends_on else 0)
    top = min((j for j in jobs if j.params["epochs"] == 9), key=lambda j: j.results["loss"])
    assert best.params == {"x": top.params["x"], "y": top.params["y"]}  # the best at the highest rung
    assert best.values["loss"] == pytest.approx(top.results["loss"])


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--sampler", "cmaes", "--halving", "epochs=1:9"], "use --sampler tpe or gp"),
        (["--sampler", "tpe", "--halving", "epochs=1:9", "--metric", "start"], "one --metric"),
        (["--sampler", "tpe", "--halving", "epochs=1:9", "--constraint", "start<=1"], "--constraint"),
        (["--sampler", "tpe", "--async"], "--async goes with --halving"),
        (["--sampler", "tpe", "--halving", "epochs=1:9", "--prune", "median"], "does not combine with --prune"),
        (["--sampler", "tpe", "--halving", "x=1:9"], "leave it out"),
    ],
)
def test_combinations_that_cannot_work_are_refused_in_one_sentence(jobman, tmp_path, exp, extra, says):
    url = f"sqlite:///{tmp_path / 'bad.db'}?table=t"
    done = jobman(
        "sqlschedule", url, f"{MODULE}:train", *SPACE, "--samples", "5", "--metric", "loss", *extra, env=exp.env
    )
    assert done.code != 0 and says in done.out + done.err, done
    assert "Traceback" not in done.out + done.err and len((done.out + done.err).strip().splitlines()) == 1
    if (tmp_path / "bad.db").exists():  # nothing written
        with sqlite3.connect(tmp_path / "bad.db") as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            assert "job" not in tables or db.execute("SELECT count(*) FROM job").fetchone() == (0,)


def test_brackets_take_hyperbands_shares():
    """Hyperband's brackets weighed as Optuna's HyperbandPruner weighs them, ceil(n * eta**s / (s + 1)):
    for epochs 1:27 and eta 3, 27, 12, 6 and 4 configurations of every 49 start at 1, 3, 9 and 27."""
    assert bracket_shares(4, 3) == [27, 12, 6, 4]
    assert bracket_shares(3, 3) == [9, 5, 3]
    assert bracket_shares(1, 3) == [1]
    counts = [0, 0, 0, 0]
    for draw in range(3 * 49):
        counts[bracket_of(bracket_shares(4, 3), draw)] += 1
    assert counts == [81, 36, 18, 12]


def test_a_configuration_goes_on_when_within_the_best_share_of_its_bracket_so_far():
    """Optuna's successive-halving rule, judged once as a configuration's runs at a rung end: within the
    best len // eta of those ended there (its own result included), the best when fewer than eta ended,
    ties included; highest best with mode max."""
    assert goes_on(0.5, [0.5], 3, "min")  # the first always goes on
    assert goes_on(0.4, [0.5, 0.4], 3, "min") and not goes_on(0.6, [0.5, 0.6], 3, "min")
    assert goes_on(0.3, [0.5, 0.4, 0.3], 3, "min") and not goes_on(0.45, [0.5, 0.4, 0.45], 3, "min")
    six = [0.1, 0.2, 0.3, 0.4, 0.5]
    assert goes_on(0.2, [*six, 0.2], 3, "min") and not goes_on(0.25, [*six, 0.25], 3, "min")  # best 2 of 6
    assert goes_on(0.2, [0.2, 0.2, 0.2], 3, "min")  # a tie with the best goes on
    assert goes_on(0.9, [0.1, 0.5, 0.9], 3, "max") and not goes_on(0.5, [0.1, 0.9, 0.5], 3, "max")


def test_the_model_ranks_configurations_by_how_far_they_got():
    """The study a proposal asks holds every configuration of the search: COMPLETE by its mean at the
    highest rung, PRUNED with its means at the rungs it reached when it stopped below, RUNNING while a
    run is pending; so that TPE ranks a configuration that reached a higher rung above one that did
    not, as Optuna's TPE ranks pruned trials."""
    import json
    from types import SimpleNamespace

    import optuna

    from jobman.jobdb.halving import Halving
    from jobman.jobdb.learn import Config, Plan, build_study

    rules = Halving("epochs", (1, 3, 9), 3, "loss", space=(("x", "uniform", (-2.0, 2.0)),))
    plan = Plan("tpe", 9, 1, 0, (("loss", "min"),), "fn", "m:f", ({},))

    def run(i: int, x: float, rung: int, loss: float | None) -> SimpleNamespace:
        done = loss is not None
        return SimpleNamespace(
            id=i,
            status=Status.DONE.value if done else Status.RUNNING.value,
            params=json.dumps({"x": x, "epochs": [1, 3, 9][rung]}),
            results=json.dumps({"loss": loss}) if done else None,
            rung=rung,
        )

    configs = {
        "top": Config("top", [run(1, 0.1, 0, 0.5), run(2, 0.1, 1, 0.4), run(3, 0.1, 2, 0.3)]),
        "stopped": Config("stopped", [run(4, 0.2, 0, 0.2)]),
        "late": Config("late", [run(5, 0.3, 2, 0.25)]),  # started in the last bracket
        "going": Config("going", [run(6, 0.4, 0, 0.6), run(7, 0.4, 1, None)]),
    }
    study, _ = build_study(None, plan, rules, configs, {}, reach=True)  # type: ignore[arg-type]
    trials = {t.params["x"]: t for t in study.get_trials(deepcopy=False)}
    State = optuna.trial.TrialState
    assert trials[0.1].state == State.COMPLETE and trials[0.1].value == pytest.approx(0.3)
    assert trials[0.3].state == State.COMPLETE and trials[0.3].value == pytest.approx(0.25)
    assert trials[0.2].state == State.PRUNED and trials[0.2].intermediate_values == {0: pytest.approx(0.2)}
    assert trials[0.4].state == State.RUNNING

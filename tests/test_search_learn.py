"""Search that learns: Optuna's samplers propose each configuration where a job's end is recorded.

Real workers and real databases (SQLite and PostgreSQL): exactly ``--samples`` configurations in all and
never the same point twice, with concurrent workers and with workers SIGKILLed at random moments
(some of them while proposing, inside the transaction that records a job's end); proposals made at
once differ; a sequential run with a seed is the same run again; failed and crashed jobs are seen by
the sampler as failures; bad input and a missing Optuna are refused in one sentence, nothing written.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from search_helpers import experiment_module

from jobman.jobdb.errors import UsageError
from jobman.jobdb.status import Status

MODULE = "jm_learn_exp"
TRAINER = textwrap.dedent('''
    """A smooth function of three parameters; ``fail`` above a threshold, ``die`` kills the job."""
    import os
    import signal
    import time


    def quad(x, y, c="a", seed=0, pause=0.0, fail_above=None, die_above=None):
        time.sleep(pause)
        if die_above is not None and x > die_above:
            os.kill(os.getpid(), signal.SIGKILL)
        if fail_above is not None and x > fail_above:
            raise ValueError("x too large")
        return {"loss": (x - 0.3) ** 2 + (y - 2) ** 2 + (0.5 if c == "b" else 0.0), "seconds": abs(x)}


    def two(x, y):
        """Two objectives whose Pareto front is known: every x in [0, 2], whatever y."""
        return {"f1": x**2, "f2": (x - 2) ** 2 + 0 * y}
''')
SPACE = ["x=uniform(-2,2)", "y=uniform(0,4)", "c=choice(a,b)"]


@pytest.fixture
def exp(tmp_path: Path):
    return experiment_module(tmp_path, MODULE, TRAINER)


def schedule(jobman, db_url, exp, *extra: str):
    return jobman("sqlschedule", db_url, f"{MODULE}:quad", *SPACE, "--metric", "loss", *extra, env=exp.env)


def points(store) -> list[tuple]:
    return [(j.params["x"], j.params["y"], j.params["c"]) for j in store.jobs()]


def start_worker(db_url: str, exp, log: Path) -> subprocess.Popen:
    env = {**os.environ, **exp.env}
    with log.open("a") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobman.cli.main",
                "worker",
                db_url,
                "--exproot",
                str(exp.runs),
                "--heartbeat",
                "0.2",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a SIGKILL takes the worker, its fork server and its job
        )


def kill_workers_until(jobman, db_url, exp, tmp_path, finished, rng, pause: tuple[float, float]) -> int:
    """Start two workers at a time and SIGKILL each after a random pause (at most 10 kills in all), the
    monitor queueing a killed worker's job again, until ``finished()`` or 480 s; how many were killed."""
    kills = 0
    deadline = time.time() + 480
    while time.time() < deadline and not finished():
        workers = [start_worker(db_url, exp, tmp_path / "w.log") for _ in range(2)]
        for victim in workers if kills < 10 else ():
            time.sleep(rng.uniform(*pause))
            if victim.poll() is None:
                os.killpg(victim.pid, signal.SIGKILL)
                kills += 1
        for w in workers:
            try:
                w.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait()
        # The killed worker's job stayed RUNNING: the monitor finds it dead and queues it again.
        scan = jobman("monitor", db_url, "--once", env=exp.env)
        assert scan.code == 0, scan
    return kills


def test_exactly_n_distinct_points_with_concurrent_workers(jobman, db_url, store, exp, tmp_path):
    done = schedule(jobman, db_url, exp, "--samples", "16", "--sampler", "tpe", "--parallel", "3", "pause=0.05")
    assert done.code == 0 and "tpe proposed 3 configurations" in done.out, done
    again = schedule(jobman, db_url, exp, "--samples", "16", "--sampler", "tpe", "--parallel", "3", "pause=0.05")
    assert again.code == 0 and "nothing added" in again.out and len(store.jobs()) == 3, again
    workers = [start_worker(db_url, exp, tmp_path / f"w{i}.log") for i in range(3)]
    for w in workers:
        w.wait(timeout=240)
    for _ in range(5):  # a worker that found nothing queued for a moment exits: start another
        if sum(j.status is Status.DONE for j in store.jobs()) == 16:
            break
        jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    jobs = store.jobs()
    assert len(jobs) == 16 and all(j.status is Status.DONE for j in jobs)
    assert len(set(points(store))) == 16
    text = "".join((tmp_path / f"w{i}.log").read_text() for i in range(3))
    assert "Traceback" not in text and "locked" not in text
    # The sampler learned: its later points are better than its first, random ones, on the whole.
    losses = [j.results["loss"] for j in sorted(jobs, key=lambda j: j.id)]
    assert min(losses[8:]) < min(losses[:4])
    # Grown: a larger budget continues the same search.
    more = schedule(jobman, db_url, exp, "--samples", "18", "--sampler", "tpe", "--parallel", "3", "pause=0.05")
    assert more.code == 0 and "proposed 2 configurations" in more.out, more
    assert len(store.jobs()) == 18


def test_exactly_n_when_workers_are_sigkilled_while_proposing(jobman, db_url, store, exp, tmp_path):
    n = 30
    # Attempts enough that no job's crashes are final: the attempt limit is not what is tested here.
    # Jobs long enough (some 0.6 s) that the sweep outlasts several kills on a quiet machine too.
    extra = ["--parallel", "2", "pause=0.5", "--max-attempts", "100"]
    done = schedule(jobman, db_url, exp, "--samples", str(n), "--sampler", "tpe", *extra)
    assert done.code == 0, done

    def finished() -> bool:
        jobs = store.jobs()
        return len(jobs) >= n and all(j.status is Status.DONE for j in jobs)

    # A job lasts some 0.6 s with its process; a proposal takes a few ms to tens of ms: a kill at a random
    # moment falls now in a job, now in a finishing transaction, now in a claim.
    kills = kill_workers_until(jobman, db_url, exp, tmp_path, finished, random.Random(7), (0.8, 2.0))
    jobs = store.jobs()
    assert kills >= 4
    assert len(jobs) == n, [(j.id, j.status) for j in jobs]
    assert all(j.status is Status.DONE for j in jobs), [(j.id, j.status, j.attempt) for j in jobs]
    assert len(set(points(store))) == n
    assert "Traceback" not in (tmp_path / "w.log").read_text()


def test_two_proposals_at_once_differ_and_a_sequential_run_repeats(jobman, tmp_path, exp):
    urls = [f"sqlite:///{tmp_path / f'run{k}.db'}?table=t" for k in range(2)]
    from jobman.jobdb.store import Store

    runs = []
    for url in urls:
        done = schedule(jobman, url, exp, "--samples", "12", "--sampler", "tpe", "--parallel", "1", "--seed", "5")
        assert done.code == 0, done
        ran = jobman("worker", url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
        assert ran.code == 0, ran
        s = Store.open(url)
        jobs = sorted(s.jobs(), key=lambda j: j.id)
        runs.append([(j.params["x"], j.params["y"], j.params["c"]) for j in jobs])
        whys = [next(e.why for e in s.events(j.id) if e.from_status is None) for j in jobs]
        s.dispose()
    assert len(runs[0]) == 12 and runs[0] == runs[1]  # the same seed, one at a time: the same run
    # A quarter of a budget of 12 at random (Optuna's 10 start-up trials, capped as SMAC3 caps its
    # initial design), the rest from TPE's model of the results before each.
    tail = [w.partition(" of 12")[2] for w in whys]
    assert tail == [
        *(f", at random: {k} result{'s' if k != 1 else ''}, the model needs 3" for k in range(3)),
        *(f", from a model of {k} results" for k in range(3, 12)),
    ]
    # Four at once from the same (empty) history: four different points.
    url = f"sqlite:///{tmp_path / 'at_once.db'}?table=t"
    assert schedule(jobman, url, exp, "--samples", "8", "--sampler", "tpe", "--parallel", "4").code == 0
    s = Store.open(url)
    assert len({(j.params["x"], j.params["y"]) for j in s.jobs()}) == 4
    s.dispose()


def study_states(store) -> dict[int, str]:
    """The trial each job is to the sampler (one job per configuration here), by job id."""
    from jobman.jobdb import learn

    def read(conn):
        search_id, spec = conn.execute(
            learn.sa.select(learn.t_search.c.id, learn.t_search.c.spec).where(
                learn.t_search.c.experiment_id == store._exp(conn)
            )
        ).one()
        data = json.loads(spec)
        configs = learn._configs(conn, search_id)
        study, _ = learn.build_study(
            conn, learn.Plan.from_dict(data["learn"]), learn.Halving.from_json(spec), configs, {}
        )
        return {configs[t.user_attrs["config"]].jobs[0].id: t.state.name for t in study.get_trials(deepcopy=False)}

    return store._read(read)


def test_failed_and_crashed_jobs_are_failures_to_the_sampler(jobman, db_url, store, exp):
    done = schedule(
        jobman, db_url, exp, "--samples", "12", "--sampler", "tpe", "--parallel", "1",
        "fail_above=0.8", "die_above=1.4", "--max-attempts", "1",
    )  # fmt: skip
    assert done.code == 0, done
    ran = jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0, ran
    jobs = {j.id: j for j in store.jobs()}
    assert len(jobs) == 12  # a failed or crashed configuration uses its share of the budget
    states = study_states(store)
    expected = {
        Status.DONE: "COMPLETE",
        Status.FAILED: "FAIL",
        Status.CRASHED: "FAIL",
    }
    assert {i: expected[j.status] for i, j in jobs.items()} == states
    assert any(j.status is Status.FAILED for j in jobs.values()), "no job failed: the test saw nothing"


def test_a_dead_job_the_monitor_finds_frees_its_slot(jobman, db_url, store, exp, tmp_path):
    # One configuration at a time; its worker is SIGKILLed mid-job, with no attempt left: the
    # monitor's verdict (CRASHED) is what the sampler sees, and the next point is proposed at once.
    done = schedule(
        jobman, db_url, exp, "--samples", "3", "--sampler", "tpe", "--parallel", "1", "pause=30", "--max-attempts", "1"
    )
    assert done.code == 0, done
    worker = start_worker(db_url, exp, tmp_path / "w.log")
    deadline = time.time() + 60
    while not any(j.status is Status.RUNNING for j in store.jobs()) and time.time() < deadline:
        time.sleep(0.1)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    scan = jobman("monitor", db_url, "--once", env=exp.env)
    assert scan.code == 0, scan
    jobs = sorted(store.jobs(), key=lambda j: j.id)
    assert [j.status for j in jobs] == [Status.CRASHED, Status.QUEUED]
    assert study_states(store) == {jobs[0].id: "FAIL", jobs[1].id: "RUNNING"}


def test_folds_of_a_configuration_are_one_trial_by_their_mean(jobman, db_url, store, exp):
    done = schedule(jobman, db_url, exp, "--samples", "3", "--sampler", "tpe", "--parallel", "2", "seed={{1,2}}")
    assert done.code == 0 and "2 configurations (4 jobs)" in done.out, done
    ran = jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0, ran
    jobs = store.jobs()
    assert len(jobs) == 6 and len({(j.params["x"], j.params["y"]) for j in jobs}) == 3
    assert sorted(j.params["seed"] for j in jobs) == [1, 1, 1, 2, 2, 2]


def test_a_multi_objective_front_is_right_on_a_known_front(jobman, db_url, store, exp, tmp_path):
    done = jobman(
        "sqlschedule", db_url, f"{MODULE}:two", "x=uniform(-1,3)", "y=uniform(0,1)", "--samples", "14",
        "--sampler", "tpe", "--metric", "f1", "--metric", "f2", "--parallel", "2", env=exp.env,
    )  # fmt: skip
    assert done.code == 0, done
    ran = jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0, ran
    jobs = store.jobs()
    assert len(jobs) == 14 and all(j.status is Status.DONE for j in jobs)
    # Every x in [0, 2] is on the front; one outside only when no point evaluated beats it on both
    # (x < 0 loses to any x' in (x, -x], x > 2 to any x' in [4 - x, x)).
    xs = {j.id: j.params["x"] for j in jobs}
    on_front = {
        i
        for i, x in xs.items()
        if 0 <= x <= 2
        or (x < 0 and not any(x < o <= -x for k, o in xs.items() if k != i))
        or (x > 2 and not any(4 - x <= o < x for k, o in xs.items() if k != i))
    }
    assert 2 <= len(on_front) < len(jobs), sorted(xs.values())  # the check tells points apart
    from jobman import Experiment

    with Experiment(db_url) as ex:
        front = ex.best()
    assert {p.job_ids[0] for p in front} == on_front
    assert all(set(p.values) == {"f1", "f2"} for p in front)
    report = jobman("report", db_url, "--metric", "f1", env=exp.env)
    assert report.code == 0 and f"Pareto front (f1 lowest best, f2 lowest best): {len(on_front)} configurations" in (
        report.out
    ), report
    plotted = jobman("report", db_url, "--metric", "f1", "--plot", str(tmp_path / "plots"), env=exp.env)
    assert plotted.code == 0 and "pareto_front.png" in plotted.err and "f1_best_so_far.png" in plotted.err, plotted
    assert "f1_importances.png" in plotted.err, plotted
    assert (tmp_path / "plots" / "pareto_front.png").stat().st_size > 10_000


def test_a_constraint_keeps_infeasible_points_from_being_best(jobman, db_url, store, exp):
    # loss is lowest at x = 0.3, y = 2, which seconds = |x| >= 0.5 makes infeasible.
    done = schedule(
        jobman, db_url, exp, "--samples", "16", "--sampler", "tpe", "--parallel", "1", "--constraint", "seconds>=0.5"
    )
    assert done.code == 0, done
    ran = jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0, ran
    jobs = store.jobs()
    assert len(jobs) == 16
    feasible = [j for j in jobs if j.results["seconds"] >= 0.5]
    assert feasible and len(feasible) < len(jobs), "all or none feasible: the check below would tell nothing"
    from jobman import Experiment

    with Experiment(db_url) as ex:
        best = ex.best()
    expected = min(feasible, key=lambda j: j.results["loss"])
    assert best.job_ids == (expected.id,) and abs(best.params["x"]) >= 0.5
    report = jobman("report", db_url, "--metric", "loss", env=exp.env)
    assert report.code == 0 and "best (loss lowest best; feasible: seconds>=0.5): 1 configurations" in report.out, (
        report
    )


def test_nsga2_keeps_its_state_in_the_search(jobman, db_url, store, exp):
    done = jobman(
        "sqlschedule", db_url, f"{MODULE}:quad", *SPACE, "--samples", "6", "--sampler", "nsga2",
        "--metric", "loss", "--metric", "seconds", "--parallel", "2", env=exp.env,
    )  # fmt: skip
    assert done.code == 0, done
    ran = jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0, ran
    assert len(store.jobs()) == 6 and len(set(points(store))) == 6
    from jobman.jobdb import learn

    spec = json.loads(
        store._read(
            lambda conn: conn.execute(
                learn.sa.select(learn.t_search.c.spec).where(learn.t_search.c.experiment_id == store._exp(conn))
            ).scalar_one()
        )
    )
    assert all("NSGAIISampler:generation" in attrs for attrs in spec["state"]["trials"].values())
    assert len(spec["state"]["trials"]) == 6  # every proposal's own state, kept to be given back


@pytest.mark.parametrize(
    "args, words",
    [
        (["--samples", "5", "--sampler", "tpe", "--metric", ""], "name a result"),
        (["--samples", "5", "--sampler", "tpe", "--metric", "loss:max", "--max", "--metric", "s"], "ambiguous"),
        (["--samples", "5", "--sampler", "tpe", "--metric", "loss", "--metric", "loss:max"], "both lowest best"),
        (["--samples", "5", "--sampler", "cmaes", "--metric", "loss"], "cannot sample choice"),
        (["--samples", "5", "--sampler", "tpe", "--metric", "loss", "z=normal(0,1)"], "no bounds"),
        (["--samples", "5", "--sampler", "tpe", "--metric", "loss", "k={{1,2}}"], "write k as choice"),
        (["--samples", "5", "--sampler", "tpe", "--metric", "loss", "--prune", "median"], "does not combine"),
        (["--samples", "5", "--metric", "loss", "--parallel", "2"], "--parallel goes with"),
        (["--samples", "5", "--sampler", "tpe", "--metric", "loss", "--parallel", "0"], "at least 1"),
        (["--sampler", "tpe", "--metric", "loss"], "needs --samples"),
        (["--samples", "5", "--sampler", "tpe", "--metric", "loss", "--constraint", "mem<4000"], "RESULT<=NUMBER"),
        (["--samples", "5", "--metric", "loss", "--constraint", "mem<=4000"], "--constraint goes with"),
        (["--samples", "5", "--sampler", "tpe", "--metric", "loss", "-r", "2"], "does not combine"),
    ],
)
def test_bad_input_is_one_sentence_and_writes_nothing(jobman, tmp_path, exp, args, words):
    db = tmp_path / "bad.db"
    got = jobman("sqlschedule", f"sqlite:///{db}?table=t", f"{MODULE}:quad", *SPACE, *args, env=exp.env)
    assert got.code != 0 and words in got.err and "Traceback" not in got.err, got
    assert len(got.err.strip().splitlines()) == 1, got.err
    assert not db.exists()


def test_tpe_without_metric_is_refused(jobman, tmp_path, exp):
    db = tmp_path / "bad.db"
    got = jobman(
        "sqlschedule", f"sqlite:///{db}?table=t", f"{MODULE}:quad", *SPACE, "--samples", "5", "--sampler", "tpe"
    )
    assert got.code != 0 and "needs --metric" in got.err and "Traceback" not in got.err, got
    assert not db.exists()


def test_without_optuna_one_sentence_names_the_extra_and_random_search_still_runs(jobman, tmp_path, exp):
    # A real process in which ``import optuna`` fails, as where the extra is not installed.
    blocker = tmp_path / "no_optuna"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['optuna'] = None\n")
    env = {**exp.env, "PYTHONPATH": os.pathsep.join([str(blocker), exp.env["PYTHONPATH"]])}
    probe = subprocess.run([sys.executable, "-c", "import optuna"], env={**os.environ, **env}, capture_output=True)
    assert probe.returncode != 0  # the blocker works
    db = tmp_path / "x.db"
    url = f"sqlite:///{db}?table=t"
    got = jobman(
        "sqlschedule", url, f"{MODULE}:quad", *SPACE, "--samples", "5", "--sampler", "tpe", "--metric", "loss", env=env
    )
    assert got.code != 0 and "pip install 'jobman-sql[search]'" in got.err and "Traceback" not in got.err, got
    assert len(got.err.strip().splitlines()) == 1 and not db.exists()
    # A worker without Optuna still records the end of a learning search's job (no point proposed then);
    # scheduling the search again, where Optuna is, goes on.
    other = f"sqlite:///{tmp_path / 'y.db'}?table=t"
    learn = ["--samples", "3", "--sampler", "tpe", "--metric", "loss", "--parallel", "1"]
    assert jobman("sqlschedule", other, f"{MODULE}:quad", *SPACE, *learn, env=exp.env).code == 0
    ran = jobman("worker", other, "--exproot", str(exp.runs), env=env, timeout=240)
    assert ran.code == 0, ran
    from jobman.jobdb.store import Store

    s = Store.open(other)
    assert [j.status for j in s.jobs()] == [Status.DONE]
    again = jobman("sqlschedule", other, f"{MODULE}:quad", *SPACE, *learn, env=exp.env)
    assert again.code == 0 and "proposed 1 configuration (1 job)" in again.out, again
    assert len(s.jobs()) == 2
    s.dispose()
    # Jobs of other searches never need Optuna: a random search schedules and runs without it.
    assert jobman("sqlschedule", url, f"{MODULE}:quad", *SPACE, "--samples", "3", env=env).code == 0
    ran = jobman("worker", url, "--exproot", str(exp.runs), env=env, timeout=240)
    assert ran.code == 0 and "Traceback" not in ran.err, ran


def test_the_readme_example_runs_as_written(jobman, tmp_path):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("### Search that learns", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    commands = [(k, line) for k, line in enumerate(lines) if line.startswith("jobman ")]
    assert [c.split()[1] for _, c in commands] == ["sqlschedule", "dispatch", "report"]
    outputs = []
    for _, command in commands:
        got = jobman(*shlex.split(command)[1:], cwd=tmp_path, timeout=600)
        assert got.code == 0 and "Traceback" not in got.err, got
        outputs.append(got.out + got.err)
    assert outputs[0].strip() == lines[commands[0][0] + 1]  # what it prints, word for word
    assert "mlp: 8 DONE" in outputs[1]
    assert lines[commands[2][0] + 3] in outputs[2]  # the search's summary line


def test_ask_and_tell_from_python_are_jobs_the_report_sees(db_url, store, jobman):
    import jobman as jm
    from jobman import Experiment

    space = {"x": jm.uniform(-2, 2), "y": jm.uniform(0, 4), "tag": "t"}
    with Experiment(db_url, backend=None) as ex:
        search = ex.search(space, metric="loss", samples=14, seed=3)
        told = []
        for k in range(14):
            point = search.ask()
            assert set(point) == {"x", "y"} and -2 <= point["x"] <= 2
            if k == 4:
                assert search.tell(point, failed="diverged") is Status.FAILED
                continue
            assert search.tell(point, loss=(point["x"] - 0.3) ** 2 + (point["y"] - 2) ** 2) is Status.DONE
            told.append(point)
        with pytest.raises(UsageError, match="spent its budget of 14 points"):
            search.ask()
        with pytest.raises(UsageError, match="needs loss="):
            ex.search(space, metric="loss", samples=15, seed=3).tell(told[0], other=1.0)
        best = ex.best("loss")
    jobs = store.jobs()
    assert len(jobs) == 14 and sum(j.status is Status.FAILED for j in jobs) == 1
    assert all(j.params["tag"] == "t" for j in jobs) and len({(j.params["x"], j.params["y"]) for j in jobs}) == 14
    expected = min((j for j in jobs if j.status is Status.DONE), key=lambda j: j.results["loss"])
    assert best.job_ids == [expected.id] or tuple(best.job_ids) == (expected.id,)
    report = jobman("report", db_url, "--metric", "loss")
    assert report.code == 0 and "14 of 15 configurations proposed, 14 ended" in report.out  # grown to 15 above, report


def bowl(x, y):
    return {"loss": (x - 0.3) ** 2 + (y - 2) ** 2}


def test_optimize_runs_a_search_to_its_budget_and_returns_the_best(db_url, store, tmp_path):
    import jobman as jm
    from jobman import Experiment

    with Experiment(db_url, backend="inline", exproot=tmp_path / "runs") as ex:
        futures, best = ex.optimize(
            bowl, {"x": jm.uniform(-2, 2), "y": jm.uniform(0, 4)}, samples=12, metric="loss", parallel=2, seed=1
        )
        again, _ = ex.optimize(
            bowl, {"x": jm.uniform(-2, 2), "y": jm.uniform(0, 4)}, samples=12, metric="loss", parallel=2, seed=1
        )
    jobs = store.jobs()
    assert len(futures) == 12 and all(f.done() for f in futures) and len(jobs) == 12
    assert [f.job_id for f in again] == [f.job_id for f in futures]  # the same call again runs nothing
    assert len({(j.params["x"], j.params["y"]) for j in jobs}) == 12
    expected = min(jobs, key=lambda j: j.results["loss"])
    assert best.mean == expected.results["loss"] and list(best.job_ids) == [expected.id]


def test_cmaes_keeps_its_optimizer_in_the_search(jobman, db_url, store, exp):
    done = jobman(
        "sqlschedule", db_url, f"{MODULE}:quad", "x=uniform(-2,2)", "y=uniform(0,4)", "--samples", "16",
        "--sampler", "cmaes", "--metric", "loss", "--parallel", "2", env=exp.env,
    )  # fmt: skip
    assert done.code == 0, done
    ran = jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0 and "no point proposed" not in ran.err, ran
    assert len(store.jobs()) == 16 and len(set((j.params["x"], j.params["y"]) for j in store.jobs())) == 16
    from jobman.jobdb import learn

    spec = json.loads(
        store._read(
            lambda conn: conn.execute(
                learn.sa.select(learn.t_search.c.spec).where(learn.t_search.c.experiment_id == store._exp(conn))
            ).scalar_one()
        )
    )
    # CMA-ES's generation and, once its first generation (6 points in 2 dimensions) has ended, its
    # optimizer, pickled into its trials' attributes, are kept and given back to each proposal.
    trials = spec["state"]["trials"].values()
    assert sum("cma:generation" in attrs for attrs in trials) >= 14
    assert any("cma:optimizer:0" in attrs for attrs in trials)
    # Without the optimizer given back, every proposal would start CMA-ES again at generation 0.
    assert max(attrs.get("cma:generation", 0) for attrs in trials) >= 1


def test_a_metric_no_job_reports_is_said_in_the_report(jobman, tmp_path, exp):
    url = f"sqlite:///{tmp_path / 'm.db'}?table=t"
    done = schedule(jobman, url, exp, "--samples", "3", "--sampler", "tpe", "--parallel", "1")
    assert done.code == 0, done
    wrong = jobman("sqlschedule", url, f"{MODULE}:quad", *SPACE, "--metric", "los", "--samples", "2", "--sampler",
                   "tpe", "--parallel", "1", env=exp.env)  # fmt: skip
    assert wrong.code == 0, wrong
    ran = jobman("worker", url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0, ran
    report = jobman("report", url, "--metric", "loss", env=exp.env)
    assert "some DONE jobs report no los (failures to the sampler)" in report.out, report
    assert report.out.count("report no") == 1  # the search on loss is not blamed


def test_importances_of_a_metric_to_maximise_ask_what_reaches_high_values():
    """The evaluator looks at what reaches low values: a metric to maximise must be negated first.
    Here the highest values depend on x alone, the lowest on y as well."""
    import optuna

    from jobman.jobdb.learn import _importances

    space = {"x": optuna.distributions.FloatDistribution(0, 1), "y": optuna.distributions.FloatDistribution(0, 1)}
    study = optuna.create_study(direction="maximize")
    for i in range(12):
        for k in range(12):
            x, y = (i + 0.5) / 12, (k + 0.5) / 12
            value = x if x >= 0.5 else -1 - y
            study.add_trial(optuna.trial.create_trial(params={"x": x, "y": y}, distributions=space, value=value))
    found = _importances(optuna, study)
    assert found["x"] > 0.9, found

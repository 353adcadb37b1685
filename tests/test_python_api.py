"""jobman from Python: Experiment, call/map futures, the cache indexed by the call, cached, grid,
results, best, schedule. Real databases, real scripts run as processes, real workers.

Each script is written under ``tmp_path`` and run there as a user would (``python script.py``),
so its functions live in ``__main__`` and are stored by value. Side effects go to files the
tests count: a call answered from the cache leaves none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import jobman
from jobman.jobdb.errors import CallTimeout, JobFailed, JobNotRun, UsageError
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store

PRELUDE = textwrap.dedent('''
    import json, os, sys, time
    import jobman

    URL = sys.argv[1]
    SIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "side.txt")


    def train(lr, nhid=64):
        """A plain keyword function; each run leaves a line in side.txt."""
        with open(SIDE, "a") as fh:
            fh.write(f"{lr} {nhid} {os.getpid()}\\n")
        return {"valid_error": lr * 100 / nhid, "pid": os.getpid()}
''')


def run_script(
    tmp_path: Path, body: str, *args: str, timeout: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return proc


def side_lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "side.txt"
    return path.read_text().splitlines() if path.exists() else []


def last_json(proc: subprocess.CompletedProcess):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_jobman_stays_cheap():
    """The CLI and the fork server import jobman: the Python API must not come with it."""
    code = "import sys, jobman; print(sorted(m for m in ('sqlalchemy', 'jobman.dispatch.futures') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.pgbouncer
def test_map_over_a_grid_on_local_workers_runs_main_functions_and_answers_again_from_the_cache(db_url, tmp_path):
    proc = run_script(
        tmp_path,
        """
        exp = jobman.Experiment(URL, backend="local", workers=2, exproot="runs")
        futures = exp.map(train, jobman.grid(lr=[0.1, 0.01], nhid=[64, 256]))
        got = {f.job_id: f.result(timeout=60) for f in jobman.as_completed(futures, timeout=90)}
        again = exp.call(train, lr=0.1, nhid=64).result()
        exp.close()
        print(json.dumps({"got": got, "again": again, "me": os.getpid()}))
    """,
        db_url,
    )
    out = last_json(proc)
    assert len(out["got"]) == 4
    errors = sorted(r["valid_error"] for r in out["got"].values())
    assert errors == sorted(lr * 100 / nhid for lr in (0.1, 0.01) for nhid in (64, 256))
    pids = {r["pid"] for r in out["got"].values()}
    assert out["me"] not in pids  # run by workers, not by the script
    assert out["again"]["valid_error"] == 0.1 * 100 / 64
    assert len(side_lines(tmp_path)) == 4  # the fifth call ran nothing
    store = Store.open(db_url)
    try:
        jobs = store.jobs()
        assert [j.status for j in jobs] == [Status.DONE] * 4
        assert {j.target.partition("#")[0] for j in jobs} == {"__main__:train"}
        assert len({j.target for j in jobs}) == 1
        assert {j.backend for j in jobs} == {"local"}
    finally:
        store.dispose()


def test_a_local_experiment_answered_from_the_database_starts_no_process_and_one_that_ran_leaves_none(db_url, tmp_path):
    """What forks the workers starts with the first call to run (its imports overlap the scheduling),
    never for calls answered from the database, and ends with the experiment."""
    proc = run_script(
        tmp_path,
        """
        import psutil

        def zygotes():
            found = []
            for p in psutil.Process().children():
                try:
                    if "jobman.dispatch.backends.zygote" in p.cmdline():
                        found.append(p.pid)
                except psutil.Error:
                    pass
            return found

        exp = jobman.Experiment(URL, backend="local", workers=1, exproot="runs")
        first = exp.call(train, lr=0.1)
        running = zygotes()
        first = first.result(timeout=60)
        exp.close()
        after_run = zygotes()
        exp = jobman.Experiment(URL, backend="local", workers=1, exproot="runs")
        again = exp.call(train, lr=0.1)
        from_cache = zygotes()
        again = again.result(timeout=60)
        exp.close()
        print(json.dumps({"counts": [len(running), len(after_run), len(from_cache), len(zygotes())],
                          "same": first == again}))
    """,
        db_url,
    )
    out = last_json(proc)
    assert out["counts"] == [1, 0, 0, 0]
    assert out["same"]
    assert len(side_lines(tmp_path)) == 1  # the second call was answered from the database


def test_calls_scheduled_while_the_first_runs_get_their_workers_at_the_next_poll(db_url, tmp_path):
    """A graph's first call starts one worker; the calls that take it, scheduled while it runs, get the
    second at once, not at the next periodic look (here made an hour away): two leaves run together."""
    proc = run_script(
        tmp_path,
        """
        import jobman.dispatch.futures as futures
        futures.KEEP_WORKERS_EVERY = 3600.0
        HERE = os.path.dirname(SIDE)  # a job runs in its own workdir

        def mark(name):
            return os.path.join(HERE, name)

        def source():
            open(mark("source-started"), "w").close()
            deadline = time.time() + 60
            while not os.path.exists(mark("go")) and time.time() < deadline:
                time.sleep(0.01)
            return {"v": 1}

        def leaf(data, i):
            open(mark(f"leaf-{i}"), "w").close()
            deadline = time.time() + 30
            while not all(os.path.exists(mark(f"leaf-{j}")) for j in (0, 1)) and time.time() < deadline:
                time.sleep(0.01)
            return {"together": all(os.path.exists(mark(f"leaf-{j}")) for j in (0, 1))}

        exp = jobman.Experiment(URL, backend="local", workers=2, exproot="runs")
        src = exp.call(source)
        deadline = time.time() + 60
        while not os.path.exists(mark("source-started")) and time.time() < deadline:
            time.sleep(0.01)
        leaves = exp.map(leaf, [{"data": src, "i": 0}, {"data": src, "i": 1}])
        open(mark("go"), "w").close()
        print(json.dumps([f.result(timeout=120)["together"] for f in leaves]))
        exp.close()
    """,
        db_url,
        timeout=240,
    )
    assert last_json(proc) == [True, True]


def test_functions_of_one_name_each_run_their_own_code_on_workers_and_a_rerun_is_answered_from_the_cache(
    db_url, tmp_path
):
    """Two lambdas, and two functions made by one factory, share a name (``__main__:<lambda>``,
    ``__main__:scaled.<locals>.step``): each call runs its own function's code on a worker."""
    body = """
        def scaled(k):
            def step(x):
                with open(SIDE, "a") as fh:
                    fh.write(f"step {k} {x}\\n")
                return {"y": x * k}
            return step

        class Note:  # a class of the script: cloudpickle gives it a new random id in every process
            def __init__(self, what):
                self.what = what

        def noted(what, y):
            # a constant set of strings: its order changes from one process to the next
            assert what in {"plus", "minus", "times", "over", "a", "b", "c", "d", "e", "f", "g", "h"}
            with open(SIDE, "a") as fh:
                fh.write(f"{Note(what).what}\\n")
            return {"y": y}

        plus = lambda x: noted("plus", x + 1)  # noqa: E731
        minus = lambda x: noted("minus", x - 1)  # noqa: E731
        exp = jobman.Experiment(URL, backend="local", workers=2, exproot="runs")
        futures = [exp.call(fn, x=10) for fn in (plus, minus, scaled(2), scaled(3))]
        got = [f.result(timeout=90)["y"] for f in futures]
        exp.close()
        print(json.dumps(got))
    """
    assert last_json(run_script(tmp_path, body, db_url)) == [11, 9, 20, 30]
    assert sorted(side_lines(tmp_path)) == ["minus", "plus", "step 2 10", "step 3 10"]
    assert last_json(run_script(tmp_path, body, db_url)) == [11, 9, 20, 30]  # the same script again
    assert len(side_lines(tmp_path)) == 4  # ... answered from the database
    store = Store.open(db_url)
    try:
        jobs = store.jobs()
        assert [j.status for j in jobs] == [Status.DONE] * 4
        names = sorted(j.target.partition("#")[0] for j in jobs)
        assert names == ["__main__:<lambda>"] * 2 + ["__main__:scaled.<locals>.step"] * 2
        assert len({j.target for j in jobs}) == 4
        assert len({store.function_code(j.target) for j in jobs}) == 4
    finally:
        store.dispose()


def test_two_scripts_train_each_run_their_own_code(db_url, tmp_path):
    """Two scripts, each with its own ``train``: one name, ``__main__:train``, two functions."""
    body = """
        def train(x):
            return {"y": x * FACTOR}

        exp = jobman.Experiment(URL, backend="local", workers=1, exproot="runs")
        print(json.dumps(exp.call(train, x=7).result(timeout=90)))
        exp.close()
    """
    got = []
    for factor in (2, 5):
        here = tmp_path / f"script{factor}"
        here.mkdir()
        got.append(last_json(run_script(here, f"FACTOR = {factor}\n" + textwrap.dedent(body), db_url)))
    assert got == [{"y": 14}, {"y": 35}]


def test_a_cache_hit_runs_nothing_and_a_new_version_runs_again(db_url, tmp_path):
    body = """
        exp = jobman.Experiment(URL, backend="inline", exproot="runs")
        a = exp.call(train, lr=0.5).result()
        b = exp.call(train, {"lr": 0.5, "nhid": 64}).result()   # the same call: defaults are not params
        c = exp.call(train, lr=0.5, version="v2").result()
        print(json.dumps([a, b, c]))
    """
    first = last_json(run_script(tmp_path, body, db_url))
    assert len(side_lines(tmp_path)) == 3  # lr=0.5; lr=0.5 nhid=64; lr=0.5 at v2
    second = last_json(run_script(tmp_path, body, db_url))
    assert second == first
    assert len(side_lines(tmp_path)) == 3  # a second interpreter: all three from the database


def test_cache_source_makes_a_changed_function_a_new_call(db_url, tmp_path):
    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")

    def f(x):
        return {"y": x + 1}

    first = exp.call(f, x=1, cache="source")
    assert exp.call(f, x=1, cache="source").job_id == first.job_id  # the same source: the same call

    def f(x):
        return {"y": x + 2}

    changed = exp.call(f, x=1, cache="source")
    assert changed.job_id != first.job_id and changed.result() == {"y": 3}
    assert exp.call(f, x=1).result() == {"y": 3}  # without a version: a call of its own, run once
    assert first.result() == {"y": 2}
    exp.close()


@pytest.mark.pgbouncer
@pytest.mark.parametrize("per_process", [None, 1])
def test_a_call_that_kills_its_own_process_loses_only_itself_and_the_others_are_done(db_url, tmp_path, per_process):
    """Calls share a job process by default (None: K=100, as a pool's workers are reused); one that
    SIGKILLs its process is recorded as crashed, and the calls after it run in a fresh one."""
    given = "" if per_process is None else f", jobs_per_process={per_process}"
    proc = run_script(
        tmp_path,
        f"""
        import signal
        from jobman.jobdb.errors import JobFailed


        def step(i):
            if i == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return {{"n": i, "pid": os.getpid()}}


        exp = jobman.Experiment(URL, backend="local", workers=1, exproot="runs", max_attempts=1{given})
        futures = exp.map(step, [{{"i": i}} for i in range(8)])
        out = {{}}
        for f in futures:
            try:
                out[f.job_id] = f.result(timeout=90)
            except JobFailed as exc:
                out[f.job_id] = {{"status": exc.status}}
        exp.close()
        print(json.dumps(out))
    """,
        db_url,
    )
    out = last_json(proc)
    crashed = [r for r in out.values() if "status" in r]
    assert crashed == [{"status": "CRASHED"}]
    done = sorted((r for r in out.values() if "n" in r), key=lambda r: r["n"])
    assert [r["n"] for r in done] == [0, 1, 2, 4, 5, 6, 7]
    pids_before = {r["pid"] for r in done if r["n"] < 3}
    pids_after = {r["pid"] for r in done if r["n"] > 3}
    assert not pids_before & pids_after  # the killed process was replaced
    if per_process is None:  # one worker, its calls in turn: a process for those before, one for those after
        assert len(pids_before) == 1 and len(pids_after) == 1
    else:
        assert len(pids_before) == 3 and len(pids_after) == 4
    store = Store.open(db_url)
    try:
        assert sorted(j.status.value for j in store.jobs()) == ["CRASHED"] + ["DONE"] * 7
    finally:
        store.dispose()


def test_jobs_per_process_is_refused_unless_a_whole_number_of_at_least_one(db_url, tmp_path, monkeypatch):
    for bad in (0, -2, 1.5, True):
        with pytest.raises(UsageError, match="jobs_per_process must be a whole number"):
            jobman.Experiment(db_url, exproot=tmp_path / "runs", jobs_per_process=bad)
    monkeypatch.setenv("JOBMAN_JOBS_PER_PROCESS", "many")
    with pytest.raises(UsageError, match=r"\$JOBMAN_JOBS_PER_PROCESS='many'"):
        jobman.Experiment(db_url, exproot=tmp_path / "runs")
    monkeypatch.setenv("JOBMAN_JOBS_PER_PROCESS", "7")
    exp = jobman.Experiment(db_url, exproot=tmp_path / "runs")
    assert exp.jobs_per_process == 7
    exp.close()
    monkeypatch.delenv("JOBMAN_JOBS_PER_PROCESS")
    exp = jobman.Experiment(db_url, exproot=tmp_path / "runs")
    assert exp.jobs_per_process == 100
    exp.close()


def test_a_failing_call_raises_with_the_jobs_traceback_and_retry_runs_it_again(db_url, tmp_path):
    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")
    flag = tmp_path / "fixed"

    def flaky(x):
        if not flag.exists():
            raise ValueError(f"no good: {x}")
        return {"y": x * 2}

    with pytest.raises(JobFailed) as info:
        exp.call(flaky, x=3).result()
    assert "ValueError: no good: 3" in str(info.value)
    assert "Traceback" in info.value.error and "raise ValueError" in info.value.error
    flag.write_text("")
    with pytest.raises(JobFailed):  # still FAILED: the database answers
        exp.call(flaky, x=3).result()
    assert exp.call(flaky, x=3, retry=True).result() == {"y": 6}
    assert exp.call(flaky, x=3).result() == {"y": 6}
    exp.close()


@pytest.mark.pgbouncer
def test_the_same_call_from_three_processes_at_once_runs_once(db_url, tmp_path):
    """Three processes ready, then let go at once; the one that runs the call holds it running until all
    three have begun it and it has started, so none of them can be answered by a finished job."""
    body = """
        here = os.path.dirname(SIDE)

        @jobman.cached(URL, exproot="runs")
        def slow(n):
            with open(SIDE, "a") as fh:
                fh.write(f"{n} {os.getpid()}\\n")
            while not os.path.exists(os.path.join(here, "finish")):
                time.sleep(0.01)
            return n * n

        print("ready", flush=True)
        while not os.path.exists(os.path.join(here, "go")):
            time.sleep(0.01)
        print("calling", flush=True)
        print(json.dumps(slow(7)))
    """
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), db_url],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        for word in ("ready", "calling"):
            for p in procs:
                line = p.stdout.readline().strip()
                assert line == word, (line, p.stderr.read() if p.poll() is not None else "")
            if word == "ready":  # all three started and waiting: let them go together
                (tmp_path / "go").write_text("")
        deadline = time.time() + 60
        while not side_lines(tmp_path):  # one of them runs it, and holds it running
            assert time.time() < deadline, "no process ran the call"
            time.sleep(0.01)
        assert all(p.poll() is None for p in procs), "a process answered while the call was still running"
        (tmp_path / "finish").write_text("")
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        (tmp_path / "finish").write_text("")
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == 49
    assert len(side_lines(tmp_path)) == 1


def test_cached_memoizes_across_two_interpreter_runs(db_url, tmp_path):
    body = """
        @jobman.cached(URL, exproot="runs")
        def features(dataset, pca=32, scale=1.0):
            with open(SIDE, "a") as fh:
                fh.write(f"{dataset} {pca}\\n")
            return [dataset, pca, scale, (1, 2)]

        print(json.dumps([features("digits"), features("digits", pca=32), features("digits", 16)]))
    """
    first = last_json(run_script(tmp_path, body, db_url))
    assert first == [["digits", 32, 1.0, [1, 2]], ["digits", 32, 1.0, [1, 2]], ["digits", 16, 1.0, [1, 2]]]
    assert len(side_lines(tmp_path)) == 2
    assert last_json(run_script(tmp_path, body, db_url)) == first
    assert len(side_lines(tmp_path)) == 2


def test_enqueue_only_futures_are_resolved_by_a_worker_started_elsewhere(db_url, tmp_path, jobman):
    (tmp_path / "mymod.py").write_text(
        textwrap.dedent("""
        import os
        def square(state, channel):
            state.y = state.x ** 2
            state.where = os.getpid()
    """)
    )
    body = """
        import mymod
        exp = jobman.Experiment(URL, backend=None)
        futures = exp.map(mymod.square, [{"x": 2}, {"x": 3}])
        open("scheduled", "w").close()
        print(json.dumps(sorted(f.result(timeout=90)["y"] for f in futures)))
    """
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    proc = subprocess.Popen(
        [sys.executable, str(script), db_url], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 60
    while not (tmp_path / "scheduled").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    # A worker in the script's directory: mymod is found there without PYTHONPATH.
    worker = jobman("worker", db_url, "--exproot", str(tmp_path / "runs"), cwd=tmp_path, env={"PYTHONPATH": ""})
    assert worker.code == 0, worker.err
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == [4, 9]


def test_sqlschedules_check_finds_a_module_in_the_current_directory(tmp_path):
    """The installed `jobman` script (not `python -m`, which puts the directory on the path itself)."""
    (tmp_path / "nextdoor.py").write_text("def fn(state, channel):\n    pass\n")
    script = Path(sys.executable).with_name("jobman")
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run(
        [str(script), "sqlschedule", f"sqlite:///{tmp_path / 'j.db'}?table=t", "nextdoor:fn", "x={{1,2}}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "added 2 jobs" in proc.stdout
    proc = subprocess.run(
        [str(script), "sqlschedule", f"sqlite:///{tmp_path / 'j.db'}?table=t", "elsewhere:fn"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode != 0 and "cannot import module 'elsewhere'" in proc.stderr


def test_bad_parameters_are_refused_naming_them_and_nothing_is_written(db_url, tmp_path):
    import numpy as np

    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")

    def f(**kw):
        return {"seen": kw}

    for params, named in [
        ({"a": 1, "obj": object()}, "'obj'"),
        ({"s": {1, 2}}, "'s'"),
        ({"x": float("nan")}, "'x'"),
        ({"arr": np.zeros(3)}, "arr.tolist()"),
        ({"nested": {"k": [1, object()]}}, "'nested.k[1]'"),
    ]:
        with pytest.raises(UsageError) as info:
            exp.map(f, [{"ok": 1}, params])
        assert named in str(info.value)
    with pytest.raises(jobman.errors.NoSuchExperiment):  # not even the experiment was made
        exp.results(as_frame=False)
    # NumPy scalars become numbers, and name the same call as the plain number.
    assert exp.call(f, n=np.int64(3), r=np.float32(0.5)).result() == {"seen": {"n": 3, "r": 0.5}}
    assert exp.call(f, n=3, r=0.5).job_id == exp.call(f, n=np.int32(3), r=0.5).job_id
    exp.close()


def test_errors_a_user_meets_are_jobman_errors(db_url, tmp_path):
    with pytest.raises(UsageError, match="not a database URL"):
        jobman.Experiment("nowhere", backend=None)
    with pytest.raises(UsageError, match="backend"):
        jobman.Experiment(db_url, backend="cloud")
    exp = jobman.Experiment(db_url, backend=None, exproot=tmp_path / "runs")
    with pytest.raises(jobman.errors.UsageError, match="cannot import module"):
        exp.call("no_such_module_here:fn", x=1)
    future = exp.call("jobman.models.mlp:train", dataset="digits", epochs=1)
    assert exp.call("jobman.models.mlp.train", dataset="digits", epochs=1) is future  # one call, two spellings
    with pytest.raises(CallTimeout, match=f"job {future.job_id} .* did not finish within 0.2 s"):
        future.result(timeout=0.2)
    assert isinstance(CallTimeout(), TimeoutError)
    assert future.cancel()
    store = Store.open(db_url)
    try:
        assert store.job(future.job_id).status is Status.CANCELED
    finally:
        store.dispose()
    again = exp.call("jobman.models.mlp:train", dataset="digits", epochs=1)
    with pytest.raises(JobNotRun, match="was cancelled"):
        again.result(timeout=10)
    exp.close()


def test_schedule_takes_the_sweep_grammar_with_phases_and_best_is_the_reports_choice(db_url, tmp_path, monkeypatch):
    (tmp_path / "phased.py").write_text(
        textwrap.dedent("""
        def first(state, channel):
            state.base = state.a * 10

        def second(state, channel):
            state.err = abs(channel.parents[0].results["base"] - state.b) + state.fold * 0.5
    """)
    )
    monkeypatch.chdir(tmp_path)  # phased.py is importable from the current directory, as with python -m
    exp = jobman.Experiment(db_url, backend="local", workers=2, exproot=tmp_path / "runs")
    futures = exp.schedule("phased:first a={{1,2}} -- phased:second b={{10,19}} fold={{0,1}}")
    assert len(futures) == 2 + 8
    results = [f.result(timeout=120) for f in futures]
    assert [r["base"] for r in results[:2]] == [10, 20]
    best = exp.best("err", phase=1)
    assert best.params == {"a": 1, "b": 10} and best.n == 2 and best.mean == 0.25
    rows = exp.results(as_frame=False, phase=1)
    assert len(rows) == 8 and {r["status"] for r in rows} == {"DONE"}
    assert exp.schedule("phased:first a={{1,2}}") and exp.results(as_frame=False, phase=0)[0]["results_base"] == 10
    with pytest.raises(jobman.errors.SweepError):
        exp.schedule("phased:first a={{1,2")
    exp.close()


def test_results_is_a_dataframe_when_pandas_is_installed(db_url, tmp_path):
    import pandas

    def double(x):
        return {"y": 2 * x}

    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")
    assert [f.result(timeout=60) for f in exp.map(double, jobman.grid(x=[1, 2, 3]))] == [{"y": 2}, {"y": 4}, {"y": 6}]
    frame = exp.results()
    assert isinstance(frame, pandas.DataFrame)
    rows = sorted(zip(frame["params_x"], frame["results_y"], frame["status"]))
    assert rows == [(1, 2, "DONE"), (2, 4, "DONE"), (3, 6, "DONE")]
    assert exp.results(as_frame=False) == frame.to_dict("records")
    exp.close()


def test_grid_is_the_sweep_expansion():
    from jobman.jobdb.sweep import expand, parse_sweep

    from_sweep = [s.params for s in expand(parse_sweep(["m:f", "lr={{0.1,0.01}}", "nhid={{64,256}}", "e=3"]))]
    assert jobman.grid(lr=[0.1, 0.01], nhid=(64, 256), e=3) == from_sweep
    with pytest.raises(UsageError, match="empty"):
        jobman.grid(lr=[])


def test_the_default_experiment_is_jobman_db(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'default.db'}?table=dflt"
    monkeypatch.setenv("JOBMAN_DB", url)
    monkeypatch.setenv("JOBMAN_EXPROOT", str(tmp_path / "runs"))
    from jobman.dispatch import futures

    futures._DEFAULT.clear()
    try:
        assert jobman.map("jobman.models.mlp:train", []) == []
        exp = futures.default_experiment()
        assert exp.name == "dflt" and exp.backend == "local"
        assert exp.store.target.sqlite_path == str(tmp_path / "default.db")
    finally:
        for exp in futures._DEFAULT.values():
            exp.close()
        futures._DEFAULT.clear()


@pytest.mark.slurm
@pytest.mark.slow
def test_map_on_slurm_workers_runs_a_main_function(slurm_cluster, pg_database, tmp_path):
    import re
    import shutil
    import uuid

    name = f"pyslurm_{uuid.uuid4().hex[:8]}"
    url = f"{pg_database}?table={name}"
    try:
        proc = run_script(
            tmp_path,
            """
            exp = jobman.Experiment(URL, backend="slurm", workers=2, exproot="runs")
            futures = exp.map(train, jobman.grid(lr=[0.1, 0.2], nhid=[10]))
            out = [f.result(timeout=150) for f in futures]
            exp.close()
            print(json.dumps(out))
        """,
            url,
            timeout=240,
        )
        out = last_json(proc)
        assert [r["valid_error"] for r in out] == [1.0, 2.0]
        store = Store.open(url)
        try:
            jobs = store.jobs()
            assert [j.status for j in jobs] == [Status.DONE] * 2
            for job in jobs:
                assert job.backend == "slurm" and re.fullmatch(r"\d+_\d+", job.backend_id), job.backend_id
        finally:
            store.dispose()
    finally:
        if shutil.which("scancel"):  # nothing of this test may go on running
            subprocess.run(["scancel", f"--name=jobman-{name}"], capture_output=True)

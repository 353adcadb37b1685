"""The original jobman's documentation, followed as written: its Python scheduling API, its URL
form, nested state, ``sqlview`` and the tutorial's query, on both engines."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import experiment_module, run_jobman
from test_migrations import fresh_url  # noqa: F401 - a fixture

from jobman.jobdb.errors import UsageError
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec
from jobman.jobdb.url import parse_db

REPO = Path(__file__).resolve().parents[1]

# The documentation's insertion script, word for word but for where the database is.
INSERT_SCRIPT = textwrap.dedent("""\
    import os
    from jobman.tools import DD, flatten
    from jobman import sql
    from jobman.examples.def_addition import addition_example

    TABLE_NAME='test_add_'

    # DB path...
    db = sql.db(os.environ['TUTORIAL_DB'] + '/' + TABLE_NAME)

    state = DD()
    for first in 0,2,4,6,8,10:
        state.first = first
        for second in 1,3,5,7,9:
            state.second = second

            sql.insert_job(addition_example, flatten(state), db)
    """)

VIEW_SCRIPT = textwrap.dedent("""\
    import os
    from jobman import sql
    TABLE_NAME='test_add_'
    db = sql.db(os.environ['TUTORIAL_DB'] + '/' + TABLE_NAME)
    db.createView(TABLE_NAME + 'view')
    """)

DOC_QUERY = (
    "SELECT id, jobman_status AS status, jobman_sql_priority AS priority, first, second, result "
    "FROM test_add_view WHERE first > 4 AND second < 7 AND jobman_status = 2 ORDER BY result"
)
# The documentation's nine rows: (id, status, priority, first, second, result).
DOC_ROWS = [
    (16, 2, 1, 6, 1, 7),
    (21, 2, 1, 8, 1, 9),
    (17, 2, 1, 6, 3, 9),
    (22, 2, 1, 8, 3, 11),
    (18, 2, 1, 6, 5, 11),
    (26, 2, 1, 10, 1, 11),
    (27, 2, 1, 10, 3, 13),
    (23, 2, 1, 8, 5, 13),
    (28, 2, 1, 10, 5, 15),
]


@pytest.fixture
def fresh_db(fresh_url):  # noqa: F811
    """A database with nothing in it (views are per database), in the original form: no table, and
    postgres:// for PostgreSQL."""
    return fresh_url.replace("postgresql://", "postgres://", 1)


def query(url: str, sql: str) -> list[tuple]:
    engine = sa.create_engine(parse_db(url).sqlalchemy_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql))]
    finally:
        engine.dispose()


def run_script(path: Path, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(path)], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def one_sentence(r) -> str:
    assert r.code != 0
    assert "Traceback" not in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1, r.err
    return r.err


def test_the_tutorial_end_to_end(fresh_db, tmp_path, jobman):
    (tmp_path / "insert_addition.py").write_text(INSERT_SCRIPT)
    (tmp_path / "createview_addition.py").write_text(VIEW_SCRIPT)
    env = {"TUTORIAL_DB": fresh_db}
    url = f"{fresh_db}/test_add_"
    for _ in range(2):  # the second run adds nothing
        r = run_script(tmp_path / "insert_addition.py", env, tmp_path)
        assert r.returncode == 0, r.stderr
        assert query(fresh_db, "SELECT count(*) FROM job") == [(30,)]
    # The view before any job ran: no result column yet, every job START (0) at priority 1.
    r = run_script(tmp_path / "createview_addition.py", env, tmp_path)
    assert r.returncode == 0, r.stderr
    rows = query(
        fresh_db,
        "SELECT id, jobman_status AS status, jobman_sql_priority AS priority, first, second "
        "FROM test_add_view ORDER BY id",
    )
    assert [tuple(int(x) for x in row) for row in rows] == [
        (i + 1, 0, 1, first, second)
        for i, (first, second) in enumerate((f, s) for f in (0, 2, 4, 6, 8, 10) for s in (1, 3, 5, 7, 9))
    ]
    with pytest.raises(sa.exc.DBAPIError):
        query(fresh_db, "SELECT result FROM test_add_view")
    r = jobman("sql", "-n0", url, ".", cwd=tmp_path)
    assert r.code == 0, r.err
    # Recreated, the view has the results, and the doc's query gives the doc's rows.
    assert run_script(tmp_path / "createview_addition.py", env, tmp_path).returncode == 0
    got = [tuple(int(x) for x in row) for row in query(fresh_db, DOC_QUERY)]
    assert sorted(got, key=lambda r: (r[5], r[0])) == sorted(DOC_ROWS, key=lambda r: (r[5], r[0]))
    assert [r[5] for r in got] == sorted(r[5] for r in got)
    hosts = query(fresh_db, "SELECT DISTINCT jobman_sql_hostname, jobman_experiment FROM test_add_view")
    assert hosts == [(os.uname().nodename, "jobman.examples.def_addition.addition_example")]
    workdir = query(fresh_db, "SELECT jobman_sql_hostworkdir FROM test_add_view WHERE id = 1")[0][0]
    assert (Path(workdir) / "stdout.txt").read_text().splitlines() == [
        "state.first = 0",
        "state.second = 1",
        "result = 1",
    ]
    # The command-line form of the same view, and its -d.
    r = jobman("sqlview", url, "cli_view")
    assert r.code == 0, r.err
    assert "first, result, second" in r.out
    assert query(fresh_db, "SELECT count(*) FROM cli_view WHERE result IS NOT NULL") == [(30,)]
    assert jobman("sqlview", url, "cli_view", "-d").code == 0
    with pytest.raises(sa.exc.DBAPIError):
        query(fresh_db, "SELECT * FROM cli_view")
    err = one_sentence(jobman("sqlview", url, "cli_view", "-d"))
    assert "no view named 'cli_view'" in err
    for bad, says in (("job", "jobman's own tables"), ("x; DROP TABLE job", "plain SQL name")):
        assert says in one_sentence(jobman("sqlview", url, bad))
    assert query(fresh_db, "SELECT count(*) FROM job") == [(30,)]


@pytest.mark.slow
def test_the_tutorial_runs_from_a_non_editable_install(tmp_path):
    wheel_dir, site = tmp_path / "wheel", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(REPO)],
        check=True,
        capture_output=True,
    )
    wheel = next(wheel_dir.glob("jobman_sql-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    work = tmp_path / "work"
    work.mkdir()
    (work / "insert_addition.py").write_text(INSERT_SCRIPT)
    db = f"sqlite:///{work / 'add.db'}"
    env = {"PYTHONPATH": str(site), "TUTORIAL_DB": db}
    r = run_script(work / "insert_addition.py", env, work)
    assert r.returncode == 0, r.stderr
    r = run_jobman("sql", "-n0", f"{db}/test_add_", ".", cwd=work, env=env)
    assert r.code == 0, r.err
    where = subprocess.run(
        [sys.executable, "-c", "import jobman.examples.def_addition as m; print(m.__file__)"],
        cwd=work,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(site)), where.stdout
    assert query(db, "SELECT count(*) FROM job WHERE status = 'DONE'") == [(30,)]
    # The other examples ship too: the MLP tutorial's files, copied out, and make2's test.conf.
    r = subprocess.run(
        [sys.executable, "-m", "jobman.examples", "."],
        cwd=work,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and (work / "mlp_jobman.conf").read_text().startswith("learning_rate=0.01"), r.stderr
    r = run_jobman("cmdline", "jobman.examples.def_make2.experiment", "test.conf", "-n", cwd=work, env=env)
    assert r.code == 0 and r.out.startswith("it's a me, luigi!"), r.out + r.err
    mlp = f"{db}/mlp_dumi"
    assert run_jobman("sqlschedule", mlp, "mlp_jobman.experiment", "mlp_jobman.conf", cwd=work, env=env).code == 0
    assert run_jobman("sql", mlp, ".", cwd=work, env=env).code == 0
    assert query(db, "SELECT count(*) FROM job WHERE status = 'DONE'") == [(31,)]


def test_the_original_url_form():
    pg = parse_db("postgres://me:secret@dbhost:5433/lab/test_add_")
    assert (pg.sqlalchemy_url, pg.experiment) == ("postgresql+psycopg://me:secret@dbhost:5433/lab", "test_add_")
    assert "secret" not in pg.display
    assert parse_db("postgres://me@dbhost/lab").experiment == "default"
    assert parse_db("postgres://me@dbhost/lab/t1?table=t2").experiment == "t2"  # ?table= wins
    assert parse_db("postgres://me@dbhost/lab/t1", table="t3").experiment == "t3"  # --table wins
    lite = parse_db("sqlite:////tmp/x/sweeps.db/mlp")
    assert (lite.sqlite_path, lite.experiment) == ("/tmp/x/sweeps.db", "mlp")
    assert parse_db("sqlite:////tmp/x/sweeps.db").experiment == "default"
    assert parse_db("sqlite:///runs/jobs.db?table=a").experiment == "a"
    with pytest.raises(UsageError, match="experiment name"):
        parse_db("postgres://me@dbhost/lab/bad name!")


def test_tools_flatten_and_expand_round_trip():
    from jobman import DD, expand, flatten

    state = DD()
    state.hyper = DD(lr=0.1, layers=DD(n=2))
    state.name = "mlp"
    flat = flatten(state)
    assert flat == {"hyper.lr": 0.1, "hyper.layers.n": 2, "name": "mlp"}
    back = expand(flat)
    assert back == state and back.hyper.layers.n == 2 and isinstance(back.hyper, DD)
    assert flatten({"a": 1}) == {"a": 1} and expand({"a": 1}) == {"a": 1}
    with pytest.raises(UsageError, match="both a value and a group"):
        expand({"a": 1, "a.b": 2})


NESTED = textwrap.dedent("""
    def nested(state, channel):
        assert channel() is None and channel.switch() is None
        state.score = state.hyper.lr * state.hyper.nhid
        state.hyper.seen = True
        state.seen = dict(id=state.jobman.id, experiment=state.jobman.experiment, status=state.jobman.status,
                          host=state.jobman.sql.host_name, workdir=state.jobman.sql.host_workdir,
                          lr_type=type(state.hyper).__name__)
        return channel.COMPLETE
    """)


@pytest.fixture
def nested_module(tmp_path):
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "jm_nested_exp.py").write_text(NESTED)
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)}


def test_nested_state_through_dispatch_and_report(db_url, tmp_path, nested_module, jobman):
    r = jobman("sqlschedule", db_url, "jm_nested_exp.nested", "hyper.lr=0.1", "hyper.nhid={{10,20}}", env=nested_module)
    assert r.code == 0, r.err
    r = jobman(
        "dispatch",
        db_url,
        "-j",
        "2",
        "--exproot",
        str(tmp_path / "runs"),
        "--no-progress",
        env=nested_module,
        cwd=tmp_path,
    )
    assert r.code == 0, r.err + r.out
    store = Store.open(db_url)
    try:
        jobs = store.jobs()
        assert [j.status.value for j in jobs] == ["DONE", "DONE"]
        for j in jobs:
            assert j.params == {"hyper.lr": 0.1, "hyper.nhid": j.params["hyper.nhid"]}
            assert j.results["score"] == pytest.approx(0.1 * j.params["hyper.nhid"])
            seen = j.results["seen"]  # a dict the job wrote, outside any group of parameters: kept whole
            assert seen["id"] == j.id and seen["status"] == 1 and seen["experiment"] == "jm_nested_exp.nested"
            assert seen["host"] == os.uname().nodename and seen["workdir"] == j.workdir
            assert seen["lr_type"] == "DD" and j.results["hyper.seen"] is True  # inside the group: by its path
            assert not any(k.startswith("jobman") for k in {**j.params, **j.results})
        # The nested spelling of the same parameters is the same job; so is the sweep again.
        spec = JobSpec(0, "fn", "jm_nested_exp.nested", {"hyper": {"lr": 0.1, "nhid": 10}}, None)
        assert store.schedule([spec]).added == 0
    finally:
        store.dispose()
    r = jobman("sqlschedule", db_url, "jm_nested_exp.nested", "hyper.lr=0.1", "hyper.nhid={{10,20}}", env=nested_module)
    assert "nothing added" in r.out, r.out
    r = jobman("report", db_url, "--metric", "score", "--max", "--where", "hyper.nhid>10", "--format", "json")
    assert r.code == 0, r.err
    rows = json.loads(r.out)["rows"] if isinstance(json.loads(r.out), dict) else json.loads(r.out)
    assert len(rows) == 1 and "hyper.nhid" in json.dumps(rows[0]), rows
    r = jobman("list", db_url)
    assert "hyper.nhid=20" in r.out, r.out


def test_plain_parameters_keep_their_identity(store):
    """Rows stored before nesting existed (plain names) are found again: their hash is unchanged."""
    params = {"lr": 0.1, "nhid": 64, "name": "mlp"}
    encoded = json.dumps(params, sort_keys=True, allow_nan=False)
    old_hash = hashlib.sha256(f"0\x1ffn\x1fpkg.mod:train\x1f{encoded}".encode()).hexdigest()
    job_id = store.schedule([JobSpec(0, "fn", "pkg.mod:train", params, None)]).job_ids[0]
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT params_hash FROM job WHERE id = :i"), {"i": job_id}).scalar() == old_hash


def test_python_api_identity_force_dup_and_bad_input(db_url):
    from jobman import sql
    from jobman.examples.def_addition import addition_example

    db = sql.db(db_url)
    try:
        first = sql.insert_job(addition_example, {"first": 1, "second": 2}, db)
        assert isinstance(first, int)
        assert sql.insert_job(addition_example, {"second": 2, "first": 1}, db) is None
        again = sql.insert_job(addition_example, {"first": 1, "second": 2}, db, force_dup=True)
        assert again not in (None, first)
        prio = sql.insert_dict(
            {"jobman.experiment": "jobman.examples.def_addition.addition_example", "first": 5, "second": 5},
            db,
            priority=3,
        )
        jobs = {j.id: j for j in db.store.jobs()}
        assert jobs[again].params == jobs[first].params and jobs[prio].priority == 3
        assert sql.hash_state({"a": {"b": 1}}) == sql.hash_state({"a.b": 1}) != sql.hash_state({"a.b": 2})
        with pytest.raises(UsageError, match="jobman.experiment"):
            sql.insert_dict({"first": 1}, db)
        with pytest.raises(UsageError, match="both a value and a group"):
            sql.insert_job(addition_example, {"a": 1, "a.b": 2}, db)
        assert len(db.store.jobs()) == 3  # nothing written by the refusals
    finally:
        db.close()


def test_channel_switch_answers_as_the_original(tmp_path):
    from jobman.dispatch.channel import DirectChannel
    from jobman.tools import DD

    ch = DirectChannel(job_id=None, phase=0, attempt=1, workdir=tmp_path, params={}, save_every=0.0)
    assert ch.switch() == "save" and ch() in ("save", None)
    ch.save_every = None
    assert ch() is None
    ch.request_stop("received SIGTERM")
    assert ch.switch() == "stop" and ch.should_stop()
    late = DirectChannel(job_id=None, phase=0, attempt=1, workdir=tmp_path, params={}, deadline=0.0)
    assert late.switch() == "finish-up"
    state = DD(n=3)
    late.bind(state)
    assert late.save_and_switch() == "finish-up" and late.saved_results() == {"n": 3}


def test_jobman_help(jobman):
    r = jobman("help")
    assert r.code == 0 and "sqlview" in r.out
    r = jobman("help", "sqlschedule")
    assert r.code == 0 and "Usage: jobman sqlschedule" in r.out
    assert "no command or topic named 'nope'" in one_sentence(jobman("help", "nope"))
    for topic, says in (
        ("parameters", "key::pkg.mod.Builder"),
        ("experiment", "def my_experiment(state, channel)"),
        ("example", "jobman sql -n0"),
    ):
        r = jobman("help", topic)
        assert r.code == 0 and says in r.out, r.out


COUNTER = textwrap.dedent("""
    import time

    def counts(state, channel):
        state.runs = state.get("runs", 0) + 1
        answers = []
        deadline = time.time() + 30
        while "save" not in answers and time.time() < deadline:
            answers.append(channel.switch())
            time.sleep(0.05)
        state.answers = sorted({a for a in answers if a})
        return channel.COMPLETE
    """)


def test_original_options_kept_or_explained(tmp_path, jobman):
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "jm_counter_exp.py").write_text(COUNTER)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)}
    url = f"sqlite:///{tmp_path / 'opts.db'}/t"
    # sqlschedule: -p is explained, -r repeats, -f forces copies, a fractional priority is kept.
    r = jobman("sqlschedule", url, "jm_counter_exp.counts", "x={{1,2}}", "-r", "2", "-p", "filemerge", env=env)
    assert r.code == 0 and "added 4 jobs" in r.out, r.out + r.err
    r = jobman("sqlschedule", url, "jm_counter_exp.counts", "x={{1,2}}", "-r", "2", "-p", "mine", env=env)
    assert "nothing added" in r.out and "not repeated (use -f" in r.err and "--parser mine is not used" in r.err
    r = jobman("sqlschedules", url, "jm_counter_exp.counts", "x=1", "-f", "--priority", "2.5", env=env)
    assert r.code == 0 and "added 1 jobs" in r.out, r.out + r.err
    r = jobman("sqlstatus", url, "--select", "x=1", "--print", "x", "--ret_nb_jobs")
    assert r.out.strip() == "3", r.out
    # sql: -w is the exproot, --save-every reaches channel.switch(), an ssh:// exproot is explained.
    assert "ssh" in one_sentence(jobman("sql", url, "ssh://host:/runs", env=env))
    r = jobman(
        "sql", "-n", "1", url, "-w", str(tmp_path / "runs"), "--save-every", "0.2", "--finish-up-after", "60", env=env
    )
    assert r.code == 0, r.err
    r = jobman("sqlstatus", url, "--status", "DONE", "--print", "answers", "--print", "runs")
    assert r.out.splitlines() == ['Job 5: status 2 (DONE) phase 0 answers=["save"] runs=1'], r.out
    assert (tmp_path / "runs" / "t" / "5").is_dir()
    # sqlstatus --restart hands the job back what it saved; reset starts it afresh.
    r = jobman("sqlstatus", url, "5", "--restart")
    assert "1 job(s) set to QUEUED (0)" in r.out, r.out
    assert jobman("sql", "-n", "1", url, "-w", str(tmp_path / "runs"), "--save-every", "0", env=env).code == 0
    assert "runs=2" in jobman("sqlstatus", url, "5", "--print", "runs").out
    assert jobman("reset", url, "5", "--yes").code == 0
    assert jobman("sql", "-n", "1", url, "-w", str(tmp_path / "runs"), "--save-every", "0", env=env).code == 0
    assert "runs=1" in jobman("sqlstatus", url, "5", "--print", "runs").out
    assert "1 job(s) back to priority 0" in jobman("sqlstatus", url, "5", "--reset_prio").out
    store = Store.open(url)
    try:
        assert {j.id: j.priority for j in store.jobs()} == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0}
    finally:
        store.dispose()
    # The selection options, and what they refuse.
    r = jobman("sqlstatus", url, "--all", "--fselect", "x=lambda v: v > 1", "--status", "START")
    assert [line.split(":")[0] for line in r.out.splitlines()] == ["Job 2", "Job 4"], r.out
    assert jobman("sqlstatus", url, "--print-keys").out.split() == ["answers", "runs", "x"]
    assert jobman("sqlstatus", url, "--status", "ERR_START").out.strip() == "no job matches"
    assert "write KEY=LAMBDA" in one_sentence(jobman("sqlstatus", url, "--fselect", "lambda v: v"))
    assert "SyntaxError" in one_sentence(jobman("sqlstatus", url, "--fselect", "x=lambda v v"))
    assert "--restart is --set_status START" in one_sentence(
        jobman("sqlstatus", url, "1", "--restart", "--set_status", "DONE")
    )


MAIN_SCRIPT = textwrap.dedent("""\
    import os, sys
    from jobman import sql

    def adder(state, channel):
        state.total = state.first + state.second
        return channel.COMPLETE

    db = sql.db(os.environ['TUTORIAL_DB'])
    print(sql.insert_job(adder, {'first': 2, 'second': 5}, db))
    print(sql.insert_job(adder, {'first': 2, 'second': 5}, db))
    """)


def test_insert_job_stores_a_scripts_own_function_by_value(db_url, tmp_path, jobman):
    (tmp_path / "insert_main.py").write_text(MAIN_SCRIPT)
    r = run_script(tmp_path / "insert_main.py", {"TUTORIAL_DB": db_url}, tmp_path)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.split()
    assert first.isdigit() and second == "None"  # the second insertion adds nothing
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = jobman("sql", "-n0", db_url, ".", cwd=elsewhere)
    assert r.code == 0, r.err
    store = Store.open(db_url)
    try:
        (job,) = store.jobs()
        assert (job.status.name, job.target.partition("#")[0], job.results) == ("DONE", "__main__:adder", {"total": 7})
    finally:
        store.dispose()


SAME_NAMES_SCRIPT = textwrap.dedent("""\
    import os
    from jobman import sql

    def offset(by):
        def add(state, channel):
            state.total = state.first + by
            return channel.COMPLETE
        return add

    def times(k):
        return lambda state, channel: (setattr(state, "total", state.first * k), channel.COMPLETE)[1]

    db = sql.db(os.environ['TUTORIAL_DB'])
    for fn in (offset(1), offset(100), times(2), times(3), offset(1)):
        print(sql.insert_job(fn, {'first': 5}, db))
    """)


def test_insert_job_keeps_the_code_of_each_function_of_one_name(db_url, tmp_path, jobman):
    """Two functions of one factory, two lambdas: one name each, ``__main__:offset.<locals>.add``
    and ``__main__:times.<locals>.<lambda>``; each job runs its own code, the same code is one job."""
    (tmp_path / "same_names.py").write_text(SAME_NAMES_SCRIPT)
    r = run_script(tmp_path / "same_names.py", {"TUTORIAL_DB": db_url}, tmp_path)
    assert r.returncode == 0, r.stderr
    ids = r.stdout.split()
    assert all(i.isdigit() for i in ids[:4]) and len(set(ids[:4])) == 4 and ids[4] == "None"
    r = run_script(tmp_path / "same_names.py", {"TUTORIAL_DB": db_url}, tmp_path)
    assert r.stdout.split() == ["None"] * 5, r.stderr  # a re-run of the script finds its jobs again
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = jobman("sql", "-n0", db_url, ".", cwd=elsewhere)
    assert r.code == 0, r.err
    store = Store.open(db_url)
    try:
        jobs = sorted(store.jobs(), key=lambda j: j.id)
        assert [(j.status.name, j.results["total"]) for j in jobs] == [
            ("DONE", 6),
            ("DONE", 105),
            ("DONE", 10),
            ("DONE", 15),
        ]
        assert [j.target.partition("#")[0] for j in jobs] == ["__main__:offset.<locals>.add"] * 2 + [
            "__main__:times.<locals>.<lambda>"
        ] * 2
    finally:
        store.dispose()


def test_a_function_stored_by_value_before_its_code_had_a_digest_still_runs(db_url, tmp_path, jobman):
    """A database made before targets carried a digest: its job ``__main__:adder`` and the code stored
    under that plain name run as they did."""
    import cloudpickle

    namespace = {"__name__": "__main__"}
    exec("def adder(state, channel):\n    state.total = state.first + 1\n    return channel.COMPLETE\n", namespace)
    store = Store.open(db_url)
    try:
        store.put_function("__main__:adder", cloudpickle.dumps(namespace["adder"]))
        store.schedule([JobSpec(0, "fn", "__main__:adder", {"first": 4}, None)])
    finally:
        store.dispose()
    r = jobman("sql", "-n0", db_url, ".", cwd=tmp_path)
    assert r.code == 0, r.err
    store = Store.open(db_url)
    try:
        (job,) = store.jobs()
        assert (job.status.name, job.target, job.results) == ("DONE", "__main__:adder", {"total": 5})
    finally:
        store.dispose()


NUL_MODULE = textwrap.dedent("""
    def nul_result(state, channel):
        state.fine = 1
        channel.save()
        state.text = "a\\x00b"
        return channel.COMPLETE

    def nul_save(state, channel):
        state.text = "a\\x00b"
        try:
            channel.save()
        except Exception as exc:
            state.save_refused = str(exc)
            del state["text"]
        return channel.COMPLETE

    def nul_error(state, channel):
        raise ValueError("bad\\x00byte")
    """)


def test_nul_is_refused_alike_on_both_engines(db_url, tmp_path, jobman):
    """PostgreSQL cannot hold a NUL character: on every engine a parameter with one is refused before
    anything is written, and a job's result with one ends the job FAILED once, saying why."""
    from jobman import sql
    from jobman.examples.def_addition import addition_example
    from jobman.jobdb.sweep import expand, parse_sweep

    store = Store.open(db_url)
    db = sql.db(db_url)
    try:
        with pytest.raises(UsageError, match=r"'first' contains a NUL character \(\\x00\)"):
            sql.insert_job(addition_example, {"first": "a\x00b", "second": 1}, db)
        with pytest.raises(UsageError, match=r"'a\\x00' contains a NUL"):
            sql.insert_dict({"jobman.experiment": "m.f", "a\x00": 1}, db)
        specs = expand(parse_sweep(["m:f", "k={{1,2}}"]))
        specs = [specs[0], specs[1]._replace(params={"k": "x\x00"}, params_json='{"k": "x\\u0000"}')]
        with pytest.raises(UsageError, match="'k' contains a NUL"):
            store.schedule(specs)
        from jobman import Experiment

        with Experiment(db_url, backend="inline", exproot=tmp_path / "runs") as exp:
            with pytest.raises(UsageError, match="'first' contains a NUL"):
                exp.call(addition_example, first="\x00", second=1)
        name = parse_db(db_url).experiment
        assert query(db_url, f"SELECT count(*) FROM experiment WHERE name = '{name}'") == [(0,)]  # nothing written
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path / "mods"), os.environ.get("PYTHONPATH")) if p)}
        (tmp_path / "mods").mkdir()
        (tmp_path / "mods" / "jm_nul_exp.py").write_text(NUL_MODULE)
        for name in ("nul_result", "nul_save", "nul_error"):
            assert jobman("sqlschedule", db_url, f"jm_nul_exp.{name}", "x=1", env=env).code == 0
        r = jobman("sql", "-n0", db_url, str(tmp_path / "runs"), env=env, timeout=120)
        assert r.code == 1 and "worker ran 3 job(s): 1 DONE, 2 FAILED" in r.err, r.err
        jobs = {j.target.rpartition(":")[2]: j for j in store.jobs()}
        bad = jobs["nul_result"]
        assert (bad.status.name, bad.attempt, bad.results) == ("FAILED", 1, {"fine": 1})
        assert "'text' contains a NUL character (\\x00), which jobman does not store" in bad.error
        saved = jobs["nul_save"]
        assert saved.status.name == "DONE" and "NUL character" in saved.results["save_refused"]
        assert jobs["nul_error"].status.name == "FAILED" and "bad\\x00byte" in jobs["nul_error"].error
        assert [e.to_status for e in store.events(bad.id)].count("FAILED") == 1
    finally:
        db.close()
        store.dispose()


DOTS_MODULE = textwrap.dedent("""
    def dotted(state, channel):
        if "a.b" not in state:
            state["a.b"] = 1
            state.c = {"x.y": 2}
            state.hyper.best = 3
            channel.save()
            return channel.INCOMPLETE
        state.seen = sorted(k for k in state if k != "jobman")
        state.inner = sorted(state.c)
        state.best = state.hyper.best
        return channel.COMPLETE
    """)


def test_dotted_result_names_come_back_as_written(db_url, tmp_path, jobman):
    env = {"PYTHONPATH": experiment_module(tmp_path, "jm_dots_exp", DOTS_MODULE)}
    assert jobman("sqlschedule", db_url, "jm_dots_exp.dotted", "hyper.lr=0.1", env=env).code == 0
    r = jobman("sql", "-n0", db_url, str(tmp_path / "runs"), env=env, timeout=120)
    assert r.code == 0, r.err
    store = Store.open(db_url)
    try:
        (job,) = store.jobs()
        assert job.status.name == "DONE", job.error
        assert job.results["seen"] == ["a.b", "c", "hyper"]
        assert (job.results["inner"], job.results["best"]) == (["x.y"], 3)
        assert (job.results["a.b"], job.results["c"], job.results["hyper.best"]) == (1, {"x.y": 2}, 3)
    finally:
        store.dispose()

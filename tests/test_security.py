"""Security: parameters never reach a shell, passwords never leave the URL, SQL is only ever bound, and a
role confined to its own PostgreSQL schema can run an experiment there and nothing else.

Passwords are checked against a real password-checking server (the throwaway scram-sha-256 cluster of
tests/test_bad_input_more.py): the shared test server trusts every local connection, so a password given
to it is never really checked.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import textwrap
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
import sqlalchemy as sa
from conftest import run_jobman
from test_bad_input_more import password_server  # noqa: F401 - a fixture: a server that checks passwords
from test_cli_basics import one_sentence

from jobman.cli.main import main
from jobman.jobdb.nested import flatten
from jobman.jobdb.schema import VERSION_TABLE, metadata
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec
from jobman.jobdb.url import mask_password

MODULE = "jm_sec_exp"
EXPERIMENTS = textwrap.dedent('''
    """What the security tests run: functions that report what they were given and where they ran."""
    import os
    import sys


    def echo(state, channel):
        """Return the parameter exactly as received."""
        state.got = state.msg


    def _ppid_of(pid):
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rpartition(")")[2].split()[1])


    def where(state, channel):
        """Whether the command lines of the job's fork server and worker (readable by every user of
        the host) hold the password."""
        server = os.getppid()
        argv = ""
        for pid in (server, _ppid_of(server)):
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv += fh.read().decode(errors="replace")
        secrets = [s for s in os.environ.get("JM_SECRETS", "").split("\\n") if s]
        state.worker_argv_has_password = any(s in argv for s in secrets)
        state.worker_argv_names_database = "postgresql://" in argv
        with open(f"/proc/{_ppid_of(server)}/comm") as fh:
            state.worker_name = fh.read().strip()
        state.score = state.n / 10
        if state.n == 3:
            raise RuntimeError(f"job {channel.job_id} fails on purpose")
''')
ECHO_ARGV = textwrap.dedent("""
    import json, os, sys
    with open(os.environ["JOBMAN_RESULTS"], "w") as fh:
        json.dump({"argv": sys.argv[1:]}, fh)
""")


@pytest.fixture
def mods(tmp_path: Path) -> Path:
    d = tmp_path / "mods"
    d.mkdir()
    (d / f"{MODULE}.py").write_text(EXPERIMENTS)
    (d / "echo_argv.py").write_text(ECHO_ARGV)
    return d


def env_with(mods: Path, **extra: str) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(mods), os.environ.get("PYTHONPATH")) if p), **extra}


# -- parameters never reach a shell ----------------------------------------------------------------


def hostile_values(pwned: Path) -> list[str]:
    return [
        f"$(touch {pwned})",
        f"`touch {pwned}`",
        f"; touch {pwned}",
        "; rm -rf ~",
        f"a && touch {pwned} #",
        f"| touch {pwned}",
        f"' ; touch {pwned} ; '",
        f'" ; touch {pwned} ; "',
        f"\n touch {pwned}",
        "{msg} $HOME * ~",
        "$(rm -rf ~)",
    ]


def test_parameter_values_stay_inert_in_function_and_command_jobs(tmp_path, mods):
    url = f"sqlite:///{tmp_path / 'sec.db'}?table=shell"
    pwned = Path(f"/tmp/pwned-{uuid.uuid4().hex}")
    home = tmp_path / "home"  # a shell that got "; rm -rf ~" would empty this, not the real home
    home.mkdir()
    (home / "canary.txt").write_text("alive")
    values = hostile_values(pwned)
    grid = "msg={{" + ",".join(json.dumps(v) for v in values) + "}}"
    env = env_with(mods, HOME=str(home))
    program = shlex.join([sys.executable, str(mods / "echo_argv.py")])
    for extra in ([f"{MODULE}:echo"], ["--cmd", program], ["--cmd", f"{program} {{msg}}"]):
        r = run_jobman("sqlschedule", url, *extra, grid, env=env)
        assert r.code == 0 and f"added {len(values)} jobs" in r.out, r.err
    r = run_jobman("dispatch", url, "-j", "2", "--no-progress", "--exproot", str(tmp_path / "runs"), env=env)
    assert r.code == 0, r.err
    r = run_jobman(
        "cmdline", f"{MODULE}:echo", f"msg={json.dumps(values[0])}", "--workdir", str(tmp_path / "one"), env=env
    )
    assert r.code == 0 and json.loads(r.out)["results"]["got"] == values[0], r.err

    store = Store.open(url, create=False)
    try:
        jobs = store.jobs()
        assert len(jobs) == 3 * len(values) and {j.status for j in jobs} == {Status.DONE}, [
            (j.id, j.status, j.error) for j in jobs if j.status is not Status.DONE
        ]
        for j in jobs:
            msg = j.params["msg"]
            assert msg in values
            if j.kind == "fn":
                assert j.results["got"] == msg
            elif "{msg}" in j.target:
                assert j.results["argv"] == [msg]  # the placeholder is filled with the value, whole
            else:
                assert j.results["argv"] == ["--msg", msg]
    finally:
        store.dispose()
    assert not pwned.exists(), "a parameter value was run by a shell"
    assert (home / "canary.txt").read_text() == "alive"


# -- passwords stay masked ------------------------------------------------------------------------


def _table_text(url: str) -> str:
    """Every row of every jobman table, as text."""
    engine = sa.create_engine(url.split("?", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return "\n".join(repr(tuple(r)) for t in metadata.sorted_tables for r in conn.execute(sa.select(t)))
    finally:
        engine.dispose()


def _files_text(root: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(root.rglob("*")) if p.is_file())


def test_passwords_are_masked_in_every_output_log_error_and_event(password_server, tmp_path, mods):  # noqa: F811
    server = password_server
    role, database = f"jm_sec_{uuid.uuid4().hex[:8]}", f"jm_sec_{uuid.uuid4().hex[:8]}"
    secret = "Pa55:w@rd/" + uuid.uuid4().hex[:6]  # characters that URLs must escape
    server.admin(f"CREATE ROLE {role} LOGIN PASSWORD '{secret}'", f"CREATE DATABASE {database} OWNER {role}")
    url = server.url(role, secret, database) + "?table=mlp"
    wrong = server.url(role, "Wr0ng-" + secret, database) + "?table=mlp"
    unreachable = f"postgresql://{role}:{quote(secret, safe='')}@127.0.0.1:1/{database}?table=mlp"
    forms = [secret, quote(secret, safe=""), quote(secret)]
    runs = tmp_path / "runs"
    env = env_with(mods, JM_SECRETS="\n".join(forms))

    results = [
        run_jobman("sqlschedule", url, f"{MODULE}:where", "n={{1,2,3,4,5}}", env=env),
        run_jobman("worker", url, "--max-jobs", "1", "--exproot", str(runs), env=env),
        run_jobman("dispatch", url, "-j", "2", "--no-progress", "--exproot", str(runs), env=env),
    ]
    assert [r.code for r in results] == [0, 0, 1], [r.err for r in results]  # job 3 fails on purpose
    fine = (
        ["list", url],
        ["list", url, "--format", "json"],
        ["show", url, "3"],
        ["sqlstatus", url],
        ["report", url, "--metric", "score"],
        ["db", "experiments", url],
        ["db", "upgrade", url],
    )
    refused = (
        ["list", wrong],
        ["--debug", "list", wrong],
        ["sqlschedule", unreachable, "--no-check", "p.m:f", "a=1"],
        ["--debug", "worker", unreachable],
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        more = list(pool.map(lambda argv: run_jobman(*argv, env=env), [*fine, *refused]))
    for argv, r in zip([*fine, *refused], more):
        assert r.code == (0 if argv in fine else 1), (argv, r.err)
    results += more
    shown = "\n".join(r.out + r.err for r in results)
    assert f"{role}:***@" in shown

    store = Store.open(url, create=False)
    try:
        jobs = store.jobs()
        assert sorted((j.params["n"], j.status) for j in jobs) == [
            (1, Status.DONE),
            (2, Status.DONE),
            (3, Status.FAILED),
            (4, Status.DONE),
            (5, Status.DONE),
        ]
        plain = _plain_worker_pid(results[1])
        ran_by_dispatch = [j for j in jobs if j.status is Status.DONE and j.pid != plain]
        assert ran_by_dispatch, "dispatch ran some jobs"
        for j in ran_by_dispatch:
            # A worker forked by the dispatch's zygote carries the zygote's argv, which names no database;
            # one started as a fresh interpreter was given the URL, so the check reads the right process.
            forked = j.results["worker_name"] == "jobman-worker"
            assert forked or j.results["worker_argv_names_database"], "the worker was given the database URL"
            assert not j.results["worker_argv_has_password"], f"job {j.id}'s worker had the password on its argv"
    finally:
        store.dispose()

    everything = {"outputs": shown, "files under the exproot": _files_text(runs), "database rows": _table_text(url)}
    for where, text in everything.items():
        for form in forms:
            assert form not in text, f"the password ({form!r}) shows in the {where}"


def _plain_worker_pid(r) -> int:
    """The pid of the plain `jobman worker` run, from its log lines."""
    found = re.findall(r"^\[jobman worker (\d+)\]", r.err, re.M)
    return int(found[0]) if found else -1


def test_mask_password_masks_every_url_form():
    for text, masked in [
        ("postgresql://me:pw@host/db", "postgresql://me:***@host/db"),
        ("POSTGRES://me:pw@host/db", "POSTGRES://me:***@host/db"),
        ("x postgresql+psycopg://me:p%40ss%3Aw@h:5/db?table=t y", "x postgresql+psycopg://me:***@h:5/db?table=t y"),
        ("a postgres://u:1@h/a and postgres://v:2@h/b", "a postgres://u:***@h/a and postgres://v:***@h/b"),
        ("postgresql://me@host/db", "postgresql://me@host/db"),
        ("sqlite:////tmp/x.db?table=t", "sqlite:////tmp/x.db?table=t"),
        ("postgresql://:only-pw@host/db", "postgresql://:***@host/db"),
        ("postgresql://me:p@ss@host/db", "postgresql://me:***@host/db"),  # an unencoded '@'
        (
            "postgres://u:a@b@c@h:5/db?table=t and sqlite:///x@y.db",
            "postgres://u:***@h:5/db?table=t and sqlite:///x@y.db",
        ),
        ("postgresql://me:pa#ss@host/db", "postgresql://me:***@host/db"),  # a raw '#'
        ("postgresql://me:pa ss@host/db?table=t", "postgresql://me:***@host/db?table=t"),  # a raw space
        ("'postgresql://me:a@b#c d@host:5432/db'", "'postgresql://me:***@host:5432/db'"),
        ("postgresql://me@host/db?password=pw&table=t", "postgresql://me@host/db?password=***&table=t"),
        ("postgresql://me@host/db?table=t&password=p%23w%40x", "postgresql://me@host/db?table=t&password=***"),
        ("postgresql://me@host/db?PassWord=pw", "postgresql://me@host/db?PassWord=***"),
        ("postgresql://me@host/db?table=t%26password%3Dpw", "postgresql://me@host/db?table=t%26password%3D***"),
        ("postgresql://me:pw@host/db\nwrite to x@y.org", "postgresql://me:***@host/db\nwrite to x@y.org"),
    ]:
        assert mask_password(text) == masked, text


@pytest.mark.parametrize("spelling", ["query", "query-encoded", "raw-hash", "raw-space", "raw-at"])
def test_a_password_in_any_spelling_of_the_url_is_masked_in_output_errors_and_pages(pg_database, spelling):
    """Against the test server (which trusts its clients, so any password connects): the password
    never shows, whether the command works or fails on the URL."""
    secret = "Zq" + uuid.uuid4().hex[:10]
    base, name = pg_database.rsplit("/", 1)
    scheme, _, hostpart = base.partition("://")
    user, _, host = hostpart.rpartition("@")
    url = {
        "query": f"{pg_database}?password={secret}&table=masked",
        "query-encoded": f"{pg_database}?table=masked&password={secret}%23x%40y",
        "raw-hash": f"{scheme}://{user}:{secret}#x@{host}/{name}?table=masked",
        "raw-space": f"{scheme}://{user}:{secret} x@{host}/{name}?table=masked",
        "raw-at": f"{scheme}://{user}:{secret}@x@{host}/{name}?table=masked",
    }[spelling]
    shown = []
    for argv in (
        ["sqlschedule", url, "--no-check", "p.m:f", "a={{1,2}}"],
        ["list", url],
        ["sqlstatus", url],
        ["--debug", "list", url],
        ["db", "experiments", url],
    ):
        r = run_jobman(*argv)
        shown.append(r.out + r.err)
        assert "Traceback" not in r.err or argv[0] == "--debug", (argv, r.err)
    assert secret not in "\n".join(shown)
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from jobman.web.app import create_app

    try:
        app = create_app(url, token="t" * 20)
    except Exception as exc:  # noqa: BLE001 - refusing the URL is fine, as long as it says nothing secret
        assert secret not in str(exc)
        return
    client = TestClient(app, base_url="http://127.0.0.1:8787" + app.state.base)
    page = client.get("/", headers={"Authorization": "token " + "t" * 20})
    assert secret not in page.text


# -- SQL is only built with bound parameters -------------------------------------------------------

EVIL = [
    "'; DROP TABLE job; --",
    "Robert'); DROP TABLE experiment;--",
    'a"b\\c',
    "x' OR '1'='1",
    "%s %(x)s ? :name $1",
    "é✓\u202e\x01",
]


def _tables(store: Store) -> dict[str, int]:
    with store.engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
        return {
            t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar()
            for t in sorted(names)
            if t in {*metadata.tables, VERSION_TABLE}
        }


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "internal error" not in captured.err, captured.err
    return code, captured.out, captured.err


def test_sql_is_only_built_with_bound_parameters(store, db_url, capsys):
    # Through the Python API: keys, values, targets, results, metric names and reasons may hold anything.
    specs = [
        JobSpec(0, "fn", f"pkg.mod:f{i}{evil}", {evil: evil, "i": i, "nested": {evil: [evil]}}, None)
        for i, evil in enumerate(EVIL)
    ]
    ids = store.schedule(specs).job_ids
    for job_id, spec in zip(ids, specs):
        job = store.job(job_id)
        assert (job.target, job.params) == (spec.target, flatten(spec.params))  # stored flat, dotted
    for i, evil in enumerate(EVIL):
        assert store.select_ids(params={evil: evil}) == [ids[i]]
    claimed = store.claim(WorkerInfo(host=EVIL[0], pid=1))
    store.save(claimed.job.id, claimed.lease, {e: e for e in EVIL})
    store.log_metrics(claimed.job.id, claimed.lease, [(1, EVIL[0], 0.5), (2, EVIL[1], 0.25)])
    store.finish(claimed.job.id, claimed.lease, "DONE", results={e: [e] for e in EVIL}, why=EVIL[3])
    assert store.job(claimed.job.id).results == {e: [e] for e in EVIL}
    assert sorted(m[2] for m in store.metrics([claimed.job.id])) == sorted(EVIL[:2])
    store.reset([claimed.job.id], why=EVIL[0])
    store.cancel([ids[1]], why=EVIL[1])
    whys = [e.why for i in ids[:2] for e in store.events(i)]
    assert EVIL[0] in whys and EVIL[1] in whys and EVIL[3] in whys
    assert any(EVIL[0] in e.why for e in store.events(claimed.job.id) if e.to_status == Status.RUNNING.value)

    # Through the command line, where the grammar allows quotes.
    quoted = "msg={{" + ",".join(json.dumps(e) for e in EVIL[:4]) + "}}"
    code, out, err = _cli(capsys, "sqlschedule", db_url, "--no-check", "pkg.mod:train", quoted)
    assert code == 0 and "added 4 jobs" in out, err
    code, out, err = _cli(capsys, "list", db_url, "--format", "json")
    assert code == 0 and sorted(j["params"]["msg"] for j in json.loads(out) if "msg" in j["params"]) == sorted(EVIL[:4])
    code, out, err = _cli(
        capsys, "sqlschedule", db_url, "--no-check", "pkg.mod:retrain", "x=1", "--after", f"msg={json.dumps(EVIL[0])}"
    )
    assert code == 0 and "added 1 jobs" in out, err
    fan_in = [j for j in store.jobs() if j.target == "pkg.mod:retrain"]
    assert len(fan_in) == 1 and len(fan_in[0].depends_on) == 1
    assert store.job(fan_in[0].depends_on[0]).params["msg"] == EVIL[0]
    for argv in (
        ["sqlstatus", db_url, "--print_keys", ",".join(EVIL)],
        ["report", db_url, "--metric", EVIL[0], "--format", "json"],
        ["report", db_url, "--where", f"msg=={json.dumps(EVIL[3])}", "--metric", "x"],
        ["sqlschedule", db_url, "--no-check", "pkg.mod:g", "x=1", "--after", f"target={EVIL[1]}"],
    ):
        code, out, err = _cli(capsys, *argv)
        assert code in (0, 1, 2), (argv, code, err)
    refused = [
        ["show", db_url, "1; DROP TABLE job"],
        ["list", db_url.replace("?table=", "?table=x'; DROP TABLE job; --")],
        ["list", db_url, "--table", "x; DROP TABLE job"],
        ["list", db_url, "--status", "DONE'; DROP TABLE job; --"],
        ["sqlstatus", db_url, "1 OR 1=1"],
    ]
    if db_url.startswith("postgresql"):
        refused.append(["list", db_url + "&schema=public;DROP TABLE job"])
    for argv in refused:
        code, out, err = _cli(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) >= 1, (argv, code, err)

    tables = _tables(store)
    assert set(tables) == {*metadata.tables, VERSION_TABLE}, tables
    assert len(store.jobs()) == len(EVIL) + 4 + 1
    assert tables["experiment"] >= 1 and tables["job_metric"] >= 2


# -- least privilege: one role, one schema ---------------------------------------------------------


def _admin(database_url: str, sql: list[str]) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in sql:
            conn.execute(statement)


def grants(schema: str, role: str) -> list[str]:
    """The least a role needs to run an experiment in ``schema``: what docs/guarantees.md prescribes."""
    return [
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
    ]


def test_a_role_works_in_its_own_schema_and_is_refused_another(pg_database, tmp_path, mods):
    tag = uuid.uuid4().hex[:6]
    schemas, roles = [f"lab_a_{tag}", f"lab_b_{tag}"], [f"jm_role_a_{tag}", f"jm_role_b_{tag}"]
    host = pg_database.split("@", 1)[1]  # host:port/database
    try:
        _admin(pg_database, [f"CREATE SCHEMA {s}" for s in schemas] + [f"CREATE ROLE {r} LOGIN" for r in roles])
        for schema, role in zip(schemas, roles):
            r = run_jobman("db", "upgrade", f"{pg_database}?schema={schema}")
            assert r.code == 0 and "upgraded from nothing" in r.out, r.err
            _admin(pg_database, grants(schema, role))

        def url(role: str, schema: str) -> str:
            return f"postgresql://{role}@{host}?schema={schema}&table=mlp"

        env = env_with(mods)
        for schema, role in zip(schemas, roles):  # each role runs a whole experiment in its own schema
            r = run_jobman("sqlschedule", url(role, schema), f"{MODULE}:echo", "msg={{a,b}}", env=env)
            assert r.code == 0 and "added 2 jobs" in r.out, r.err
            r = run_jobman("worker", url(role, schema), "--exproot", str(tmp_path / "runs" / schema), env=env)
            assert r.code == 0, r.err
            r = run_jobman("list", url(role, schema), "--format", "json")
            assert r.code == 0 and [j["status"] for j in json.loads(r.out)] == ["DONE", "DONE"], r.err
            assert [j["results"]["got"] for j in json.loads(r.out)] == ["a", "b"]

        # Role A in schema B: refused, in one sentence, and nothing changes there.
        before = run_jobman("list", f"{pg_database}?schema={schemas[1]}&table=mlp", "--format", "json").out
        attempts = (
            ["list", url(roles[0], schemas[1])],
            ["sqlschedule", url(roles[0], schemas[1]), "--no-check", "pkg.mod:f", "x=1"],
            ["worker", url(roles[0], schemas[1]), "--exproot", str(tmp_path / "stolen")],
        )
        with ThreadPoolExecutor(max_workers=2) as pool:
            for r in pool.map(lambda argv: run_jobman(*argv), attempts):
                message = one_sentence(r)
                assert "permission denied" in message and roles[0] in message and schemas[1] in message, message
        assert run_jobman("list", f"{pg_database}?schema={schemas[1]}&table=mlp", "--format", "json").out == before
        # ... and in the public schema, whose jobman tables it may see but not read.
        assert run_jobman("db", "upgrade", pg_database).code == 0
        message = one_sentence(run_jobman("list", f"postgresql://{roles[0]}@{host}?table=mlp"))
        assert "permission denied" in message, message
        # A schema that does not exist is named as such.
        message = one_sentence(run_jobman("db", "upgrade", f"{pg_database}?schema=nope_{tag}"))
        assert f"schema 'nope_{tag}' does not exist" in message and "CREATE SCHEMA" in message, message
    finally:
        _admin(
            pg_database,
            [f"DROP SCHEMA IF EXISTS {s} CASCADE" for s in schemas]
            + [f"DROP OWNED BY {r}" for r in roles if _role_exists(pg_database, r)]
            + [f"DROP ROLE IF EXISTS {r}" for r in roles],
        )


def _role_exists(database_url: str, role: str) -> bool:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone() is not None

"""What a careless or hostile user gives jobman, met with one sentence or handled, on both engines:
an experiment named like a folder, a database password a job could read, a read-only SQLite
database, a version table holding two schema versions.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import experiment_module, need_service, run_jobman
from test_cli_basics import dump_db, one_sentence
from test_migrations import fresh_url  # noqa: F401 - a fixture: an empty database on each engine

from jobman.jobdb.errors import UsageError
from jobman.jobdb.schema import VERSION_TABLE
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec
from jobman.jobdb.url import parse_db, without_password

SECRET = "s3cretpw"


# -- an experiment named like a folder -------------------------------------------------------------


@pytest.mark.parametrize("name", ["..", ".", "..."])
def test_an_experiment_named_like_a_folder_is_refused_and_nothing_is_written(name, store, db_url, tmp_path):
    store.schedule([JobSpec(phase=0, kind="fn", target="m:f", params={"x": 1}, parent=None)])
    base = db_url.split("?", 1)[0]
    before = dump_db(db_url)
    runs = tmp_path / "runs"
    for argv in (
        ["sqlschedule", f"{base}?table={name}", "m:f", "x=1", "--no-check"],
        ["sqlschedule", base, "--table", name, "m:f", "x=2", "--no-check"],
        ["worker", f"{base}?table={name}", "--exproot", str(runs), "--no-wait"],
        ["list", f"{base}?table={name}"],
    ):
        message = one_sentence(run_jobman(*argv))
        assert f"experiment name {name!r}" in message, message
    with pytest.raises(UsageError, match="names a folder"):
        parse_db(base, name)
    with pytest.raises(UsageError, match="names a folder"):
        import jobman

        jobman.Experiment(f"{base}?table={name}", backend="inline")
    assert dump_db(db_url) == before
    assert not runs.exists() and not (tmp_path / name / "1").exists()


# -- the database password stays with the worker ---------------------------------------------------

SHOW_ENV = """
import json, os

def env(state, channel):
    return {"env": dict(os.environ)}
"""
SHOW_ENV_COMMAND = """
import json, os
with open(os.environ["JOBMAN_RESULTS"], "w") as out:
    json.dump({"env": dict(os.environ)}, out)
"""


def test_jobs_do_not_inherit_the_database_password_unless_asked(store, db_url, tmp_path):
    path = experiment_module(tmp_path, "showenv", SHOW_ENV)
    (tmp_path / "showenv.py").write_text(SHOW_ENV_COMMAND)
    command = shlex.join([sys.executable, str(tmp_path / "showenv.py")])
    leaked_url = f"postgresql://lab:{SECRET}@db.example/lab?table=t&password={SECRET}"
    env = {
        "PYTHONPATH": path,
        "PGPASSWORD": SECRET,
        "JOBMAN_DB": leaked_url,
        "OLD_URL": f"postgres://lab:{SECRET}@db.example/lab",
        "HTTPS_PROXY": "http://me:proxypw@proxy.example:3128",  # not the database's: the job's to use
    }

    def run(**extra: str) -> list[dict]:
        ids = store.schedule(
            [
                JobSpec(phase=0, kind="fn", target="showenv:env", params={"n": len(extra)}, parent=None),
                JobSpec(phase=0, kind="cmd", target=command, params={"n": len(extra)}, parent=None),
            ]
        ).job_ids
        seen = []
        for per_process in ("1", "3"):  # a fresh job process, and one that runs several
            r = run_jobman(
                "worker", db_url, "--exproot", str(tmp_path / "runs"), "--no-wait",
                "--jobs-per-process", per_process, env={**env, **extra},
            )  # fmt: skip
            assert r.code == 0, r.err
            jobs = [store.job(i) for i in ids]
            assert all(j.results for j in jobs), [(j.status, j.error) for j in jobs]
            seen += [j.results["env"] for j in jobs]
            store.reset(ids)
        return seen

    for seen in run():
        assert "PGPASSWORD" not in seen
        assert SECRET not in json.dumps(seen)
        assert seen["JOBMAN_DB"] == "postgresql://lab@db.example/lab?table=t&password="
        assert seen["OLD_URL"] == "postgres://lab@db.example/lab"
        assert seen["HTTPS_PROXY"] == "http://me:proxypw@proxy.example:3128"
    for seen in run(JOBMAN_JOBS_GET_DB_PASSWORD="1"):  # asked for: as the worker has them
        assert seen["PGPASSWORD"] == SECRET and seen["JOBMAN_DB"] == leaked_url


def test_a_password_in_the_dispatch_url_never_reaches_a_job(pg_database, tmp_path):
    """`jobman dispatch` hands its workers the password of its URL (in PGPASSWORD): their jobs do not
    get it. The test server trusts local connections, so any password connects."""
    path = experiment_module(tmp_path, "showenv", SHOW_ENV)
    url = pg_database.replace("postgres@", f"postgres:{SECRET}@", 1) + f"?table=pw_{os.getpid()}"
    assert SECRET in url
    store = Store.open(url)
    try:
        [job_id] = store.schedule([JobSpec(phase=0, kind="fn", target="showenv:env", params={}, parent=None)]).job_ids
        r = run_jobman("dispatch", url, "-j", "1", "--exproot", str(tmp_path / "runs"), env={"PYTHONPATH": path})
        assert r.code == 0, r.err
        seen = store.job(job_id).results["env"]
        assert "PGPASSWORD" not in seen and SECRET not in json.dumps(seen)
    finally:
        store.dispose()


def test_without_password_keeps_the_rest_of_every_url_form():
    for given, kept in [
        (f"postgresql://u:{SECRET}@h:5432/db?table=t", "postgresql://u@h:5432/db?table=t"),
        (f"postgresql://u:a@b#c {SECRET}@h/db", "postgresql://u@h/db"),
        (f"postgresql://u@h/db?password={SECRET}&table=t", "postgresql://u@h/db?password=&table=t"),
        (f"postgresql://u@h/db?sslmode=require&password={SECRET}", "postgresql://u@h/db?sslmode=require&password="),
        ("sqlite:////tmp/x.db?table=t", "sqlite:////tmp/x.db?table=t"),
        ("no url here", "no url here"),
    ]:
        assert without_password(given) == kept, given


# -- a read-only SQLite database -------------------------------------------------------------------

JOB = """
def f(state, channel):
    return {"y": state.x * 2}
"""


def _finished_database(folder: Path, mods: str) -> str:
    url = f"sqlite:///{folder / 'jobs.db'}?table=ro"
    store = Store.open(url)
    store.schedule([JobSpec(phase=0, kind="fn", target="rojob:f", params={"x": x}, parent=None) for x in (1, 2)])
    store.dispose()
    r = run_jobman("worker", url, "--exproot", str(folder / "runs"), "--no-wait", env={"PYTHONPATH": mods})
    assert r.code == 0, r.err
    con = sa.create_engine(url.split("?")[0])  # a clean close: no -wal or -shm file left beside it
    with con.connect() as c:
        c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    con.dispose()
    return url


def _reads_work(url: str, run) -> None:
    r = run("list", url)
    assert r.code == 0 and "2 jobs: 2 DONE" in r.out, r.err
    r = run("report", url, "--metric", "y")
    assert r.code == 0 and "best: x=1" in r.out, r.err
    r = run("show", url, "1")
    assert r.code == 0 and "DONE" in r.out, r.err
    r = run("sqlschedule", url, "rojob:f", "x=3", "--no-check")
    message = one_sentence(r)
    assert "read-only" in message, message


def _serve_answers(url: str, run_prefix: list[str]) -> None:
    import re
    import urllib.request

    proc = subprocess.Popen(
        [*run_prefix, sys.executable, "-m", "jobman.cli.main", "serve", url, "--port", "0", "--token", "t" * 12],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        root = re.search(r"http://127\.0\.0\.1:\d+/s/[\w-]+", proc.stdout.readline()).group(0)  # its secret path
        req = urllib.request.Request(f"{root}/e/ro", headers={"Authorization": "token " + "t" * 12})
        with urllib.request.urlopen(req, timeout=20) as page:
            assert page.status == 200 and "DONE" in page.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "Traceback" not in proc.stderr.read()


def test_a_database_on_a_read_only_mount_can_be_read(tmp_path):
    if os.geteuid() != 0:
        need_service("mounting a tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="jobman-ro-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        where.rmdir()
        need_service(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        url = _finished_database(where, experiment_module(tmp_path, "rojob", JOB))
        assert not list(where.glob("jobs.db-*"))
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        _reads_work(url, run_jobman)
        _serve_answers(url, [])
        assert not list(where.glob("jobs.db-*"))
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


def _without_file_override(*args: str):
    """The jobman command run as root without the capabilities that pass over file modes (real
    permission checks, as any other user meets them)."""
    line = shlex.join([sys.executable, "-m", "jobman.cli.main", *args])
    proc = subprocess.run(
        ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", line],
        capture_output=True,
        text=True,
        timeout=120,
    )
    from conftest import CliResult

    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.mark.parametrize("what", ["file 0444", "folder 0555"])
def test_a_read_only_database_file_or_folder_can_be_read(what, tmp_path):
    if os.geteuid() != 0 or not any(Path(d, "capsh").exists() for d in ("/usr/sbin", "/sbin", "/usr/bin")):
        need_service("reading as a user without write permission needs root and capsh (libcap2-bin)")
    folder = tmp_path / "db"
    folder.mkdir()
    url = _finished_database(folder, experiment_module(tmp_path, "rojob", JOB))
    (folder / "jobs.db").chmod(0o444)
    if what == "folder 0555":
        folder.chmod(0o555)
    try:
        _reads_work(url, _without_file_override)
        _serve_answers(url, ["capsh", "--drop=cap_dac_override,cap_dac_read_search", "--", "-c", 'exec "$@"', "x"])
    finally:
        folder.chmod(0o755)


# -- a version table holding two versions ----------------------------------------------------------


def test_two_schema_versions_are_one_sentence_and_a_doubled_one_is_repaired(fresh_url):  # noqa: F811
    r = run_jobman("db", "upgrade", fresh_url)
    assert r.code == 0, r.err
    engine = sa.create_engine(fresh_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        head = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one()
        conn.execute(sa.text(f"INSERT INTO {VERSION_TABLE} VALUES ('0001')"))
    before = dump_db(fresh_url)
    for argv in (["db", "upgrade", fresh_url], ["list", f"{fresh_url}?table=x"]):
        message = one_sentence(run_jobman(*argv))
        assert f"holds 2 schema versions (0001, {head})" in message, message
    assert dump_db(fresh_url) == before
    # The same version twice (a version table made without its key): `db upgrade` leaves one.
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE {VERSION_TABLE}"))
        conn.execute(sa.text(f"CREATE TABLE {VERSION_TABLE} (version_num VARCHAR(32) NOT NULL)"))
        conn.execute(sa.text(f"INSERT INTO {VERSION_TABLE} VALUES ('{head}'), ('{head}')"))
    r = run_jobman("db", "upgrade", fresh_url)
    assert r.code == 0 and "Traceback" not in r.err, r.err
    with engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [head]
    r = run_jobman("list", f"{fresh_url}?table=x")
    assert "Traceback" not in r.err and "schema versions" not in r.err, r.err
    engine.dispose()

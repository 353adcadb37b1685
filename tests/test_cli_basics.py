"""The first CLI commands as a user runs them: real processes, real SQLite files, real PostgreSQL.

Every bad input must give one sentence on stderr, a non-zero exit, no traceback,
no password, and leave the database exactly as it was.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from conftest import need_service, run_jobman

from jobman.cli.main import cli
from jobman.jobdb.schema import metadata
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import expand, parse_sweep

TARGET = "jobman.examples.def_addition:addition_example"  # importable, takes any state: passes the check
SECRET = "s3cretpw"


def dump_db(url: str) -> dict[str, list[tuple]] | None:
    """Every row of every jobman table (None: no database file)."""
    base = url.split("?", 1)[0]
    if base.startswith("sqlite:///"):
        if not os.path.exists(base[len("sqlite:///") :]):
            return None
    engine = sa.create_engine(base.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            names = set(sa.inspect(conn).get_table_names())
            return {
                t.name: [tuple(r) for r in conn.execute(sa.select(t).order_by(*t.primary_key))]
                for t in metadata.sorted_tables
                if t.name in names
            }
    finally:
        engine.dispose()


def one_sentence(r, *, secret: str = SECRET) -> str:
    """The error a user sees: one line on stderr, a non-zero exit, no traceback, no password."""
    assert r.code != 0, (r.out, r.err)
    assert "Traceback" not in r.err and "Traceback" not in r.out
    lines = [
        line for line in r.err.strip().splitlines() if not line.startswith("Usage:") and not line.startswith("Try ")
    ]
    assert len(lines) == 1, r.err
    assert lines[0].startswith("jobman: "), r.err
    assert "internal error" not in lines[0], r.err
    assert secret not in r.err and secret not in r.out
    return lines[0]


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A SQLite database holding experiment 'mlp' with a two-phase sweep."""
    url = f"sqlite:///{tmp_path / 'sweeps.db'}?table=mlp"
    s = Store.open(url)
    s.schedule(expand(parse_sweep([TARGET, "n={{1,2}}", "--", "m={{a,b}}"])))
    s.dispose()
    return url


# -- help ---------------------------------------------------------------------------------------


def _all_commands(group: click.Group, path=()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, f"{name} is listed but cannot be loaded"
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _all_commands(command, (*path, name))


def test_every_command_has_help_with_an_example(jobman):
    r = jobman("--help")
    assert r.code == 0 and "Usage: jobman" in r.out
    listed = set(re.findall(r"^  ([a-z][a-z_-]*)\s", r.out.split("Commands:")[1], re.M))
    commands = list(_all_commands(cli))
    names = {path[0] for path, _ in commands}
    assert listed == names, (listed, names)
    assert {"sqlschedule", "sqlschedules", "schedule", "list", "show", "sqlstatus", "db"} <= names
    runner = CliRunner()
    lacking = []
    for path, command in commands:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        if "Example" not in result.output or not (command.help or "").strip():
            lacking.append(" ".join(path))
    assert lacking == [], f"commands without help and an example: {lacking}"


def test_sqlschedule_help_through_the_real_entry_point(jobman):
    r = jobman("sqlschedule", "--help")
    assert r.code == 0 and "Example" in r.out and "{{" in r.out


# -- the everyday flow ---------------------------------------------------------------------------


def test_schedule_list_show_and_sqlstatus_on_sqlite(tmp_path, jobman):
    url = f"sqlite:///{tmp_path / 'sweeps.db'}?table=mlp"
    r = jobman("sqlschedule", url, TARGET, "n={{1,2}}", "--", "m={a}", "m={b}")  # the shell's expansion
    assert r.code == 0, r.err
    assert "added 6 jobs" in r.out and "mlp" in r.out

    s = Store.open(url)
    first = s.claim(WorkerInfo(host="nodeA", pid=31337))
    s.finish(first.job.id, first.lease, "DONE", results={"valid_error": 0.125})
    running = s.claim(WorkerInfo(host="nodeB", pid=4242))

    r = jobman("list", url, "--format", "json")
    assert r.code == 0, r.err
    jobs = json.loads(r.out)
    assert len(jobs) == 6
    for j in jobs:
        assert {"id", "phase", "status", "params", "results", "attempt", "host", "pid", "depends_on"} <= set(j)
    by_id = {j["id"]: j for j in jobs}
    assert by_id[first.job.id]["status"] == "DONE" and by_id[first.job.id]["results"] == {"valid_error": 0.125}
    assert by_id[running.job.id]["status"] == "RUNNING"
    assert (by_id[running.job.id]["host"], by_id[running.job.id]["pid"], by_id[running.job.id]["attempt"]) == (
        "nodeB",
        4242,
        1,
    )
    phase1 = [j for j in jobs if j["phase"] == 1]
    assert sorted(p["params"]["m"] for p in phase1) == ["a", "a", "b", "b"]
    assert all(len(p["depends_on"]) == 1 and by_id[p["depends_on"][0]]["phase"] == 0 for p in phase1)
    assert {p["status"] for p in phase1 if p["depends_on"] == [first.job.id]} == {"QUEUED"}

    r = jobman("list", url)
    assert r.code == 0, r.err
    assert "nodeB:4242" in r.out and "valid_error=0.125" in r.out
    for status in ("DONE", "RUNNING", "QUEUED", "WAITING"):
        assert status in r.out
    assert "6 jobs" in r.out

    r = jobman("show", url, str(first.job.id))
    assert r.code == 0, r.err
    assert "valid_error" in r.out and "nodeA" in r.out and "history" in r.out and "QUEUED" in r.out

    r = jobman("sqlstatus", url, "--status", "START")
    assert r.code == 0, r.err
    queued = [j["id"] for j in jobs if j["status"] == "QUEUED"]
    assert re.findall(r"^Job (\d+): status 0 \(QUEUED\)", r.out, re.M) == [str(i) for i in queued]

    r = jobman("sqlstatus", url, "--status", "2", "--print_keys", "valid_error")
    assert r.code == 0, r.err
    assert r.out.strip() == f"Job {first.job.id}: status 2 (DONE) phase 0 valid_error=0.125"

    other_root = next(j["id"] for j in jobs if j["phase"] == 0 and j["id"] != first.job.id)
    assert other_root == running.job.id
    waiting = [j["id"] for j in phase1 if j["depends_on"] == [other_root]]
    r = jobman("sqlstatus", url, str(waiting[0]), "--set_status", "-1")
    assert r.code == 0, r.err
    assert "1 job(s) set to CANCELED (-1)" in r.out
    assert s.job(waiting[0]).status is Status.CANCELED
    assert s.job(waiting[1]).status is Status.WAITING
    assert any(e.to_status == "CANCELED" for e in s.events(waiting[0]))
    s.dispose()


def test_postgres_scheme_db_and_table_options(pg_database, jobman):
    base = pg_database.replace("postgresql://", "postgres://", 1)
    name = f"cli_{uuid.uuid4().hex[:8]}"
    r = jobman("sqlschedule", f"{base}?table={name}", "--no-check", "pkg.mod:train", "lr={{0.1,0.01}}")
    assert r.code == 0, r.err
    assert "added 2 jobs" in r.out
    assert "postgresql://" in r.out  # shown in the canonical form
    r = jobman("list", "--db", f"{pg_database}?table=other", "--table", name, "--format", "json")
    assert r.code == 0, r.err
    assert sorted(j["params"]["lr"] for j in json.loads(r.out)) == [0.01, 0.1]
    r = jobman("sqlstatus", "--db", pg_database, "--table", name, "--status", "QUEUED", "--count")
    assert r.code == 0 and r.out.strip() == "2", r.err


def test_jobman_db_env_and_relative_sqlite_paths(tmp_path, jobman):
    env = {"JOBMAN_DB": "sqlite:///rel.db?table=envexp"}
    r = jobman("db", "upgrade", cwd=tmp_path, env=env)
    assert r.code == 0 and "upgraded from nothing" in r.out, r.err
    assert (tmp_path / "rel.db").exists()
    r = jobman("sqlschedule", "--no-check", "pkg.mod:f", "x={{1,2,3}}", cwd=tmp_path, env=env)
    assert r.code == 0 and "'envexp'" in r.out, r.err
    r = jobman("db", "experiments", "--format", "json", cwd=tmp_path, env=env)
    assert r.code == 0 and json.loads(r.out) == ["envexp"], r.err


# -- bad input ------------------------------------------------------------------------------------

BAD_SWEEPS = [
    ([TARGET, "lr={{0.1,0.2"], ["argument 2", "character 4", "never closed"]),
    ([TARGET, "lr={{}}"], ["argument 2", "character 4", "empty"]),
    ([TARGET, "lr"], ["argument 2", "'=' is missing"]),
    ([TARGET, "2lr=1"], ["argument 2", "character 1", "not a valid parameter name"]),
    ([TARGET, "a=1", "a={{2,3}}"], ["argument 3", "already set in this phase"]),
    ([TARGET, "a=1", "--", "a=2"], ["argument 4", "already set in phase 0"]),
    ([TARGET, "a=1", "--"], ["argument 3", "must be followed by a phase"]),
    ([TARGET, "a=1", "--", "--", "b=2"], ["argument 4", "empty"]),
    (["nosuchpkg_xyz.train:main", "a=1"], ["cannot import", "nosuchpkg_xyz", "--no-check"]),
    (["os.path:sep", "a=1"], ["not a callable"]),
]


def refused_all(cases: list[tuple[str, list[str], list[str]]]) -> None:
    """Run (label, argv, words) cases as real processes, two at a time, and check every refusal."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda case: run_jobman(*case[1]), cases))
    problems = []
    for (label, _, words), r in zip(cases, results):
        try:
            message = one_sentence(r)
            absent = [w for w in words if w not in message]
            assert not absent, f"{absent} not in {message!r}"
        except AssertionError as exc:
            problems.append(f"{label}: {exc}")
    assert problems == [], "\n".join(problems)


def test_bad_input_on_sqlite_is_one_masked_sentence_and_changes_nothing(sqlite_url, tmp_path):
    never, missing = tmp_path / "never.db", tmp_path / "missing.db"
    cases = [(f"sweep {t}", ["sqlschedule", sqlite_url, *t], w) for t, w in BAD_SWEEPS]
    cases += [
        ("a refused sweep into a new file", ["sqlschedule", f"sqlite:///{never}", TARGET, "a={{1,"], ["argument 2"]),
        (
            "missing experiment",
            ["list", sqlite_url.replace("table=mlp", "table=nope")],
            ["no experiment 'nope'", "mlp"],
        ),
        ("missing file", ["list", f"sqlite:///{missing}"], ["no jobman database"]),
        (
            "unknown scheme",
            ["sqlschedule", f"mysql://me:{SECRET}@127.0.0.1/lab?table=x", "--no-check", "p.m:f", "a=1"],
            ["unknown database scheme 'mysql'"],
        ),
        (
            "unreachable server",
            ["list", f"postgresql://postgres:{SECRET}@127.0.0.1:1/lab?table=x"],
            ["cannot connect to", "unreachable", "postgres:***@"],
        ),
        (
            "unreachable server, --db",
            ["sqlschedule", "--db", f"postgres://me:{SECRET}@127.0.0.1:1/lab", "p.m:f", "a=1", "--no-check"],
            ["cannot connect to", "unreachable", "me:***@"],
        ),
    ]
    before = dump_db(sqlite_url)
    refused_all(cases)
    assert dump_db(sqlite_url) == before
    assert not never.exists() and not missing.exists()


def test_bad_input_on_postgresql_is_one_masked_sentence_and_changes_nothing(pg_database):
    server = pg_database.rsplit("/", 1)[0].replace("postgres@", f"postgres:{SECRET}@")
    pid = os.getpid()
    # An experiment of its own, as the SQLite test has: the session's database holds jobman's tables
    # and a sweep whatever ran before, so a missing experiment is told apart from a database without them.
    mine = f"mlp_{uuid.uuid4().hex[:8]}"
    s = Store.open(f"{pg_database}?table={mine}")
    s.schedule(expand(parse_sweep([TARGET, "n={{1,2}}", "--", "m={{a,b}}"])))
    s.dispose()
    cases = [
        (
            "unknown database",
            ["sqlschedule", f"{server}/jobman_no_such_db_{pid}?table=x", "--no-check", "p.m:f", "a=1"],
            ["cannot connect to", "database does not exist", "postgres:***@"],
        ),
        (
            "unknown role",
            ["list", f"{server.replace('postgres:', f'no_such_role_{pid}:')}/postgres?table=x"],
            ["cannot connect to", "role (user) does not exist", f"no_such_role_{pid}:***@"],
        ),
        ("missing experiment", ["list", f"{pg_database}?table=nope_{pid}"], [f"no experiment 'nope_{pid}'", mine]),
    ]
    before = dump_db(pg_database)
    refused_all(cases)
    assert dump_db(pg_database) == before


def _set_immutable(paths: list[Path], on: bool) -> None:
    subprocess.run(["chattr", "+i" if on else "-i", *map(str, paths)], check=True, capture_output=True)


@pytest.fixture
def read_only(tmp_path):
    """Make files and directories truly read-only, even for root: chmod, and the immutable attribute.

    Root ignores permission bits, so chmod alone proves nothing when the tests run as root;
    ``chattr +i`` makes the kernel refuse every write, whoever asks.
    """
    made: list[Path] = []
    chmodded: list[Path] = []

    def undo() -> None:
        if made:
            _set_immutable(made, False)
        for p in chmodded:
            p.chmod(0o755 if p.is_dir() else 0o644)
        made.clear()
        chmodded.clear()

    def make(*paths: Path) -> None:
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
            chmodded.append(p)
        if os.geteuid() == 0:
            if shutil.which("chattr") is None:
                need_service("running as root without chattr: root cannot be refused a write")
            try:
                _set_immutable(list(paths), True)
            except subprocess.CalledProcessError as exc:
                need_service(f"chattr +i does not work here ({exc.stderr.strip()}): root cannot be refused a write")
            made.extend(paths)
        probe = paths[0] if not paths[0].is_dir() else paths[0] / "probe"
        with pytest.raises(OSError):
            with open(probe, "a") as f:
                f.write("x")

    make.undo = undo
    yield make
    undo()


@pytest.mark.parametrize("dir_too", [False, True], ids=["file", "file-and-dir"])
def test_a_read_only_sqlite_database_is_refused_cleanly(sqlite_url, tmp_path, jobman, read_only, dir_too):
    db = tmp_path / "sweeps.db"
    for leftover in tmp_path.glob("sweeps.db-*"):
        leftover.unlink()
    before = dump_db(sqlite_url)
    read_only(db, *([tmp_path] if dir_too else []))
    message = one_sentence(jobman("sqlschedule", sqlite_url, TARGET, "extra={{1,2}}"))
    assert "read-only" in message, message
    if not dir_too:  # reading still works where SQLite can write its WAL index beside the file
        message = one_sentence(jobman("sqlstatus", sqlite_url, "1", "--set_status", "DONE"))
        assert "read-only" in message, message
        r = jobman("list", sqlite_url, "--format", "json")
        assert r.code == 0 and len(json.loads(r.out)) == 6, r.err
    read_only.undo()
    assert dump_db(sqlite_url) == before

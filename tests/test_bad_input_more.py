"""More bad input, each met by one sentence and a non-zero exit, with the database left intact.

Beyond tests/test_cli_basics.py: the running commands (worker, dispatch, report, db) against an
unreachable or hung server; a password the server really refuses (the shared test server trusts every
local connection, so a throwaway PostgreSQL cluster with scram-sha-256 is started for it); a database
from a newer jobman, met by every command; parameters that cannot be stored; a checkpoint over the size
limit; a full disk (a 1 MiB tmpfs holding the SQLite file); and SQLite on a network filesystem.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import textwrap
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
import sqlalchemy as sa
from conftest import need_service, run_jobman
from test_cli_basics import TARGET, dump_db, one_sentence, refused_all
from test_migrations import fresh_url  # noqa: F401 - a fixture: an empty database on each engine

from jobman.cli.main import main
from jobman.jobdb import engine as db_engine
from jobman.jobdb.errors import DatabaseError, StateTooLarge, UsageError
from jobman.jobdb.schema import VERSION_TABLE
from jobman.jobdb.status import Status
from jobman.jobdb.store import MAX_STATE_BYTES, Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec, expand, parse_sweep

SECRET = "s3cretpw"  # what one_sentence() checks never shows


# -- a server that checks passwords -------------------------------------------------------------


@dataclass
class PasswordServer:
    """A throwaway PostgreSQL cluster on 127.0.0.1 that checks passwords (scram-sha-256)."""

    port: int
    admin_password: str

    def url(self, user: str = "postgres", password: str | None = None, database: str = "postgres") -> str:
        secret = quote(password if password is not None else self.admin_password, safe="")
        return f"postgresql://{quote(user, safe='')}:{secret}@127.0.0.1:{self.port}/{database}"

    def admin(self, *statements: str) -> None:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            for sql in statements:
                conn.execute(sql)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SERVER: dict = {}


def _start_password_server() -> PasswordServer:
    bindir = None
    if shutil.which("pg_config"):
        bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
    if not bindir or not os.path.exists(os.path.join(bindir, "initdb")):
        found = shutil.which("initdb") or next(
            iter(
                sorted(
                    glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: float(p.split("/")[4]), reverse=True
                )
            ),
            None,
        )
        bindir = os.path.dirname(found) if found else None
    if bindir is None:
        need_service("PostgreSQL's initdb was not found: cannot start a server that checks passwords")
    as_postgres: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="jobman-pwpg-"))
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            need_service("running as root without a 'postgres' user to run initdb as")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_postgres = ["runuser", "-u", "postgres", "--"]
    password = "adm1n-pw"
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    if as_postgres:
        os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
    port = _free_port()
    data = root / "data"
    steps = [
        [
            *as_postgres,
            f"{bindir}/initdb",
            "-D",
            str(data),
            "-U",
            "postgres",
            "-A",
            "scram-sha-256",
            f"--pwfile={pwfile}",
            "-N",
            "-E",
            "UTF8",
            "--locale=C",
        ],
        [
            *as_postgres,
            f"{bindir}/pg_ctl",
            "-D",
            str(data),
            "-l",
            str(root / "log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=30",
            "start",
        ],
    ]
    for argv in steps:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            need_service(f"could not start a PostgreSQL that checks passwords: {(r.stderr or r.stdout).strip()[-300:]}")
    _SERVER.update(root=root, data=data, as_postgres=as_postgres, bindir=bindir)
    return PasswordServer(port, password)


def _stop_password_server() -> None:
    subprocess.run(
        [
            *_SERVER["as_postgres"],
            f"{_SERVER['bindir']}/pg_ctl",
            "-D",
            str(_SERVER["data"]),
            "-m",
            "immediate",
            "-w",
            "stop",
        ],
        capture_output=True,
        timeout=60,
    )
    shutil.rmtree(_SERVER["root"], ignore_errors=True)
    _SERVER.clear()


@pytest.fixture(scope="session")
def password_server():
    """One throwaway password-checking cluster for every module that asks (started once, stopped last)."""
    if "server" not in _SERVER:
        server = _start_password_server()
        _SERVER["server"], _SERVER["users"] = server, 0
    _SERVER["users"] += 1
    yield _SERVER["server"]
    _SERVER["users"] -= 1
    if _SERVER["users"] == 0:
        _stop_password_server()


def test_a_wrong_password_is_refused_in_one_sentence(password_server):
    server = password_server
    server.admin(f"CREATE ROLE lab LOGIN PASSWORD '{SECRET}'", "CREATE DATABASE labdb OWNER lab")
    good = server.url("lab", SECRET, "labdb") + "?table=mlp"
    r = run_jobman("sqlschedule", good, "--no-check", "pkg.mod:train", "lr={{0.1,0.2}}")
    assert r.code == 0 and "added 2 jobs" in r.out and "lab:***@" in r.out, r.err
    assert SECRET not in r.out + r.err
    before = dump_db(good)

    wrong = server.url("lab", "wrong-" + SECRET, "labdb") + "?table=mlp"
    words = ["cannot connect to", "the password was refused", "lab:***@"]
    cases = [
        (f"{cmd[0]} with a wrong password", [*cmd], words)
        for cmd in (
            ["list", wrong],
            ["sqlschedule", wrong, "--no-check", "pkg.mod:train", "lr=1"],
            ["db", "upgrade", wrong],
            ["worker", wrong, "--exproot", "/nonexistent-runs"],
            ["dispatch", wrong, "-j", "1", "--no-progress"],
        )
    ]
    cases.append(
        (
            "no password at all",
            ["list", server.url("lab", "", "labdb").replace("lab:@", "lab@")],
            ["cannot connect to", "asks for a password and none was given"],
        )
    )
    refused_all(cases)
    assert dump_db(good) == before


# -- unreachable and hung servers -----------------------------------------------------------------


@pytest.fixture
def hung_server():
    """A port that accepts connections and never says a word: a server behind a dropping firewall."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for s in held:
        s.close()
    listener.close()


def test_running_commands_against_an_unreachable_or_hung_server(hung_server, tmp_path):
    refused = f"postgresql://me:{SECRET}@127.0.0.1:1/lab?table=x"
    hung = f"postgresql://me:{SECRET}@127.0.0.1:{hung_server}/lab?table=x"
    words = ["cannot connect to", "unreachable", "me:***@"]
    runs = str(tmp_path / "runs")
    cases = [("worker, hung server (the connect timeout)", ["worker", hung, "--exproot", runs], words)]
    cases += [
        (f"{cmd[0]} {cmd[1]}", cmd, words)
        for cmd in (
            ["worker", refused, "--exproot", runs],
            ["dispatch", refused, "--no-progress"],
            ["report", refused],
            ["db", "upgrade", refused],
        )
    ]
    refused_all(cases)
    assert not (tmp_path / "runs").exists()


# -- a database from a newer jobman ----------------------------------------------------------------


def test_every_command_refuses_a_database_from_a_newer_jobman(fresh_url, tmp_path):  # noqa: F811
    db_url = fresh_url + "?table=x"
    store = Store.open(db_url)
    store.schedule(expand(parse_sweep([TARGET, "n={{1,2}}"])))
    store.dispose()
    engine = sa.create_engine(fresh_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {VERSION_TABLE} SET version_num = 'ffff9999'"))
    finally:
        engine.dispose()
    before = dump_db(db_url)
    words = ["ffff9999", "newer jobman", "upgrade jobman"]
    runs = str(tmp_path / "runs")
    cases = [
        (cmd[0], cmd, words)
        for cmd in (  # Store.open and `db upgrade`: tests/test_migrations.py
            ["sqlschedule", db_url, TARGET, "n=3"],
            ["report", db_url],
            ["worker", db_url, "--exproot", runs],
            ["dispatch", db_url, "--no-progress"],
        )
    ]
    refused_all(cases)
    assert dump_db(db_url) == before


# -- values that cannot be stored --------------------------------------------------------------


def _job_rows(store: Store) -> list[tuple]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text("SELECT * FROM job ORDER BY id"))]


@pytest.mark.parametrize(
    "params, words",
    [
        ({"s": {1, 2}}, "set is not JSON serializable"),
        ({"lr": float("nan")}, "Out of range float"),
        ({"lr": float("inf")}, "Out of range float"),
        ({"lr": -float("inf")}, "Out of range float"),
        ({"layers": [64, {"nested": {3}}]}, "set is not JSON serializable"),
        ({"raw": b"bytes"}, "bytes is not JSON serializable"),
        ({"when": object()}, "object is not JSON serializable"),
    ],
    ids=["set", "nan", "inf", "-inf", "nested set", "bytes", "object"],
)
def test_parameters_that_are_not_json_are_refused_and_nothing_is_written(store, params, words):
    store.schedule([JobSpec(0, "fn", TARGET, {"ok": 1}, None)])
    before = _job_rows(store)
    specs = [JobSpec(0, "fn", TARGET, {"ok": 2}, None), JobSpec(0, "fn", TARGET, params, None)]
    with pytest.raises(UsageError, match=f"the parameters cannot be stored as JSON: .*{words}"):
        store.schedule(specs)
    assert _job_rows(store) == before


def _nested(depth: int, make) -> object:
    value: object = 1
    for _ in range(depth):
        value = make(value)
    return value


@pytest.mark.parametrize(
    "params, words",
    [
        ({"a": _nested(1000, lambda v: {"k": v})}, "nested more than 32 levels deep"),
        ({"a": _nested(1000, lambda v: [v])}, "nested more than 32 levels deep"),
        ({"a": _nested(40, lambda v: [v, 2])}, "nested more than 32 levels deep"),
        ({"x" * 5000: 1}, "a name of 5000 characters"),
    ],
)
def test_parameters_too_deep_or_with_too_long_a_name_are_refused_and_nothing_is_written(store, params, words):
    store.schedule([JobSpec(0, "fn", TARGET, {"ok": 1}, None)])
    before = _job_rows(store)
    specs = [JobSpec(0, "fn", TARGET, {"ok": 2}, None), JobSpec(0, "fn", TARGET, params, None)]
    with pytest.raises(UsageError, match=f"the parameters of job 1 of the sweep cannot be stored: {words}"):
        store.schedule(specs)
    assert _job_rows(store) == before
    assert _nested(32, lambda v: [v])  # the limit itself is kept
    store.schedule([JobSpec(0, "fn", TARGET, {"deep": _nested(31, lambda v: [v])}, None)])


def _a_job(a: object) -> dict:
    return {}


def test_a_call_from_python_nested_too_deep_is_refused_and_nothing_is_written(store, db_url):
    import jobman

    before = _job_rows(store)  # the PostgreSQL database is shared with other experiments
    exp = jobman.Experiment(db_url)
    try:
        for deep in (_nested(1000, lambda v: [v]), _nested(1000, lambda v: {"k": v})):
            with pytest.raises(UsageError, match="parameter 'a' cannot be stored: nested more than 32 levels deep"):
                exp.map(_a_job, [{"a": 1}, {"a": deep}])
    finally:
        exp.close()
    assert _job_rows(store) == before


def test_a_list_nested_too_deep_on_the_command_line_is_one_sentence_and_writes_nothing(tmp_path):
    never = tmp_path / "never.db"
    deep = "[" * 1000 + "1" + "]" * 1000
    message = one_sentence(run_jobman("sqlschedule", f"sqlite:///{never}?table=x", TARGET, f"a={deep}"))
    assert "nested more than 32 levels deep" in message, message
    assert not never.exists()


def test_results_or_a_state_nested_too_deep_are_refused_and_every_reader_copes(store, db_url):
    [job_id] = store.schedule([JobSpec(0, "fn", TARGET, {"n": 1}, None)]).job_ids
    claimed = store.claim(WorkerInfo.here(backend="local", backend_id="1"))
    assert claimed is not None
    with pytest.raises(StateTooLarge, match="state cannot be stored: nested more than 32 levels deep"):
        store.save(job_id, claimed.lease, {"deep": _nested(1000, lambda v: [v])})
    store.finish(job_id, claimed.lease, "DONE", results={"deep": _nested(1000, lambda v: {"k": v})})
    job = store.job(job_id)
    assert job.status is Status.FAILED and "results cannot be stored: nested more than 32" in job.error
    for argv in (["list", db_url], ["show", db_url, str(job_id)], ["sqlstatus", db_url]):
        r = run_jobman(*argv)
        assert r.code == 0 and "Traceback" not in r.err, (argv, r.err)


def test_a_number_too_large_to_store_is_refused_at_its_position(tmp_path):
    never = tmp_path / "never.db"
    message = one_sentence(run_jobman("sqlschedule", f"sqlite:///{never}?table=x", TARGET, "lr={{0.1,-1e999}}"))
    assert "argument 2" in message and "character 10" in message and "too large" in message, message
    assert not never.exists()


# -- a checkpoint over the size limit ------------------------------------------------------------

BIG_STATE = textwrap.dedent(f"""
    MAX = {MAX_STATE_BYTES}


    def big_checkpoint(state, channel):
        state.step = 1
        channel.save()
        state.blob = "x" * (MAX + 1)
        channel.save()  # over the limit: raises


    def big_return(state, channel):
        return {{"blob": "y" * (MAX + 1)}}


    def fine(state, channel):
        state.fine = True
""")


def test_a_state_past_the_size_limit_fails_its_job_with_the_reason(db_url, store, tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "jm_big_state.py").write_text(BIG_STATE)
    ids = store.schedule(
        [JobSpec(0, "fn", f"jm_big_state:{name}", {}, None) for name in ("big_checkpoint", "big_return", "fine")]
    ).job_ids
    r = run_jobman(
        "worker",
        db_url,
        "--exproot",
        str(tmp_path / "runs"),
        env={"PYTHONPATH": os.pathsep.join(p for p in (str(mods), os.environ.get("PYTHONPATH")) if p)},
    )
    assert r.code == 0, r.err
    assert "Traceback" not in r.err
    saved, returned, fine = (store.job(i) for i in ids)
    for job in (saved, returned):
        assert job.status is Status.FAILED
        assert f"over the {MAX_STATE_BYTES}-byte limit" in job.error and "workdir" in job.error, job.error
    assert saved.results == {"step": 1}, "the last checkpoint that fitted is kept"
    assert returned.results is None
    assert fine.status is Status.DONE and fine.results == {"fine": True}
    assert store.running() == []
    why = [e.why for e in store.events(saved.id) if e.to_status == "FAILED"]
    assert len(why) == 1 and "byte limit" in why[0], why
    shown = run_jobman("show", db_url, str(saved.id))
    assert shown.code == 0 and "byte limit" in shown.out, shown.err
    if db_url.startswith("sqlite"):
        with sqlite3.connect(db_url.split("?")[0][len("sqlite:///") :]) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


# -- a full disk --------------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs: the disk a SQLite database fills up (mounting needs root; unmounted after)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0:
        need_service("mounting a small tmpfs to fill up needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        need_service(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_is_one_sentence_and_the_database_stays_readable(tiny_disk, tmp_path):
    url = f"sqlite:///{tiny_disk / 'sweeps.db'}?table=mlp"
    store = Store.open(url)
    scheduled = 0
    try:
        for i in range(200):
            try:
                scheduled += store.schedule(
                    expand(parse_sweep(["pkg.mod:train", f"i={i}", "x={{" + ",".join(map(str, range(300))) + "}}"]))
                ).added
            except DatabaseError as exc:
                assert "the disk is full" in str(exc), exc
                break
        else:
            pytest.fail("a 1 MiB disk never filled up")
    finally:
        store.dispose()
    assert scheduled > 0
    # (A worker is left out on purpose: it retries recording a finished job for two minutes before it
    # gives up, since a database that cannot be written for a while may come back.)
    message = one_sentence(
        run_jobman("sqlschedule", url, "--no-check", "pkg.mod:train", "x={{" + ",".join(map(str, range(300))) + "}}")
    )
    assert message.startswith("jobman: cannot write to sqlite:///") and "the disk is full" in message, message
    r = run_jobman("sqlstatus", url, "--count")
    assert r.code == 0 and r.out.strip() == str(scheduled), r.err
    r = run_jobman("list", url, "--status", "RUNNING", "--format", "json")
    assert r.code == 0 and r.out.strip() == "[]", r.err
    with sqlite3.connect(tiny_disk / "sweeps.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        counts = conn.execute("SELECT count(*), count(DISTINCT params_hash) FROM job").fetchone()
        assert counts == (scheduled, scheduled)
        assert conn.execute("SELECT count(*) FROM job WHERE status != 'QUEUED'").fetchone() == (0,)


# -- SQLite on a network filesystem ---------------------------------------------------------------


def test_filesystem_type_reads_the_mount_table(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "rootfs / rootfs rw 0 0\n"
        "/dev/sda1 / ext4 rw,relatime 0 0\n"
        "nas:/export/lab /mnt/lab nfs4 rw,vers=4.2,addr=192.0.2.7 0 0\n"
        "/dev/sdb1 /mnt/lab/local xfs rw 0 0\n"
        "//srv/share /mnt/my\\040share cifs rw 0 0\n"
        "sshfs#me@host: /home/me/remote fuse.sshfs rw 0 0\n"
        "a broken line\n"
    )
    assert db_engine.filesystem_type(Path("/"), mounts) == "ext4"  # the later of two mounts on one point
    assert db_engine.filesystem_type(Path("/mnt/lab"), mounts) == "nfs4"
    assert db_engine.filesystem_type(Path("/mnt/lab/runs/deep"), mounts) == "nfs4"
    assert db_engine.filesystem_type(Path("/mnt/lab/local/x"), mounts) == "xfs"  # the longest mount point wins
    assert db_engine.filesystem_type(Path("/mnt/laboratory"), mounts) == "ext4"  # a name prefix is not a parent
    assert db_engine.filesystem_type(Path("/mnt/my share/x"), mounts) == "cifs"  # \040 is a space
    assert db_engine.filesystem_type(Path("/home/me/remote/db"), mounts) == "fuse.sshfs"
    assert db_engine.filesystem_type(Path("/x"), tmp_path / "no-such-mounts") is None
    assert db_engine.filesystem_type(Path(tmp_path)) is not None  # the real /proc/mounts by default


def test_sqlite_on_a_network_filesystem_is_refused_with_the_reason(tmp_path, monkeypatch, capsys):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\nnas:/export {tmp_path / 'nfs'} nfs rw 0 0\n")
    db = tmp_path / "nfs" / "lab" / "sweeps.db"
    with pytest.raises(
        DatabaseError,
        match=r"is on a network filesystem \(nfs\), where SQLite's WAL mode does not "
        r"work .*use PostgreSQL",
    ):
        db_engine.refuse_network_filesystem(db, mounts)
    db_engine.refuse_network_filesystem(tmp_path / "local.db", mounts)  # a local disk is fine
    monkeypatch.setenv("JOBMAN_ALLOW_NETWORK_SQLITE", "1")
    db_engine.refuse_network_filesystem(db, mounts)  # the user's explicit override
    monkeypatch.delenv("JOBMAN_ALLOW_NETWORK_SQLITE")

    # Through the command line, with the fabricated mount table standing in for /proc/mounts.
    real = db_engine.filesystem_type
    monkeypatch.setattr(db_engine, "filesystem_type", lambda directory, _mounts=None: real(directory, mounts))
    db.parent.mkdir(parents=True)
    code = main(["sqlschedule", f"sqlite:///{db}?table=x", "--no-check", "pkg.mod:train", "lr={{0.1,0.2}}"])
    captured = capsys.readouterr()
    assert code == 1
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "network filesystem (nfs)" in lines[0] and "PostgreSQL" in lines[0], captured.err
    assert not db.exists()


# -- numbers past what a database holds ---------------------------------------------------------------


def test_ids_and_numbers_past_what_a_database_holds_are_one_sentence(db_url, capsys):
    store = Store.open(db_url)
    store.schedule(expand(parse_sweep([TARGET, "n={{1,2}}"])))
    store.dispose()
    before = dump_db(db_url)
    huge = "1" * 30
    for argv in (
        ["show", db_url, huge],
        ["sqlstatus", db_url, huge, "--set_status", "DONE"],
        ["sqlstatus", db_url, "1-100000000000"],
        ["list", db_url, "--phase", huge],
        ["list", db_url, "--limit", huge],
        ["report", db_url, "--phase", huge],
        ["sqlschedule", db_url, TARGET, "n=3", "--priority", "1e400"],
        ["sqlschedule", db_url, TARGET, "n=3", "--priority", "nan"],
        ["set-priority", db_url, "1", huge],
        ["sqlschedule", db_url, TARGET, "n=4", "--max-attempts", huge],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code in (0, 1, 2), (argv, code, err)
        if code:
            assert len(lines) == 1 and lines[0].startswith("jobman: ") and "internal error" not in err, (argv, err)
        assert "Traceback" not in err
    assert dump_db(db_url) == before

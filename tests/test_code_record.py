"""What a job records is what ran: the code (source digest, git commit, uncommitted changes and
their diff) and the environment (Python, jobman, installed packages, host) of each run; a sweep
scheduled again over jobs that ran older code says so; workers find a target from any directory.

Real git repositories, real databases on both engines, and the real ``jobman`` command run from
the directories a user would run it from.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import platform
import socket
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

import jobman
from jobman.jobdb.schema import code_text
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec

SOURCE = """
def kw(lr, width=4):
    return {"loss": lr * width}
"""
EDITED = """
def kw(lr, width=4):
    return {"loss": lr * width * 10}
"""
NO_PATH = {"PYTHONPATH": ""}  # the module is found only where jobman records it was found


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A real git repository holding the experiment's module, committed."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "someone@example.org")
    git(root, "config", "user.name", "someone")
    (root / "mytrain.py").write_text(textwrap.dedent(SOURCE))
    git(root, "add", "mytrain.py")
    git(root, "commit", "-q", "-m", "first")
    return root


def digest_of_function(path: Path, name: str = "kw") -> str:
    namespace: dict = {}
    code = path.read_text()
    exec(compile(code, str(path), "exec"), namespace)
    lines = code.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    source = inspect.getblock(lines[start:])
    return hashlib.sha256("".join(source).encode()).hexdigest()


def dashboard_page(db_url: str, job_id: int) -> str:
    """The dashboard's page of a job, served in process."""
    from starlette.testclient import TestClient

    from jobman.web.app import create_app

    app = create_app(db_url, token="t" * 20)
    client = TestClient(
        app, base_url="http://127.0.0.1:8787" + app.state.base, headers={"Authorization": "token " + "t" * 20}
    )
    page = client.get(f"/e/{db_url.rpartition('table=')[2]}/job/{job_id}")
    assert page.status_code == 200, page.text
    return page.text


def job_ids(jobman, db_url: str) -> list[int]:
    out = jobman("list", db_url, "--format", "json")
    assert out.code == 0, out.err
    return sorted(j["id"] for j in json.loads(out.out))


def shown(jobman, db_url: str, job_id: int) -> dict:
    out = jobman("show", db_url, str(job_id), "--format", "json")
    assert out.code == 0, out.err
    return json.loads(out.out)


def schedule_and_run(jobman, db_url: str, repo: Path, *values: str, runs: Path, cwd: Path | None = None) -> None:
    out = jobman("sqlschedule", db_url, "mytrain.kw", *values, cwd=repo, env=NO_PATH)
    assert out.code == 0, out.err
    out = jobman("dispatch", db_url, "-j", "1", "--no-progress", "--exproot", str(runs), cwd=cwd or repo, env=NO_PATH)
    assert out.code == 0, out.err


def test_a_job_of_a_clean_tree_records_its_commit_source_and_environment(db_url, repo, tmp_path, jobman):
    schedule_and_run(jobman, db_url, repo, "lr={{0.1,0.2}}", runs=tmp_path / "runs")
    first = job_ids(jobman, db_url)[0]
    data = shown(jobman, db_url, first)
    assert data["status"] == "DONE"
    code, env = data["code"], data["environment"]
    assert code["commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert code["dirty"] is False and "diff" not in code
    assert code["repo"] == str(repo.resolve())
    assert code["source"] == digest_of_function(repo / "mytrain.py")
    assert code["where"] == str(repo.resolve())
    assert env["python"] == platform.python_version()
    assert env["host"] == socket.gethostname() == data["host"]
    assert env["jobman"] == __import__("jobman").__version__
    packages = jobman("show", db_url, str(first), "--packages")
    assert packages.code == 0 and "sqlalchemy==" in packages.out.lower()
    assert hashlib.sha256(packages.out.encode()).hexdigest() == env["packages"]
    text = jobman("show", db_url, str(first))
    assert f"git       {code['commit'][:12]} clean" in text.out, text.out
    nodiff = jobman("show", db_url, str(first), "--diff")
    assert nodiff.code != 0 and nodiff.err.startswith(f"jobman: job {first} ran a tree without uncommitted changes")
    assert "Traceback" not in nodiff.err


def test_uncommitted_changes_are_recorded_and_their_diff_kept_once(db_url, repo, tmp_path, jobman):
    with (repo / "mytrain.py").open("a") as fh:
        fh.write("\n# tried a smaller width\n")
    schedule_and_run(jobman, db_url, repo, "lr={{0.1,0.2,0.3}}", runs=tmp_path / "runs")
    ids = job_ids(jobman, db_url)
    records = [shown(jobman, db_url, i) for i in ids]
    assert all(r["code"]["dirty"] is True for r in records)
    assert len({r["code"]["diff"] for r in records}) == 1
    diff = jobman("show", db_url, str(ids[1]), "--diff")
    assert diff.code == 0 and diff.out == git(repo, "diff", "HEAD")
    assert "+# tried a smaller width" in diff.out
    assert "uncommitted changes (--diff)" in jobman("show", db_url, str(ids[1])).out
    store = Store.open(db_url)
    try:
        with store.engine.connect() as conn:
            kept = conn.execute(
                sa.select(sa.func.count())
                .select_from(code_text)
                .where(code_text.c.digest == records[0]["code"]["diff"])
            ).scalar()
    finally:
        store.dispose()
    assert kept == 1
    page = dashboard_page(db_url, ids[1])
    assert f"<code>{records[1]['code']['commit'][:12]}</code> with uncommitted changes" in page
    assert "+# tried a smaller width" in page and f"<td>{platform.python_version()}</td>" in page


def test_a_target_edited_between_two_schedules_is_noticed_and_rerun_on_request(db_url, repo, tmp_path, jobman):
    runs = tmp_path / "runs"
    schedule_and_run(jobman, db_url, repo, "lr={{0.1,0.2}}", runs=runs)
    first = job_ids(jobman, db_url)[0]
    before = shown(jobman, db_url, first)
    assert before["results"] == {"loss": pytest.approx(0.4)}
    (repo / "mytrain.py").write_text(textwrap.dedent(EDITED))
    again = jobman("sqlschedule", db_url, "mytrain.kw", "lr={{0.1,0.2,0.3}}", cwd=repo, env=NO_PATH)
    assert again.code == 0, again.err
    assert "2 of these jobs ran an older mytrain.kw; --rerun-changed runs them again" in again.out, again.out
    assert shown(jobman, db_url, first)["status"] == "DONE"  # said, not done
    rerun = jobman("sqlschedule", db_url, "mytrain.kw", "lr={{0.1,0.2,0.3}}", "--rerun-changed", cwd=repo, env=NO_PATH)
    assert rerun.code == 0 and "2 of these jobs ran an older mytrain.kw: queued again" in rerun.out, rerun.out
    job = shown(jobman, db_url, first)
    assert job["status"] == "QUEUED"
    assert any(e["data"] and "0.4" in json.dumps(e["data"]) for e in job["events"])  # the old results kept
    out = jobman("dispatch", db_url, "-j", "1", "--no-progress", "--exproot", str(runs), cwd=repo, env=NO_PATH)
    assert out.code == 0, out.err
    after = shown(jobman, db_url, first)
    assert after["results"] == {"loss": pytest.approx(4.0)}
    assert after["code"]["source"] == digest_of_function(repo / "mytrain.py") != before["code"]["source"]
    quiet = jobman("sqlschedule", db_url, "mytrain.kw", "lr={{0.1,0.2,0.3}}", cwd=repo, env=NO_PATH)
    assert "older" not in quiet.out, quiet.out


def test_dispatch_from_another_directory_finds_the_target_where_it_was_scheduled(db_url, repo, tmp_path, jobman):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    schedule_and_run(jobman, db_url, repo, "lr={{0.1,0.2,0.3}}", runs=tmp_path / "runs", cwd=elsewhere)
    listing = jobman("list", db_url, "--format", "json")
    assert [j["status"] for j in json.loads(listing.out)] == ["DONE"] * 3, listing.out


def test_a_target_that_cannot_be_imported_stops_dispatch_and_leaves_its_jobs_queued(db_url, repo, tmp_path, jobman):
    out = jobman("sqlschedule", db_url, "mytrain.kw", "lr={{1,2,3,4,5,6}}", cwd=repo, env=NO_PATH)
    assert out.code == 0, out.err
    (repo / "mytrain.py").rename(repo / "mytrain.py.moved")
    out = jobman(
        "dispatch", db_url, "-j", "1", "--no-progress", "--exproot", str(tmp_path / "runs"), cwd=tmp_path, env=NO_PATH
    )
    assert out.code != 0
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "cannot import module 'mytrain'" in lines[0], out.err
    assert "its other jobs are left QUEUED" in lines[0] and "Traceback" not in out.err
    statuses = [j["status"] for j in json.loads(jobman("list", db_url, "--format", "json").out)]
    assert statuses.count("FAILED") == 1 and statuses.count("QUEUED") == 5, statuses


def test_a_job_recorded_before_code_was_kept_says_its_code_is_unknown(db_url, jobman):
    store = Store.open(db_url)
    try:
        store.schedule([JobSpec(0, "fn", "mytrain:kw", {"lr": 0.1}, None)])
        claimed = store.claim(WorkerInfo.here())
        assert claimed is not None
        assert store.finish(claimed.job.id, claimed.lease, "DONE", results={"loss": 0.4}) is Status.DONE
        job_id = claimed.job.id
    finally:
        store.dispose()
    data = shown(jobman, db_url, job_id)
    assert data["code"] is None and data["environment"] is None
    assert (
        "code      unknown: its run was recorded before jobman kept the code" in jobman("show", db_url, str(job_id)).out
    )
    out = jobman("show", db_url, str(job_id), "--diff")
    assert (
        out.code != 0 and out.err.startswith(f"jobman: job {job_id} has no code record") and "Traceback" not in out.err
    )


def test_from_python_an_edited_function_is_a_new_call_and_a_version_pins_one(db_url, tmp_path, monkeypatch):
    name = f"callee_{uuid.uuid4().hex[:8]}"
    path = tmp_path / f"{name}.py"
    path.write_text("def f(x):\n    return {'y': x + 1}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    callee = importlib.import_module(name)
    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")
    try:
        first = exp.call(callee.f, x=1)
        assert first.result() == {"y": 2}
        assert exp.call(callee.f, x=1).job_id == first.job_id  # the same code: the same call
        pinned = exp.call(callee.f, x=1, version="v1")
        assert pinned.job_id != first.job_id and pinned.result() == {"y": 2}
        path.write_text("def f(x):\n    return {'y': x + 10}\n")
        importlib.reload(callee)
        changed = exp.call(callee.f, x=1)
        assert changed.job_id != first.job_id and changed.result() == {"y": 11}
        assert exp.call(callee.f, x=1, version="v1").result() == {"y": 2}  # pinned: answered as before
        record = exp.store.job(changed.job_id).code
        assert record is not None
        assert record["code"]["source"] == hashlib.sha256(inspect.getsource(callee.f).encode()).hexdigest()
        assert record["environment"]["python"] == platform.python_version()
    finally:
        exp.close()


def test_from_python_a_call_recorded_before_code_was_part_of_its_identity_still_answers(db_url, tmp_path, monkeypatch):
    name = f"callee_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("def f(x):\n    return {'y': x + 1}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    callee = importlib.import_module(name)
    store = Store.open(db_url)
    try:  # recorded as a call was before: under the plain target, with no code record
        store.schedule([JobSpec(0, "fn", f"{name}:f", {"x": 5}, None)])
        claimed = store.claim(WorkerInfo.here())
        assert claimed is not None
        store.finish(claimed.job.id, claimed.lease, "DONE", results={"y": 100})
    finally:
        store.dispose()
    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")
    try:
        old = exp.call(callee.f, x=5)
        assert (old.job_id, old.result()) == (claimed.job.id, {"y": 100})
        assert exp.call(callee.f, x=6).result() == {"y": 7}  # a new call gets the code in its identity
        assert len(exp.store.jobs()) == 2
    finally:
        exp.close()


SEEDED = """
def kw(lr, seed=0):
    return {"loss": lr + seed / 100}
"""


def test_report_says_when_the_runs_of_one_configuration_ran_different_code(db_url, repo, tmp_path, jobman):
    (repo / "mytrain.py").write_text(textwrap.dedent(SEEDED))
    git(repo, "commit", "-q", "-am", "seeded")
    runs = tmp_path / "runs"
    schedule_and_run(jobman, db_url, repo, "lr={{0.1,0.2}}", "seed={{1,2}}", runs=runs)
    alone = jobman("report", db_url, "--metric", "loss")
    assert alone.code == 0 and "versions of the code" not in alone.out, alone.out
    (repo / "mytrain.py").write_text(textwrap.dedent(SEEDED).replace("seed / 100", "seed / 1000"))
    out = jobman("sqlschedule", db_url, "mytrain.kw", "lr=0.1", "seed={{3,4}}", cwd=repo, env=NO_PATH)
    assert out.code == 0, out.err
    out = jobman("dispatch", db_url, "-j", "1", "--no-progress", "--exproot", str(runs), cwd=repo, env=NO_PATH)
    assert out.code == 0, out.err
    mixed = jobman("report", db_url, "--metric", "loss")
    assert mixed.code == 0, mixed.err
    lines = [line for line in mixed.out.splitlines() if "versions of the code" in line]
    assert len(lines) == 1 and lines[0].startswith("lr=0.1: its runs ran 2 versions of the code (jobs "), mixed.out


def test_a_command_job_records_the_git_state_of_the_directory_it_was_scheduled_from(db_url, repo, tmp_path, jobman):
    (repo / "train_cli.py").write_text("import sys\nprint(sys.argv)\n")
    git(repo, "add", "train_cli.py")
    git(repo, "commit", "-q", "-m", "cli")
    (repo / "train_cli.py").write_text("import sys\nprint('changed', sys.argv)\n")
    out = jobman("sqlschedule", db_url, "--cmd", "python3 train_cli.py", "lr={{1,2}}", cwd=repo, env=NO_PATH)
    assert out.code == 0, out.err
    out = jobman("dispatch", db_url, "-j", "1", "--no-progress", "--exproot", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.code == 0, out.err
    data = shown(jobman, db_url, job_ids(jobman, db_url)[0])
    assert data["status"] == "DONE"
    assert data["code"]["commit"] == git(repo, "rev-parse", "HEAD").strip() and data["code"]["dirty"] is True
    assert data["code"]["where"] == str(repo) and data["environment"]["python"] == platform.python_version()


def test_a_target_that_cannot_be_imported_leaves_its_jobs_queued_and_the_other_targets_run(
    db_url, repo, tmp_path, jobman
):
    (repo / "good.py").write_text(textwrap.dedent(SOURCE))
    for target in ("mytrain.kw", "good.kw"):  # the broken target's jobs first: both workers meet them
        out = jobman("sqlschedule", db_url, target, "lr={{1,2,3,4,5,6}}", cwd=repo, env=NO_PATH)
        assert out.code == 0, out.err
    (repo / "mytrain.py").rename(repo / "mytrain.py.moved")
    out = jobman(
        "dispatch", db_url, "-j", "2", "--no-progress", "--exproot", str(tmp_path / "runs"), cwd=tmp_path, env=NO_PATH
    )
    assert out.code == 4, (out.code, out.err)
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "cannot import module 'mytrain'" in lines[0], out.err
    assert "its other jobs are left QUEUED" in lines[0] and "Traceback" not in out.err
    jobs = json.loads(jobman("list", db_url, "--format", "json").out)
    by_target: dict[str, list[str]] = {}
    for job in jobs:
        by_target.setdefault(job["target"], []).append(job["status"])
    assert by_target["good:kw"] == ["DONE"] * 6, by_target
    broken = by_target["mytrain:kw"]
    assert broken.count("FAILED") == 1 and broken.count("QUEUED") == 5, broken
    (repo / "mytrain.py.moved").rename(repo / "mytrain.py")  # fixed: the jobs left QUEUED run
    again = jobman(
        "dispatch", db_url, "-j", "2", "--no-progress", "--exproot", str(tmp_path / "runs"), cwd=tmp_path, env=NO_PATH
    )
    assert again.code == 1 and "11 DONE, 1 FAILED" in again.err, again.err  # the one FAILED stays so
    jobs = json.loads(jobman("list", db_url, "--format", "json").out)
    assert sorted(j["status"] for j in jobs if j["target"] == "mytrain:kw") == ["DONE"] * 5 + ["FAILED"]
    assert {j["attempt"] for j in jobs if j["status"] == "DONE"} == {1}  # none left QUEUED spent an attempt

"""The artifact store: values JSON cannot hold and files a job attaches, kept once by content.

Real databases (SQLite, and PostgreSQL with a shared folder named in its URL), real workers and
the real ``jobman`` command; the store is a real folder, attacked with real symbolic links.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

import jobman as jobman_api
from jobman.jobdb import artifacts
from jobman.jobdb.artifacts import REF, ArtifactError, ArtifactStore
from jobman.jobdb.errors import JobmanError, UsageError
from jobman.jobdb.store import Store
from jobman.jobdb.url import parse_db

MOD = """
    import threading
    import numpy as np

    class Model:
        def __init__(self, width):
            self.width = width

    def values(seed):
        return {
            "weights": np.arange(12.0).reshape(3, 4) * seed,
            "model": Model(seed),
            "lock": threading.Lock(),
            "loss": 0.5,
        }

    def attaching(state, channel):
        with open("curve.csv", "w") as fh:
            fh.write("step,loss\\n1,0.5\\n")
        channel.attach("curve", "curve.csv")
        channel.attach("table", {"a": [1, 2], "b": np.ones(2)})
        state.acc = 0.75

    def resumes(state, channel):
        if "model" not in state:  # the first run: checkpoint a model and an array, then stop
            state.model = Model(7)
            state.w = np.arange(3)
            channel.save()
            return channel.INCOMPLETE
        state.seen = [type(state.model).__name__, state.model.width, state.w.tolist()]

    def same(seed):
        return {"shared": np.zeros(1000), "own": np.full(10, seed)}
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def art_url(request, tmp_path: Path) -> str:
    """A fresh experiment: on SQLite (its store beside the file), and on a PostgreSQL database of the
    test's own (its store a folder named in the URL, as a cluster's shared one is)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'runs.db'}?table=art"
    base = request.getfixturevalue("own_pg_database")
    return f"{base}?table=art&artifacts={tmp_path / 'shared' / 'artifacts'}"


@pytest.fixture
def artmod(tmp_path: Path, monkeypatch) -> Path:
    """The jobs' module, beside the database, importable here too (a future is read from Python)."""
    (tmp_path / "artmod.py").write_text(textwrap.dedent(MOD))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "artmod.py"


def store_dir(url: str, tmp_path: Path) -> Path:
    return tmp_path / "runs.artifacts" if url.startswith("sqlite") else tmp_path / "shared" / "artifacts"


def files_in(root: Path) -> list[Path]:
    return sorted(p for p in (root / "sha256").rglob("*") if p.is_file()) if root.exists() else []


def run_worker(jobman, url: str, tmp_path: Path) -> None:
    out = jobman("worker", url, "--exproot", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.code == 0, out.err


# -- where the store is -----------------------------------------------------------------------------


def test_the_store_is_beside_a_sqlite_file_else_where_the_url_or_environment_says(tmp_path, monkeypatch):
    monkeypatch.delenv("JOBMAN_ARTIFACTS", raising=False)
    sqlite = parse_db(f"sqlite:///{tmp_path}/runs.db?table=x")
    assert artifacts.for_database(sqlite).root == tmp_path / "runs.artifacts"
    pg = parse_db("postgresql://u@h/db?table=x")
    assert artifacts.for_database(pg, tmp_path / "exproot").root == tmp_path / "exproot" / "_artifacts"
    named = parse_db(f"postgresql://u@h/db?table=x&artifacts={tmp_path}/shared")
    assert named.artifacts == f"{tmp_path}/shared" and "artifacts=" in named.with_table()
    assert "artifacts" not in named.sqlalchemy_url  # never handed to the driver
    assert artifacts.for_database(named).root == tmp_path / "shared"
    monkeypatch.setenv("JOBMAN_ARTIFACTS", str(tmp_path / "env"))
    assert artifacts.for_database(sqlite).root == tmp_path / "env"
    assert artifacts.for_database(named).root == tmp_path / "shared"  # the URL's own word first


def test_an_fsspec_url_without_fsspec_is_one_sentence(tmp_path):
    try:  # fsspec is an optional extra: without it, one sentence; with it, the store works through it
        import fsspec  # noqa: F401
    except ImportError:
        with pytest.raises(UsageError, match=r"needs fsspec: pip install"):
            artifacts.open_store("s3://bucket/prefix")
    else:
        store = artifacts.open_store("memory://jobman-test/store")
        ref = store.put_object(np.arange(4))
        assert store.put_object(np.arange(4)) == ref  # once by content there too
        assert (store.load(ref) == np.arange(4)).all()
        assert [d for d, _s, _m in store.digests()] == [ref[REF]]
        # A job run here (inline) keeps its array there, and the future reads it back.
        url = f"sqlite:///{tmp_path / 'runs.db'}?table=remote&artifacts=memory://jobman-test/jobs"
        exp = jobman_api.Experiment(url, backend="inline", exproot=tmp_path / "runs")
        got = exp.call(lambda n: {"x": np.arange(n)}, n=5).result(timeout=60)
        assert got["x"].tolist() == [0, 1, 2, 3, 4]
        exp.close()
        assert len(list(artifacts.open_store("memory://jobman-test/jobs").digests())) == 1
        assert store.remove(ref[REF]) and not store.has(ref[REF])


# -- the store itself -------------------------------------------------------------------------------


def test_equal_artifacts_are_stored_once_and_read_back_whole(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    a = store.put_object(np.arange(1000.0))
    b = store.put_object(np.arange(1000.0))
    c = store.put_object(np.arange(1001.0))
    assert a == b and a[REF] != c[REF] and a["kind"] == "npy"
    assert len(files_in(tmp_path / "store")) == 2
    assert (store.load(a) == np.arange(1000.0)).all()
    assert list((tmp_path / "store" / "tmp").iterdir()) == []  # nothing left half-written
    with pytest.raises(TypeError, match="cannot be pickled"):
        store.put_object(iter(open(__file__)))


def test_nothing_is_read_outside_the_store(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    ref = store.put_bytes(b"mine")
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    for name in ("../secret.txt", "/etc/passwd", "a" * 63, "A" * 64, ref.digest + "/.."):
        with pytest.raises(ArtifactError, match="not an artifact digest"):
            store.open(name)
    # A link planted where an artifact should be is never followed, for a file or a folder.
    forged = "f" * 64
    (tmp_path / "store" / "sha256" / "ff").mkdir()
    os.symlink(secret, tmp_path / "store" / "sha256" / "ff" / forged)
    with pytest.raises(ArtifactError, match="cannot be read"):
        store.open(forged)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(secret, outside / ("e" * 64))
    os.symlink(outside, tmp_path / "store" / "sha256" / "ee")
    with pytest.raises(ArtifactError, match="cannot be read"):
        store.open("e" * 64)
    assert store.get_bytes(ref.digest) == b"mine"
    # Storing the same content over a planted link replaces the link, never writes through it.
    planted = hashlib_hex(b"over")
    (tmp_path / "store" / "sha256" / planted[:2]).mkdir(exist_ok=True)
    os.symlink(secret, tmp_path / "store" / "sha256" / planted[:2] / planted)
    store.put_bytes(b"over")
    assert secret.read_text() == "not yours" and store.get_bytes(planted) == b"over"


def hashlib_hex(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


# -- jobs: results and attachments ------------------------------------------------------------------


def test_a_workers_job_keeps_arrays_and_objects_naming_only_what_cannot_be_pickled(art_url, artmod, tmp_path, jobman):
    for target in ("artmod:values", "artmod:attaching"):
        out = jobman("sqlschedule", art_url, target, "seed=2", cwd=tmp_path)
        assert out.code == 0, out.err
    run_worker(jobman, art_url, tmp_path)
    jobs = {j.target: j for j in Store.open(art_url).jobs()}
    values, attaching = jobs["artmod:values"], jobs["artmod:attaching"]
    assert values.status == "DONE" and attaching.status == "DONE", (values.error, attaching.error)
    assert values.results is not None and attaching.results is not None
    assert values.results["loss"] == 0.5
    assert values.results["_not_kept"] == {"lock": "lock cannot be pickled: cannot pickle '_thread.lock' object"}
    assert values.results["weights"]["kind"] == "npy" and values.results["model"]["type"] == "artmod.Model"
    assert attaching.results["curve"]["kind"] == "file" and attaching.results["curve"]["filename"] == "curve.csv"
    assert attaching.results["acc"] == 0.75
    assert len(files_in(store_dir(art_url, tmp_path))) == 4  # weights, model, curve, table

    # From Python, each is itself again.
    exp = jobman_api.Experiment(art_url, backend=None, exproot=tmp_path / "runs")
    got = exp.call("artmod:values", seed=2).result(timeout=60)
    assert isinstance(got["weights"], np.ndarray) and (got["weights"] == np.arange(12.0).reshape(3, 4) * 2).all()
    assert type(got["model"]).__name__ == "Model" and got["model"].width == 2
    rows = {r["target"]: r for r in exp.results(as_frame=False)}
    table = rows["artmod:attaching"]["results_table"]
    assert table["a"] == [1, 2] and (table["b"] == np.ones(2)).all()
    assert rows["artmod:attaching"]["results_curve"].read_bytes() == b"step,loss\n1,0.5\n"
    exp.close()

    # jobman show lists them and says how to fetch one; jobman artifact fetches it.
    shown = jobman("show", art_url, str(values.id), cwd=tmp_path)
    assert shown.code == 0, shown.err
    assert "artifacts" in shown.out and "array (.npy)" in shown.out and "pickled artmod.Model" in shown.out
    assert f"jobman artifact '{parse_db(art_url).with_table()}' {values.id} NAME -o PATH" in shown.out
    data = json.loads(jobman("show", art_url, str(values.id), "--format", "json", cwd=tmp_path).out)
    assert [a["name"] for a in data["artifacts"]] == ["model", "weights"]
    fetched = jobman("artifact", art_url, str(values.id), "weights", "-o", str(tmp_path / "w.npy"), cwd=tmp_path)
    assert fetched.code == 0, fetched.err
    assert (np.load(tmp_path / "w.npy") == np.arange(12.0).reshape(3, 4) * 2).all()
    into_folder = jobman("artifact", art_url, str(attaching.id), "curve", "-o", str(tmp_path), cwd=tmp_path)
    assert into_folder.code == 0 and (tmp_path / "curve.csv").read_text() == "step,loss\n1,0.5\n"
    to_stdout = jobman("artifact", art_url, str(attaching.id), "curve", cwd=tmp_path)
    assert to_stdout.code == 0 and to_stdout.out == "step,loss\n1,0.5\n"


def test_a_resumed_job_finds_the_objects_it_checkpointed_not_references(art_url, artmod, tmp_path, jobman):
    jobman("sqlschedule", art_url, "artmod:resumes", "seed=1", cwd=tmp_path)
    run_worker(jobman, art_url, tmp_path)
    (job,) = Store.open(art_url).jobs()
    assert job.status == "DONE" and job.attempt == 1, job.error
    assert job.results is not None and job.results["seen"] == ["Model", 7, [0, 1, 2]]
    assert job.results["model"]["kind"] == "pickle"  # still a reference in the database


def test_bad_requests_for_an_artifact_are_one_sentence(art_url, artmod, tmp_path, jobman):
    jobman("sqlschedule", art_url, "artmod:values", "seed=1", cwd=tmp_path)
    run_worker(jobman, art_url, tmp_path)
    job_id = Store.open(art_url).jobs()[0].id
    for args, said in (
        ((str(job_id), "nope"), f"job {job_id} has no artifact 'nope' (its artifacts: model, weights)"),
        (("999999", "weights"), "no job 999999"),
        ((str(job_id), "weights", "-o", str(tmp_path / "no" / "such" / "w.npy")), "there is no folder"),
        ((str(job_id),), "give a job id and an artifact name"),
    ):
        out = jobman("artifact", art_url, *args, cwd=tmp_path)
        assert out.code != 0 and said in out.err and "Traceback" not in out.err, out.err
        assert len(out.err.strip().splitlines()[-1]) < 200
    assert not (tmp_path / "no").exists()


def test_from_python_an_array_comes_back_an_array_and_cached_too(art_url, tmp_path):
    exp = jobman_api.Experiment(art_url, backend="inline", exproot=tmp_path / "runs")

    def features(n):
        return {"x": np.arange(n) * 1.5, "n": n, "by_pair": {(0, 1): "a"}, "ring": ring()}

    def ring():
        node: dict = {"name": "r"}
        node["self"] = node
        return node

    first = exp.call(features, n=4).result(timeout=60)
    assert isinstance(first["x"], np.ndarray) and first["x"].tolist() == [0.0, 1.5, 3.0, 4.5]
    assert first["by_pair"] == {(0, 1): "a"}  # keys JSON cannot hold: the dict kept whole
    assert first["ring"]["self"] is first["ring"]  # a cycle too
    again = exp.call(features, n=4).result(timeout=60)  # answered from the database
    assert (again["x"] == first["x"]).all()
    exp.close()

    calls = []

    @jobman_api.cached(art_url.replace("table=art", "table=cache"), exproot=tmp_path / "runs")
    def feats(n):
        calls.append(n)
        return np.ones(n)

    assert (feats(3) * 2).tolist() == [2.0, 2.0, 2.0]  # an array, not a list repeated
    assert (feats(3) * 2).tolist() == [2.0, 2.0, 2.0] and calls == [3]


def test_a_value_nothing_can_keep_is_an_error_of_the_cached_call(art_url, tmp_path):
    import threading

    @jobman_api.cached(art_url, exproot=tmp_path / "runs")
    def locked(n):
        return threading.Lock()

    with pytest.raises(JobmanError, match="the value locked\\(\\) returned could not be kept"):
        locked(1)


def test_a_store_that_cannot_be_written_loses_only_what_needed_it(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")
    url = f"sqlite:///{tmp_path / 'runs.db'}?table=t&artifacts={tmp_path / 'a-file' / 'store'}"
    exp = jobman_api.Experiment(url, backend="inline", exproot=tmp_path / "runs")
    got = exp.call(lambda seed: {"w": np.ones(3), "loss": 0.1}, seed=1).result(timeout=60)
    assert got["loss"] == 0.1 and got["_not_kept"]["w"].startswith("the artifact store could not keep it: ")
    assert "Not a directory" in got["_not_kept"]["w"]
    exp.close()


# -- reclaiming -------------------------------------------------------------------------------------


def test_rm_removes_only_what_no_other_job_refers_to_and_gc_the_rest(art_url, artmod, tmp_path, jobman):
    jobman("sqlschedule", art_url, "artmod:same", "seed={{1,2}}", cwd=tmp_path)
    run_worker(jobman, art_url, tmp_path)
    root = store_dir(art_url, tmp_path)
    first, second = Store.open(art_url).jobs()
    assert first.results is not None and second.results is not None
    shared = first.results["shared"][REF]
    assert shared == second.results["shared"][REF]
    assert len(files_in(root)) == 3  # one shared array, each job's own

    # Deleting the first job takes its own array, never the one the second refers to too.
    out = jobman("rm", art_url, str(first.id), "--yes", cwd=tmp_path)
    assert out.code == 0 and "1 artifact(s) no other job refers to removed" in out.out, out.out + out.err
    left = {p.name for p in files_in(root)}
    assert left == {shared, second.results["own"][REF]}
    exp = jobman_api.Experiment(art_url, backend=None, exproot=tmp_path / "runs")
    assert (exp.call("artmod:same", seed=2).result(timeout=60)["shared"] == np.zeros(1000)).all()
    exp.close()

    # gc removes what nothing refers to (a crashed job's leftover), and keeps what is referred to.
    orphan = ArtifactStore(root).put_bytes(b"left by a job that crashed").digest
    dry = jobman("gc", art_url, "--dry-run", cwd=tmp_path)
    assert dry.code == 0 and "would remove 1 artifact(s)" in dry.out and orphan in {p.name for p in files_in(root)}
    collected = jobman("gc", art_url, cwd=tmp_path)
    assert collected.code == 0 and "removed 1 artifact(s)" in collected.out, collected.out + collected.err
    assert {p.name for p in files_in(root)} == left

    # A reset moves results into the event log: what they refer to is still referred to.
    store = Store.open(art_url)
    store.reset([second.id], why="again")
    assert store.job(second.id).results is None
    assert jobman("gc", art_url, cwd=tmp_path).code == 0
    assert {p.name for p in files_in(root)} == left

    # What a running job may have just written is not garbage yet.
    jobman("sqlschedule", art_url, "artmod:same", "seed=3", cwd=tmp_path)
    from jobman.jobdb.store import WorkerInfo

    claimed = store.claim(WorkerInfo.here(), str(tmp_path / "runs"))
    assert claimed is not None
    fresh = ArtifactStore(root).put_bytes(b"being written by a running job").digest
    # The kernel stamps a file from a clock that advances once a tick: a file written just after
    # the job started may carry a time a little before it.
    started = store.job(claimed.job.id).started_at
    assert started is not None
    fresh_path = root / "sha256" / fresh[:2] / fresh
    os.utime(fresh_path, (started - 0.5, started - 0.5))
    kept = jobman("gc", art_url, cwd=tmp_path)
    assert kept.code == 0 and "removed 0 artifact(s)" in kept.out and fresh in {p.name for p in files_in(root)}
    store.dispose()


# -- the dashboard ----------------------------------------------------------------------------------


def test_the_dashboard_offers_a_jobs_artifacts_behind_its_token_and_nothing_else(art_url, artmod, tmp_path, jobman):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from jobman.web.app import create_app

    jobman("sqlschedule", art_url, "artmod:attaching", "seed=1", cwd=tmp_path)
    run_worker(jobman, art_url, tmp_path)
    job_id = Store.open(art_url).jobs()[0].id
    token = "artifact-token-0123456789"
    app = create_app(art_url, token=token)
    base = "http://127.0.0.1:8787" + app.state.base
    anonymous = TestClient(app, base_url=base, follow_redirects=False)
    client = TestClient(app, base_url=base, headers={"Authorization": f"token {token}"}, follow_redirects=False)
    path = f"/e/art/job/{job_id}/artifact/curve"
    assert anonymous.get(path).status_code == 403
    got = client.get(path)
    assert got.status_code == 200 and got.content == b"step,loss\n1,0.5\n"
    assert "curve.csv" in got.headers["content-disposition"]
    page = client.get(f"/e/art/job/{job_id}")
    assert page.status_code == 200 and f'href="{app.state.base}{path}"' in page.text
    for name in ("../../../../etc/passwd", "%2e%2e/%2e%2e/etc/passwd", "nope", "_not_kept"):
        assert client.get(f"/e/art/job/{job_id}/artifact/{name}").status_code == 404

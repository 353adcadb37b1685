"""Files a job controls, read by the worker, the monitor and the dashboard: a symlink to /dev/zero or
out of the workdir, a FIFO, a huge file must neither hang nor flood the reader, nor show what lies
outside the job's folder. Real files, FIFOs and processes; real databases where one is involved."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobman.dispatch.interrupted import interruption, mark_interrupted
from jobman.dispatch.jobfiles import NotReadable, copy_tree, read_capped, read_tail
from jobman.jobdb.records import WorkerInfo
from jobman.jobdb.status import Status
from jobman.jobdb.sweep import JobSpec

SECRET = "not-for-the-job-s-eyes"


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``, which must return within ``seconds`` (a read that blocks on a FIFO does not)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((fn(), None))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, as if called here
            box.append((None, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds} s"
    value, error = box[0]
    if error is not None:
        raise error
    return value


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET)
    path = tmp_path / "runs" / "exp" / "1"
    path.mkdir(parents=True)
    return path


def test_a_read_takes_regular_files_inside_the_root_only_and_a_bounded_tail(workdir: Path):
    (workdir / "zero").symlink_to("/dev/zero")
    (workdir / "out").symlink_to(workdir.parents[2] / "outside.txt")
    os.mkfifo(workdir / "fifo")
    for name in ("zero", "out", "fifo"):
        with pytest.raises(NotReadable):
            within(5, lambda name=name: read_tail(workdir / name, workdir, 100))
    (workdir / "big").write_bytes(b"a" * 1_000_000 + b"THE END")
    assert read_tail(workdir / "big", workdir, 7) == b"THE END"
    (workdir / "inner").symlink_to("big")  # a symlink that stays inside is followed
    assert read_tail(workdir / "inner", workdir, 3) == b"END"
    with pytest.raises(NotReadable, match="more than 100 bytes"):
        read_capped(workdir / "big", workdir, 100)


def test_an_interruption_mark_that_is_not_a_small_file_reads_as_no_mark(workdir: Path):
    (workdir / ".jobman-interrupted-3").symlink_to("/dev/zero")
    os.mkfifo(workdir / ".jobman-interrupted-4")
    assert within(5, lambda: interruption(workdir, 3)) is None
    assert within(5, lambda: interruption(workdir, 4)) is None
    (workdir / ".jobman-interrupted-5").symlink_to(workdir.parents[2] / "outside.txt")
    assert interruption(workdir, 5) is None
    # nor is a mark written through a symlink the job left in its place
    assert mark_interrupted(workdir, 5, "the database is gone") is False
    assert (workdir.parents[2] / "outside.txt").read_text() == SECRET
    assert mark_interrupted(workdir, 6, "the database is gone")
    assert interruption(workdir, 6) == "the database is gone"


def test_a_copied_workdir_keeps_symlinks_as_symlinks_skips_fifos_and_is_capped(workdir: Path, tmp_path: Path):
    (workdir / "weights.bin").write_bytes(b"w" * 1000)
    (workdir / "sub").mkdir()
    (workdir / "sub" / "ckpt").write_text("step 5")
    (workdir / "zero").symlink_to("/dev/zero")
    (workdir / "etc").symlink_to("/etc")
    os.mkfifo(workdir / "fifo")
    dest = tmp_path / "child"
    dest.mkdir()
    assert within(10, lambda: copy_tree(workdir, dest)) == 1006
    assert (dest / "weights.bin").read_bytes() == b"w" * 1000 and (dest / "sub" / "ckpt").read_text() == "step 5"
    assert os.readlink(dest / "zero") == "/dev/zero" and os.readlink(dest / "etc") == "/etc"
    assert not (dest / "fifo").exists()
    capped = tmp_path / "capped"
    capped.mkdir()
    with pytest.raises(NotReadable, match="more than 500 bytes"):
        copy_tree(workdir, capped, limit=500)


SCRIPT = textwrap.dedent('''
    """A command job that turns the files its worker reads into traps."""
    import os
    import sys

    what = sys.argv[sys.argv.index("--trap") + 1]
    if what == "stderr":
        os.remove("stderr.txt")
        os.symlink("/dev/zero", "stderr.txt")
        sys.exit(1)
    path = os.environ["JOBMAN_RESULTS"]
    if what == "results-zero":
        os.symlink("/dev/zero", path)
    elif what == "results-fifo":
        os.mkfifo(path)
    elif what == "results-outside":
        os.symlink(sys.argv[sys.argv.index("--outside") + 1], path)
''')


def test_a_command_job_cannot_trap_its_worker_with_its_stderr_or_results(jobman, db_url, store, tmp_path: Path):
    script = tmp_path / "trap.py"
    script.write_text(SCRIPT)
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"stolen": SECRET}))
    traps = ["stderr", "results-zero", "results-fifo", "results-outside"]
    specs = [
        JobSpec(
            phase=0,
            kind="cmd",
            target=f"{sys.executable} {script}",
            params={"trap": trap, "outside": str(outside)},
            parent=None,
        )
        for trap in traps
    ]
    ids = store.schedule(specs).job_ids
    worker = jobman("worker", db_url, "--exproot", str(tmp_path / "runs"), "--heartbeat", "0.2", timeout=120)
    assert worker.code == 0, worker.err
    jobs = {j.id: j for j in store.jobs()}
    for job_id, trap in zip(ids, traps):
        job = jobs[job_id]
        assert job.status is Status.FAILED, (trap, job.status, job.error)
        assert len(job.error) < 10_000 and SECRET not in job.error and SECRET not in str(job.results)
        if trap != "stderr":
            assert "$JOBMAN_RESULTS" in job.error, (trap, job.error)


def test_the_job_page_shows_files_inside_the_jobs_workdir_only(store, db_url, tmp_path: Path):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from jobman.web.app import create_app

    [job_id] = store.schedule([JobSpec(phase=0, kind="fn", target="m:f", params={}, parent=None)]).job_ids
    claimed = store.claim(WorkerInfo.here(backend="local", backend_id="1"), str(tmp_path / "runs" / store.experiment))
    assert claimed is not None
    workdir = Path(claimed.job.workdir)
    workdir.mkdir(parents=True)
    (tmp_path / "secret.txt").write_text(SECRET)
    (workdir / "stdout.txt").symlink_to(tmp_path / "secret.txt")
    os.mkfifo(workdir / "stderr.txt")
    (workdir / "peek").symlink_to(tmp_path / "secret.txt")
    token = "t" * 20
    app = create_app(db_url, token=token)
    client = TestClient(
        app, base_url="http://127.0.0.1:8787" + app.state.base, headers={"Authorization": f"token {token}"}
    )
    page = within(10, lambda: client.get(f"/e/{store.experiment}/job/{job_id}"))
    assert page.status_code == 200 and SECRET not in page.text
    assert "peek" in page.text  # listed, as a symlink, not read
    # a workdir changed in the database to another folder is not used
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stdout.txt").write_text(SECRET)
    (elsewhere / "private-file").write_text("x")
    with store.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(
            text("UPDATE job SET workdir = :w, log_path = :w WHERE id = :id"), {"w": str(elsewhere), "id": job_id}
        )
    page = within(10, lambda: client.get(f"/e/{store.experiment}/job/{job_id}"))
    assert page.status_code == 200 and SECRET not in page.text and "private-file" not in page.text

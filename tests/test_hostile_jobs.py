"""A job that sends its worker what it should not, or stops reading its answers, through real job
processes on real databases: each poison ends its own job FAILED with the reason, and the worker goes
on with the next job."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

MODULE = "jm_hostile_exp"

POISONS = textwrap.dedent('''
    """Jobs that write malformed messages on the socket that joins them to their worker."""
    import json
    import struct
    import time


    def _raw(channel, body):
        channel._sock.sendall(struct.pack("!I", len(body)) + body)
        time.sleep(30)  # the worker ends the job before this does


    def _send(channel, obj):
        _raw(channel, json.dumps(obj).encode())


    def bad_json(state, channel):
        _raw(channel, b"{not json")


    def not_utf8(state, channel):
        _raw(channel, b"\\xff\\xfe")


    def not_an_object(state, channel):
        _send(channel, [1, 2, 3])


    def too_deep(state, channel):
        _raw(channel, b"[" * 100000 + b"]" * 100000)


    def save_without_results(state, channel):
        _send(channel, {"op": "save"})


    def save_a_list(state, channel):
        _send(channel, {"op": "save", "results": [1]})


    def log_without_step(state, channel):
        _send(channel, {"op": "log", "metrics": {"loss": 1.0}})


    def log_a_text_metric(state, channel):
        _send(channel, {"op": "log", "step": 1, "metrics": {"loss": "low"}})


    def unknown_request(state, channel):
        _send(channel, {"op": "drop_tables"})


    def unknown_status(state, channel):
        _send(channel, {"op": "report", "status": "BOGUS", "results": {}, "error": None})


    def list_results(state, channel):
        _send(channel, {"op": "report", "status": "DONE", "results": [1, 2], "error": None})


    def oversized_length(state, channel):
        channel._sock.sendall(struct.pack("!I", 0xFFFFFFF0) + b"{}")
        time.sleep(30)


    def never_reads(state, channel):
        """Checkpoints on and on without ever reading the worker's answers."""
        body = json.dumps({"op": "save", "results": {"n": 1}}).encode()
        message = struct.pack("!I", len(body)) + body
        for _ in range(1_000_000):
            channel._sock.sendall(message)
        time.sleep(30)


    def ok(state, channel):
        channel.save()
        channel.log(1, loss=0.5)
        return {"fine": True, "loss": 0.5}
''')

POISON_WHY = {
    "bad_json": "not valid JSON",
    "not_utf8": "not valid JSON",
    "not_an_object": "a JSON list where an object belongs",
    "too_deep": "not valid JSON",
    "save_without_results": "a save with no results",
    "save_a_list": "a save with a list as results",
    "log_without_step": "a log whose step is not a 64-bit integer",
    "log_a_text_metric": "a log whose metric 'loss' is not a number",
    "unknown_request": "the unknown request 'drop_tables'",
    "unknown_status": "a report with the unknown status 'BOGUS'",
    "list_results": "a report with a list as results",
    "oversized_length": "over the limit",
}
BROKE_PROTOCOL = {
    **{name: "the job sent a malformed message: " for name in POISON_WHY},
    "never_reads": "the job stopped reading its worker's replies",
}


@pytest.fixture
def poisons(tmp_path: Path, jobs_per_process: int) -> dict[str, str]:
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / f"{MODULE}.py").write_text(POISONS)
    pythonpath = os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": pythonpath, "JOBMAN_JOBS_PER_PROCESS": str(jobs_per_process)}


def test_each_malformed_message_fails_its_job_and_the_worker_runs_the_next(
    jobman, db_url, store: Store, poisons, tmp_path
):
    # each poison is followed by a healthy job, which must run (in a fresh process when they are reused)
    order = [n for name in BROKE_PROTOCOL for n in (name, "ok")]
    specs = [
        JobSpec(phase=0, kind="fn", target=f"{MODULE}:{name}", params={"i": i}, parent=None)
        for i, name in enumerate(order)
    ]
    ids = store.schedule(specs, max_attempts=3).job_ids
    worker = jobman(
        "worker",
        db_url,
        "--exproot",
        str(tmp_path / "runs"),
        "--heartbeat",
        "0.2",
        "--grace",
        "2",
        env=poisons,
        timeout=300,
    )
    assert worker.code == 0, worker.err
    assert "Traceback" not in worker.err
    assert f"ran {len(order)} job(s)" in worker.err
    jobs = {j.id: j for j in store.jobs()}
    for job_id, name in zip(ids, order):
        job = jobs[job_id]
        if name == "ok":
            assert job.status is Status.DONE and job.results == {"fine": True, "loss": 0.5}, (name, job.error)
            continue
        assert job.status is Status.FAILED, (name, job.status, job.error)
        assert job.attempt == 1  # an attempt was spent: the job is not put back for free
        assert job.error.startswith(BROKE_PROTOCOL[name]), (name, job.error)
        assert POISON_WHY.get(name, "") in job.error, (name, job.error)
        assert any(BROKE_PROTOCOL[name].strip(": ") in (e.why or "") for e in store.events(job_id)), name
    # every reader of the experiment still works
    assert jobman("list", db_url).code == 0
    assert jobman("report", db_url, "--metric", "loss").code == 0


THREADS_AND_FORKS = textwrap.dedent('''
    """A job that checkpoints from several threads at once, and one whose forked child tries to."""
    import os
    import threading


    def from_threads(state, channel):
        def work(k):
            for i in range(50):
                state[f"t{k}"] = i
                channel.save()
                channel.log(i, **{f"loss{k}": float(i)})
        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {f"t{k}": state[f"t{k}"] for k in range(8)}


    def from_a_child(state, channel):
        pid = os.fork()
        if pid == 0:
            try:
                channel.save()
                note = "saved"
            except Exception as exc:
                note = f"{type(exc).__name__}: {exc}"
            with open(os.environ["JM_NOTE"], "w") as fh:
                fh.write(note)
            os._exit(0)
        os.waitpid(pid, 0)
        channel.save()
        return {"parent": "went on"}
''')


def test_the_channel_is_safe_from_threads_and_refuses_a_forked_child_in_one_sentence(
    jobman, db_url, store: Store, tmp_path, jobs_per_process
):
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / "jm_threads_exp.py").write_text(THREADS_AND_FORKS)
    note = tmp_path / "note.txt"
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p),
        "JOBMAN_JOBS_PER_PROCESS": str(jobs_per_process),
        "JM_NOTE": str(note),
    }
    threads, child = store.schedule(
        [JobSpec(0, "fn", f"jm_threads_exp:{name}", {}, None) for name in ("from_threads", "from_a_child")]
    ).job_ids
    worker = jobman(
        "worker",
        db_url,
        "--exproot",
        str(tmp_path / "runs"),
        "--heartbeat",
        "0.2",
        "--timeout",
        "60",
        env=env,
        timeout=120,
    )
    assert worker.code == 0, worker.err
    jobs = {j.id: j for j in store.jobs()}
    assert jobs[threads].status is Status.DONE, jobs[threads].error
    assert jobs[threads].results == {f"t{k}": 49 for k in range(8)}
    assert len([m for m in store.metrics([threads])]) == 8 * 50
    assert jobs[child].status is Status.DONE, jobs[child].error
    assert note.read_text().startswith("JobmanError: the channel of job ")
    assert "not in a process it forked" in note.read_text()

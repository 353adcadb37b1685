"""Jobs of many processes (``--ranks N``) run by a real worker on both engines, their ranks forked by the
job's process or started by the mpich wheel's real mpiexec: the rank variables read inside every rank, a
rank really SIGKILLed (the job CRASHED, relaunched from its checkpoint, DONE, and nothing of it left
running), a rank that raises (FAILED with its traceback), jobman.ps across the ranks, and the refusals."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import experiment_module, need_service, signal_once_started

from jobman.jobdb.errors import NoSuchExperiment
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import expand, parse_sweep

MODULE = "jm_gang_exp"
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

EXPERIMENTS = textwrap.dedent('''
    """A gang job: each rank writes what it sees, then does what ``mode`` says."""
    import json
    import os
    import signal
    import time

    VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


    def _wait_for(path, seconds=60):
        end = time.time() + seconds
        while not path.exists():
            if time.time() > end:
                raise RuntimeError(f"{path} never came")
            time.sleep(0.02)


    def gang(state, channel):
        attempt, rank = channel.attempt, channel.rank
        seen = {
            "rank": rank,
            "world_size": channel.world_size,
            "pid": os.getpid(),
            "progress": state.get("progress"),
            "env": {k: os.environ.get(k) for k in VARS},
        }
        (channel.workdir / f"seen-{attempt}-{rank}.tmp").write_text(json.dumps(seen))
        os.replace(channel.workdir / f"seen-{attempt}-{rank}.tmp", channel.workdir / f"seen-{attempt}-{rank}.json")
        for other in range(channel.world_size):  # every rank is running before any goes on
            _wait_for(channel.workdir / f"seen-{attempt}-{other}.json")
        if state.mode == "kill" and attempt == 1:
            if rank == 0:
                state.progress = 42
                channel.save()
                (channel.workdir / "saved").write_text("")
            if rank == state.victim:
                _wait_for(channel.workdir / "saved")
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(120)  # the others: ended by the gang long before this
            return {"outlived": rank}
        if state.mode == "raise" and rank == state.victim:
            raise ValueError(f"rank {rank} cannot go on")
        if state.mode == "raise":
            time.sleep(120)
            return {"outlived": rank}
        if state.mode == "stop":
            end = time.time() + 60
            while not channel.should_stop():
                if time.time() > end:
                    raise RuntimeError("never asked to stop")
                time.sleep(0.02)
            (channel.workdir / f"stopped-{attempt}-{rank}").write_text("")
            return channel.INCOMPLETE
        if state.mode == "ps":
            import numpy as np
            from jobman import ps

            ps.init()
            table = ps.ArrayTableHandler(4)
            table.add(np.full(4, rank + 1.0))
            ps.barrier()
            state.total = table.get().tolist()
            state.workers, state.worker_id = ps.num_workers(), ps.worker_id()
            ps.shutdown()
            return
        if state.mode == "span":  # when each process ran, to count them
            start = time.time()
            (channel.workdir.parent / "started").write_text("")
            time.sleep(state.secs)
            span = {"job": channel.job_id, "rank": rank, "start": start, "end": time.time()}
            (channel.workdir.parent / f"span-{channel.job_id}-{rank}.json").write_text(json.dumps(span))
            return
        state.rank_seen = rank
        state.resumed_from = state.get("progress")
        if rank != 0:
            state.rank_seen = -1  # what another rank writes is not the job's
            channel.save()
        return channel.COMPLETE
''')


@pytest.fixture(params=["fork", "mpiexec"])
def launch(request) -> str:
    """How the gang's ranks start: forks of the job's process, or the processes of mpiexec (the ps extra)."""
    if request.param == "mpiexec":
        from jobman.dispatch.gang import mpiexec_path

        if mpiexec_path() is None or importlib.util.find_spec("mpi4py") is None:
            need_service("mpiexec and mpi4py are not installed (pip install -e '.[ps]')")
    return request.param


@pytest.fixture
def exp(tmp_path: Path, launch: str) -> dict[str, str]:
    path = experiment_module(tmp_path, MODULE, EXPERIMENTS)
    return {**os.environ, "PYTHONPATH": path, "JOBMAN_GANG_LAUNCH": launch}


def seen(workdir: Path, attempt: int, ranks: int) -> list[dict]:
    return [json.loads((workdir / f"seen-{attempt}-{rank}.json").read_text()) for rank in range(ranks)]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_all_gone(pids: list[int]) -> None:
    end = time.time() + 10
    while not all(gone(p) for p in pids) and time.time() < end:
        time.sleep(0.05)
    assert [p for p in pids if not gone(p)] == [], "a rank outlived its job"


def schedule(jobman, db_url: str, exp: dict, *args: str) -> None:
    r = jobman("sqlschedule", db_url, f"{MODULE}:gang", *args, env=exp)
    assert r.code == 0, r.out + r.err


def work(jobman, db_url: str, exp: dict, tmp_path: Path, *args: str) -> None:
    r = jobman("worker", db_url, "--exproot", str(tmp_path / "runs"), *args, env=exp, timeout=300)
    assert r.code == 0, r.out + r.err


def test_every_rank_reads_its_variables_and_rank_0s_results_are_the_jobs(jobman, db_url, store, exp, tmp_path):
    schedule(jobman, db_url, exp, "mode=plain", "--ranks", "3")
    work(jobman, db_url, exp, tmp_path)
    [job] = store.jobs()
    assert job.status is Status.DONE and job.ranks == 3
    assert job.results == {"rank_seen": 0, "resumed_from": None}  # rank 0's; the others' saves ignored
    ranks = seen(Path(job.workdir), 1, 3)
    port = ranks[0]["env"]["MASTER_PORT"]
    assert port and int(port) > 0
    for rank, s in enumerate(ranks):
        assert s["rank"] == rank and s["world_size"] == 3
        assert s["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
    assert len({s["pid"] for s in ranks}) == 3
    assert (Path(job.workdir) / "rank-1.log").exists() and (Path(job.workdir) / "rank-2.log").exists()
    assert_all_gone([s["pid"] for s in ranks])
    shown = jobman("show", str(job.id), "--db", db_url, "--format", "json", env=exp)
    assert shown.code == 0, shown.err
    listed = jobman("list", db_url, env=exp)
    assert listed.code == 0 and listed.out.split()[:4] == ["id", "phase", "status", "ranks"], listed.out
    data = json.loads(shown.out)
    assert data["ranks"] == 3
    assert data["rank_logs"][1:] == [f"{job.workdir}/rank-1.log", f"{job.workdir}/rank-2.log"]
    here = socket.gethostname()
    assert data["rank_places"] == [  # where each rank ran, as the rank itself wrote it
        {"rank": rank, "host": here, "pid": s["pid"], "log": log}
        for rank, (s, log) in enumerate(zip(ranks, data["rank_logs"]))
    ]
    text = jobman("show", str(job.id), "--db", db_url, env={**exp, "COLUMNS": "250"})
    for rank, s in enumerate(ranks):
        assert f"rank {rank}  {here} pid {s['pid']}  {data['rank_logs'][rank]}" in text.out, text.out


def test_a_rank_killed_crashes_the_job_and_a_relaunch_runs_every_rank_from_the_checkpoint(
    jobman, db_url, store, exp, tmp_path
):
    schedule(jobman, db_url, exp, "mode=kill", "victim=1", "--ranks", "3")
    work(jobman, db_url, exp, tmp_path, "--max-jobs", "1")
    [job] = store.jobs()
    first = seen(Path(job.workdir), 1, 3)
    assert_all_gone([s["pid"] for s in first])  # ranks 0 and 2 were sleeping: the gang ended them
    assert job.status is Status.QUEUED and job.attempt == 1  # CRASHED, then relaunched
    crash = [e for e in store.events(job.id) if e.to_status == "CRASHED"]
    assert len(crash) == 1 and "rank 1 of 3 was killed by SIGKILL" in crash[0].why
    assert job.results == {"progress": 42}  # rank 0's checkpoint kept

    work(jobman, db_url, exp, tmp_path)
    [job] = store.jobs()
    assert job.status is Status.DONE and job.attempt == 2
    again = seen(Path(job.workdir), 2, 3)
    assert [s["progress"] for s in again] == [42, 42, 42]  # every rank started from the checkpoint
    assert job.results == {"progress": 42, "rank_seen": 0, "resumed_from": 42}
    assert_all_gone([s["pid"] for s in again])


def test_a_rank_that_raises_fails_the_job_with_its_traceback(jobman, db_url, store, exp, tmp_path):
    schedule(jobman, db_url, exp, "mode=raise", "victim=2", "--ranks", "3")
    work(jobman, db_url, exp, tmp_path)
    [job] = store.jobs()
    assert job.status is Status.FAILED
    assert job.error.startswith("rank 2 of 3 raised:\nTraceback")
    assert "ValueError: rank 2 cannot go on" in job.error
    assert_all_gone([s["pid"] for s in seen(Path(job.workdir), 1, 3)])
    assert "ValueError: rank 2 cannot go on" in (Path(job.workdir) / "rank-2.log").read_text()


@pytest.mark.parametrize("engine_name", ["sqlite"])
def test_a_stopped_worker_stops_every_rank_and_puts_the_job_back(jobman, db_url, store, exp, tmp_path):
    schedule(jobman, db_url, exp, "mode=stop", "--ranks", "3")
    runs = tmp_path / "runs"
    workdir = runs / store.experiment / "1"
    argv = [sys.executable, "-m", "jobman.cli.main", "worker", db_url, "--exproot", str(runs)]
    code, err = signal_once_started(argv, exp, workdir / "seen-1-2.json")
    assert code == 0, err
    [job] = store.jobs()
    assert job.status is Status.QUEUED and job.attempt == 1  # put back to resume, no attempt spent
    assert [(workdir / f"stopped-1-{r}").exists() for r in range(3)] == [True, True, True]
    assert_all_gone([s["pid"] for s in seen(workdir, 1, 3)])


def test_rank_0_raising_ends_the_others(jobman, db_url, store, exp, tmp_path):
    schedule(jobman, db_url, exp, "mode=raise", "victim=0", "--ranks", "2")
    work(jobman, db_url, exp, tmp_path)
    [job] = store.jobs()
    assert job.status is Status.FAILED and job.error.startswith("rank 0 of 2 raised:\n")
    assert "ValueError: rank 0 cannot go on" in job.error
    assert_all_gone([s["pid"] for s in seen(Path(job.workdir), 1, 2)])


def test_jobman_ps_works_across_the_ranks_of_an_mpiexec_gang_and_is_refused_in_forked_ones(
    jobman, db_url, store, exp, tmp_path, launch
):
    schedule(jobman, db_url, exp, "mode=ps", "--ranks", "3")
    work(jobman, db_url, exp, tmp_path)
    [job] = store.jobs()
    if launch == "mpiexec":
        assert job.status is Status.DONE, job.error
        assert job.results["total"] == [6.0, 6.0, 6.0, 6.0]  # 1 + 2 + 3 from the three ranks
        assert (job.results["workers"], job.results["worker_id"]) == (3, 0)
    else:
        assert job.status is Status.FAILED
        assert "jobman.ps needs the ranks of the job to be one MPI world" in job.error, job.error


@pytest.mark.parametrize("engine_name", ["sqlite"])
@pytest.mark.parametrize("launch", ["fork"])
def test_refusals_are_one_sentence_and_write_nothing(jobman, db_url, store, exp, tmp_path):
    for bad in ("0", "-2", "x"):
        r = jobman("sqlschedule", db_url, f"{MODULE}:gang", "mode=plain", "--ranks", bad, env=exp)
        assert r.code != 0 and "Traceback" not in r.err, r.err
        assert len(r.err.strip().splitlines()) <= 3, r.err
    with pytest.raises(NoSuchExperiment):  # not even the experiment was made
        store.jobs()
    schedule(jobman, db_url, exp, "mode=plain", "--ranks", "3")
    r = jobman("dispatch", db_url, "-j", "2", "--exproot", str(tmp_path / "runs"), env=exp)
    assert r.code != 0 and "Traceback" not in r.err
    assert "has 3 ranks, more than the 2 slots of this dispatch" in r.err, r.err
    [job] = store.jobs()
    assert job.status is Status.QUEUED and job.attempt == 0  # nothing ran


def test_python_calls_take_ranks_and_refuse_bad_ones(db_url, tmp_path):
    from test_python_api import last_json, run_script

    proc = run_script(
        tmp_path,
        """
        import json
        from jobman.jobdb.errors import UsageError

        def where(state, channel):
            return {"rank": channel.rank, "world": channel.world_size, "env": os.environ["WORLD_SIZE"]}

        exp = jobman.Experiment(URL, backend="local", workers=2, exproot="runs")
        refused = []
        for bad in (0, "2", True):
            try:
                exp.call(where, ranks=bad)
            except UsageError as exc:
                refused.append(str(exc))
        try:
            jobman.Experiment(URL, backend="inline", exproot="runs").call(where, ranks=2)
        except UsageError as exc:
            refused.append(str(exc))
        got = exp.call(where, ranks=2).result(timeout=120)
        exp.close()
        print(json.dumps({"got": got, "refused": refused}))
        """,
        db_url,
        timeout=240,
    )
    out = last_json(proc)
    assert out["got"] == {"rank": 0, "world": 2, "env": "2"}
    assert out["refused"] == [
        "ranks must be between 1 and 65536 processes, not 0",
        "ranks is a whole number of processes, not '2'",
        "ranks is a whole number of processes, not True",
        "ranks=2 needs workers: the inline backend runs each call in this one process",
    ]
    store = Store.open(db_url)
    try:
        [job] = store.jobs()  # the refused calls wrote nothing
        assert job.ranks == 2 and job.status is Status.DONE
    finally:
        store.dispose()


@pytest.mark.parametrize("engine_name", ["sqlite"])
@pytest.mark.parametrize("launch", ["fork"])
def test_gangs_scheduled_while_a_dispatch_runs_hold_its_slots(jobman, db_url, store, exp, tmp_path):
    """A dispatch of -j 2 started with jobs of one process only: a gang of 2 scheduled while it runs waits
    for both slots (never more than 2 processes at once), and one of 3 fails with the reason."""
    runs = tmp_path / "runs"
    schedule(jobman, db_url, exp, "mode=span", "secs=1.5", "n={{1,2,3,4,7,8}}")
    argv = [sys.executable, "-m", "jobman.cli.main", "dispatch", db_url, "-j", "2", "--exproot", str(runs)]
    proc = subprocess.Popen(argv, env=exp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.time() + 120
        while not list(runs.glob("*/started")) and time.time() < end:
            time.sleep(0.05)
        for n, ranks in ((5, 2), (6, 3)):
            store.schedule(
                expand(parse_sweep([f"{MODULE}:gang", "mode=span", "secs=1", f"n={n}"])), ranks=ranks, priority=9
            )
        _out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    jobs = {job.params["n"]: job for job in store.jobs()}
    assert [jobs[n].status for n in (1, 2, 3, 4, 5, 7, 8)] == [Status.DONE] * 7, err
    assert jobs[6].status is Status.FAILED and jobs[6].error == (
        "the job has 3 ranks, more than the 2 slots of its dispatch (-j)"
    ), (jobs[6].error, err)
    spans = [json.loads(p.read_text()) for p in runs.glob("*/span-*.json")]
    assert sorted((s["job"], s["rank"]) for s in spans if s["job"] == jobs[5].id) == [(jobs[5].id, 0), (jobs[5].id, 1)]
    assert len(spans) == 8
    gang_start = min(s["start"] for s in spans if s["job"] == jobs[5].id)
    assert any(s["start"] < gang_start for s in spans if s["job"] != jobs[5].id)  # it came while others ran
    at_once = max(sum(1 for s in spans if s["start"] <= t < s["end"]) for t in (s["start"] for s in spans))
    assert at_once <= 2, spans


@pytest.mark.parametrize("engine_name", ["sqlite"])
@pytest.mark.parametrize("launch", ["fork"])
def test_list_shows_where_the_ranks_of_a_running_gang_run(jobman, db_url, store, exp, tmp_path):
    schedule(jobman, db_url, exp, "mode=span", "secs=8", "--ranks", "2")
    argv = [sys.executable, "-m", "jobman.cli.main", "worker", db_url, "--exproot", str(tmp_path / "runs")]
    proc = subprocess.Popen(argv, env=exp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.time() + 120
        while not list((tmp_path / "runs").glob("*/started")) and time.time() < end:
            time.sleep(0.05)
        [job] = store.jobs()
        places = [json.loads((Path(job.workdir) / f"rank-{rank}.where").read_text()) for rank in range(2)]
        listed = jobman("list", db_url, env={**exp, "COLUMNS": "200"})
        assert listed.code == 0, listed.err
        here = socket.gethostname()
        assert f"{here}:{places[0]['pid']},{places[1]['pid']}" in listed.out, listed.out
        assert {p["host"] for p in places} == {here} and job.status is Status.RUNNING
    finally:
        proc.communicate(timeout=120)

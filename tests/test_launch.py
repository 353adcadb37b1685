"""The launch room: what workers are started with, and how the database reaches them.

``jobman dispatch`` and the Python API start workers through ``dispatch/launch.py``; a worker's
settings travel as one value (to the zygote) or as ``jobman worker`` options (to a fresh
interpreter or a Slurm task), and both must say the same.
"""

from __future__ import annotations

import subprocess
import sys
from urllib.parse import quote

import pytest

from jobman.dispatch.launch import LaunchPlan, worker_access
from jobman.dispatch.machine import JobProcesses
from jobman.dispatch.worker_settings import WorkerSettings
from jobman.jobdb.url import parse_db

SETTINGS = [
    WorkerSettings(),
    WorkerSettings(
        "/tmp/runs",
        timeout=3600.0,
        heartbeat=0.2,
        grace=2.0,
        outage_wait=5.0,
        verbose=True,
        processes=JobProcesses(jobs_per_process=100, threads_per_job=2, gpus=("0", "1"), gpus_per_job=2),
    ),
    WorkerSettings("runs", max_jobs=3, wait=False, idle_timeout=1.5),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_settings_sent_to_the_zygote_come_back_equal(settings):
    import json

    assert WorkerSettings.from_message(json.loads(json.dumps(settings.to_message()))) == settings


@pytest.mark.parametrize("settings", SETTINGS)
def test_the_worker_options_a_dispatch_writes_are_read_back_by_jobman_worker_as_the_same_settings(
    settings, monkeypatch, tmp_path
):
    from jobman.cli import run
    from jobman.cli.main import main

    for name in ("JOBMAN_EXPROOT", "JOBMAN_OUTAGE_WAIT", "JOBMAN_JOBS_PER_PROCESS"):
        monkeypatch.delenv(name, raising=False)
    seen = []
    monkeypatch.setattr(run, "run_worker", lambda target, got, log_to_stderr: seen.append((target, got)))
    monkeypatch.setattr("jobman.dispatch.machine.visible_gpus", lambda: ("0", "1"))
    url = f"sqlite:///{tmp_path / 'w.db'}?table=t"
    assert main(["worker", url, *settings.argv()]) == 0
    [(target, got)] = seen
    assert target.experiment == "t" and got == settings


def test_workers_get_the_database_url_without_its_password_and_the_password_in_their_environment():
    secret = "S1urm:p@ss/x y"
    target = parse_db(f"postgresql://me:{quote(secret, safe='')}@db.example:5433/lab?table=mlp", None)
    url, environment = worker_access(target)
    assert url == "postgresql://me@db.example:5433/lab?table=mlp"
    assert environment == {"PGPASSWORD": secret}
    assert all(form not in url for form in (secret, quote(secret, safe=""), quote(secret)))
    sqlite = parse_db("sqlite:///runs.db?table=mlp", None)
    assert worker_access(sqlite) == (sqlite.with_table(), {})


def test_a_plan_names_a_known_backend(tmp_path):
    from jobman.dispatch.launch import Launch
    from jobman.jobdb.store import Store

    store = Store.open(f"sqlite:///{tmp_path / 'p.db'}?table=t")
    try:
        with pytest.raises(ValueError, match="no backend"):
            Launch(store, LaunchPlan("condor"))
    finally:
        store.dispose()


def test_running_jobs_imports_nothing_of_the_command_line():
    """dispatch sits below cli: the zygote, the worker and the launch room run without it."""
    code = (
        "import sys; import jobman.dispatch.backends.zygote, jobman.dispatch.worker_process, "
        "jobman.dispatch.launch, jobman.dispatch.futures, jobman.dispatch.backends.local, "
        "jobman.dispatch.slurm_dispatch; print(sorted(m for m in sys.modules if m.startswith('jobman.cli')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

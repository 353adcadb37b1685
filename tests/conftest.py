"""Shared fixtures: a real SQLite file and a real PostgreSQL database for every storage test.

PostgreSQL comes from ``JOBMAN_TEST_PG`` or the local server on 127.0.0.1:5432; a
throwaway database is made for the test session and dropped after it. Under
``CI=true`` a missing server fails the run instead of skipping.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"

# Tests press Ctrl-C by sending SIGINT. A runner that started this session in the background has
# SIGINT ignored, and every process started from here would inherit that: give it back its default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
PG_ADMIN_URL = os.environ.get("JOBMAN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
_counter = itertools.count()


def need_service(reason: str) -> None:
    """A service a test needs is missing: fail under CI, skip on a developer's machine."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: tests that need it must not be skipped)", pytrace=False)
    pytest.skip(reason)


def _kernel_controllers() -> dict[str, tuple[int, bool]]:
    """The cgroup controllers this kernel has (/proc/cgroups): name -> (v1 hierarchy or 0, enabled)."""
    try:
        lines = Path("/proc/cgroups").read_text().splitlines()[1:]
    except OSError:
        return {}
    return {f[0]: (int(f[1]), f[3] == "1") for f in (line.split() for line in lines) if len(f) >= 4}


def kernel_lacks(what: str) -> str | None:
    """What this kernel (or the cgroup hierarchy it booted with) lacks for ``what``, or None when it has
    it: a job cgroup (``"job cgroup"``), one on the v1 pids controller (``"v1 pids"``), a memory cgroup
    (``"memory cgroup"``). Where it has it and a test still cannot use it, the machine's set-up is at
    fault, which a CI machine must get right."""
    controllers = _kernel_controllers()
    pids_hierarchy, pids_on = controllers.get("pids", (0, False))
    v1_pids = pids_on and pids_hierarchy != 0
    if what == "v1 pids":
        return (
            None
            if v1_pids
            else ("a cgroup v1 pids hierarchy (this host runs the pids controller under cgroup v2 only)")
        )
    if what == "job cgroup":
        has_v2 = "cgroup2" in Path("/proc/filesystems").read_text()
        release = tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
        if v1_pids or (has_v2 and release >= (5, 14)):
            return None
        return "both cgroup v2's cgroup.kill (Linux 5.14 or later) and the cgroup v1 pids controller"
    if what == "memory cgroup":
        return None if controllers.get("memory", (0, False))[1] else "the memory controller (not built or disabled)"
    raise ValueError(what)


def need_kernel(reason: str, what: str) -> None:
    """A cgroup a test needs cannot be made: fail under CI unless the kernel itself lacks it (then the
    test is skipped everywhere, and docs/guarantees.md says where), skip on a developer's machine."""
    lacking = kernel_lacks(what)
    if lacking is not None:
        pytest.skip(f"{reason}: this kernel lacks {lacking}")
    need_service(reason)


def made_pg_database():
    """A fresh PostgreSQL database: yields its URL, then drops it."""
    import psycopg

    admin = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    name = f"jobman_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable server
        need_service(f"PostgreSQL is not reachable at {admin}: {exc}".splitlines()[0])
    base = admin.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except Exception:  # noqa: BLE001 - dropping a test's database is best effort
        pass


@pytest.fixture(scope="session")
def pg_database() -> str:
    """The URL of a PostgreSQL database made for this test session."""
    yield from made_pg_database()


@pytest.fixture
def own_pg_database() -> str:
    """The URL of a PostgreSQL database of this test alone (its plans see no other test's jobs)."""
    yield from made_pg_database()


@pytest.fixture(scope="session")
def pgbouncer(pg_database: str) -> str:
    """A real PgBouncer in transaction pooling mode in front of the test PostgreSQL, for the test session:
    the URL of the session's database through it."""
    from pgbouncer import PgBouncerError, pgbouncer_fixture, through_pgbouncer

    try:
        started = pgbouncer_fixture(PG_ADMIN_URL)
        address = next(started)
    except PgBouncerError as exc:
        need_service(str(exc))
    yield through_pgbouncer(pg_database, address)
    next(started, None)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real one-node Slurm, started once per test session (installed with apt-get if missing)."""
    from slurm_cluster import slurm_cluster_fixture

    yield from slurm_cluster_fixture()


@pytest.fixture(params=["sqlite", "postgresql", "pgbouncer"])
def engine_name(request) -> str:
    """The store a test runs on; "pgbouncer" (PostgreSQL through a PgBouncer in transaction pooling mode)
    only for the core cases marked ``pgbouncer``."""
    return request.param


@pytest.fixture(params=[1, 4], ids=["fresh-process", "reused-process"])
def jobs_per_process(request) -> int:
    """Function jobs per job process: worker tests run with a fresh process per job, and with reuse."""
    return request.param


def pytest_collection_modifyitems(config, items) -> None:
    """Process reuse is tried on SQLite only: how jobs are run does not change with the store. PgBouncer is
    tried on the core cases (marked ``pgbouncer``) only."""

    def reused_on_postgresql(item) -> bool:
        params = getattr(item, "callspec", None) and item.callspec.params
        if not params:
            return False
        if params.get("engine_name") == "pgbouncer" and item.get_closest_marker("pgbouncer") is None:
            return True  # through PgBouncer: the core cases only
        return params.get("jobs_per_process", 1) > 1 and params.get("engine_name") in ("postgresql", "pgbouncer")

    dropped = [item for item in items if reused_on_postgresql(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not reused_on_postgresql(item)]


@pytest.fixture
def db_url(engine_name: str, tmp_path: Path, request) -> str:
    """A database URL naming a fresh experiment, on each engine in turn."""
    experiment = f"t{next(_counter)}_{uuid.uuid4().hex[:6]}"
    if engine_name == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}?table={experiment}"
    base = request.getfixturevalue("pgbouncer" if engine_name == "pgbouncer" else "pg_database")
    return f"{base}?table={experiment}"


@pytest.fixture
def store(db_url):
    from jobman.jobdb.store import Store

    s = Store.open(db_url)
    yield s
    s.dispose()


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_jobman(
    *args: str, cwd: str | Path | None = None, env: dict | None = None, timeout: float = 300, stdin: str | None = None
) -> CliResult:
    """Run the real ``jobman`` command in a subprocess."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "jobman.cli.main", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def jobman():
    """Call the jobman CLI as a user would (a real process)."""
    return run_jobman


def signal_once_started(argv: list[str], env: dict, marker: Path, sig: int = signal.SIGTERM) -> tuple[int, str]:
    """Start a process, send it ``sig`` once ``marker`` exists (its job started): its exit code and stderr."""
    import time

    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the job never started"
        time.sleep(0.3)
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def experiment_module(tmp_path: Path, name: str, source: str) -> str:
    """Write an experiment module under ``tmp_path``; the PYTHONPATH that finds it."""
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / f"{name}.py").write_text(source)
    return os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)


def sqlite_only() -> str:
    """A module's ``engine_name`` fixture when what it tests does not depend on the store: SQLite only."""
    return "sqlite"

"""A real one-node Slurm for the tests: install, configure, start, reuse, stop.

The Slurm tests run against real daemons, not a fake: ``slurmctld`` and ``slurmd``
on this host, authenticated by ``munged``. Everything the cluster writes (its
``slurm.conf``, state, spool, logs, pid files) lives under one directory,
``$JOBMAN_SLURM_DIR`` or ``<tmp>/jobman-slurm``, and client commands find the
configuration through ``SLURM_CONF``: nothing is written under ``/etc/slurm``.
There is no slurmdbd, so job states come from ``squeue -t all``/``scontrol``,
which keep finished jobs for ``MinJobAge`` (an hour here).

Slurm's ports are fixed (6817/6818), so there is one such cluster per host;
``up`` reuses one left running by an earlier start when its configuration is
the same. For humans::

    python tests/slurm_cluster.py up|down|status

Needs root (the daemons run as root, and a missing Slurm is installed with
apt-get). A start that cannot succeed raises ``SlurmClusterError`` with one
sentence; ``slurm_cluster_fixture`` turns it into a failure under ``CI=true``
and a skip elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
COMMANDS = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo", "munged", "munge")
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
CONTROLLER_PORT = 6817
USABLE_NODE_STATES = ("idle", "mixed", "allocated")
MUNGE_RUN_DIR = Path("/run/munge")
MUNGE_KEY = Path("/etc/munge/munge.key")
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)


class SlurmClusterError(Exception):
    """The test cluster could not be installed, started or reached."""


def _which(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


def _pid_alive(pid_file: Path, name: str) -> int | None:
    """The pid in ``pid_file`` if that process is alive and is ``name``, else None."""
    try:
        pid = int(pid_file.read_text().split()[0])
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError, IndexError):
        return None
    return pid if comm == name[:15] and _running(pid) else None


def _running(pid: int) -> bool:
    """True if the process exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _stop_pids(pids: list[int], timeout: float = 10.0) -> None:
    """SIGTERM every pid at once, then SIGKILL those still there after ``timeout`` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [pid for pid in pids if _running(pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class SlurmCluster:
    """One controller and one compute node on this host, configured from ``root``.

    ``cpus`` is what the node advertises: more than the machine has, so several
    jobs start at once (tests mostly sleep or wait on a database).
    """

    def __init__(self, root: Path | None = None, cpus: int = 8, start_timeout: float = 30.0) -> None:
        default_root = Path(tempfile.gettempdir()) / "jobman-slurm"
        self.root = Path(root or os.environ.get("JOBMAN_SLURM_DIR") or default_root)
        self.cpus = cpus
        self.start_timeout = start_timeout
        self.node = socket.gethostname().split(".")[0]

    # -- paths and environment -------------------------------------------------

    @property
    def conf_path(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def ctld_pid_file(self) -> Path:
        return self.root / "run" / "slurmctld.pid"

    @property
    def slurmd_pid_file(self) -> Path:
        return self.root / "run" / "slurmd.pid"

    @property
    def munged_marker(self) -> Path:
        """Holds munged's pid when this harness started it (so ``down`` stops only that one)."""
        return self.root / "run" / "munged.started"

    def env(self) -> dict[str, str]:
        """The current environment with ``SLURM_CONF`` pointing at this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path), "PATH": SBIN_PATH}

    def config_text(self) -> str:
        """The slurm.conf for this host; ``up`` compares it to decide whether to reuse."""
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        r = self.root
        lines = [
            "# Written by tests/slurm_cluster.py: a one-node Slurm for jobman's tests.",
            "ClusterName=jobman",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={self.ctld_pid_file}",
            f"SlurmdPidFile={self.slurmd_pid_file}",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups in a container: track processes by parentage, bind nothing.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # The stock batch delay makes every job wait ~2.5 s before it starts.
            "SchedulerParameters=batch_sched_delay=0",
            # A job whose dependency failed is killed instead of pending forever.
            "DependencyParameters=kill_invalid_depend",
            # Finished jobs stay visible to squeue/scontrol for a whole test session.
            "MinJobAge=3600",
            # scancel and time limits: SIGTERM, then SIGKILL 5 s later.
            "KillWait=5",
            "InactiveLimit=0",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            # The node advertises more CPUs than the machine has; slurmd must not object.
            "SlurmdParameters=config_overrides",
            # Two "GPUs" (gres.conf: two character devices every Linux has): Slurm sets a job's
            # CUDA_VISIBLE_DEVICES from what it was given, as on a real GPU node.
            "GresTypes=gpu",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} Gres=gpu:2 RealMemory={mem_mb} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def gres_text(self) -> str:
        """gres.conf, read from beside slurm.conf: the node's two fake GPUs."""
        return "".join(f"NodeName={self.node} Name=gpu File={device}\n" for device in ("/dev/null", "/dev/zero"))

    # -- public verbs ------------------------------------------------------------

    def up(self) -> bool:
        """Start the cluster, or reuse a running one with the same config; True if started here."""
        text = self.config_text()
        if self._daemons() != (None, None):
            same = self.conf_path.is_file() and self.conf_path.read_text() == text
            if same and self._node_state() in USABLE_NODE_STATES:
                return False
            self.down()
        if os.geteuid() != 0:
            raise SlurmClusterError("The test cluster runs its daemons as root; run the Slurm tests as root.")
        self._ensure_installed()
        for sub in ("state", "spool", "log", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(text)
        self.conf_path.with_name("gres.conf").write_text(self.gres_text())
        self._ensure_munge()
        if _port_open(CONTROLLER_PORT):
            raise SlurmClusterError(
                f"Port {CONTROLLER_PORT} is taken by another slurmctld not started from {self.root};"
                " stop it first (one Slurm per host)."
            )
        self._start("slurmctld", ["-i"], self.ctld_pid_file)
        self._start("slurmd", ["-N", self.node], self.slurmd_pid_file)
        self._wait_ready()
        return True

    def down(self) -> None:
        """Cancel the cluster's jobs and stop its daemons (and munged, if started here)."""
        ctld, slurmd = self._daemons()
        if ctld is not None and slurmd is not None:
            # Let the jobs end while slurmd is there to hear of it, or their slurmstepd lingers.
            self._client("scancel", f"--user={os.getuid()}", check=False)
            _wait(lambda: not self._client("squeue", "-h", "-t", "CF,R,CG,S", check=False).strip(), 15.0)
        munged = _pid_alive(self.munged_marker, "munged")
        _stop_pids([pid for pid in (slurmd, ctld, munged) if pid is not None])
        self.munged_marker.unlink(missing_ok=True)

    def status(self) -> str:
        """One line saying whether the cluster runs, its daemons' pids and the node state."""
        ctld, slurmd = self._daemons()
        if ctld is None and slurmd is None:
            return f"stopped (directory {self.root})"
        return (
            f"running: slurmctld pid {ctld}, slurmd pid {slurmd}, node {self.node} is"
            f" {self._node_state() or 'unknown'}; export SLURM_CONF={self.conf_path}"
        )

    # -- helpers for tests -----------------------------------------------------

    def sbatch(self, script: str, *options: str, directory: Path | None = None) -> str:
        """Submit a batch script given as text; return the job id (``N`` or ``N_[..]`` base id)."""
        folder = Path(directory or self.root / "jobs")
        folder.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=folder)
        with os.fdopen(fd, "w") as handle:
            handle.write(script)
        out = self._client("sbatch", "--parsable", f"--output={folder}/%j.out", *options, path)
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` of one job (or array task) as a dict; empty if Slurm has forgotten it."""
        out = self._client("scontrol", "-o", "show", "job", job_id, check=False)
        fields: dict[str, str] = {}
        for word in out.split():
            key, _, value = word.partition("=")
            fields.setdefault(key, value)
        return fields

    def wait_state(self, job_id: str, states: frozenset[str] = ENDED_STATES, timeout: float = 30.0) -> str:
        """Poll until the job's state is one of ``states``; return it (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job(job_id).get("JobState", "")
            if state in states:
                return state
            time.sleep(0.05)
        raise AssertionError(f"Slurm job {job_id} is still {state or 'unknown'} after {timeout:.0f} s.")

    # -- internals -------------------------------------------------------------

    def _client(self, *argv: str, check: bool = True) -> str:
        """Run a Slurm client command against this cluster; return its stdout."""
        proc = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise SlurmClusterError(f"{' '.join(argv)} failed: {_last_line(proc.stderr or proc.stdout)}")
        return proc.stdout

    def _daemons(self) -> tuple[int | None, int | None]:
        return _pid_alive(self.ctld_pid_file, "slurmctld"), _pid_alive(self.slurmd_pid_file, "slurmd")

    def _node_state(self) -> str:
        try:
            return self._client("sinfo", "-h", "-N", "-o", "%T", check=False).strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    def _ensure_installed(self) -> None:
        """apt-get install the Slurm and munge packages if any of their commands is missing."""
        missing = [c for c in COMMANDS if _which(c) is None]
        if not missing:
            return
        if _which("apt-get") is None:
            raise SlurmClusterError(
                f"Slurm is not installed (no {', '.join(missing)}) and there is no apt-get to install it."
            )
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        proc = subprocess.run(install, env=env, capture_output=True, text=True)
        no_lists = "Unable to locate" in proc.stderr or "no installation candidate" in proc.stderr
        if proc.returncode != 0 and no_lists:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
            proc = subprocess.run(install, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            detail = _last_line(proc.stderr or proc.stdout)
            raise SlurmClusterError(f"apt-get could not install Slurm: {detail}")

    def _ensure_munge(self) -> None:
        """Start munged as the munge user unless one already answers; without systemd."""
        if _munge_answers():
            return
        if not MUNGE_KEY.exists():
            subprocess.run(
                ["runuser", "-u", "munge", "--", _which("mungekey") or "mungekey", "--create"], capture_output=True
            )
        MUNGE_RUN_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        shutil.chown(MUNGE_RUN_DIR, "munge", "munge")
        proc = subprocess.run(
            ["runuser", "-u", "munge", "--", _which("munged") or "munged"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SlurmClusterError(f"munged did not start: {_last_line(proc.stderr)}")
        if (MUNGE_RUN_DIR / "munged.pid").exists():
            shutil.copy(MUNGE_RUN_DIR / "munged.pid", self.munged_marker)
        if not _wait(_munge_answers, 5.0):
            raise SlurmClusterError("munged started but does not answer on its socket within 5 s.")

    def _start(self, daemon: str, args: list[str], pid_file: Path) -> None:
        """Start a Slurm daemon (it daemonizes itself) and wait for its pid file."""
        proc = subprocess.run(
            [_which(daemon) or daemon, "-f", str(self.conf_path), *args], env=self.env(), capture_output=True, text=True
        )
        log = self.root / "log" / f"{daemon}.log"
        if proc.returncode != 0 or not _wait(lambda: _pid_alive(pid_file, daemon) is not None, 10.0):
            detail = _last_line(proc.stderr) or _last_line(log.read_text() if log.exists() else "")
            raise SlurmClusterError(f"{daemon} did not start ({detail or 'no message'}); see {log}.")

    def _wait_ready(self) -> None:
        """Wait until the node is idle; raise with what sinfo said otherwise."""
        if not _wait(lambda: self._node_state() in USABLE_NODE_STATES, self.start_timeout):
            raise SlurmClusterError(
                f"Node {self.node} did not become idle within {self.start_timeout:.0f} s"
                f" (sinfo says {self._node_state() or 'nothing'!r}); see {self.root / 'log'}."
            )


def _munge_answers() -> bool:
    try:
        return subprocess.run(["munge", "-n"], capture_output=True, env={"PATH": SBIN_PATH}).returncode == 0
    except OSError:
        return False


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def slurm_cluster_fixture() -> Iterator[SlurmCluster]:
    """Body of the pytest fixture: start or reuse the cluster, export SLURM_CONF, stop it after.

    Under ``CI=true`` a cluster that cannot start fails the tests (they must run
    there); elsewhere they are skipped with the reason. The cluster is stopped at
    the end only if it was started here and ``JOBMAN_SLURM_KEEP`` is not set.
    Use it as ``yield from slurm_cluster_fixture()``.
    """
    import pytest

    cluster = SlurmCluster()
    try:
        started = cluster.up()
    except SlurmClusterError as exc:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"Slurm test cluster: {exc}", pytrace=False)
        pytest.skip(f"Slurm test cluster: {exc}")
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf_path)
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if started and not os.environ.get("JOBMAN_SLURM_KEEP"):
            cluster.down()


def main(argv: list[str]) -> int:
    """``up``, ``down`` or ``status`` from the command line."""
    if len(argv) != 1 or argv[0] not in ("up", "down", "status"):
        print("usage: python tests/slurm_cluster.py up|down|status", file=sys.stderr)
        return 2
    cluster = SlurmCluster()
    try:
        if argv[0] == "up":
            t0 = time.monotonic()
            started = cluster.up()
            print(f"{'started' if started else 'reused'} in {time.monotonic() - t0:.1f} s")
        elif argv[0] == "down":
            cluster.down()
    except SlurmClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(cluster.status())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

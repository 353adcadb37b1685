"""Chaos: nothing is lost when jobs, workers and the dispatcher itself are killed with SIGKILL.

A sweep of 200 function jobs runs under ``jobman dispatch -j 4`` while the test kills, every 0.3 to
1 s during a bounded window (a seeded ``random.Random``, so a failure can be replayed), one process
of the dispatch's tree with SIGKILL: a job's own process, a worker, now and then whatever else runs
below a worker (the helper that forks its jobs), and three times the dispatcher. A killed
dispatcher's workers get SIGTERM (no worker outlives its dispatcher): each lets its job finish or
puts it back, and exits; a new ``jobman dispatch`` is started at once, as a user would. After the
window every process of the test is SIGKILLed, ``jobman monitor --once --relaunch`` must find every
job left RUNNING and queue
it again (by its dead worker's pid: the heartbeat grace is ten minutes), and a fresh ``jobman
dispatch`` must finish the sweep. It runs with a fresh process per job, and (on SQLite) with job
processes that run four jobs each: the same kills then take down a process between two jobs, or
mid-job after others it ran.

Processes are told apart in the live tree: dispatchers and workers carry the experiment's URL on
their command line (``dispatch`` or ``worker``); a job's process is a descendant of a worker that
has moved into its workdir under ``runs/``. The test process makes itself a child subreaper while
it runs, so workers orphaned by a killed dispatcher stay in its tree while they stop, to be found,
killed and reaped.

Each job takes 10 steps of 100 ms; after each it writes the step and a running value (an integer
recurrence seeded by its parameters) into ``state`` and calls ``channel.save()``; a relaunch
resumes from what was saved. It appends ``job_id attempt begin|saved step`` to one side file opened
with O_APPEND (one write per line, so lines never interleave) when it starts and after each save.
The only SIGTERMs are those a killed dispatcher's workers get: a job they put back is resumed without
spending an attempt, so an attempt number names one claim, or several when it was put back in between.
What is asserted, and what each catches:

* every job is DONE with exactly the value of an undisturbed run (the recurrence computed here):
  a checkpoint lost, applied twice or taken from the wrong run changes the value;
* each job became DONE once and never left DONE; its claims in ``job_event`` equal its lease counter and
  its attempt plus the times it was put back, every claim but the last ended CRASHED or was put back,
  and there are more claims than jobs;
* in the side file each run (a start and what follows) logged consecutive steps; each started at or
  after the last step an earlier attempt logged, and at most one step beyond it (a SIGKILL may fall
  between a save and its log line), so progress was resumed, never restarted; the attempt that
  ended DONE logged every step; and some attempt resumed from a step other than 0, so this check
  is not vacuous;
* the monitor's scan finds exactly the jobs left RUNNING, and leaves none RUNNING;
* no dispatch or worker log shows a traceback or a lock error, and no process outlives the sweep.

Why these numbers: 200 jobs of about 1.1 s each are some 55 s of work for four workers, more than
the 30 s window; but a killed dispatcher's workers finish their jobs beside the new one's, so the
window also ends once 180 jobs are DONE, leaving work for the monitor and the last dispatch.
Observed on two cores: 140 to 185 jobs DONE when the window closes, about 40 kills
(some 20 workers, 15 jobs, 5 helpers, 3 dispatchers), about ten jobs left RUNNING, each engine done
in 38 to 50 s. No job needed more than 4 attempts; the sweep is scheduled with ``max_attempts=100``
all the same, because the attempt limit is not what is tested here (test_monitor.py does) and a job
CRASHED for good would hide what this test looks for.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa

from jobman.jobdb.schema import job_event as t_event
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

JOBS = 200
STEPS = 10
PAUSE = 0.1  # seconds per step
WORKERS = 4
MAX_ATTEMPTS = 100
CHAOS_SECONDS = 30.0
STOP_CHAOS_AT_DONE = 180  # leave work for the monitor and the last dispatch
DISPATCHER_KILLS = ((0.15, 0.3), (0.4, 0.55), (0.65, 0.8))  # when, as fractions of the window
SEED = 20240611
MODULE = "jm_chaos_exp"
EXPERIMENTS = textwrap.dedent('''
    """A job that checkpoints after every step and logs each start and each saved step."""
    import os
    import time

    MOD = 2_147_483_647


    def advance(value, seed, step):
        """One step of the recurrence: depends only on the parameters and the step."""
        return (value * 48271 + seed * 7919 + step * 104729 + 12345) % MOD


    def undisturbed(seed, steps):
        """The value of a run that is never interrupted."""
        value = seed
        for step in range(steps):
            value = advance(value, seed, step)
        return value


    def _log(channel, what, step):
        line = f"{channel.job_id} {channel.attempt} {what} {step}\\n".encode()
        fd = os.open(os.environ["JM_CHAOS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


    def walk(state, channel):
        """Resume from the saved step, if any; save after every step."""
        step = state.get("step", 0)
        value = state.get("value", state.seed)
        _log(channel, "begin", step)
        while step < state.steps:
            time.sleep(state.pause)
            value = advance(value, state.seed, step)
            step += 1
            state.step = step
            state.value = value
            channel.save()
            _log(channel, "saved", step)
        return channel.COMPLETE
''')
LINE = re.compile(r"^(\d+) (\d+) (begin|saved) (\d+)$")
FORBIDDEN = re.compile(
    r"Traceback|database is locked|database table is locked|could not serialize|"
    r"deadlock detected|internal error",
    re.I,
)
PR_SET_CHILD_SUBREAPER = 36


def _subreaper(on: bool) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


class Tree:
    """The jobman processes this test started: dispatchers and workers have the experiment's URL on
    their command line (a worker forked by a dispatch's zygote is named ``jobman-worker`` instead); a
    job's process is a descendant of a worker that moved into its workdir (under ``runs``);
    anything else below a worker (a helper that forks the jobs, a job not yet
    in its workdir) is a "helper"."""

    def __init__(self, url: str, runs: Path) -> None:
        self.url = url
        self.runs = str(runs) + os.sep
        self.dispatchers: dict[int, subprocess.Popen] = {}

    def processes(self) -> dict[str, list[psutil.Process]]:
        """Live (not zombie) dispatchers, workers, job processes and helpers under this process."""
        kinds: dict[str, list[psutil.Process]] = {"dispatcher": [], "worker": [], "job": [], "helper": []}
        seen: dict[int, tuple[psutil.Process, list[str], str]] = {}
        for p in psutil.Process().children(recursive=True):
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmd = p.cmdline()
                if p.name() == "jobman-worker":  # forked by a dispatch's zygote: its command line is the zygote's
                    cmd = ["worker", self.url]
                seen[p.pid] = (p, cmd, p.cwd())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        ours = {pid for pid, (_p, cmd, _cwd) in seen.items() if self.url in cmd}
        for pid, (p, cmd, cwd) in seen.items():
            try:
                ancestors = {a.pid for a in p.parents()}
            except psutil.NoSuchProcess:
                continue
            below_ours = bool(ancestors & ours)
            below_worker = any("worker" in seen[a][1] for a in ancestors & ours)
            if pid in ours and "dispatch" in cmd:
                kinds["dispatcher"].append(p)
            elif below_worker and (cwd + os.sep).startswith(self.runs):
                kinds["job"].append(p)
            elif below_worker:
                kinds["helper"].append(p)
            elif pid in ours and "worker" in cmd:
                kinds["worker"].append(p)
            elif below_ours:
                kinds["helper"].append(p)
        return kinds

    def alive(self) -> list[psutil.Process]:
        return [p for group in self.processes().values() for p in group]

    def reap(self) -> None:
        """Collect orphans that died under this process (it is their subreaper); Popen reaps its own."""
        for p in psutil.Process().children():
            try:
                if p.pid not in self.dispatchers and p.status() == psutil.STATUS_ZOMBIE:
                    os.waitpid(p.pid, os.WNOHANG)
            except (psutil.NoSuchProcess, ChildProcessError):
                pass

    def kill_all(self) -> None:
        """SIGKILL every process of the test, until none is left twice in a row: a worker the
        zygote forked as its dispatcher died is an orphan with the zygote's name for an instant."""
        deadline = time.time() + 30
        empty = 0
        while time.time() < deadline:
            procs = self.alive()
            if not procs:
                empty += 1
                if empty == 2:
                    break
                time.sleep(0.5)
                continue
            empty = 0
            for p in procs:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(procs, timeout=2)
            self.reap()
        for proc in self.dispatchers.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self.reap()


def _runs_of(lines: list[tuple[str, int]]) -> list[list[tuple[str, int]]]:
    """One attempt's lines cut into runs, each from a "begin" (an attempt put back runs twice)."""
    runs: list[list[tuple[str, int]]] = []
    for line in lines:
        if line[0] == "begin" or not runs:
            runs.append([])
        runs[-1].append(line)
    return runs


def read_side_file(path: Path) -> dict[int, dict[int, list[tuple[str, int]]]]:
    """job id -> attempt -> [(begin|saved, step)] in the order written."""
    runs: dict[int, dict[int, list[tuple[str, int]]]] = defaultdict(lambda: defaultdict(list))
    for line in path.read_text().splitlines():
        m = LINE.match(line)
        assert m, f"malformed side-file line {line!r}"
        job_id, attempt, what, step = m.groups()
        runs[int(job_id)][int(attempt)].append((what, int(step)))
    return runs


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_nothing_is_lost_when_jobs_workers_and_dispatchers_are_killed(
    db_url, engine_name, tmp_path: Path, jobman, jobs_per_process
):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{MODULE}.py").write_text(EXPERIMENTS)
    formula: dict = {}
    exec(compile(EXPERIMENTS, f"{MODULE}.py", "exec"), formula)  # the same recurrence, run undisturbed here
    expected = {seed: {"step": STEPS, "value": formula["undisturbed"](seed, STEPS)} for seed in range(JOBS)}
    side = tmp_path / "steps.txt"
    side.touch()
    runs_dir = tmp_path / "runs"
    store = Store.open(db_url)
    ids = store.schedule(
        [JobSpec(0, "fn", f"{MODULE}:walk", {"seed": s, "steps": STEPS, "pause": PAUSE}, None) for s in range(JOBS)],
        max_attempts=MAX_ATTEMPTS,
    ).job_ids
    assert len(ids) == JOBS

    env = {
        **os.environ,
        "JM_CHAOS_LOG": str(side),
        "PYTHONPATH": os.pathsep.join(p for p in (str(mods), os.environ.get("PYTHONPATH")) if p),
    }
    args = [
        "dispatch",
        db_url,
        "-j",
        str(WORKERS),
        "--exproot",
        str(runs_dir),
        "--heartbeat",
        "1",
        "--no-progress",
        "--jobs-per-process",
        str(jobs_per_process),
    ]
    rng = random.Random(SEED)
    kills: Counter[str] = Counter()
    misses: Counter[str] = Counter()  # picks that found no such process
    tree = Tree(db_url, runs_dir.resolve())
    logs: list[Path] = []

    def start_dispatch(name: str) -> subprocess.Popen:
        logs.append(tmp_path / f"dispatch-{name}.log")
        with open(logs[-1], "wb") as fh:  # to a file: a full pipe would stall the dispatcher
            proc = subprocess.Popen(
                [sys.executable, "-m", "jobman.cli.main", *args],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
            )
        tree.dispatchers[proc.pid] = proc
        return proc

    def done() -> int:
        return sum(n for (_phase, status), n in store.counts().items() if status == Status.DONE.value)

    started = time.monotonic()
    _subreaper(True)
    try:
        # -- the chaos window ------------------------------------------------------------------------
        current = start_dispatch("0")
        plan = sorted(started + rng.uniform(a, b) * CHAOS_SECONDS for a, b in DISPATCHER_KILLS)
        while time.monotonic() - started < CHAOS_SECONDS and current.poll() is None and done() < STOP_CHAOS_AT_DONE:
            time.sleep(rng.uniform(0.3, 1.0))
            tree.reap()
            if plan and time.monotonic() >= plan[0]:
                plan.pop(0)
                kind = "dispatcher"
            else:
                kind = rng.choices(["job", "worker", "helper"], weights=[45, 45, 10])[0]
            victims = tree.processes()[kind]
            if kind == "dispatcher":
                victims = [p for p in victims if p.pid == current.pid]
            if not victims:
                misses[kind] += 1
                continue
            victim = rng.choice(sorted(victims, key=lambda p: p.pid))
            try:
                os.kill(victim.pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            kills[kind] += 1
            if kind == "dispatcher":  # its workers stop (SIGTERM); a user starts dispatch again
                current.wait(timeout=30)
                current = start_dispatch(str(kills["dispatcher"]))
        chaos_seconds = time.monotonic() - started
        first_exit = current.poll()
        done_in_chaos = done()

        # -- kill what is left, let the monitor find the dead, finish the sweep ----------------------
        tree.kill_all()
        assert tree.alive() == []
        left_running = {j.id for j in store.running()}
        summary = (
            f"{engine_name}: chaos {chaos_seconds:.1f} s, {done_in_chaos} DONE by then, kills {dict(kills)} "
            f"(none found {dict(misses)}), {len(left_running)} left RUNNING"
        )
        print(summary)
        # a grace of ten minutes: what finds them at once is that their workers' pids are gone
        r = jobman(
            "monitor", db_url, "--once", "--relaunch", "--format", "json", "--heartbeat-grace", "600", timeout=120
        )
        assert r.code == 0, r.err
        scan = json.loads(r.out)["scan"]
        assert sorted(f["job_id"] for f in scan["crashed"]) == sorted(left_running), scan
        assert {f["sign"] for f in scan["crashed"]} <= {"process"}, scan
        assert set(scan["relaunched"]) >= left_running, scan
        assert store.running() == [], "the monitor left a job RUNNING whose worker is dead"

        final = start_dispatch("final")
        final.wait(timeout=240)
        total_seconds = time.monotonic() - started
        final_out = logs[-1].read_text(errors="replace")
        assert final.returncode == 0, final_out[-3000:]
        assert f"{JOBS} DONE" in final_out, final_out[-3000:]
        deadline = time.time() + 10
        while tree.alive() and time.time() < deadline:
            time.sleep(0.1)
        assert tree.alive() == [], "a process of the sweep outlived it"
    finally:
        tree.kill_all()
        _subreaper(False)
        tree.reap()
    print(f"{summary}; all DONE after {total_seconds:.1f} s, at most {max(j.attempt for j in store.jobs())} attempts")

    # -- what was killed ---------------------------------------------------------------------------
    assert first_exit in (None, 0), f"dispatch exited {first_exit} during the chaos window: {summary}"
    assert kills["job"] >= 1 and kills["worker"] >= 1 and kills["dispatcher"] >= 1, summary

    # -- every job DONE, with the value of an undisturbed run ----------------------------------------
    jobs = store.jobs(with_deps=False)
    assert Counter(j.status for j in jobs) == {Status.DONE: JOBS}
    wrong = [(j.id, j.results, expected[j.params["seed"]]) for j in jobs if j.results != expected[j.params["seed"]]]
    assert wrong == [], f"{len(wrong)} jobs differ from an undisturbed run (id, got, expected): {wrong[:5]}"
    assert store.running() == []

    # -- the audit trail: every claim an attempt, one DONE each, and the kills cost attempts -----------
    with store.engine.connect() as conn:
        events = conn.execute(
            sa.select(t_event.c.job_id, t_event.c.from_status, t_event.c.to_status).where(t_event.c.job_id.in_(ids))
        ).all()
    claims = Counter(e.job_id for e in events if e.to_status == Status.RUNNING.value)
    crashes = Counter(e.job_id for e in events if e.to_status == Status.CRASHED.value)
    dones = Counter(e.job_id for e in events if e.to_status == Status.DONE.value)
    assert dones == Counter({i: 1 for i in ids}), "a job became DONE more than once, or never"
    assert [e for e in events if e.from_status == Status.DONE.value] == [], "a DONE job was moved again"
    put_back = Counter(
        e.job_id for e in events if e.from_status == Status.RUNNING.value and e.to_status == Status.QUEUED.value
    )
    off = [
        (j.id, claims[j.id], j.attempt, put_back[j.id], j.lease)
        for j in jobs
        if not claims[j.id] == j.attempt + put_back[j.id] == j.lease
    ]
    assert off == [], f"claims, attempts and leases disagree (job, claims, attempt, put back, lease): {off[:10]}"
    off = [(i, claims[i], crashes[i], put_back[i]) for i in ids if claims[i] != crashes[i] + put_back[i] + 1]
    assert off == [], (
        f"every claim but the last must end CRASHED or put back (job, claims, crashes, put back): {off[:10]}"
    )
    assert sum(claims.values()) > JOBS, "no job needed a second attempt: the kills did nothing"

    # -- the side file: each attempt resumed from the last checkpoint, never from before it -------------
    runs = read_side_file(side)
    by_id = {j.id: j for j in jobs}
    resumed = 0
    for job_id in ids:
        attempts = runs.get(job_id, {})
        final_attempt = by_id[job_id].attempt
        assert final_attempt in attempts, f"job {job_id}: the attempt that ended DONE left no trace"
        assert max(attempts) <= final_attempt, f"job {job_id}: an attempt was logged that was never claimed"
        high = 0  # the highest step earlier runs logged, as their start or as saved
        for attempt in sorted(attempts):
            for lines in _runs_of(attempts[attempt]):  # more than one when the attempt was put back
                (what, begin), rest = lines[0], lines[1:]
                assert what == "begin" and rest == [("saved", s) for s in range(begin + 1, begin + 1 + len(rest))], (
                    f"job {job_id} attempt {attempt} did not log one start and then consecutive steps: {lines}"
                )
                assert high <= begin <= high + 1, (
                    f"job {job_id} attempt {attempt} started at step {begin}, but "
                    f"earlier runs had saved step {high}: {dict(attempts)}"
                )
                resumed += begin > 0
                high = begin + len(rest)
        last = _runs_of(attempts[final_attempt])[-1]
        assert last[-1] == (("saved", STEPS) if len(last) > 1 else ("begin", STEPS)), (
            f"job {job_id}: the attempt that ended DONE did not log every step: {last}"
        )
    assert resumed > 0, "no attempt resumed from a checkpoint: the resume check proved nothing"

    # -- no traceback and no lock error in any log -----------------------------------------------------
    problems = []
    for log in [*logs, *sorted((runs_dir / store.experiment / "_workers").glob("*.log"))]:
        lines = log.read_text(errors="replace").splitlines()
        problems += [
            f"{log.name}: " + "\n    ".join(lines[i : i + 12]) for i, line in enumerate(lines) if FORBIDDEN.search(line)
        ]
    assert problems == [], "\n".join(problems[:10])
    store.dispose()

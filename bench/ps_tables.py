"""jobman.ps between 2 ranks: adds and gets per second of an ArrayTableHandler of 1e3 and 1e6 floats, against
mpi4py's own Allreduce of the same array in the same run (the floor), and whether a get waits for a busy rank.

    python bench/ps_tables.py [--append] [--defaults] [--before REV]
        # starts itself under the mpich wheel's mpiexec; writes bench/RESULTS-ps.md. --defaults: MPICH's
        # defaults only; --before REV: jobman.ps as it was at git revision REV, measured in the same run

Target: a jobman.ps step (every rank adds its array, barrier, every rank gets the sum), the work one Allreduce
does, within 2x of the Allreduce.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SIZES = tuple(int(s) for s in os.environ.get("PS_BENCH_SIZES", "1000,1000000").split(","))
SECONDS = 0.5  # per round of one measurement, best of ROUNDS
ROUNDS = 6
BUSY_SECONDS = 2.0


def calibrated(comm, body) -> int:
    """How many operations make one round of ``body`` last about SECONDS, the same on every rank."""
    from mpi4py import MPI

    k = 1
    while True:
        comm.Barrier()
        start = time.perf_counter()
        body(k)
        took = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
        if took > SECONDS / 10:
            return max(1, int(k * SECONDS / took))
        k *= 4


def timed(comm, bodies: dict) -> dict[str, float]:
    """Operations per second of each ``body(k)`` (k operations, then whatever completes them), best of ROUNDS.
    The bodies take turns within each round, so that a load that comes and goes on a shared machine weighs
    on all of them alike, and the ratios between them hold."""
    from mpi4py import MPI

    counts = {name: calibrated(comm, body) for name, body in bodies.items()}
    best = dict.fromkeys(bodies, 0.0)
    for _ in range(ROUNDS):
        for name, body in bodies.items():
            comm.Barrier()
            start = time.perf_counter()
            body(counts[name])
            took = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            best[name] = max(best[name], counts[name] / took)
    return best


def before_module():
    """jobman.ps as it was at the revision $PS_BENCH_BEFORE (a file main wrote), to measure beside today's."""
    import importlib.util

    path = os.environ.get("PS_BENCH_BEFORE_FILE")
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("jobman_ps_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.init()
    return module


def step_bodies(ps, table, mine, prefix: str = "") -> dict:
    """Timed bodies of adds alone, gets alone and steps (add, barrier, get) of ``table``."""

    def adds(k: int) -> None:
        for _ in range(k):
            table.add(mine)
        ps.barrier()

    def gets(k: int) -> None:
        for _ in range(k):
            table.get()

    def steps(k: int) -> None:
        for _ in range(k):
            table.add(mine)
            ps.barrier()
            table.get()

    return {prefix + "add": adds, prefix + "get": gets, prefix + "step": steps}


def rates(comm, ps, size: int, before=None) -> dict[str, float]:
    """Per-rank operations per second for one table size (and of the earlier jobman.ps, ``before``)."""
    from mpi4py import MPI

    mine = np.random.default_rng(comm.rank).random(size, dtype=np.float32)
    summed = np.empty_like(mine)
    table = ps.ArrayTableHandler(size)

    def allreduce(k: int) -> None:
        for _ in range(k):
            comm.Allreduce(mine, summed, op=MPI.SUM)

    first, end = table.local_rows
    raw = MPI.Win.Allocate((end - first) * 4, 4, comm=comm)
    bounds = comm.allgather(table.local_rows)
    raw.Lock_all()

    def raw_gets(k: int) -> None:  # what a get would cost without its atomicity: not part of the API
        out = np.empty(size, dtype=np.float32)
        for _ in range(k):
            for owner, (first, end) in enumerate(bounds):
                raw.Get(out[first:end], owner, target=(0, end - first, MPI.FLOAT))
            raw.Flush_all()

    bodies = {"allreduce": allreduce, **step_bodies(ps, table, mine), "raw_get": raw_gets}
    if before is not None:
        bodies.update(step_bodies(before, before.ArrayTableHandler(size), mine, "before_"))
    figures = timed(comm, bodies)
    raw.Unlock_all()
    raw.Free()
    return figures


def progress(comm, ps) -> dict[str, dict]:
    """Rank 0 adds to a table held by rank 1 and gets it back (MPI orders the get after the add, so
    the pair waits for the add to land), while rank 1 computes without entering MPI, and while it waits in a
    barrier: how many pairs, the slowest, and whether every add was in once rank 1 came back."""
    table = ps.ArrayTableHandler(1000, dtype=np.int64)
    while comm.allgather(table.local_rows)[1] != (0, 1000):  # small tables take turns: one rank 1 holds
        table = ps.ArrayTableHandler(1000, dtype=np.int64)
    ones = np.ones(1000, dtype=np.int64)
    found: dict[str, dict] = {}
    for busy in (False, True):
        comm.Barrier()
        if comm.rank == 0:
            before = int(table.get()[-1])
            latencies, end = [], time.perf_counter() + BUSY_SECONDS
            while time.perf_counter() < end:
                start = time.perf_counter()
                table.add(ones)
                seen = int(table.get()[-1])  # it lives on rank 1
                latencies.append(time.perf_counter() - start)
            found["busy" if busy else "idle"] = {
                "pairs": len(latencies),
                "slowest_ms": 1000 * max(latencies),
                "median_ms": 1000 * float(np.median(latencies)),
                "all_seen": seen - before == len(latencies),
            }
        elif busy:
            x, end = np.random.default_rng(0).random((100, 100)), time.perf_counter() + BUSY_SECONDS + 0.2
            while time.perf_counter() < end:
                x = np.tanh(x @ x.T / 100)
        ps.barrier()
    return found


def anatomy(comm) -> dict[str, float]:
    """Microseconds per round of bare MPI (no jobman) on 2 x 500 floats: where a small step's time goes."""
    from mpi4py import MPI

    n, other = 500, 1 - comm.rank
    mine, one, got = np.ones(n, dtype=np.float32), np.ones(1, dtype=np.int32), np.empty(1, dtype=np.int32)
    win = MPI.Win.Allocate(n * 4, 4, comm=comm)
    win.Lock_all()
    span = (0, n, MPI.FLOAT)

    def accumulate() -> None:
        for owner in (comm.rank, other):
            win.Accumulate(mine, owner, target=span, op=MPI.SUM)

    def put() -> None:
        for owner in (comm.rank, other):
            win.Put(mine, owner, target=span)

    rounds = {
        "Barrier": lambda: comm.Barrier(),
        "Put, Flush_all, Barrier": lambda: (put(), win.Flush_all(), comm.Barrier()),
        "Accumulate, Flush_all": lambda: (accumulate(), win.Flush_all()),
        "Accumulate, Flush_all, Barrier": lambda: (accumulate(), win.Flush_all(), comm.Barrier()),
        "Accumulate, Flush_all, Allreduce of 1 int": lambda: (accumulate(), win.Flush_all(), comm.Allreduce(one, got)),
    }

    def repeat(body):
        return lambda k: [body() for _ in range(k)]

    rates = timed(comm, {name: repeat(body) for name, body in rounds.items()})
    win.Unlock_all()
    win.Free()
    return {name: 1e6 / rate for name, rate in rates.items()}


def rank_main() -> None:
    """What each rank runs under mpiexec; rank 0 prints the figures as one JSON line."""
    from mpi4py import MPI

    from jobman import ps

    ps.init()
    comm = MPI.COMM_WORLD
    before = before_module()
    figures = {
        "sizes": {size: rates(comm, ps, size, before) for size in SIZES},
        "progress": progress(comm, ps),
        "anatomy": anatomy(comm),
    }
    ps.shutdown()
    if before is not None:
        before.shutdown()
    if comm.rank == 0:
        figures["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
        import mpi4py

        figures["mpi4py"] = mpi4py.__version__
        print(json.dumps(figures), flush=True)


def launch(extra_env: dict[str, str]) -> dict:
    """Run this file on 2 ranks with the mpiexec beside this Python; the figures rank 0 printed."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **extra_env}
    done = subprocess.run(
        [str(mpiexec), "-n", "2", sys.executable, "-m", "mpi4py", __file__, "--rank"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))


SETTINGS = {
    "MPICH's defaults": {},
    "MPIR_CVAR_POLLS_BEFORE_YIELD=0": {"MPIR_CVAR_POLLS_BEFORE_YIELD": "0"},
    "MPIR_CVAR_ASYNC_PROGRESS=1": {"MPIR_CVAR_ASYNC_PROGRESS": "1"},
}


def report(runs: dict[str, dict], command: str) -> str:
    """The figures as markdown: rates per size and MPICH setting, then the adds and gets to a busy rank."""
    lines = [
        "| MPICH setting | floats | Allreduce /s (floor) | ps step /s (add, barrier, get)"
        " | step time / Allreduce time | add /s | get /s | raw Win.Get /s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    before = any("before_step" in f for figures in runs.values() for f in figures["sizes"].values())
    if before:
        lines[0] += " before: step /s | before: step time / Allreduce time |"
        lines[1] += "---|---|"
    for setting, figures in runs.items():
        for size, f in figures["sizes"].items():
            ratio = f["allreduce"] / f["step"]
            lines.append(
                f"| {setting} | {int(size):,} | {f['allreduce']:,.0f} | {f['step']:,.0f} | {ratio:.2f}x |"
                f" {f['add']:,.0f} | {f['get']:,.0f} | {f['raw_get']:,.0f} |"
                + (f" {f['before_step']:,.0f} | {f['allreduce'] / f['before_step']:.2f}x |" if before else "")
            )
            verdicts.append(
                f"- {setting}, {int(size):,} floats: a step within 2x of Allreduce:"
                f" {'yes' if ratio <= 2 else 'NO'} ({ratio:.2f}x); adds alone"
                f" {f['add'] / f['allreduce']:.2f}x and gets alone {f['get'] / f['allreduce']:.2f}x"
                " the Allreduce rate" + (f"; before: {f['allreduce'] / f['before_step']:.2f}x" if before else "")
            )
    lines += [
        "",
        *verdicts,
        "",
        "An add then a get by rank 0 of a 1,000-number table held by rank 1, for"
        f" {BUSY_SECONDS:.0f} s, while rank 1 waits in a barrier (idle) or computes without calling MPI (busy);"
        " the get is ordered after the add, so each pair waits for its add to land:",
        "",
        "| MPICH setting | rank 1 | add+get pairs | median ms | slowest ms | each get saw every add |",
        "|---|---|---|---|---|---|",
    ]
    for setting, figures in runs.items():
        for state, p in figures["progress"].items():
            lines.append(
                f"| {setting} | {state} | {p['pairs']:,} | {p['median_ms']:.3f} | {p['slowest_ms']:.1f} |"
                f" {'yes' if p['all_seen'] else 'NO'} |"
            )
    lines += [
        "",
        "Where a small step's time goes: microseconds per round of bare mpi4py, 2 ranks, 500 floats to"
        " each (no jobman):",
        "",
        "| round | " + " | ".join(runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for name in next(iter(runs.values()))["anatomy"]:
        lines.append(f"| {name} | " + " | ".join(f"{f['anatomy'][name]:,.1f}" for f in runs.values()) + " |")
    first = next(iter(runs.values()))
    load = os.getloadavg()[0]
    lines += [
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.processor() or 'x86_64'},"
        f" {os.cpu_count()} CPUs shared with other work (load average {load:.1f} at the end);"
        f" {first['mpi']}, mpi4py {first['mpi4py']}, Python {platform.python_version()},"
        f" NumPy {np.__version__}. Rates are per rank, best of {ROUNDS} rounds of about {SECONDS} s,"
        " taken in turns.",
        f"Command: `{command}`",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = sys.argv[1:]
    settings = dict(list(SETTINGS.items())[:1]) if "--defaults" in args else SETTINGS
    extra: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "--before" in args:  # jobman.ps at that git revision, measured in the same run, in turns
            revision = args[args.index("--before") + 1]
            source = subprocess.run(
                ["git", "show", f"{revision}:dispatch/ps.py"], cwd=HERE.parent, capture_output=True, check=True
            ).stdout
            Path(tmp, "ps_before.py").write_bytes(source)
            extra["PS_BENCH_BEFORE_FILE"] = str(Path(tmp, "ps_before.py"))
        runs = {setting: launch({**env, **extra}) for setting, env in settings.items()}
    append = "--append" in args  # a second run beside the first: on a shared machine, one run is an anecdote
    text = report(runs, "python bench/ps_tables.py " + " ".join(args))
    print(text)
    results = HERE / "RESULTS-ps.md"
    if append and results.exists():
        results.write_text(results.read_text() + "\n## Another run\n\n" + text)
    else:
        results.write_text("# jobman.ps benchmark\n\nWritten by `bench/ps_tables.py`.\n\n" + text)


if __name__ == "__main__":
    rank_main() if "--rank" in sys.argv else main()

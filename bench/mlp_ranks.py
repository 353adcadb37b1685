"""The bundled MLP on Fashion-MNIST trained by one process, then data-parallel by 2 ranks (``ps=1``).

    python bench/mlp_ranks.py [--epochs 4] [--rounds 1] [--no-write]

One ``jobman worker`` on SQLite runs, in turn and in the same invocation, the MLP as one process (the
baseline) and as a gang of 2 ranks started by the ``ps`` extra's mpiexec, the weights and Adam's slots in
the parameter server, with the same parameters and seed: a fixed number of epochs (no early stop), one
validation per epoch. Each job reports its seconds (training and validations, not the data's loading) and
its test error; a rank's epoch time is the job's seconds over its epochs. ``--rounds`` repeats the pair,
alternating which runs first. The load average is read beside each job.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Figure, machine, say

from jobman.jobdb.store import Store

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS-gangs.md"
SECTION = "## The data-parallel MLP on Fashion-MNIST"


def run_job(tmp: Path, name: str, ranks: int, epochs: int) -> dict:
    """One MLP job through one worker: its seconds per epoch, test error and the load average after it."""
    url = f"sqlite:///{tmp / name}.db?table=t"
    env = {**os.environ, "JOBMAN_GANG_LAUNCH": "mpiexec"}
    jobman = [sys.executable, "-m", "jobman.cli.main"]
    params = ["dataset=fashion-mnist", f"epochs={epochs}", "patience=1000", "lr_patience=0", "eval_every=0"]
    params += ["checkpoint_every=0", "progress_every=0"]
    gang = ["ps=1", "--ranks", str(ranks)] if ranks > 1 else []
    subprocess.run([*jobman, "sqlschedule", url, "jobman.models.mlp:train", *params, *gang], env=env, check=True)
    subprocess.run([*jobman, "worker", url, "--exproot", str(tmp / f"runs-{name}")], env=env, check=True)
    load = os.getloadavg()[0]
    store = Store.open(url)
    try:
        [job] = store.jobs()
        assert job.status.value == "DONE", (name, job.error)
        return {
            "epoch_seconds": job.results["seconds"] / epochs,
            "test_error": job.results["test_error"],
            "valid_error": job.results["valid_error"],
            "load": load,
        }
    finally:
        store.dispose()


def write(text: str) -> None:
    """Put this benchmark's section in RESULTS-gangs.md, in place of its last one."""
    old = RESULTS.read_text() if RESULTS.exists() else ""
    kept = re.split(rf"\n?{re.escape(SECTION)}\n", old, maxsplit=1)[0].rstrip("\n")
    RESULTS.write_text((kept + "\n\n" if kept else "") + text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs, alternating which goes first")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {RESULTS.name}")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="jobman-mlp-ranks-"))
    rows: list[tuple[str, dict]] = []
    for i in range(args.rounds):
        order = [("1 process", 1), ("2 ranks, ps=1", 2)]
        for label, ranks in order if i % 2 == 0 else order[::-1]:
            rows.append((label, run_job(tmp, f"r{i}-{ranks}", ranks, args.epochs)))
    ones = [r for label, r in rows if label == "1 process"]
    twos = [r for label, r in rows if label != "1 process"]
    base = min(r["epoch_seconds"] for r in ones)
    best = min(r["epoch_seconds"] for r in twos)
    load = os.getloadavg()[0]
    say(Figure("epoch, 2 ranks", best, "s", base, "measured: the speed-up this machine gives", note=f"load {load:.1f}"))
    say(Figure("test error, 2 ranks", twos[0]["test_error"], "", ones[0]["test_error"], "within noise of one process"))
    if args.no_write:
        return
    m = machine()
    lines = [
        SECTION,
        "",
        f"Written by `bench/mlp_ranks.py --epochs {args.epochs} --rounds {args.rounds}` ({m['cpu']}, {m['date']}). "
        "`jobman.models.mlp:train dataset=fashion-mnist` (784-256-10, Adam, batch 64, input noise 0.1), a fixed "
        f"{args.epochs} epochs with one validation each, one process against 2 ranks (`ps=1 --ranks 2`, "
        "mpiexec) in the same run, one worker on SQLite; each job's load average (1 min) read as it ended.",
        "",
        "| run | seconds per epoch | test error | valid error | load |",
        "|---|---|---|---|---|",
    ]
    for label, r in rows:
        lines.append(
            f"| {label} | {r['epoch_seconds']:.2f} | {r['test_error']:.4f} | {r['valid_error']:.4f} | {r['load']:.1f} |"
        )
    lines += [
        "",
        f"Speed-up of 2 ranks over one process (fastest epoch of each): {base / best:.2f}x, on a machine of "
        f"{os.cpu_count()} cores shared with other work (load {load:.1f} at the end).",
        "",
    ]
    write("\n".join(lines))


if __name__ == "__main__":
    main()

"""Benchmark: random search against a grid, and successive halving against the full budget.

    python bench/search.py                   # small: 16 points, 3 folds, 9 epochs at most, 2 seeds
    python bench/search.py --points 32 --epochs 27 --seeds 3     # the size the targets are stated for

The bundled MLP (``jobman.models.mlp:train``) on digits, with ``nb_cross_fold`` folds; a
configuration's score is its validation error averaged over the folds, as ``jobman report``
ranks it. Over the same ranges (lr log-uniform in [1e-4, 1e-1], nhid in {32, 64, 128, 256}):

- grid: lr at evenly log-spaced values times the four nhid, ``--points`` in all, full budget;
- random: ``--points`` draws of ``lr=loguniform(1e-4,1e-1) nhid=choice(32,64,128,256)`` from the
  seed (the sweep grammar's own draws), full budget;
- full: the random configurations, each trained to ``--epochs`` (the baseline of halving);
- halving: the same configurations through ``--halving epochs=MIN:MAX --eta 3`` rungs, chosen by
  the rules the database applies (``jobdb.halving.choose``), each promoted run continuing in a copy
  of its parent's workdir, as a worker starts it.

Runs are made in this process with ``run_direct`` (no database: the benchmark measures the search,
not the queue), one BLAS thread, one after another. Epochs are counted as trained: a promoted run
counts only the epochs it added. Figures are measured in this run and written to
``bench/RESULTS-search.md``; on a shared machine only the seconds are noisy, not the errors.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import datetime, timezone  # noqa: E402
from pathlib import Path  # noqa: E402

from jobman.dispatch.experiment import run_direct  # noqa: E402
from jobman.jobdb.halving import choose, config_of, rung_values  # noqa: E402
from jobman.jobdb.sweep import expand, format_value, parse_sweep  # noqa: E402

RESULTS = Path(__file__).with_name("RESULTS-search.md")
TARGET = "jobman.models.mlp:train"
NHID = (32, 64, 128, 256)
FIXED = {"dataset": "digits", "eval_every": 0, "progress_every": 0, "checkpoint_every": 0}


class Runner:
    """Runs MLP jobs in fresh directories and counts the epochs they train."""

    def __init__(self, root: Path, folds: int) -> None:
        self.root, self.folds, self.epochs, self.count = root, folds, 0, 0

    def fold_dirs(self, config: dict, epochs: int) -> list[Path]:
        self.count += 1
        return [self.root / f"run{self.count}-fold{f}" for f in range(self.folds)]

    def score(self, config: dict, epochs: int, parents: list[Path] | None = None) -> tuple[float, list[Path]]:
        """The mean validation error over the folds; a run with ``parents`` continues their workdirs."""
        dirs, errors = self.fold_dirs(config, epochs), []
        for fold, workdir in enumerate(dirs):
            if parents:
                shutil.copytree(parents[fold], workdir)
            params = {**FIXED, **config, "epochs": epochs, "nb_cross_fold": self.folds, "id_cross_fold": fold}
            outcome = run_direct(TARGET, params, workdir)
            if outcome.status != "DONE":
                raise RuntimeError(f"{config}: {outcome.status} {outcome.error}")
            errors.append(outcome.results["valid_error"])
            self.epochs += epochs - (_epochs_in(parents[fold]) if parents else 0)
        return statistics.fmean(errors), dirs


def _epochs_in(workdir: Path) -> int:
    import json

    return max(json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines())


def grid_configs(points: int) -> list[dict]:
    per = max(1, points // len(NHID))
    lrs = [float(f"{10 ** (-4 + 3 * i / max(1, per - 1)):.6g}") for i in range(per)]
    tokens = [TARGET, "lr={{" + ",".join(map(format_value, lrs)) + "}}", "nhid={{" + ",".join(map(str, NHID)) + "}}"]
    return [s.params for s in expand(parse_sweep(tokens))]


def random_configs(points: int, seed: int) -> list[dict]:
    tokens = [TARGET, "lr=loguniform(1e-4,1e-1)", f"nhid=choice({','.join(map(str, NHID))})"]
    return [s.params for s in expand(parse_sweep(tokens), samples=points, seed=seed)]


def full_budget(runner: Runner, configs: list[dict], epochs: int) -> float:
    return min(runner.score(c, epochs)[0] for c in configs)


def halving(runner: Runner, configs: list[dict], low: int, high: int, eta: int) -> float:
    """Synchronous successive halving by the database's rules; the best score at the top rung."""
    rungs = rung_values(low, high, eta)
    alive = {config_of(c, "epochs"): (c, None) for c in configs}
    best = float("inf")
    for k, epochs in enumerate(rungs):
        scores, dirs = {}, {}
        for key, (config, parents) in alive.items():
            scores[key], dirs[key] = runner.score(config, epochs, parents)
        if k == len(rungs) - 1:
            best = min(scores.values())
            break
        chosen = choose(scores, len(scores), [], eta, "min", False)
        alive = {key: (alive[key][0], dirs[key]) for key in chosen}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=16, help="configurations per search (grid: a multiple of 4)")
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=9, help="the full budget: epochs of a fully trained run")
    ap.add_argument("--min-epochs", type=int, default=1, help="the first rung of halving")
    ap.add_argument("--eta", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()

    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="jobman-bench-search-") as tmp:
        grid_runner = Runner(Path(tmp) / "grid", args.folds)
        grid_best = full_budget(grid_runner, grid_configs(args.points), args.epochs)
        print(f"grid of {args.points}: best valid_error {grid_best:.4f}, {grid_runner.epochs} epochs", flush=True)
        for seed in range(args.seeds):
            configs = random_configs(args.points, seed)
            full, halv = Runner(Path(tmp) / f"full{seed}", args.folds), Runner(Path(tmp) / f"halv{seed}", args.folds)
            full_best = full_budget(full, configs, args.epochs)
            halving_best = halving(halv, configs, args.min_epochs, args.epochs, args.eta)
            rows.append((seed, full_best, full.epochs, halving_best, halv.epochs))
            print(f"seed {seed}: random/full best {full_best:.4f} in {full.epochs} epochs; "
                  f"halving best {halving_best:.4f} in {halv.epochs} epochs", flush=True)
    seconds = time.perf_counter() - started

    random_mean = statistics.fmean(r[1] for r in rows)
    gaps = [100 * (r[3] - r[1]) for r in rows]
    shares = [r[4] / r[2] for r in rows]
    halving_met = all(g <= 0.5 for g in gaps) and all(s <= 1 / 3 for s in shares)
    random_met = random_mean <= grid_best
    lines = [
        f"## Search quality ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} cores, shared)",
        "",
        f"`python bench/search.py --points {args.points} --folds {args.folds} --epochs {args.epochs} "
        f"--min-epochs {args.min_epochs} --eta {args.eta} --seeds {args.seeds}` ({seconds:.0f} s). "
        "Validation error is the mean over the folds, in percent.",
        "",
        "| seed | random, full budget: best | its epochs | halving: best | its epochs | gap (points) | epochs share |",
        "|---|---|---|---|---|---|---|",
        *[f"| {s} | {100 * fb:.2f} | {fe} | {100 * hb:.2f} | {he} | {g:+.2f} | {sh:.2f} |"
          for (s, fb, fe, hb, he), g, sh in zip(rows, gaps, shares)],
        "",
        f"- grid of {args.points} (lr log-spaced x nhid), full budget: best {100 * grid_best:.2f} "
        f"({grid_runner.epochs} epochs); random search, mean over seeds: {100 * random_mean:.2f}. "
        f"Target (random at least matches the grid): {'met' if random_met else 'MISSED'}.",
        f"- halving within 0.5 points of the full-budget best with at most a third of its epochs, every seed: "
        f"{'met' if halving_met else 'MISSED'} (largest gap {max(gaps):+.2f} points, largest share "
        f"{max(shares):.2f}).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.write_text("# Search benchmark\n\nWritten by `bench/search.py`; see its docstring for the method.\n\n"
                       + text)


if __name__ == "__main__":
    main()

"""Benchmark: random search against a grid, and successive halving against the full budget.

    python bench/search.py                   # small: 16 points, 3 folds, 9 epochs at most, 2 seeds
    python bench/search.py --points 32 --epochs 27 --seeds 3     # the size the targets are stated for
    python bench/search.py --space 3d --points 32 --epochs 27 --seeds 3      # lr, nhid and momentum
    python bench/search.py --space 3d --points 32 --epochs 27 --min-epochs 3 --seeds 10 --outer-folds 5

The bundled MLP (``jobman.models.mlp:train``) on digits, with ``nb_cross_fold`` folds; a
configuration's score is its validation error averaged over the folds, as ``jobman report``
ranks it. Each fold validates on a seeded 10 % of its training part (119 digits; ``--valid-fraction``
changes the share), or, with ``--outer-folds K``, on one of the folds themselves: k-fold
cross-validation of the pool left once outer fold 0 of K is set aside as the test set, the
folds' validation sets covering that pool once (the trainer's double cross-validation,
``nb_outer_fold``). Three search spaces (``--space``):

- ``2d``: lr log-uniform in [1e-4, 1e-1], nhid in {32, 64, 128, 256}, the trainer's default
  optimizer (Adam); the grid is ``--points / 4`` log-spaced lr (both ends included) times the
  four nhid.
- ``3d``: the same two plus momentum uniform in [0.5, 0.99], with ``optimizer=momentum``
  (heavy-ball SGD: Adam does not read ``momentum``); the grid is ``--points / 8`` log-spaced lr
  times the four nhid times two momenta, evenly spaced with both ends included (0.5 and 0.99).
- ``3d-adam``: the same three with the trainer's default optimizer, Adam, which does not read
  ``momentum``: a space where one of three parameters has no effect (the case random search is
  made for), and the same grid as ``3d``.

In either space, over the same ranges and the same folds:

- grid: the points above, full budget;
- random: ``--points`` draws of the distributions from the seed (the sweep grammar's own draws,
  ``--sampler random``), full budget;
- quasi-random: ``--points`` draws from the same seed with ``--sampler halton`` (a Halton
  sequence randomly shifted by the seed), full budget;
- full: the random configurations, each trained to ``--epochs`` (the baseline of halving);
- halving: the same configurations through ``--halving epochs=MIN:MAX --eta 3`` rungs, chosen by
  the rules the database applies (``jobdb.halving.choose``), each promoted run continuing in a copy
  of its parent's workdir, as a worker starts it.

With ``--learn``, searches that learn instead (``python bench/search.py --learn --space 2d --points 32
--folds 3 --epochs 9 --outer-folds 5 --seeds 5``), each seed in one process, ``--jobs`` at once:

- at the grid's number of evaluations, full budget: the grid, random search, and jobman's
  ``--sampler tpe`` through a SQLite job table (its jobs claimed and finished in this process by the
  store, each end proposing the next configuration in the finishing transaction, one pending at a
  time); beside them Optuna's ``TPESampler`` with the settings jobman gives it (multivariate, constant
  liar, ``min(10, points // 4)`` random start-up, the seed) in Optuna's own ask/tell loop over the same
  trainer and folds, one trial at a time: the algorithm without jobman's plumbing. For each, the
  evaluations it took to first reach the grid's best (never: more than the grid's);
- epochs spent until a configuration trained to ``--epochs`` first reaches the grid's best: Optuna's
  own recommended pair, ``TPESampler`` with ``HyperbandPruner(min_resource=--min-epochs,
  max_resource=--epochs, reduction_factor=--eta)`` driving the same trainer in this process (each
  trial trained rung by rung in its own workdirs, reporting the folds' mean at each rung), against
  jobman's ``--sampler tpe --halving epochs=MIN:MAX --eta E --async`` through the job table (a
  promoted job continuing a copy of its parent's workdirs, as a worker does), one job at a time; both
  given ``3 * --points`` configurations at most (``--only tpe`` leaves this pair out, so that many
  seeds of the searches at the full budget are affordable).

Runs are made in this process with ``run_direct`` (no database: the benchmark measures the search,
not the queue), one BLAS thread, one after another. Epochs are counted as trained: a promoted run
counts only the epochs it added. Figures are measured in this run and written to
``bench/RESULTS-search.md``, in place of an earlier run of the same command; on a shared machine
only the seconds are noisy, not the errors.
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import argparse
import math
import platform
import re
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from jobman.dispatch.runner import run_direct
from jobman.jobdb.halving import choose, config_of, rung_values
from jobman.jobdb.sweep import expand, format_value, parse_sweep

RESULTS = Path(__file__).with_name("RESULTS-search.md")
TARGET = "jobman.models.mlp:train"
NHID = (32, 64, 128, 256)
FIXED = {"dataset": "digits", "eval_every": 0, "progress_every": 0, "checkpoint_every": 0}


class Runner:
    """Runs MLP jobs in fresh directories and counts the epochs they train."""

    def __init__(self, root: Path, folds: int, fixed: dict | None = None) -> None:
        self.root, self.folds, self.epochs, self.count = root, folds, 0, 0
        self.fixed = {**FIXED, **(fixed or {})}

    def fold_dirs(self, config: dict, epochs: int) -> list[Path]:
        self.count += 1
        return [self.root / f"run{self.count}-fold{f}" for f in range(self.folds)]

    def score(self, config: dict, epochs: int, parents: list[Path] | None = None) -> tuple[float, list[Path]]:
        """The mean validation error over the folds; a run with ``parents`` continues their workdirs."""
        dirs, errors = self.fold_dirs(config, epochs), []
        for fold, workdir in enumerate(dirs):
            if parents:
                shutil.copytree(parents[fold], workdir)
            params = {**self.fixed, **config, "epochs": epochs, "nb_cross_fold": self.folds, "id_cross_fold": fold}
            outcome = run_direct(TARGET, params, workdir)
            if outcome.status != "DONE":
                raise RuntimeError(f"{config}: {outcome.status} {outcome.error}")
            errors.append(outcome.results["valid_error"])
            self.epochs += epochs - (_epochs_in(parents[fold]) if parents else 0)
        return statistics.fmean(errors), dirs


def _epochs_in(workdir: Path) -> int:
    import json

    return max(json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines())


def _log_spaced(low_exp: float, high_exp: float, count: int) -> list[float]:
    return [float(f"{10 ** (low_exp + (high_exp - low_exp) * i / max(1, count - 1)):.6g}") for i in range(count)]


def _even(low: float, high: float, count: int) -> list[float]:
    return [float(f"{low + (high - low) * i / max(1, count - 1):.6g}") for i in range(count)]


def _grid_token(key: str, values: list) -> str:
    return f"{key}={{{{" + ",".join(map(format_value, values)) + "}}"


# Each space: the fixed parameters, the distributions random search draws from, and the grid
# over the same ranges for a given number of points.
SPACES = {
    "2d": {
        "fixed": [],
        "drawn": ["lr=loguniform(1e-4,1e-1)", f"nhid=choice({','.join(map(str, NHID))})"],
        "grid": lambda points: [
            _grid_token("lr", _log_spaced(-4, -1, max(1, points // len(NHID)))),
            _grid_token("nhid", list(NHID)),
        ],
        "grid_text": "{lrs} log-spaced lr x 4 nhid",
    },
    "3d": {
        "fixed": ["optimizer=momentum"],
        "drawn": ["lr=loguniform(1e-4,1e-1)", f"nhid=choice({','.join(map(str, NHID))})", "momentum=uniform(0.5,0.99)"],
        "grid": lambda points: [
            _grid_token("lr", _log_spaced(-4, -1, max(1, points // (2 * len(NHID))))),
            _grid_token("nhid", list(NHID)),
            _grid_token("momentum", _even(0.5, 0.99, 2)),
        ],
        "grid_text": "{lrs} log-spaced lr x 4 nhid x 2 momentum",
    },
    "3d-adam": {
        "fixed": [],
        "drawn": ["lr=loguniform(1e-4,1e-1)", f"nhid=choice({','.join(map(str, NHID))})", "momentum=uniform(0.5,0.99)"],
        "grid": lambda points: [
            _grid_token("lr", _log_spaced(-4, -1, max(1, points // (2 * len(NHID))))),
            _grid_token("nhid", list(NHID)),
            _grid_token("momentum", _even(0.5, 0.99, 2)),
        ],
        "grid_text": "{lrs} log-spaced lr x 4 nhid x 2 momentum, momentum without effect under Adam",
    },
}


def grid_configs(space: str, points: int) -> list[dict]:
    tokens = [TARGET, *SPACES[space]["fixed"], *SPACES[space]["grid"](points)]
    return [s.params for s in expand(parse_sweep(tokens))]


def random_configs(space: str, points: int, seed: int, sampler: str = "random") -> list[dict]:
    tokens = [TARGET, *SPACES[space]["fixed"], *SPACES[space]["drawn"]]
    return [s.params for s in expand(parse_sweep(tokens), samples=points, seed=seed, sampler=sampler)]


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


def _versus(bests: list[float], grid_best: float) -> str:
    # Compared in whole validation digits: errors are means of per-fold fractions, so equal counts
    # may differ in the last bits.
    won = sum(b < grid_best - 1e-9 for b in bests)
    tied = sum(abs(b - grid_best) <= 1e-9 for b in bests)
    return f"beats the grid on {won} seed(s), ties on {tied}, loses on {len(bests) - won - tied}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--space",
        choices=sorted(SPACES),
        default="2d",
        help="2d: lr x nhid (Adam); 3d: lr x nhid x momentum (SGD with momentum); "
        "3d-adam: lr x nhid x momentum under Adam, which ignores momentum",
    )
    ap.add_argument(
        "--points",
        type=int,
        default=16,
        help="configurations per search (grid: a multiple of 4, or of 8 for --space 3d)",
    )
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=9, help="the full budget: epochs of a fully trained run")
    ap.add_argument("--min-epochs", type=int, default=1, help="the first rung of halving")
    ap.add_argument("--eta", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument(
        "--outer-folds",
        type=int,
        default=None,
        help="validate by k-fold cross-validation: the --folds folds are the inner folds of "
        "outer fold 0 of this many (its test set left aside), so their validation sets "
        "together cover the whole pool (1,438 digits with 5), not 119 digits a fold",
    )
    ap.add_argument(
        "--valid-fraction",
        type=float,
        default=None,
        help="the share of each fold's training part held out for validation (the trainer's "
        "default: 0.1, 119 digits a fold); larger makes the validation error finer",
    )
    ap.add_argument("--learn", action="store_true", help="compare searches that learn (see the docstring)")
    ap.add_argument("--jobs", type=int, default=2, help="with --learn: seeds run at once, one process each")
    ap.add_argument(
        "--only",
        choices=["tpe"],
        default=None,
        help="with --learn: only the searches at the full budget (random, jobman's tpe, Optuna's TPE), "
        "not the multi-fidelity pair",
    )
    args = ap.parse_args()
    if args.outer_folds is not None and args.valid_fraction is not None:
        ap.error("--outer-folds validates on whole folds: --valid-fraction has no share to set there")
    if args.learn:
        learned(args)
        return
    space = SPACES[args.space]

    rows = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="jobman-bench-search-") as tmp:
        grid = grid_configs(args.space, args.points)
        fixed = {} if args.valid_fraction is None else {"valid_fraction": args.valid_fraction}
        if args.outer_folds is not None:
            fixed.update(nb_outer_fold=args.outer_folds, id_outer_fold=0)
        grid_runner = Runner(Path(tmp) / "grid", args.folds, fixed)
        grid_best = full_budget(grid_runner, grid, args.epochs)
        print(f"grid of {len(grid)}: best valid_error {grid_best:.4f}, {grid_runner.epochs} epochs", flush=True)
        for seed in range(args.seeds):
            configs = random_configs(args.space, args.points, seed)
            full, halv = (Runner(Path(tmp) / f"{kind}{seed}", args.folds, fixed) for kind in ("full", "halv"))
            quasi = Runner(Path(tmp) / f"quasi{seed}", args.folds, fixed)
            full_best = full_budget(full, configs, args.epochs)
            quasi_best = full_budget(quasi, random_configs(args.space, args.points, seed, "halton"), args.epochs)
            halving_best = halving(halv, configs, args.min_epochs, args.epochs, args.eta)
            rows.append((seed, full_best, quasi_best, full.epochs, halving_best, halv.epochs))
            print(
                f"seed {seed}: random/full best {full_best:.4f}, quasi-random {quasi_best:.4f}, "
                f"each in {full.epochs} epochs; halving best {halving_best:.4f} in {halv.epochs} epochs",
                flush=True,
            )
    seconds = time.perf_counter() - started

    random_mean = statistics.fmean(r[1] for r in rows)
    quasi_mean = statistics.fmean(r[2] for r in rows)
    gaps = [100 * (r[4] - r[1]) for r in rows]
    shares = [r[5] / r[3] for r in rows]
    halving_met = all(g <= 0.5 for g in gaps) and all(s <= 1 / 3 for s in shares)
    grid_text = space["grid_text"].format(lrs=len({c["lr"] for c in grid}))
    lines = [
        f"## Search quality, space {args.space}"
        + (f", {args.valid_fraction:g} of each fold for validation" if args.valid_fraction is not None else "")
        + (
            f", validation by {args.folds}-fold CV in outer fold 0 of {args.outer_folds}"
            if args.outer_folds is not None
            else ""
        )
        + f" ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores, shared)",
        "",
        f"`python bench/search.py --space {args.space} --points {args.points} --folds {args.folds} "
        f"--epochs {args.epochs} --min-epochs {args.min_epochs} --eta {args.eta} --seeds {args.seeds}"
        + (f" --valid-fraction {args.valid_fraction:g}" if args.valid_fraction is not None else "")
        + (f" --outer-folds {args.outer_folds}" if args.outer_folds is not None else "")
        + "` "
        f"({seconds:.0f} s). Random search draws {' '.join(f'`{t}`' for t in space['drawn'])}"
        + (f" with {' '.join(f'`{t}`' for t in space['fixed'])}" if space["fixed"] else "")
        + ". Validation error is the mean over the folds, in percent.",
        "",
        "| seed | random, full budget: best | quasi-random (halton), full budget: best | epochs of each "
        "| halving of the random points: best | its epochs | gap (points) | epochs share |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {s} | {100 * fb:.2f} | {100 * qb:.2f} | {fe} | {100 * hb:.2f} | {he} | {g:+.2f} | {sh:.2f} |"
            for (s, fb, qb, fe, hb, he), g, sh in zip(rows, gaps, shares)
        ],
        "",
        f"- grid of {len(grid)} ({grid_text}), full budget: best {100 * grid_best:.2f} ({grid_runner.epochs} epochs).",
        f"- random search, mean over seeds: {100 * random_mean:.2f}; it "
        f"{_versus([r[1] for r in rows], grid_best)}. Target (random at least matches the grid): "
        f"{'met' if random_mean <= grid_best else 'MISSED'}.",
        f"- quasi-random search, mean over seeds: {100 * quasi_mean:.2f}; it "
        f"{_versus([r[2] for r in rows], grid_best)}. Target (at least matches the grid): "
        f"{'met' if quasi_mean <= grid_best else 'MISSED'}.",
        f"- halving within 0.5 points of the full-budget best with at most a third of its epochs, every seed: "
        f"{'met' if halving_met else 'MISSED'} (largest gap {max(gaps):+.2f} points, largest share "
        f"{max(shares):.2f}).",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    RESULTS.write_text(with_section(RESULTS.read_text() if RESULTS.exists() else "", lines[0], lines[2], text))


def with_section(document: str, heading: str, command: str, text: str) -> str:
    """The results file with this run's section, in place of an earlier run of the same command.

    The file's other sections (other spaces, seeds and first rungs, and the summary above them)
    are kept; a new command's section is added after the last.
    """
    if not document:
        document = "# Search benchmark\n\nWritten by `bench/search.py`; see its docstring for the method.\n"
    parts = re.split(r"(?m)^(?=## )", document)
    run = command.split(" (")[0]
    kind = heading.split(",")[0]
    kept = [part for part in parts if not (part.startswith(kind) and run in part)]
    position = next((i for i, part in enumerate(parts) if part not in kept), len(kept))
    kept.insert(position, text if text.endswith("\n") else text + "\n")
    return "".join(part if part.endswith("\n\n") or i == len(kept) - 1 else part + "\n" for i, part in enumerate(kept))


# -- searches that learn (--learn) -----------------------------------------------------------------


def _numbers(results: dict) -> dict:
    return {k: v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _fold_params(args: argparse.Namespace, fixed: dict) -> list[dict]:
    tokens = [TARGET, *SPACES[args.space]["fixed"]]
    base = {**FIXED, **fixed, **expand(parse_sweep(tokens))[0].params}
    base.pop("epochs", None)
    return [{**base, "nb_cross_fold": args.folds, "id_cross_fold": f} for f in range(args.folds)]


def _space(args: argparse.Namespace) -> dict:
    from jobman.jobdb.halving import sweep_space

    return sweep_space(parse_sweep([TARGET, *SPACES[args.space]["drawn"]]))


def _first_reach(scores: list[float], goal: float) -> int | None:
    """The 1-based evaluation at which ``scores`` first reach ``goal`` (None: never)."""
    return next((i + 1 for i, v in enumerate(scores) if v <= goal + 1e-9), None)


def jobman_search(args: argparse.Namespace, root: Path, seed: int, goal: float, halving: bool) -> tuple[list, int]:
    """jobman's ``--sampler tpe`` (with ``--halving ... --async`` when ``halving``) through a SQLite job
    table, one job at a time: (the full-budget configurations' mean errors in the order they ended,
    epochs spent until the first reached ``goal``, or in all when none did)."""
    from jobman.jobdb.halving import Halving, parse_halving, sampled
    from jobman.jobdb.learn import Plan
    from jobman.jobdb.records import WorkerInfo
    from jobman.jobdb.store import Store

    fixed = {} if args.valid_fraction is None else {"valid_fraction": args.valid_fraction}
    if args.outer_folds is not None:
        fixed.update(nb_outer_fold=args.outer_folds, id_outer_fold=0)
    folds = _fold_params(args, fixed)
    if halving:
        rules = parse_halving(f"epochs={args.min_epochs}:{args.epochs}", args.eta, "valid_error", False, True)
        runs, samples = [{**f, "epochs": args.min_epochs} for f in folds], 3 * args.points
    else:
        rules, samples = Halving("", (), 0, "valid_error"), args.points
        runs = [{**f, "epochs": args.epochs} for f in folds]
    name = f"{'bohb' if halving else 'tpe'}{seed}"
    store = Store.open(f"sqlite:///{root / name}.db?table=t", create=True)
    plan = Plan("tpe", samples, 1, seed, (("valid_error", "min"),), "fn", TARGET, tuple(runs))
    store.start_search(sampled(_space(args), rules), plan)  # type: ignore[arg-type]
    worker, spent, reached = WorkerInfo.here(), 0, None
    errors: dict[str, list[float]] = {}
    finals: list[float] = []
    while reached is None and (claimed := store.claim(worker)) is not None:
        job = claimed.job
        workdir = root / name / str(job.id)
        start = store.continuation(job.id)
        before = 0
        if start is not None and start[0]:
            shutil.copytree(start[0], workdir)
            before = _epochs_in(workdir)
        outcome = run_direct(TARGET, job.params, workdir)
        if outcome.status != "DONE":
            raise RuntimeError(f"{job.params}: {outcome.status} {outcome.error}")
        spent += job.params["epochs"] - before
        store.finish(job.id, claimed.lease, "DONE", results=_numbers(outcome.results))
        if job.params["epochs"] == args.epochs:
            key = config_of(job.params, "epochs")
            errors.setdefault(key, []).append(outcome.results["valid_error"])
            if len(errors[key]) == args.folds:
                finals.append(statistics.fmean(errors[key]))
                if halving and finals[-1] <= goal + 1e-9:
                    reached = spent
    store.dispose()
    return finals, spent


def optuna_tpe(args: argparse.Namespace, root: Path, seed: int) -> list[float]:
    """Optuna's TPESampler with the settings jobman's ``--sampler tpe`` gives it (multivariate, constant
    liar, its random start-up of ``min(10, points // 4)``), in Optuna's own ask/tell loop in this
    process, one trial at a time at the full budget: each trial's mean error over the folds, in order."""
    import optuna

    from jobman.jobdb.learn import startup_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    fixed = {} if args.valid_fraction is None else {"valid_fraction": args.valid_fraction}
    if args.outer_folds is not None:
        fixed.update(nb_outer_fold=args.outer_folds, id_outer_fold=0)
    folds = _fold_params(args, fixed)
    dists = {
        "lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
        "nhid": optuna.distributions.CategoricalDistribution(list(NHID)),
    }
    if args.space != "2d":
        dists["momentum"] = optuna.distributions.FloatDistribution(0.5, 0.99)
    sampler = optuna.samplers.TPESampler(
        seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup_trials(args.points)
    )
    study = optuna.create_study(sampler=sampler)
    scores = []
    for number in range(args.points):
        trial = study.ask(dists)
        errors = []
        for f, params in enumerate(folds):
            outcome = run_direct(TARGET, {**params, **trial.params, "epochs": args.epochs}, root / f"otpe{number}-{f}")
            if outcome.status != "DONE":
                raise RuntimeError(f"{trial.params}: {outcome.status} {outcome.error}")
            errors.append(outcome.results["valid_error"])
        scores.append(statistics.fmean(errors))
        study.tell(trial, scores[-1])
    return scores


def optuna_hyperband(args: argparse.Namespace, root: Path, seed: int, goal: float) -> tuple[float, int, bool]:
    """Optuna's TPE with its HyperbandPruner driving the trainer here, rung by rung: (best full-budget
    error, epochs spent until it first reached ``goal`` or in all, whether it did)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rungs = rung_values(args.min_epochs, args.epochs, args.eta)
    fixed = {} if args.valid_fraction is None else {"valid_fraction": args.valid_fraction}
    if args.outer_folds is not None:
        fixed.update(nb_outer_fold=args.outer_folds, id_outer_fold=0)
    folds = _fold_params(args, fixed)
    state = {"spent": 0, "reached": False, "best": float("inf")}

    def objective(trial: optuna.Trial) -> float:
        config = {
            "lr": trial.suggest_float("lr", 1e-4, 1e-1, log=True),
            "nhid": trial.suggest_categorical("nhid", list(NHID)),
        }
        if args.space != "2d":
            config["momentum"] = trial.suggest_float("momentum", 0.5, 0.99)
        done, mean = 0, float("inf")
        for epochs in rungs:
            errors = []
            for f, params in enumerate(folds):
                workdir = root / f"hb{seed}-{trial.number}-{f}"
                outcome = run_direct(TARGET, {**params, **config, "epochs": epochs}, workdir)
                errors.append(outcome.results["valid_error"])
            state["spent"] += (epochs - done) * len(folds)  # epochs trained, summed over the folds
            done, mean = epochs, statistics.fmean(errors)
            trial.report(mean, epochs)
            if epochs == args.epochs:
                state["best"] = min(state["best"], mean)
                if mean <= goal + 1e-9:
                    state["reached"] = True
                    trial.study.stop()
            elif trial.should_prune():
                raise optuna.TrialPruned()
        return mean

    study = optuna.create_study(
        study_name=f"hyperband-{seed}",  # the pruner's brackets are drawn from the study's name: reproducible
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=optuna.pruners.HyperbandPruner(
            min_resource=args.min_epochs, max_resource=args.epochs, reduction_factor=args.eta
        ),
    )
    study.optimize(objective, n_trials=3 * args.points)
    return state["best"], int(state["spent"]), bool(state["reached"])


def _one_seed(job: tuple) -> dict:
    args, tmp, seed, goal = job
    root = Path(tmp) / f"seed{seed}"
    root.mkdir()
    fixed = {} if args.valid_fraction is None else {"valid_fraction": args.valid_fraction}
    if args.outer_folds is not None:
        fixed.update(nb_outer_fold=args.outer_folds, id_outer_fold=0)
    runner = Runner(root / "random", args.folds, fixed)
    random_scores = [runner.score(c, args.epochs)[0] for c in random_configs(args.space, args.points, seed)]
    tpe_scores, _ = jobman_search(args, root, seed, goal, halving=False)
    otpe_scores = optuna_tpe(args, root, seed)
    out = {
        "seed": seed,
        "random": _first_reach(random_scores, goal),
        "random_best": min(random_scores),
        "tpe": _first_reach(tpe_scores, goal),
        "tpe_best": min(tpe_scores),
        "otpe": _first_reach(otpe_scores, goal),
        "otpe_best": min(otpe_scores),
    }
    if args.only != "tpe":
        bohb_scores, bohb_epochs = jobman_search(args, root, seed, goal, halving=True)
        hb_best, hb_epochs, hb_reached = optuna_hyperband(args, root, seed, goal)
        out.update(
            bohb_epochs=bohb_epochs,
            bohb_reached=bool(bohb_scores) and min(bohb_scores) <= goal + 1e-9,
            bohb_best=min(bohb_scores, default=float("inf")),
            hb_epochs=hb_epochs,
            hb_reached=hb_reached,
            hb_best=hb_best,
        )
    print(f"seed {seed}: {out}", flush=True)
    return out


def _median_reach(values: list, never: int) -> str:
    """The median of evaluations (or epochs) to reach the goal, a run that never did counted past ``never``."""
    ordered = sorted(v if v is not None else never + 1 for v in values)
    median = statistics.median(ordered)
    return f"> {never}" if median > never else f"{median:g}"


def learned(args: argparse.Namespace) -> None:
    from concurrent.futures import ProcessPoolExecutor

    started, load_before = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="jobman-bench-learn-") as tmp:
        fixed = {} if args.valid_fraction is None else {"valid_fraction": args.valid_fraction}
        if args.outer_folds is not None:
            fixed.update(nb_outer_fold=args.outer_folds, id_outer_fold=0)
        grid = grid_configs(args.space, args.points)
        grid_runner = Runner(Path(tmp) / "grid", args.folds, fixed)
        grid_scores = [grid_runner.score(c, args.epochs)[0] for c in grid]
        goal = min(grid_scores)
        grid_reach = _first_reach(grid_scores, goal)
        print(f"grid of {len(grid)}: best {goal:.4f}, first reached at evaluation {grid_reach}", flush=True)
        jobs = [(args, tmp, seed, goal) for seed in range(args.seeds)]
        with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            rows = list(pool.map(_one_seed, jobs))
    seconds, load_after = time.perf_counter() - started, os.getloadavg()
    n = len(grid)
    tpe_median = _median_reach([r["tpe"] for r in rows], n)
    tpe_met = statistics.median(r["tpe"] if r["tpe"] is not None else n + 1 for r in rows) <= n / 2
    otpe_median = _median_reach([r["otpe"] for r in rows], n)
    multi = args.only != "tpe"
    command = (
        f"python bench/search.py --learn --space {args.space} --points {args.points} --folds {args.folds} "
        f"--epochs {args.epochs} --min-epochs {args.min_epochs} --eta {args.eta} --seeds {args.seeds}"
        + (f" --valid-fraction {args.valid_fraction:g}" if args.valid_fraction is not None else "")
        + (f" --outer-folds {args.outer_folds}" if args.outer_folds is not None else "")
        + (f" --only {args.only}" if args.only else "")
    )
    head = (
        "| seed | random: evaluations to the grid's best | its best | jobman tpe: evaluations | its best "
        "| Optuna TPE, its own loop: evaluations | its best |"
    )
    if multi:
        head += " Optuna TPE + Hyperband: epochs | its best | jobman tpe --halving --async: epochs | its best |"
    table = []
    for r in rows:
        row = (
            f"| {r['seed']} | {r['random'] or 'never'} | {100 * r['random_best']:.2f} | {r['tpe'] or 'never'} | "
            f"{100 * r['tpe_best']:.2f} | {r['otpe'] or 'never'} | {100 * r['otpe_best']:.2f} |"
        )
        if multi:
            row += (
                f" {r['hb_epochs']}{'' if r['hb_reached'] else ' (never)'} | {100 * r['hb_best']:.2f} | "
                f"{r['bohb_epochs']}{'' if r['bohb_reached'] else ' (never)'} | {100 * r['bohb_best']:.2f} |"
            )
        table.append(row)
    lines = [
        f"## Search that learns, space {args.space} ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, {os.cpu_count()} cores, shared; load average {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after)",
        "",
        f"`{command}` ({seconds:.0f} s, {args.jobs} seeds at once). The grid: {n} points, best "
        f"{100 * goal:.2f} % (first reached at its evaluation {grid_reach}). Evaluations: configurations "
        f"trained to {args.epochs} epochs, each the mean over {args.folds} folds; 'never': not within {n}.",
        "",
        head,
        "|---" * head.count(" | ") + "|---|",
        *table,
        "",
        f"- jobman tpe reaches the grid's best in a median of {tpe_median} evaluations (Optuna's TPE with the "
        f"same settings in its own loop: {otpe_median}; random search: "
        f"{_median_reach([r['random'] for r in rows], n)}; the grid: {grid_reach}). Target (at most half the "
        f"grid's {n}): {'met' if tpe_met else 'MISSED'}.",
    ]
    if multi:
        hb = statistics.median(r["hb_epochs"] if r["hb_reached"] else math.inf for r in rows)
        bohb = statistics.median(r["bohb_epochs"] if r["bohb_reached"] else math.inf for r in rows)
        lines.append(
            f"- epochs until a configuration trained to {args.epochs} reaches the grid's best, median over seeds "
            f"(a run that never did counts as infinite): Optuna TPE + HyperbandPruner {hb:g}, jobman "
            f"`--sampler tpe --halving epochs={args.min_epochs}:{args.epochs} --eta {args.eta} --async` {bohb:g} "
            f"(each with {3 * args.points} configurations at most). Target (jobman spends no more): "
            f"{'met' if math.isfinite(bohb) and bohb <= hb else 'MISSED'}."
        )
    lines.append("")
    text = "\n".join(lines)
    print(text)
    RESULTS.write_text(with_section(RESULTS.read_text() if RESULTS.exists() else "", lines[0], lines[2], text))


if __name__ == "__main__":
    main()

"""Ablation of jobman's multi-fidelity learning search against Optuna's TPE + HyperbandPruner.

    python bench/search_ablation.py bohb,jobman,optuna-hb --seeds 0-19 --jobs 2

The problem of ``bench/search.py --learn --space 2d --points 32 --folds 3 --epochs 27 --min-epochs 3
--eta 3 --outer-folds 5``: epochs trained (summed over the folds) until a configuration trained to 27
epochs first reaches the grid's best, 96 configurations at most; 'never' when none did. Each variant
sets the ways jobman's ``--sampler tpe --halving epochs=3:27 --eta 3 --async`` may differ from
Optuna's pair (``bench/search.py``'s ``optuna_hyperband``, the variant ``optuna-hb``):

- which trials the model is fit on: ``rung``, BOHB's (the highest rung with d + 3 results), or
  ``reach``, every ended configuration, COMPLETE at the full budget or PRUNED with its means at the
  rungs it reached, ranked by how far it got (Optuna's TPE on pruned trials);
- whose: every bracket's, or (``bracket``) only those of the bracket the proposal goes to. (Optuna
  hands its sampler the HyperbandPruner's ``_BracketStudy``, but that study filters only
  ``get_trials``, and Optuna 5.0's TPE reads ``_get_trials``: it is fit on every bracket's trials.)
- the share drawn at random once the model is fit: BOHB's third, or none (``norand``);
- the promotions: ASHA's (at most a ``1/eta`` share of a rung, an earlier configuration taking a
  place later), or (``sh``) Optuna's SuccessiveHalvingPruner rule, each configuration judged once as
  its runs at a rung end;
- the TPE: jobman's (multivariate, d + 3 results before the model) or Optuna's defaults
  (univariate, 10), ``optuna-like``.

``bohb`` is jobman before the change this measured (rung, random third, ASHA); ``jobman`` is jobman
now (``reach-norand-sh``). The variants set the private switches of ``jobman.jobdb.learn``
(``_SCOPE``, ``_TRIALS``, ``_STARTUP``, ``_RANDOM_FRACTION``) and ``jobman.jobdb.halving``
(``_JUDGED_ONCE``), each run in a fresh process. Each run prints one JSON line; the summary prints
the median over seeds (a run that never reached counts as infinite), how many reached, and the
seeds where a variant spent fewer or more epochs than Optuna's pair.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search

BOHB = {"_SCOPE": "all", "_TRIALS": "rung", "_STARTUP": None, "_RANDOM_FRACTION": 1 / 3, "sh": False}
NOW = {"_SCOPE": "all", "_TRIALS": "reach", "_STARTUP": None, "_RANDOM_FRACTION": 0.0, "sh": True}
OPTUNA_LIKE = {**NOW, "_STARTUP": 10, "univariate": True, "sh": False}
KNOBS = {
    "bohb": BOHB,
    "bohb-sh": {**BOHB, "sh": True},
    "bohb-norand-sh": {**BOHB, "_RANDOM_FRACTION": 0.0, "sh": True},
    "bracket": {**BOHB, "_SCOPE": "bracket"},
    "bracket-reach": {**BOHB, "_SCOPE": "bracket", "_TRIALS": "reach"},
    "bracket-reach-norand": {**BOHB, "_SCOPE": "bracket", "_TRIALS": "reach", "_RANDOM_FRACTION": 0.0},
    "reach-norand": {**NOW, "sh": False},
    "jobman": NOW,
    "optuna-like": OPTUNA_LIKE,
    "optuna-like-sh": {**OPTUNA_LIKE, "sh": True},
}


def _args() -> argparse.Namespace:
    return argparse.Namespace(
        space="2d",
        points=32,
        folds=3,
        epochs=27,
        min_epochs=3,
        eta=3,
        outer_folds=5,
        valid_fraction=None,
        only=None,
    )


def one(job: tuple[str, int, float]) -> dict:
    variant, seed, goal = job
    args = _args()
    from jobman.jobdb import halving, learn

    knobs = dict(KNOBS.get(variant, {}))
    if knobs.pop("univariate", False):

        def make(sampler: str, seed_: int, plan: learn.Plan, startup: int | None = None) -> object:
            import optuna

            return optuna.samplers.TPESampler(seed=seed_, n_startup_trials=startup or learn.STARTUP)

        learn.make_sampler = make  # type: ignore[assignment]
    halving._JUDGED_ONCE = knobs.pop("sh", True)
    for key, value in knobs.items():
        setattr(learn, key, value)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="jobman-ablation-") as tmp:
        if variant == "optuna-hb":
            best, epochs, reached = search.optuna_hyperband(args, Path(tmp), seed, goal)
        else:
            scores, epochs = search.jobman_search(args, Path(tmp), seed, goal, halving=True)
            best = min(scores, default=math.inf)
            reached = best <= goal + 1e-9
    out = {
        "variant": variant,
        "seed": seed,
        "epochs": epochs,
        "reached": bool(reached),
        "best": round(100 * best, 2),
        "seconds": round(time.perf_counter() - started),
    }
    print(json.dumps(out), flush=True)
    return out


def _seeds(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "variants",
        help=f"comma-separated, of: {', '.join(KNOBS)}, optuna-hb",
    )
    ap.add_argument("--seeds", default="0-2", help="a range, such as 0-19")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in KNOBS and v != "optuna-hb"]
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(unknown)}: choose among {', '.join(KNOBS)}, optuna-hb")
    grid = search.grid_configs("2d", 32)
    fixed = {"nb_outer_fold": 5, "id_outer_fold": 0}
    with tempfile.TemporaryDirectory(prefix="jobman-ablation-grid-") as tmp:
        goal = min(search.Runner(Path(tmp), 3, fixed).score(c, 27)[0] for c in grid)
    print(f"grid of {len(grid)}: best {100 * goal:.2f} %", flush=True)
    jobs = [(v, s, goal) for v in variants for s in _seeds(args.seeds)]
    spawn = multiprocessing.get_context("spawn")  # a fresh process a run: the switches are module globals
    with ProcessPoolExecutor(max(1, args.jobs), mp_context=spawn, max_tasks_per_child=1) as pool:
        rows = list(pool.map(one, jobs))
    by: dict[str, dict[int, dict]] = {}
    for r in rows:
        by.setdefault(r["variant"], {})[r["seed"]] = r

    def value(r: dict) -> float:
        return r["epochs"] if r["reached"] else math.inf

    for variant, runs in by.items():
        values = [value(r) for r in runs.values()]
        line = (
            f"{variant}: median {statistics.median(values):g} epochs, reached on {sum(map(math.isfinite, values))} "
            f"of {len(values)} seeds"
        )
        if "optuna-hb" in by and variant != "optuna-hb":
            ref = by["optuna-hb"]
            common = [s for s in runs if s in ref]
            fewer = sum(value(runs[s]) < value(ref[s]) for s in common)
            more = sum(value(runs[s]) > value(ref[s]) for s in common)
            line += f"; against Optuna's pair, fewer epochs on {fewer} seeds, more on {more}"
        print(line)


if __name__ == "__main__":
    main()

"""Benchmark: jobman's ``--sampler tpe`` through the job table against Optuna's own TPE loop.

    python bench/learn_quality.py                    # 40 evaluations, seeds 0-9
    python bench/learn_quality.py --evals 60 --seeds 20

A smooth function of four parameters, one on a log scale:
``f = (log10(lr) + 3)² + 4 (a - 0.5)² + (b - 1)² + (c + 0.5)²`` with ``lr`` log-uniform in
[1e-6, 1] and ``a``, ``b``, ``c`` uniform in [-2, 2] (its minimum, 0, at lr = 1e-3).
Methods, each over the same seeds, the best value found after ``--evals`` evaluations:

- optuna: ``TPESampler(seed=s)`` (multivariate, constant liar, jobman's random start-up) driven by
  Optuna's own ask/tell loop in memory, one evaluation at a time, and with 2 pending (two asked before each tell);
- jobman tpe: a ``--sampler tpe`` search in a SQLite job table, its jobs claimed and finished in
  this process through the store (``Store.claim``/``Store.finish``: each end proposes the next point
  in the finishing transaction), ``--parallel 1`` and ``--parallel 2`` (two jobs claimed before
  the first is finished);
- jobman random: ``--samples`` draws of the sweep grammar (``--sampler random``) from the same seed.

The same algorithm should give the same distribution of results: a jobman figure clearly worse
than Optuna's would mean the pending, seed or failure plumbing is wrong. The medians and quartiles
over seeds are printed side by side; all methods run in this invocation.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ask_and_tell, claim_and_finish

from jobman.jobdb.distributions import Distribution
from jobman.jobdb.halving import Halving, sampled
from jobman.jobdb.learn import Plan, startup_trials
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import Expansion, parse_sweep

SPACE = {
    "lr": Distribution("loguniform", (1e-6, 1.0)),
    "a": Distribution("uniform", (-2.0, 2.0)),
    "b": Distribution("uniform", (-2.0, 2.0)),
    "c": Distribution("uniform", (-2.0, 2.0)),
}
TOKENS = ["bench:f", "lr=loguniform(1e-6,1)", "a=uniform(-2,2)", "b=uniform(-2,2)", "c=uniform(-2,2)"]


def f(p: dict) -> float:
    return (math.log10(p["lr"]) + 3) ** 2 + 4 * (p["a"] - 0.5) ** 2 + (p["b"] - 1) ** 2 + (p["c"] + 0.5) ** 2


def optuna_native(seed: int, evals: int, pending: int) -> float:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {
        "lr": optuna.distributions.FloatDistribution(1e-6, 1.0, log=True),
        **{k: optuna.distributions.FloatDistribution(-2.0, 2.0) for k in "abc"},
    }
    sampler = optuna.samplers.TPESampler(
        seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup_trials(evals)
    )  # jobman's start-up rule, so that the two are the same algorithm at any budget
    study = optuna.create_study(sampler=sampler)
    ask_and_tell(study, dists, evals, pending, f)
    return study.best_value


def jobman_run(root: Path, seed: int, evals: int, pending: int, sampler: str) -> float:
    store = Store.open(f"sqlite:///{root / f'{sampler}_{seed}_{pending}.db'}?table=t", create=True)
    if sampler == "tpe":
        plan = Plan("tpe", evals, pending, seed, (("loss", "min"),), "fn", TOKENS[0], ({},))
        store.start_search(sampled(SPACE, Halving("", (), 0, "loss")), plan)  # type: ignore[arg-type]
    else:
        store.schedule(Expansion(parse_sweep(TOKENS), samples=evals, seed=seed))
    best = min(claim_and_finish(store, pending, f))
    store.dispose()
    return best


def quartiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{q[1]:7.3f} [{q[0]:.3f}, {q[2]:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evals", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    seeds = range(args.seeds)
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for pending in (1, 2):
            rows[f"optuna TPE, {pending} pending"] = [optuna_native(s, args.evals, pending) for s in seeds]
            rows[f"jobman --sampler tpe, {pending} pending"] = [
                jobman_run(root, s, args.evals, pending, "tpe") for s in seeds
            ]
        rows["jobman --sampler random"] = [jobman_run(root, s, args.evals, 1, "random") for s in seeds]
    print(f"best value after {args.evals} evaluations, median [quartiles] over {args.seeds} seeds (lower is better)")
    for name, values in rows.items():
        print(f"{name:<36} {quartiles(values)}")


if __name__ == "__main__":
    main()

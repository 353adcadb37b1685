"""Benchmark: jobman's ``--sampler tpe`` against Optuna's own TPE and random search on BBOB.

    pip install 'jobman-sql[bench]'                  # coco-experiment: BBOB, compiled in, no download
    python bench/bbob.py --functions 1-24 --dims 2,5,10 --instances 1-5 --evals 100
    python bench/bbob.py --functions 1,8,15,21 --dims 2 --instances 1-3 --cli   # and the full CLI path
    python bench/bbob.py --evals 32 --budgets 8,16,24,32 --startups 10,8   # Optuna's TPE, two start-ups

The problems are COCO's noiseless ``bbob`` suite (module ``cocoex`` of the ``coco-experiment``
package, in the ``bench`` extra with the Optuna it compares against; never needed to run jobman). A
problem is a function (f1-f24), a dimension and an instance; the instance number is also the seed
of every method on it. Each method has ``--evals`` evaluations over the box [-5, 5]^d, one at a
time (sequential) and with ``--pending`` points out at a time (the oldest is evaluated, then one
more is asked for):

- random: uniform draws (NumPy, seeded by the instance);
- optuna TPE: ``TPESampler(seed, multivariate=True, constant_liar=True, n_startup_trials=S)``, the
  settings jobman gives it (S: Optuna's 10 start-up points, at most a quarter of ``--evals``, as
  ``jobman.jobdb.learn.startup_trials`` says), driven by Optuna's own ask/tell loop over an
  in-memory study;
- jobman TPE: a ``--sampler tpe`` search in a SQLite job table, its jobs claimed and finished in
  this process through the store (``Store.claim``/``Store.finish``, as a worker does: each end
  proposes the next point in the finishing transaction), ``--parallel 1``, and ``--parallel P``
  with P jobs claimed and left running while the oldest is finished;
- with ``--cli``, on the same problems, jobman TPE through the whole command line:
  ``jobman sqlschedule ... --sampler tpe --parallel P`` then ``jobman dispatch -j P`` (``-j 2``
  for the sequential case), real worker processes evaluating the function.

For each budget (10, 25, 50 and 100 evaluations by default) the methods are ranked on every
problem by the best value found (ties share their mean rank); the mean ranks are printed, and for
each pair of methods the sign test over the problems: how often one is better, worse, tied, and
the two-sided p-value of the exact binomial test on the untied ones. The same algorithm should be
indistinguishable from itself (large p-values between the two TPEs) and both ahead of random.
Before TPE's start-up points (10 of 100 evaluations) have ended every method is drawing at random, and with one seed
per instance a method draws the same start-up points for every function of a dimension and
instance: the figures at 10 evaluations compare a few random designs, not the samplers.

The full grid takes hours on a loaded 2-core machine: ``--save F`` appends each run to ``F`` as it
ends (runs go instance by instance, so a run cut short covers whole instances), and
``--tables F`` prints the tables of the saved runs and the problems they cover.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ask_and_tell, claim_and_finish

from jobman.jobdb.distributions import Distribution
from jobman.jobdb.halving import Halving, sampled
from jobman.jobdb.learn import Plan, startup_trials
from jobman.jobdb.store import Store

LOW, HIGH = -5.0, 5.0
MODULE = textwrap.dedent("""
    import cocoex
    import numpy as np

    _problems = {}

    def bbob(function, dimension, instance, **x):
        key = (function, dimension, instance)
        if key not in _problems:
            suite = cocoex.Suite(
                "bbob", "", f"function_indices:{function} dimensions:{dimension} instance_indices:{instance}"
            )
            _problems[key] = suite[0]
        return {"loss": float(_problems[key](np.array([x[f"x{i}"] for i in range(dimension)])))}
""")

Problem = tuple[int, int, int]  # (function, dimension, instance)


def problem(function: int, dimension: int, instance: int) -> Callable[[np.ndarray], float]:
    import cocoex

    suite = cocoex.Suite("bbob", "", f"function_indices:{function} dimensions:{dimension} instance_indices:{instance}")
    p = suite[0]
    return lambda x: float(p(np.asarray(x, dtype=float)))


def keys(dimension: int) -> list[str]:
    return [f"x{i}" for i in range(dimension)]


def run_random(prob: Problem, evals: int, pending: int) -> list[float]:
    f = problem(*prob)
    rng = np.random.default_rng(prob[2])
    return [f(x) for x in rng.uniform(LOW, HIGH, size=(evals, prob[1]))]


def run_optuna(prob: Problem, evals: int, pending: int, startup: int | None = None) -> list[float]:
    """Optuna's TPE in its own loop; ``startup``: its random start-up points (jobman's rule when None)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    f = problem(*prob)
    names = keys(prob[1])
    dists = {k: optuna.distributions.FloatDistribution(LOW, HIGH) for k in names}
    sampler = optuna.samplers.TPESampler(
        seed=prob[2],
        multivariate=True,
        constant_liar=True,
        n_startup_trials=startup_trials(evals) if startup is None else startup,
    )
    study = optuna.create_study(sampler=sampler)
    return ask_and_tell(study, dists, evals, pending, lambda params: f([params[k] for k in names]))


def run_jobman(prob: Problem, evals: int, pending: int) -> list[float]:
    f = problem(*prob)
    names = keys(prob[1])
    space = {k: Distribution("uniform", (LOW, HIGH)) for k in names}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(f"sqlite:///{Path(tmp) / 'bbob.db'}?table=t", create=True)
        plan = Plan("tpe", evals, pending, prob[2], (("loss", "min"),), "fn", "bench:bbob", ({},))
        store.start_search(sampled(space, Halving("", (), 0, "loss")), plan)  # type: ignore[arg-type]
        out = claim_and_finish(store, pending, lambda params: f([params[k] for k in names]))
        store.dispose()
    return out


def run_cli(prob: Problem, evals: int, pending: int) -> list[float]:
    """``jobman sqlschedule`` and ``jobman dispatch`` in subprocesses; the values in proposal order."""
    function, dimension, instance = prob
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "bench_bbob_mod.py").write_text(MODULE)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p)}
        url = f"sqlite:///{root / 'bbob.db'}?table=t"
        space = [f"{k}=uniform({LOW:g},{HIGH:g})" for k in keys(dimension)]
        for command in (
            ["sqlschedule", url, "bench_bbob_mod:bbob", f"function={function}", f"dimension={dimension}"]
            + [f"instance={instance}", *space, "--samples", str(evals), "--sampler", "tpe", "--metric", "loss"]
            + ["--parallel", str(pending), "--seed", str(instance)],
            ["dispatch", url, "-j", str(max(2, pending)), "--exproot", str(root / "runs")],
        ):
            subprocess.run(
                [sys.executable, "-m", "jobman.cli.main", *command], env=env, check=True, capture_output=True
            )
        store = Store.open(url)
        jobs = sorted(store.jobs(), key=lambda j: j.id)
        store.dispose()
    values = [float(j.results["loss"]) for j in jobs if j.status.name == "DONE" and j.results]
    if len(values) != evals or len(jobs) != evals:
        raise RuntimeError(f"{prob}: {len(values)} DONE of {len(jobs)} jobs, not {evals}")
    return values


METHODS: dict[str, Callable[[Problem, int, int], list[float]]] = {
    "random": run_random,
    "optuna TPE": run_optuna,
    "jobman TPE": run_jobman,
    "jobman TPE, CLI": run_cli,
}


def task(args: tuple[str, Problem, int, int]) -> tuple[str, Problem, int, list[float], float]:
    method, prob, evals, pending = args
    started = time.perf_counter()
    values = METHODS[method](prob, evals, pending)
    return method, prob, pending, values, time.perf_counter() - started


def ranks(values: Sequence[float]) -> list[float]:
    """1 for the lowest; tied values share their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def sign_test(wins: int, losses: int) -> float:
    """Two-sided p-value of the exact binomial test of ``wins`` against ``losses`` at one half."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def spans(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def table(
    results: dict[tuple[str, Problem, int], list[float]], methods: list[str], budgets: list[int], title: str
) -> None:
    cases = sorted({(p, q) for (_, p, q) in results if all((m, p, q) in results for m in methods)})
    if not cases:
        return
    print(f"\n{title}: {len(cases)} runs of each method")
    best = {
        (m, b): [min(results[(m, p, q)][:b]) for p, q in cases] for m in methods for b in budgets
    }  # the best value after b evaluations, per case
    print("mean rank (1 is best)    " + "".join(f"{b:>9}" for b in budgets))
    for i, m in enumerate(methods):
        line = []
        for b in budgets:
            per_case = [ranks([best[(n, b)][c] for n in methods])[i] for c in range(len(cases))]
            line.append(sum(per_case) / len(per_case))
        print(f"{m:<24}" + "".join(f"{r:>9.2f}" for r in line))
    print("sign test: first better/worse/tied, p (two-sided)")
    for i, a in enumerate(methods):
        for b_ in methods[i + 1 :]:
            cells = []
            for b in budgets:
                pa, pb = best[(a, b)], best[(b_, b)]
                w = sum(x < y for x, y in zip(pa, pb))
                lo = sum(x > y for x, y in zip(pa, pb))
                cells.append(f"{b}: {w}/{lo}/{len(pa) - w - lo} p={sign_test(w, lo):.3g}")
            print(f"  {a} vs {b_}: " + "; ".join(cells))


def compare_startups(args: argparse.Namespace) -> None:
    """Optuna's TPE, sequential, with each of ``--startups`` random start-up points: the sign test of
    the first against each other at every budget (does a budget-aware start-up help?)."""
    counts = [int(x) for x in args.startups.split(",")]
    problems = [(f, d, i) for i in spans(args.instances) for d in spans(args.dims) for f in spans(args.functions)]
    results = {(f"start-up {n}", p, 1): run_optuna(p, args.evals, 1, n) for n in counts for p in problems}
    budgets = [b for b in spans(args.budgets) if b <= args.evals]
    print(f"{len(problems)} problems, {args.evals} evaluations, loadavg {os.getloadavg()[0]:.1f}")
    table(results, [f"start-up {n}" for n in counts], budgets, "Optuna TPE, sequential")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", default="1-24")
    parser.add_argument("--dims", default="2,5,10")
    parser.add_argument("--instances", default="1-5")
    parser.add_argument("--evals", type=int, default=100)
    parser.add_argument("--pending", type=int, default=4, help="points out at a time in the parallel case")
    parser.add_argument("--budgets", default="10,25,50,100")
    parser.add_argument("--cli", action="store_true", help="also jobman TPE through sqlschedule and dispatch")
    parser.add_argument("--no-grid", action="store_true", help="with --cli: only the CLI runs and their baselines")
    parser.add_argument("--jobs", type=int, default=1, help="runs made at once (processes)")
    parser.add_argument("--save", type=Path, help="append each run to this file (JSON lines) as it ends")
    parser.add_argument("--tables", type=Path, help="only print the tables of the runs saved in this file")
    parser.add_argument(
        "--startups",
        help="only compare Optuna's TPE with these random start-ups, such as 10,8 (sequential, over the problems)",
    )
    args = parser.parse_args()
    if args.startups:
        compare_startups(args)
        return
    if args.tables:
        results = {}
        loads, took = [], {}
        for line in args.tables.read_text().splitlines():
            row = json.loads(line)
            results[(row["method"], tuple(row["problem"]), row["pending"])] = row["values"]
            loads += [row["loadavg"]] if "loadavg" in row else []
            took.setdefault(row["method"], []).append(row["seconds"])
        print(f"{len(results)} runs saved in {args.tables}", end="")
        print(f", loadavg {min(loads):.1f} to {max(loads):.1f} as they ended" if loads else "")
        print("seconds per run: " + ", ".join(f"{m} {sum(s) / len(s):.2f}" for m, s in took.items()))
        covered: dict[tuple[int, int], list[int]] = {}
        runs = {(m, q) for m, _, q in results}
        for f, d, i in sorted({p for _, p, _ in results}):
            if all((m, (f, d, i), q) in results for m, q in runs):  # every method, in every mode
                covered.setdefault((d, i), []).append(f)
        for (d, i), functions in sorted(covered.items()):
            print(f"  {d}-D, instance {i}: functions {','.join(map(str, functions))}")
        report(results, sorted({m for m, _, _ in results}, key=list(METHODS).index), spans(args.budgets))
        return
    try:
        import cocoex  # noqa: F401
    except ImportError:
        sys.exit("bench/bbob.py needs COCO's BBOB functions: pip install 'jobman-sql[bench]' (or coco-experiment)")
    budgets = [b for b in spans(args.budgets) if b <= args.evals]
    # Instance by instance: the runs that ended by any moment cover whole instances of every function.
    problems = [(f, d, i) for i in spans(args.instances) for d in spans(args.dims) for f in spans(args.functions)]
    methods = ["random", "optuna TPE", "jobman TPE"] + (["jobman TPE, CLI"] if args.cli else [])
    if args.cli and args.no_grid:
        methods = ["random", "optuna TPE", "jobman TPE, CLI"]
    tasks = [(m, p, args.evals, q) for p in problems for q in (1, args.pending) for m in methods]
    print(
        f"BBOB: functions {args.functions}, dimensions {args.dims}, instances {args.instances}, {args.evals}"
        f" evaluations, 1 and {args.pending} pending; methods: {', '.join(methods)}; {len(tasks)} runs,"
        f" {args.jobs} at a time; loadavg {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results: dict[tuple[str, Problem, int], list[float]] = {}
    seconds: dict[str, list[float]] = {m: [] for m in methods}
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        for n, (method, prob, pending, values, took) in enumerate(pool.map(task, tasks), 1):
            results[(method, prob, pending)] = values
            if args.save:
                with args.save.open("a") as out:
                    row = {"method": method, "problem": prob, "pending": pending, "values": values}
                    row.update(seconds=took, loadavg=os.getloadavg()[0])
                    out.write(json.dumps(row) + "\n")
            seconds[method].append(took)
            if n % 50 == 0 or n == len(tasks):
                print(
                    f"  {n}/{len(tasks)} runs, {time.perf_counter() - started:.0f} s, loadavg {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    print("seconds per run: " + ", ".join(f"{m} {sum(s) / len(s):.2f}" for m, s in seconds.items() if s))
    report(results, methods, budgets)
    print(
        f"\nwall clock {time.perf_counter() - started:.0f} s, loadavg {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )


def report(results: dict[tuple[str, Problem, int], list[float]], methods: list[str], budgets: list[int]) -> None:
    dims = sorted({p[1] for _, p, _ in results})
    for q in sorted({q for _, _, q in results}):
        mode = "sequential" if q == 1 else f"{q} pending"
        sub = {k: v for k, v in results.items() if k[2] == q}
        grid = [m for m in methods if m != "jobman TPE, CLI"]
        table(sub, grid, budgets, f"{mode}, all problems")
        if "jobman TPE, CLI" in methods:
            table(sub, [*grid, "jobman TPE, CLI"], budgets, f"{mode}, the problems run through the CLI")
    if len(dims) > 1:
        for d in dims:
            sub = {k: v for k, v in results.items() if k[1][1] == d}
            table(sub, [m for m in methods if m != "jobman TPE, CLI"], budgets, f"{d}-D, both modes")


if __name__ == "__main__":
    main()

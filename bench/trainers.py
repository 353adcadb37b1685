"""Benchmark: the bundled MLP and DBN against scikit-learn, accuracy and time, one BLAS thread.

    python bench/trainers.py                          # digits, 5-fold stratified CV
    python bench/trainers.py --dataset fashion-mnist  # 10,000 training images, 2,000 test images

Our trainers run as jobs do (``run_direct`` in a fresh directory, default
parameters, a seeded validation split held out of the training folds for early
stopping). scikit-learn's ``MLPClassifier(hidden_layer_sizes=(256,), solver='adam',
max_iter=200, random_state=0)`` and ``BernoulliRBM(n_components=256)`` +
``LogisticRegression`` train on the whole training folds. Every method sees the
same folds (stratified, fold seed 0) and the same [0, 1] features; methods are
interleaved fold by fold so a busy machine slows them alike. Accuracy is the
mean over folds with the sample standard deviation; seconds are the median wall
time of one fold's training and testing (our jobs' include writing their files). The figures printed are
measured in this run and written to ``bench/RESULTS-trainers.md`` (the section of
this data set is replaced, the others kept).
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import argparse
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from jobman.dispatch.runner import run_direct
from jobman.models import folds, splits
from jobman.models.params import settings

RESULTS = Path(__file__).with_name("RESULTS-trainers.md")
FOLD_SEED = 0


def ours(target: str, params: dict) -> Callable[[], tuple[float, float]]:
    """A run of one of our trainers as a job in a fresh directory: (accuracy, seconds)."""

    def run() -> tuple[float, float]:
        with tempfile.TemporaryDirectory() as work:
            start = time.perf_counter()
            out = run_direct(target, {**params, "progress_every": 0}, work)
            seconds = time.perf_counter() - start
        if out.status != "DONE":
            raise RuntimeError(f"{target} ended {out.status}: {out.error}")
        return 1.0 - out.results["test_error"], seconds

    return run


def sklearn_run(make, X_train, y_train, X_test, y_test) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # MLPClassifier warns that 200 iterations did not converge
            model = make().fit(X_train, y_train)
            accuracy = float(np.mean(model.predict(X_test) == y_test))
        return accuracy, time.perf_counter() - start

    return run


def sklearn_models():
    """scikit-learn's two baselines, or {} when it is not installed."""
    try:
        from sklearn.linear_model import LogisticRegression
        from sklearn.neural_network import BernoulliRBM, MLPClassifier
        from sklearn.pipeline import Pipeline
    except ImportError:
        return {}
    return {
        "sklearn MLPClassifier(256, adam, 200 it)": lambda: MLPClassifier(
            hidden_layer_sizes=(256,), solver="adam", max_iter=200, random_state=0
        ),
        "sklearn BernoulliRBM(256) + LogisticRegression": lambda: Pipeline(
            [("rbm", BernoulliRBM(n_components=256, random_state=0)), ("lr", LogisticRegression(max_iter=1000))]
        ),
    }


def runs_for_digits(n_folds: int, with_sklearn: bool):
    """Per fold, the runs of every method on that fold."""
    data = splits.load_dataset(settings({"dataset": "digits"}, splits.SPLIT_DEFAULTS))
    parts = folds.stratified_folds(data.y, n_folds, FOLD_SEED)
    models = sklearn_models() if with_sklearn else {}
    for k, test in enumerate(parts):
        train = np.sort(np.concatenate([f for i, f in enumerate(parts) if i != k]))
        cv = {"dataset": "digits", "nb_cross_fold": n_folds, "id_cross_fold": k, "fold_seed": FOLD_SEED}
        fold = {
            "jobman mlp (defaults)": ours("jobman.models.mlp:train", cv),
            "jobman dbn (defaults)": ours("jobman.models.dbn:train", cv),
        }
        for name, make in models.items():
            fold[name] = sklearn_run(make, data.X[train], data.y[train], data.X[test], data.y[test])
        yield fold


def runs_for_fashion(n_train: int, n_test: int, with_sklearn: bool):
    """One split: a seeded subset of the training images, and of the test images."""
    sub = {"dataset": "fashion-mnist", "n_train": n_train, "n_test": n_test, "data_seed": 0}
    whole = splits.make_split(settings({**sub, "valid_fraction": 0.0}, splits.SPLIT_DEFAULTS))
    fold = {
        "jobman mlp (defaults)": ours("jobman.models.mlp:train", sub),
        "jobman dbn (defaults)": ours("jobman.models.dbn:train", sub),
    }
    for name, make in (sklearn_models() if with_sklearn else {}).items():
        fold[name] = sklearn_run(make, whole.X_train, whole.y_train, whole.X_test, whole.y_test)
    yield fold


def warm_up() -> None:
    """Import and cache what the first timed job would otherwise pay for."""
    with tempfile.TemporaryDirectory() as work:
        run_direct("jobman.models.mlp:train", {"dataset": "synthetic", "epochs": 1, "progress_every": 0}, work)


def summarise(scores: dict[str, list[tuple[float, float]]]) -> list[tuple[str, float, float, float, int]]:
    rows = []
    for name, runs in scores.items():
        acc = np.array([a for a, _ in runs])
        secs = np.array([s for _, s in runs])
        std = float(acc.std(ddof=1)) if len(acc) > 1 else float("nan")
        rows.append((name, float(acc.mean()), std, float(np.median(secs)), len(runs)))
    return rows


def verdicts(rows, dbn_floor: float | None) -> list[str]:
    by = {name: (acc, secs) for name, acc, _, secs, _ in rows}
    mlp, dbn = by.get("jobman mlp (defaults)"), by.get("jobman dbn (defaults)")
    sk_mlp = next((v for k, v in by.items() if k.startswith("sklearn MLP")), None)
    sk_rbm = next((v for k, v in by.items() if k.startswith("sklearn BernoulliRBM")), None)
    out = []
    if mlp and sk_mlp:
        out.append(
            f"MLP accuracy >= scikit-learn's MLP: {'yes' if mlp[0] >= sk_mlp[0] else 'NO'} "
            f"({mlp[0]:.4f} vs {sk_mlp[0]:.4f})"
        )
        out.append(
            f"MLP time <= half of scikit-learn's: {'yes' if mlp[1] <= sk_mlp[1] / 2 else 'NO'} "
            f"({mlp[1] / sk_mlp[1]:.2f}x)"
        )
    if dbn and dbn_floor is not None:
        out.append(f"DBN accuracy >= {dbn_floor}: {'yes' if dbn[0] >= dbn_floor else 'NO'} ({dbn[0]:.4f})")
    if dbn and sk_rbm:
        out.append(
            f"DBN accuracy > RBM + logistic regression: {'yes' if dbn[0] > sk_rbm[0] else 'NO'} "
            f"({dbn[0]:.4f} vs {sk_rbm[0]:.4f})"
        )
    return out


def table(rows) -> list[str]:
    lines = ["| method | accuracy (mean ± std) | seconds per run (median) | runs |", "|---|---|---|---|"]
    for name, acc, std, secs, n in rows:
        spread = f" ± {std:.4f}" if np.isfinite(std) else ""
        lines.append(f"| {name} | {acc:.4f}{spread} | {secs:.2f} | {n} |")
    return lines


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import sklearn

        skv = f", scikit-learn {sklearn.__version__}"
    except ImportError:
        skv = ", scikit-learn not installed"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{cpu}, {os.cpu_count()} CPUs, load average {load:.1f} at the end; Python {platform.python_version()}, "
        f"NumPy {np.__version__}{skv}; one BLAS thread"
    )


def write_section(title: str, body: list[str]) -> None:
    """Replace this data set's section of the results file, keeping the others."""
    header = [
        "# Trainer benchmark",
        "",
        "Written by `bench/trainers.py`; each section is the output of its last run.",
        "",
    ]
    sections: dict[str, list[str]] = {}
    if RESULTS.exists():
        current = None
        for line in RESULTS.read_text().splitlines():
            if line.startswith("## "):
                current = line[3:].strip()
                sections[current] = []
            elif current is not None:
                sections[current].append(line)
    sections[title] = [""] + body + [""]
    lines = list(header)
    for name in sorted(sections):
        lines.append(f"## {name}")
        lines.extend(sections[name])
    RESULTS.write_text("\n".join(lines).rstrip() + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["digits", "fashion-mnist"], default="digits")
    parser.add_argument("--folds", type=int, default=5, help="digits: number of CV folds (default 5)")
    parser.add_argument("--n-train", type=int, default=10000, help="fashion-mnist: training images (default 10000)")
    parser.add_argument("--n-test", type=int, default=2000, help="fashion-mnist: test images (default 2000)")
    parser.add_argument("--no-sklearn", action="store_true", help="only our trainers")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS.name}")
    args = parser.parse_args(argv)

    warm_up()
    if args.dataset == "digits":
        title = f"digits: {args.folds}-fold stratified cross-validation"
        runs = runs_for_digits(args.folds, not args.no_sklearn)
        dbn_floor: float | None = 0.975
    else:
        title = f"fashion-mnist: {args.n_train} training images, {args.n_test} test images"
        runs = runs_for_fashion(args.n_train, args.n_test, not args.no_sklearn)
        dbn_floor = None
    scores: dict[str, list[tuple[float, float]]] = {}
    started = datetime.now(timezone.utc)
    for i, fold in enumerate(runs):
        for name, run in fold.items():
            acc, secs = run()
            scores.setdefault(name, []).append((acc, secs))
            print(f"  split {i}: {name}: accuracy {acc:.4f}, {secs:.2f} s", flush=True)
    rows = summarise(scores)
    body = (
        table(rows)
        + [""]
        + [f"- {v}" for v in verdicts(rows, dbn_floor)]
        + [
            "",
            f"Run started {started:%Y-%m-%d %H:%M} UTC on {machine()}.",
            "Command: `" + " ".join(["python bench/trainers.py", *(argv if argv is not None else sys.argv[1:])]) + "`",
        ]
    )
    print()
    print(f"## {title}")
    print("\n".join(body))
    if not args.no_write:
        write_section(title, body)
        print(f"\nwritten to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

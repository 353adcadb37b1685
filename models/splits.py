"""From a job's parameters to its training, validation and test arrays.

Parameters (shared by every trainer):

- ``dataset`` (``"digits"``), ``data_dir`` (None): what :func:`datasets.load` reads.
- ``n_train``, ``n_test`` (0 = all): a seeded random subset (seed ``data_seed``, 0) of
  the training pool and of the data set's own test set.
- ``n_samples``, ``n_features``, ``n_classes``: the shape of the ``synthetic`` set.
- ``nb_cross_fold``/``id_cross_fold``: k-fold cross-validation over the training
  pool; fold ``id_cross_fold`` is the test set, a seeded ``valid_fraction`` (0.1)
  of the rest is the validation set. A data set's own test set is then unused.
- ``nb_outer_fold``/``id_outer_fold`` with ``nb_cross_fold``/``id_cross_fold``:
  double cross-validation; outer fold ``id_outer_fold`` is the test set and inner
  fold ``id_cross_fold`` (of the other outer folds) the validation set.
- Without folds: the data set's test set, or a seeded ``test_fraction`` (0.2)
  hold-out when it has none (0 = no test set); validation as above.

Folds and hold-outs are seeded by ``fold_seed`` (0), independent of the model's ``seed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import datasets, folds

SPLIT_DEFAULTS: dict[str, Any] = {
    "dataset": "digits",
    "data_dir": None,
    "n_train": 0,
    "n_test": 0,
    "data_seed": 0,
    "n_samples": 600,
    "n_features": 20,
    "n_classes": 3,
    "nb_cross_fold": 0,
    "id_cross_fold": 0,
    "nb_outer_fold": 0,
    "id_outer_fold": 0,
    "fold_seed": 0,
    "valid_fraction": 0.1,
    "test_fraction": 0.2,
}


@dataclass(frozen=True)
class Split:
    """The three sets a supervised job uses; any of valid/test may be empty."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_valid: np.ndarray
    y_valid: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int

    @property
    def n_features(self) -> int:
        return int(self.X_train.shape[1])


def load_dataset(p: Mapping[str, Any]) -> datasets.Dataset:
    """The data set named by the parameters (cached)."""
    return datasets.load(
        p["dataset"],
        p.get("data_dir"),
        n_samples=p["n_samples"],
        n_features=p["n_features"],
        n_classes=p["n_classes"],
        seed=p["data_seed"],
    )


def _subset(n: int, size: int, seed: int) -> np.ndarray:
    size = int(size)
    if size <= 0 or size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).permutation(n)[:size])


def split_indices(
    y: np.ndarray, p: Mapping[str, Any], has_test: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(train, valid, test) indices into the training pool; test is None for the data set's own test set."""
    seed = int(p["fold_seed"])
    if int(p["nb_outer_fold"]):
        if not int(p["nb_cross_fold"]):
            raise ValueError("nb_outer_fold needs nb_cross_fold too: the inner folds choose hyperparameters")
        return folds.nested_fold(
            y, p["nb_outer_fold"], p["id_outer_fold"], p["nb_cross_fold"], p["id_cross_fold"], seed
        )
    if int(p["nb_cross_fold"]):
        return folds.cross_fold(y, p["nb_cross_fold"], p["id_cross_fold"], seed, p["valid_fraction"])
    if has_test:
        train, valid = folds.holdout(y, p["valid_fraction"], seed + 1)
        return train, valid, None
    pool, test = folds.holdout(y, p["test_fraction"], seed)
    keep, valid = folds.holdout(y[pool], p["valid_fraction"], seed + 1)
    return pool[keep], pool[valid], test


def make_split(p: Mapping[str, Any]) -> Split:
    """Load the data set and cut it as the parameters say (see the module docstring)."""
    ds = load_dataset(p)
    pool = _subset(len(ds.y), p["n_train"], int(p["data_seed"]))
    X, y = ds.X[pool], ds.y[pool]
    train, valid, test = split_indices(y, p, ds.has_test)
    if test is None:
        assert ds.X_test is not None and ds.y_test is not None
        keep = _subset(len(ds.y_test), p["n_test"], int(p["data_seed"]) + 1)
        X_test, y_test = ds.X_test[keep], ds.y_test[keep]
    else:
        X_test, y_test = X[test], y[test]
    return Split(X[train], y[train], X[valid], y[valid], X_test, y_test, ds.n_classes)

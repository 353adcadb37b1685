"""Seeded, stratified splits: k folds, validation hold-outs and nested (double) cross-validation.

All functions return sorted index arrays into the labels they were given, and
depend only on the labels and the seed, so every job of a sweep that names the
same fold gets exactly the same examples.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _stratified_order(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices grouped class by class, shuffled within each class.

    Dealing this order round-robin (position mod k) gives every fold the same
    share of each class, to within one example.
    """
    y = np.asarray(y)
    return (
        np.concatenate([rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y)])
        if len(y)
        else np.zeros(0, dtype=np.intp)
    )


def stratified_folds(y: np.ndarray, nb_folds: int, seed: int | Sequence[int] = 0) -> list[np.ndarray]:
    """Split ``range(len(y))`` into ``nb_folds`` disjoint, class-balanced folds."""
    nb_folds = int(nb_folds)
    if nb_folds < 2:
        raise ValueError(f"nb_cross_fold must be at least 2, not {nb_folds}")
    if nb_folds > len(y):
        raise ValueError(f"cannot make {nb_folds} folds of {len(y)} examples")
    order = _stratified_order(y, np.random.default_rng(seed))
    # The order runs class after class without restarting the deal, so fold sizes differ by at most one.
    return [np.sort(order[i::nb_folds]) for i in range(nb_folds)]


def holdout(y: np.ndarray, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Split indices into (kept, held out), holding out ``floor(fraction * n)``, stratified."""
    fraction = float(fraction)
    if not 0 <= fraction < 1:
        raise ValueError(f"a held-out fraction must be in [0, 1), not {fraction}")
    order = _stratified_order(y, np.random.default_rng(seed))
    pos = np.arange(len(order))
    held = np.floor((pos + 1) * fraction) > np.floor(pos * fraction)
    return np.sort(order[~held]), np.sort(order[held])


def _check_id(name: str, idx: int, nb: int) -> int:
    idx = int(idx)
    if not 0 <= idx < nb:
        raise ValueError(f"{name} must be in 0..{nb - 1}, not {idx}")
    return idx


def cross_fold(
    y: np.ndarray, nb_cross_fold: int, id_cross_fold: int, seed: int = 0, valid_fraction: float = 0.1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, valid, test) for plain k-fold cross-validation.

    Fold ``id_cross_fold`` is the test set; a stratified ``valid_fraction`` of the
    remaining folds (seeded) is the validation set; the rest is the training set.
    """
    folds = stratified_folds(y, nb_cross_fold, seed)
    test = folds[_check_id("id_cross_fold", id_cross_fold, len(folds))]
    rest = np.sort(np.concatenate([f for i, f in enumerate(folds) if i != int(id_cross_fold)]))
    keep, held = holdout(np.asarray(y)[rest], valid_fraction, seed + 1)
    return rest[keep], rest[held], test


def nested_fold(
    y: np.ndarray, nb_outer_fold: int, id_outer_fold: int, nb_cross_fold: int, id_cross_fold: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, valid, test) for double (nested) cross-validation.

    Outer fold ``id_outer_fold`` is the test set. The other outer folds are split
    again into ``nb_cross_fold`` inner folds (seeded by ``seed`` and the outer
    fold's id): inner fold ``id_cross_fold`` is the validation set on which
    hyperparameters are chosen, the other inner folds are the training set.
    """
    train, test = outer_split(y, nb_outer_fold, id_outer_fold, seed)
    inner = stratified_folds(np.asarray(y)[train], nb_cross_fold, _inner_seed(seed, id_outer_fold))
    k = _check_id("id_cross_fold", id_cross_fold, len(inner))
    valid = train[inner[k]]
    fit = train[np.sort(np.concatenate([f for i, f in enumerate(inner) if i != k]))]
    return fit, valid, test


def outer_split(y: np.ndarray, nb_outer_fold: int, id_outer_fold: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(training set, test set) of outer fold ``id_outer_fold``: what a retrain after double CV uses."""
    folds = stratified_folds(y, nb_outer_fold, seed)
    k = _check_id("id_outer_fold", id_outer_fold, len(folds))
    return np.sort(np.concatenate([f for i, f in enumerate(folds) if i != k])), folds[k]


def _inner_seed(seed: int, id_outer_fold: int) -> list[int]:
    return [int(seed), 1, int(id_outer_fold)]

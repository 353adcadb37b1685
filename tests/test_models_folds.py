"""Cross-validation folds: stratified, disjoint, covering, seeded; nested folds; splits from parameters."""

import numpy as np
import pytest

from jobman.models import folds, splits
from jobman.models.params import settings

Y = np.repeat(np.arange(3), [50, 30, 20])  # unbalanced classes, sorted: a naive split would not stratify


def test_folds_are_disjoint_cover_everything_and_balance_sizes():
    parts = folds.stratified_folds(Y, 5, seed=0)
    together = np.concatenate(parts)
    assert len(together) == len(Y) and len(np.unique(together)) == len(Y)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_folds_are_stratified():
    for part in folds.stratified_folds(Y, 5, seed=3):
        assert list(np.bincount(Y[part], minlength=3)) == [10, 6, 4]


def test_folds_are_seeded():
    a = folds.stratified_folds(Y, 4, seed=1)
    b = folds.stratified_folds(Y, 4, seed=1)
    c = folds.stratified_folds(Y, 4, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_bad_fold_counts_are_refused():
    with pytest.raises(ValueError):
        folds.stratified_folds(Y, 1)
    with pytest.raises(ValueError):
        folds.cross_fold(Y, 5, 5)


def test_holdout_is_stratified_and_exact():
    keep, held = folds.holdout(Y, 0.1, seed=0)
    assert len(held) == 10 and len(keep) == 90
    assert not set(keep) & set(held)
    assert list(np.bincount(Y[held], minlength=3)) == [5, 3, 2]
    assert len(folds.holdout(Y, 0.0)[1]) == 0


def test_cross_fold_test_is_the_fold_and_valid_comes_from_the_rest():
    parts = folds.stratified_folds(Y, 5, seed=0)
    tests = []
    for k in range(5):
        train, valid, test = folds.cross_fold(Y, 5, k, seed=0, valid_fraction=0.25)
        assert np.array_equal(test, parts[k])
        assert not (set(train) & set(valid) or set(train) & set(test) or set(valid) & set(test))
        assert len(train) + len(valid) + len(test) == len(Y)
        assert len(valid) == 20
        tests.append(test)
    assert sorted(np.concatenate(tests)) == list(range(len(Y)))


def test_nested_folds():
    outer = folds.stratified_folds(Y, 4, seed=0)
    for o in range(4):
        valids = []
        for i in range(3):
            train, valid, test = folds.nested_fold(Y, 4, o, 3, i, seed=0)
            assert np.array_equal(test, outer[o])
            assert not (set(train) & set(valid) or set(test) & (set(train) | set(valid)))
            assert len(train) + len(valid) == len(Y) - len(test)
            valids.append(valid)
        # the inner folds partition the outer training set
        assert sorted(np.concatenate(valids)) == sorted(folds.outer_split(Y, 4, o, seed=0)[0])
    a = folds.nested_fold(Y, 4, 0, 3, 0, seed=0)[1]
    b = folds.nested_fold(Y, 4, 1, 3, 0, seed=0)[1]
    assert not np.array_equal(a, b)


def split_of(**params):
    return splits.make_split(settings({"dataset": "synthetic", **params}, splits.SPLIT_DEFAULTS))


def test_make_split_with_folds_and_without():
    s = split_of(nb_cross_fold=5, id_cross_fold=2)
    assert len(s.y_test) == 120 and len(s.y_valid) == 48 and len(s.y_train) == 432
    s = split_of()
    assert len(s.y_test) == 120 and len(s.y_valid) == 48
    s = split_of(test_fraction=0.0, valid_fraction=0.0)
    assert len(s.y_test) == 0 and len(s.y_train) == 600
    s = split_of(nb_outer_fold=3, id_outer_fold=1, nb_cross_fold=4, id_cross_fold=0)
    assert len(s.y_test) == 200 and len(s.y_valid) == 100 and len(s.y_train) == 300
    s = split_of(n_train=100, nb_cross_fold=2, id_cross_fold=0, valid_fraction=0.0)
    assert len(s.y_train) == 50 and len(s.y_test) == 50
    with pytest.raises(ValueError, match="nb_cross_fold"):
        split_of(nb_outer_fold=3)


def test_same_fold_gives_same_examples_whatever_the_model_seed():
    a = split_of(nb_cross_fold=3, id_cross_fold=1, seed=1)
    b = split_of(nb_cross_fold=3, id_cross_fold=1, seed=2)
    c = split_of(nb_cross_fold=3, id_cross_fold=1, fold_seed=5)
    assert np.array_equal(a.X_test, b.X_test) and np.array_equal(a.X_valid, b.X_valid)
    assert not np.array_equal(a.X_test, c.X_test)


def test_parameters_take_the_type_of_their_default():
    p = settings({"n_train": "100", "valid_fraction": 0, "dataset": "synthetic", "unknown": 1}, splits.SPLIT_DEFAULTS)
    assert p["n_train"] == 100 and isinstance(p["valid_fraction"], float) and "unknown" not in p
    assert settings({"x": "1,2"}, {"x": 3})["x"] == "1,2"
    assert settings({"flag": "false"}, {"flag": True})["flag"] is False
    with pytest.raises(ValueError, match="integer"):
        settings({"n_train": 2.5}, splits.SPLIT_DEFAULTS)
    with pytest.raises(ValueError, match="number"):
        settings({"n_train": "many"}, splits.SPLIT_DEFAULTS)

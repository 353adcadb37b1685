"""Data sets: synthetic, .npz, idx files (fashion-mnist), digits, and the in-process cache."""

import gzip
import os
import struct
import sys

import numpy as np
import pytest

from jobman.models import datasets
from jobman.models.checkpoint import load_npz, rng_state, save_npz, set_rng_state


@pytest.fixture(autouse=True)
def fresh_cache():
    datasets.clear_cache()
    yield
    datasets.clear_cache()


def test_synthetic_is_seeded_scaled_and_read_only():
    a = datasets.load("synthetic", n_samples=90, n_features=7, n_classes=3, seed=4)
    b = datasets.load("synthetic", n_samples=90, n_features=7, n_classes=3, seed=4)
    c = datasets.load("synthetic", n_samples=90, n_features=7, n_classes=3, seed=5)
    assert a is b  # cached
    assert a.X.shape == (90, 7) and a.X.dtype == np.float32 and a.n_classes == 3
    assert a.X.min() >= 0 and a.X.max() <= 1
    assert not np.array_equal(a.X, c.X)
    assert np.bincount(a.y).tolist() == [30, 30, 30]
    with pytest.raises(ValueError):
        a.X[0, 0] = 1


def test_npz_round_trip_with_scaling_and_test_set(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(20, 2, 3)).astype(np.uint8)
    X[0, 0, 0], X[1, 0, 0] = 0, 255
    Xt = np.full((4, 2, 3), 300, dtype=np.int64)  # beyond the training range: clipped
    np.savez(tmp_path / "d.npz", X=X, y=np.arange(20) % 2, X_test=Xt, y_test=[0, 1, 1, 0])
    ds = datasets.load(str(tmp_path / "d.npz"))
    assert ds.X.shape == (20, 6) and ds.X.dtype == np.float32
    assert ds.X.min() == 0 and ds.X.max() == 1
    assert np.allclose(ds.X[2], X[2].reshape(-1) / 255)
    assert ds.has_test and np.all(ds.X_test == 1) and ds.y_test.tolist() == [0, 1, 1, 0]
    assert ds.name == "d"


def test_npz_relative_to_data_dir_and_without_test(tmp_path):
    np.savez(tmp_path / "e.npz", X=np.random.default_rng(0).random((5, 3)), y=[0, 1, 2, 0, 1])
    ds = datasets.load("e.npz", data_dir=tmp_path)
    assert not ds.has_test and ds.n_classes == 3


def test_npz_errors_are_clear(tmp_path):
    np.savez(tmp_path / "bad.npz", features=np.zeros((2, 2)))
    with pytest.raises(datasets.DatasetError, match="X and y"):
        datasets.load(str(tmp_path / "bad.npz"))
    with pytest.raises(datasets.DatasetError, match="does not exist"):
        datasets.load(str(tmp_path / "missing.npz"))
    with pytest.raises(datasets.DatasetError, match="unknown dataset"):
        datasets.load("imagenet")


def write_idx(path, array, gz):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(path, "wb").write(data)


def test_fashion_mnist_from_a_named_directory(tmp_path):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (6, 28, 28))
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", train, True)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.arange(6) % 10, True)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", rng.integers(0, 256, (3, 28, 28)), False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([9, 0, 1]), False)
    ds = datasets.load("fashion-mnist", data_dir=tmp_path)
    assert ds.X.shape == (6, 784) and ds.X_test.shape == (3, 784)
    assert np.allclose(ds.X[1], train[1].reshape(-1) / 255)
    assert ds.y_test.tolist() == [9, 0, 1]


def test_missing_fashion_mnist_directory_names_the_package(tmp_path):
    with pytest.raises(datasets.DatasetError, match="dataset-fashion-mnist"):
        datasets.load("fashion-mnist", data_dir=tmp_path / "nowhere")


def test_missing_debian_package_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "FASHION_DEBIAN_DIR", tmp_path / "absent")
    with pytest.raises(datasets.DatasetError, match=r"apt-get install dataset-fashion-mnist"):
        datasets.load("fashion-mnist")


def test_truncated_idx_file_is_refused(tmp_path):
    path = tmp_path / "x.idx"
    write_idx(path, np.zeros((4, 2)), False)
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(datasets.DatasetError, match="size"):
        datasets.read_idx(path)


@pytest.mark.skipif(
    not datasets.FASHION_DEBIAN_DIR.exists() and os.environ.get("CI", "").lower() != "true",
    reason="dataset-fashion-mnist is not installed (CI installs it, and fails without it)",
)
def test_fashion_mnist_from_the_debian_package():
    ds = datasets.load("fashion-mnist")
    assert ds.X.shape == (60000, 784) and ds.X_test.shape == (10000, 784)
    assert ds.n_classes == 10 and ds.X.max() == 1.0


def test_digits():
    pytest.importorskip("sklearn")
    ds = datasets.load("digits")
    assert ds.X.shape == (1797, 64) and ds.X.max() == 1.0 and ds.n_classes == 10


def test_digits_without_scikit_learn_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(datasets.DatasetError, match=r"pip install 'jobman-sql\[digits\]'"):
        datasets.load("digits")


def test_atomic_save_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    path = tmp_path / "w.npz"
    save_npz(path, {"a": np.arange(3)})

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken)
    with pytest.raises(OSError):
        save_npz(path, {"a": np.arange(5)})
    monkeypatch.undo()
    assert load_npz(path)["a"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["w.npz"]  # no temp file left behind


def test_rng_state_round_trip(tmp_path):
    rng = np.random.default_rng(7)
    rng.random(3)
    save_npz(tmp_path / "r.npz", {"rng": rng_state(rng)})
    expected = rng.random(5)
    other = np.random.default_rng(0)
    set_rng_state(other, load_npz(tmp_path / "r.npz")["rng"])
    assert np.array_equal(other.random(5), expected)

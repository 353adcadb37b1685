"""The data sets the bundled workloads train on, read from local files and cached in-process.

``load(name)`` knows ``digits`` (scikit-learn's bundled 8x8 digits, an optional
extra), ``fashion-mnist`` (idx files, as Debian's ``dataset-fashion-mnist``
installs them), ``synthetic`` (seeded, for tests) and any ``.npz`` path holding
``X``, ``y`` and optionally ``X_test``, ``y_test``. Features come back as float32
in [0, 1]; nothing is ever downloaded. Loaded sets are cached for the life of the
process (a worker runs many jobs in one warm process, and forked workers share
the cache); the arrays are read-only so no job can corrupt another's data.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

FASHION_DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = {
    "X": "train-images-idx3-ubyte",
    "y": "train-labels-idx1-ubyte",
    "X_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


class DatasetError(Exception):
    """A data set cannot be found or read; the message says how to get it."""


@dataclass(frozen=True)
class Dataset:
    """Features in [0, 1] (float32) and integer labels; a test set when the data comes with one."""

    name: str
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray | None = None
    y_test: np.ndarray | None = None

    @property
    def n_classes(self) -> int:
        ys = [self.y] if self.y_test is None else [self.y, self.y_test]
        return int(max(int(a.max()) for a in ys if len(a)) + 1)

    @property
    def has_test(self) -> bool:
        return self.X_test is not None


def load(
    name: str = "digits",
    data_dir: str | os.PathLike | None = None,
    *,
    n_samples: int = 600,
    n_features: int = 20,
    n_classes: int = 3,
    seed: int = 0,
) -> Dataset:
    """Load a data set by name or ``.npz`` path (cached; see the module docstring).

    ``n_samples``, ``n_features``, ``n_classes`` and ``seed`` shape the ``synthetic`` set only.
    """
    key = str(name).lower().replace("_", "-")
    if key == "synthetic":
        return _synthetic(int(n_samples), int(n_features), int(n_classes), int(seed))
    if key == "digits":
        return _digits()
    if key in ("fashion-mnist", "fashionmnist", "fashion"):
        return _fashion_mnist(str(Path(data_dir).expanduser().resolve()) if data_dir else None)
    if str(name).endswith(".npz"):
        path = Path(name).expanduser()
        if not path.is_absolute() and data_dir:
            path = Path(data_dir).expanduser() / path
        return _npz(str(path.resolve()), path.stat().st_mtime_ns if path.exists() else 0)
    raise DatasetError(f"unknown dataset {name!r}: use digits, fashion-mnist, synthetic or a path to an .npz file")


def _frozen(*arrays: np.ndarray | None) -> None:
    for a in arrays:
        if a is not None:
            a.setflags(write=False)


@cache
def _digits() -> Dataset:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DatasetError("the digits dataset needs scikit-learn: pip install 'jobman-sql[digits]'") from None
    raw = load_digits()
    X = (raw.data / 16.0).astype(np.float32)
    y = raw.target.astype(np.int64)
    _frozen(X, y)
    return Dataset("digits", X, y)


@lru_cache(maxsize=8)
def _fashion_mnist(data_dir: str | None) -> Dataset:
    where = Path(data_dir) if data_dir else FASHION_DEBIAN_DIR
    arrays = {}
    for key, stem in FASHION_FILES.items():
        path = next((p for p in (where / stem, where / f"{stem}.gz") if p.exists()), None)
        if path is None:
            if data_dir:
                raise DatasetError(
                    f"fashion-mnist: no {stem}[.gz] in {where}; point data_dir at the idx files, "
                    f"or install Debian's dataset-fashion-mnist package and leave data_dir unset"
                )
            raise DatasetError(
                f"fashion-mnist not found in {where}: install Debian's dataset-fashion-mnist "
                f"package (apt-get install dataset-fashion-mnist) or pass data_dir="
            )
        arrays[key] = read_idx(path)
    X = (arrays["X"].reshape(len(arrays["X"]), -1) / np.float32(255)).astype(np.float32)
    X_test = (arrays["X_test"].reshape(len(arrays["X_test"]), -1) / np.float32(255)).astype(np.float32)
    y, y_test = arrays["y"].astype(np.int64), arrays["y_test"].astype(np.int64)
    _frozen(X, y, X_test, y_test)
    return Dataset("fashion-mnist", X, y, X_test, y_test)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an idx file (the MNIST format: big-endian header, then raw data), gzipped or not."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise DatasetError(f"{path} is not an idx file")
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if data[2] not in dtypes:
        raise DatasetError(f"{path}: unknown idx data type 0x{data[2]:02x}")
    ndim = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(dtypes[data[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - 4 - 4 * ndim != expected:
        raise DatasetError(f"{path}: idx header promises {shape} but the file has another size")
    return np.frombuffer(data, dtype=dtype, offset=4 + 4 * ndim).reshape(shape).astype(dtype.newbyteorder("="))


@lru_cache(maxsize=16)
def _npz(path: str, _mtime: int) -> Dataset:
    if not os.path.exists(path):
        raise DatasetError(f"dataset file {path} does not exist")
    with np.load(path, allow_pickle=False) as data:
        if "X" not in data.files or "y" not in data.files:
            raise DatasetError(f"{path} must hold arrays named X and y (and optionally X_test, y_test)")
        X, y = data["X"], data["y"]
        X_test = data["X_test"] if "X_test" in data.files else None
        y_test = data["y_test"] if "y_test" in data.files else None
    if (X_test is None) != (y_test is None):
        raise DatasetError(f"{path} must hold both X_test and y_test, or neither")
    X, X_test = scale_unit(X, X_test)
    y = _labels(y, path)
    y_test = None if y_test is None else _labels(y_test, path)
    _frozen(X, y, X_test, y_test)
    return Dataset(Path(path).stem, X, y, X_test, y_test)


def _labels(y: np.ndarray, path: str) -> np.ndarray:
    y = np.asarray(y).reshape(-1)
    if not np.issubdtype(y.dtype, np.integer):
        if not np.all(np.equal(np.mod(y, 1), 0)):
            raise DatasetError(f"{path}: labels must be integers 0..k-1")
        y = y.astype(np.int64)
    if len(y) and y.min() < 0:
        raise DatasetError(f"{path}: labels must be integers 0..k-1")
    return y.astype(np.int64)


def scale_unit(X: np.ndarray, X_test: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Flatten to 2-d float32; map into [0, 1] by the training set's global min and max.

    Data already in [0, 1] is left as it is. The test set uses the training set's
    constants (clipped), so no information leaks from it.
    """
    X = np.asarray(X, dtype=np.float32).reshape(len(X), -1)
    if X_test is not None:
        X_test = np.asarray(X_test, dtype=np.float32).reshape(len(X_test), -1)
    lo, hi = (float(X.min()), float(X.max())) if X.size else (0.0, 1.0)
    if lo >= 0 and hi <= 1:
        return X, X_test
    span = hi - lo if hi > lo else 1.0
    X = (X - lo) / np.float32(span)
    if X_test is not None:
        X_test = np.clip((X_test - lo) / np.float32(span), 0, 1)
    return X.astype(np.float32), None if X_test is None else X_test.astype(np.float32)


@lru_cache(maxsize=16)
def _synthetic(n_samples: int, n_features: int, n_classes: int, seed: int) -> Dataset:
    """Noisy binary prototypes: one random pattern per class, pixels flipped and blurred.

    Learnable but not trivially so (a linear model leaves some error), binary-ish so
    RBMs fit it, and small so tests run in milliseconds.
    """
    rng = np.random.default_rng(seed)
    protos = rng.random((n_classes, n_features)) < 0.5
    y = np.arange(n_samples) % n_classes
    rng.shuffle(y)
    flip = rng.random((n_samples, n_features)) < 0.2
    X = np.logical_xor(protos[y], flip).astype(np.float32)
    X = np.clip(0.8 * X + 0.1 + rng.normal(0, 0.1, X.shape), 0, 1).astype(np.float32)
    y = y.astype(np.int64)
    _frozen(X, y)
    return Dataset("synthetic", X, y)


def clear_cache() -> None:
    """Forget every cached data set (tests; a process that wants its memory back)."""
    for fn in (_digits, _fashion_mnist, _npz, _synthetic):
        fn.cache_clear()

"""Arrays to and from the job's workdir, written atomically, and RNG state as an array.

A checkpoint is one ``.npz`` of flat ``"part/name"`` arrays. It is written to a
temporary file in the same directory and moved into place with ``os.replace``,
so a job killed mid-write leaves the previous checkpoint intact. Nothing is
pickled: loading never executes code.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def save_npz(path: str | Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` atomically (temp file, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".npz.tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            named: dict[str, Any] = {k: np.asarray(v) for k, v in arrays.items()}
            np.savez(fh, **named)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` file, loaded into memory."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def prefixed(prefix: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with keys ``prefix/key``."""
    return {f"{prefix}/{k}": v for k, v in arrays.items()}


def unprefixed(prefix: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays under ``prefix/``, with the prefix stripped."""
    head = prefix + "/"
    return {k[len(head) :]: v for k, v in arrays.items() if k.startswith(head)}


def json_array(value: Any) -> np.ndarray:
    """A JSON document as a 0-d string array (so it fits in an npz without pickling)."""
    return np.array(json.dumps(value, sort_keys=True))


def from_json_array(arr: np.ndarray) -> Any:
    return json.loads(str(arr[()]))


def rng_state(rng: np.random.Generator) -> np.ndarray:
    """The generator's exact state (128-bit integers included) as a string array."""
    return json_array(rng.bit_generator.state)


def set_rng_state(rng: np.random.Generator, arr: np.ndarray) -> None:
    rng.bit_generator.state = from_json_array(arr)

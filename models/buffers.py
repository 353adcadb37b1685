"""Many named arrays as views of one contiguous buffer.

An optimizer step over one flat vector costs a handful of NumPy calls instead
of a handful per parameter; for the small networks of the bundled workloads
that overhead, not the arithmetic, is what an update costs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def flatten(arrays: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A new buffer holding a copy of every array, and views of it under the same names."""
    dtype = np.result_type(*arrays.values()) if arrays else np.float32
    buf = np.empty(sum(a.size for a in arrays.values()), dtype=dtype)
    views = views_of(buf, {k: a.shape for k, a in arrays.items()})
    for k, a in arrays.items():
        views[k][...] = a
    return buf, views


def views_of(buf: np.ndarray, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Consecutive views of ``buf`` with the given shapes, in order."""
    views, offset = {}, 0
    for k, shape in shapes.items():
        size = int(np.prod(shape, dtype=np.int64))
        views[k] = buf[offset : offset + size].reshape(shape)
        offset += size
    if offset != buf.size:
        raise ValueError(f"the shapes need {offset} elements, the buffer has {buf.size}")
    return views


def is_view_set(arrays: Mapping[str, np.ndarray], buf: np.ndarray) -> bool:
    """True when ``arrays`` are exactly the consecutive views of ``buf`` (so updating ``buf`` updates them)."""
    offset = 0
    base = buf.__array_interface__["data"][0]
    item = buf.itemsize
    for a in arrays.values():
        if a.dtype != buf.dtype:
            return False
        if a.size and (not a.flags.c_contiguous or a.__array_interface__["data"][0] != base + offset * item):
            return False
        offset += a.size
    return offset == buf.size

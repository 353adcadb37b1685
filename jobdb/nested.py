"""Nested state, jobman's way: ``state.hyper.lr`` in a job is the parameter ``hyper.lr`` in the database.

A job's parameters and results are stored flat, with dotted names (the form the
original jobman stored too); a job sees them nested. So a flat spelling
(``hyper.lr=0.1``) and a nested one (``{"hyper": {"lr": 0.1}}``) are one job, and
parameters stored with plain names keep their identity.
"""

from __future__ import annotations

from collections.abc import Mapping  # not typing's: its isinstance is several times slower
from typing import Any

from .errors import UsageError

# The key under which a job finds what jobman knows of it (state.jobman.id, ...): never a parameter.
RESERVED = "jobman"


class DD(dict):
    """A dict whose keys are also attributes: ``state.lr`` is ``state['lr']``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getstate__(self) -> dict:
        return dict(self)

    def __setstate__(self, data: dict) -> None:
        self.update(data)

    def __copy__(self) -> DD:
        return DD(self)

    def __deepcopy__(self, memo: dict) -> DD:
        from copy import deepcopy

        return DD({k: deepcopy(v, memo) for k, v in self.items()})


def _nests(value: Any) -> bool:
    """A mapping flatten descends into: a non-empty one whose keys are all strings."""
    return isinstance(value, Mapping) and bool(value) and all(isinstance(k, str) for k in value)


def flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"hyper": {"lr": 0.1}}`` to ``{"hyper.lr": 0.1}``; a flat dict comes back equal."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if _nests(value):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def expand(flat: Mapping[str, Any]) -> DD:
    """``{"hyper.lr": 0.1}`` to ``DD(hyper=DD(lr=0.1))``: the inverse of :func:`flatten`."""
    out = DD()
    for key, value in flat.items():
        node = out
        *path, leaf = str(key).split(".")
        for part in path:
            child = node.get(part)
            if not isinstance(child, DD):
                child = node[part] = DD() if child is None else _conflict(key, part)
            node = child
        if isinstance(node.get(leaf), DD):
            _conflict(key, leaf)
        node[leaf] = expand(value) if _nests(value) and not isinstance(value, DD) else value
    return out


def _conflict(key: str, part: str) -> Any:
    raise UsageError(f"parameter {key!r} is both a value and a group of values ({part!r}); rename one")


def needs_canonical(params: Mapping[str, Any]) -> bool:
    """True when ``params`` holds a nested group (a dict value) that :func:`canonical_params` flattens."""
    return any(_nests(v) for v in params.values())


def canonical_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The stored form of a job's parameters: flat, dotted names; refused if a name is used twice
    (``hyper`` as a value and ``hyper.lr``) or if it is jobman's own."""
    flat = flatten(params)
    check_names(flat)
    return flat


def check_names(names: Any) -> None:
    """Refuse parameter names that cannot nest: jobman's own, and a value that is also a group."""
    names = list(names)
    present = set(names)
    for name in names:
        parts = name.split(".")
        if parts[0] == RESERVED:
            raise UsageError(f"parameter {name!r}: the name {RESERVED!r} is jobman's own (state.{RESERVED}.id, ...)")
        for i in range(1, len(parts)):
            if ".".join(parts[:i]) in present:
                raise UsageError(
                    f"parameter {'.'.join(parts[:i])!r} is both a value and a group of values ({name!r}); rename one"
                )

"""What a call is: a target naming a function, and JSON parameters; grids and samples of them.

``jobman.grid`` and ``jobman.sample`` make parameter dicts as ``sqlschedule`` expands a sweep; a
call's target is ``module:qualname`` (a script's own function gets ``#digest`` of its code), with
``@version`` when its code is versioned by hand or by its source.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from jobman.jobdb.callrefs import CALL, RESERVED_KEYS, call_refs, replace_refs
from jobman.jobdb.distributions import Distribution
from jobman.jobdb.errors import JobmanError, UsageError
from jobman.jobdb.records import Job
from jobman.jobdb.shape import MAX_DEPTH
from jobman.jobdb.status import Status
from jobman.jobdb.sweep import Assignment, Phase, Sweep, canonical_target, expand

from .channel import NOT_KEPT
from .experiment import TargetError, resolve


class CallRef(dict):
    """A future given as a parameter, as it is stored: ``{"$call": IDENTITY}`` (see :mod:`jobman.jobdb.callrefs`)."""

    def __init__(self, identity: str) -> None:
        super().__init__({CALL: identity})


def json_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` as JSON values (NumPy scalars become numbers); a UsageError naming the first
    parameter that is not one."""
    if not isinstance(params, Mapping):
        raise UsageError(f"parameters are given as a dict of name to value, not a {type(params).__name__}")
    out = {}
    for key, value in params.items():
        if not isinstance(key, str) or not key:
            raise UsageError(f"parameter names are non-empty strings, not {key!r}")
        out[key] = _json_value(value, key)
    return out


def _json_value(value: Any, name: str, depth: int = 1) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, CallRef):
        return dict(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise UsageError(f"parameter {name!r} is {value}, which the database cannot store")
        return float(value)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return _json_value(value.item(), name)  # a NumPy scalar
    if isinstance(value, (list, tuple, Mapping)) and depth > MAX_DEPTH:  # before recursing any deeper
        top = name.split("[", 1)[0].split(".", 1)[0]
        raise UsageError(f"parameter {top!r} cannot be stored: nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, (list, tuple)):
        return [_json_value(v, f"{name}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise UsageError(f"parameter {name!r} is a dict whose keys are not all strings")
        reserved = next((k for k in RESERVED_KEYS if k in value), None)
        if reserved is not None:
            raise UsageError(
                f"parameter {name!r} is a dict with the key {reserved!r}, which jobman keeps for its references"
            )
        return {k: _json_value(v, f"{name}.{k}", depth + 1) for k, v in value.items()}
    hint = " (pass arr.tolist())" if type(value).__module__ == "numpy" else ""
    raise UsageError(
        f"parameter {name!r} is a {type(value).__name__}, not a JSON value "
        f"(a number, string, bool, None, list or dict){hint}"
    )


def taken_values(params: Mapping[str, Any], parents: list[Job]) -> dict[str, Any]:
    """The parameters of a job that takes other calls, by top-level name, each reference replaced by the
    stored results of the call it names (one of ``parents``, DONE); artifacts stay references, for the
    job's own process to read. A JobmanError, one sentence, when one cannot be given."""
    by_identity = {p.identity: p for p in parents if p.identity}

    def value_of(identity: str) -> Any:
        parent = by_identity.get(identity)
        if parent is None:
            raise JobmanError(f"the call {identity[:12]} it takes is no longer in the experiment")
        where = f"job {parent.id} ({parent.target})"
        if parent.status is not Status.DONE:
            raise JobmanError(f"{where}, a call it takes, is {parent.status.value}, not DONE")
        results = parent.results or {}
        lost = results.get(NOT_KEPT)
        if isinstance(lost, dict) and lost:
            key, why = next(iter(lost.items()))
            raise JobmanError(f"{where} returned {key!r}, which could not be kept ({why}), so no call can take it")
        return results

    return {key: replace_refs(value, value_of) for key, value in params.items() if next(call_refs(value), None)}


def target_of(fn: Callable[..., Any] | str, version: str | None = None) -> str:
    """The job target naming ``fn``: ``module:qualname`` (``__main__:name`` for a script's own
    function, which is then run by value and gets ``#digest`` of its code), with ``@version``
    when one is given."""
    if isinstance(fn, str):
        name, at, given = fn.partition("@")
        target = canonical_target(name) + at + given  # pkg.mod.fn and pkg.mod:fn are one call
        try:
            resolve(target.partition("@")[0])
        except TargetError as exc:
            raise UsageError(str(exc)) from None
    else:
        module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
        if not callable(fn) or not module or not qualname:
            raise UsageError(f"{fn!r} is not a function: call a function, or give its path as 'package.module:fn'")
        target = f"{module}:{qualname}"
    if version is not None:
        if not str(version) or "@" in str(version):
            raise UsageError(f"version {version!r} must be a non-empty string without '@'")
        target = f"{target.partition('@')[0]}@{version}"
    return target


def source_version(fn: Callable[..., Any]) -> str:
    """A version made of the function's source text: a changed function is a new call."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        raise UsageError(
            f"the source of {getattr(fn, '__qualname__', fn)!r} cannot be read; give version= instead of cache='source'"
        ) from None
    return "src-" + hashlib.sha256(source.encode()).hexdigest()[:12]


def code_version(fn: Callable[..., Any]) -> str | None:
    """The version a call of ``fn`` gets when none is given: made of its source, as joblib keys its
    cache; None when its source cannot be read (a builtin, code made at run time)."""
    try:
        return source_version(fn)
    except UsageError:
        return None


def grid(**axes: Any) -> list[dict[str, Any]]:
    """The product of the axes, as one params dict per point, in the order ``sqlschedule`` makes them.

    A list or tuple is an axis (``lr=[0.1, 0.01]``); any other value is fixed (``epochs=10``).
    ``grid(lr=[0.1, 0.01], nhid=[64, 256])`` is the sweep ``lr={{0.1,0.01}} nhid={{64,256}}``.
    Distributions are drawn by :func:`sample`, which says how many points.
    """
    drawn = [key for key, value in axes.items() if isinstance(value, Distribution)]
    if drawn:
        raise UsageError(f"{drawn[0]!r} is a distribution: draw points with jobman.sample(n, axes, seed=...)")
    return [spec.params for spec in expand(Sweep([Phase("grid", _assignments(axes))]))]


def sample(n: int, axes: Mapping[str, Any], *, seed: int = 0, sampler: str = "random") -> list[dict[str, Any]]:
    """``n`` points drawn from the distributions of ``axes`` (``jobman.loguniform(1e-4, 1e-1)``, ...),
    as ``sqlschedule --samples n --seed seed`` draws them; lists are grid axes, each point of which
    gets the same draws. The first n points are the same whatever n is.

    ``jobman.sample(32, {"lr": jobman.loguniform(1e-4, 1e-1), "nhid": [64, 256]}, seed=7)``.
    """
    return [
        spec.params
        for spec in expand(Sweep([Phase("sample", _assignments(axes))]), samples=n, seed=seed, sampler=sampler)
    ]


def _assignments(axes: Mapping[str, Any]) -> list[Assignment]:
    """A list or tuple is a grid axis, a distribution is drawn, anything else is fixed."""
    assignments = []
    for key, value in axes.items():
        if isinstance(value, (list, tuple)):
            if not value:
                raise UsageError(f"grid axis {key!r} is empty")
            assignments.append(Assignment(key, tuple(value), True))
        else:
            assignments.append(Assignment(key, (value,), False))
    return assignments

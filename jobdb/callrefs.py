"""Calls that take calls: how a parameter that is another call's value is stored, found and given.

A future passed as a parameter (alone, or anywhere inside a list or dict) is stored as the
reference ``{"$call": IDENTITY}``, the identity (``params_hash``) of the call it stands for, never
its job id: a call's identity then includes the identities of the calls it takes, so the same
script run again finds every call it made, and a changed parameter upstream is a new identity all
the way down. The dependency itself is a ``job_dep`` row; when the job runs, each reference is
replaced by the results of the call it names (the dict its future gives), artifacts read back in
the job's own process. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

CALL = "$call"  # the key of a reference to another call, in a job's parameters
RESERVED_KEYS = (CALL, "$artifact")  # what a parameter's own dicts may not use as a key


def is_call_ref(value: Any) -> bool:
    """Whether ``value`` is a stored reference to another call."""
    return isinstance(value, Mapping) and len(value) == 1 and isinstance(value.get(CALL), str)


def call_refs(params: Any) -> Iterator[str]:
    """The identities of the calls ``params`` refers to, in the order met (repeats included)."""
    if is_call_ref(params):
        yield params[CALL]
    elif isinstance(params, Mapping):
        for value in params.values():
            yield from call_refs(value)
    elif isinstance(params, list):
        for value in params:
            yield from call_refs(value)


def takes_calls(params: Mapping[str, Any]) -> bool:
    """Whether a job's parameters refer to another call."""
    return next(call_refs(params), None) is not None


def replace_refs(params: Any, value_of: Callable[[str], Any]) -> Any:
    """``params`` with each reference replaced by ``value_of(identity)``; the rest as it was."""
    if is_call_ref(params):
        return value_of(params[CALL])
    if isinstance(params, Mapping):
        return {k: replace_refs(v, value_of) for k, v in params.items()}
    if isinstance(params, list):
        return [replace_refs(v, value_of) for v in params]
    return params

"""Resolve a target and call it the way jobman did: ``fn(state, channel)`` or ``fn(**params)``.

How a call ended is a :class:`CallEnd`: DONE with results, INCOMPLETE (re-queue
and resume), or FAILED with a reason. Workers, the inline mode and ``jobman cmdline``
share this module so a function behaves the same everywhere.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Mapping  # not typing's: its isinstance is several times slower
from dataclasses import dataclass, field
from typing import Any

from jobman.jobdb.artifacts import load_refs
from jobman.jobdb.nested import RESERVED

from .channel import COMPLETE, DD, INCOMPLETE, Channel, keepable


class TargetError(Exception):
    """The target cannot be imported or is not callable."""


def by_value(target: str) -> bool:
    """True for a function no worker can import by name, stored with its jobs by value instead:
    one defined in a script's or a notebook's ``__main__``, or inside another function."""
    return target.startswith("__main__:") or "<" in target


def load_function(code: bytes, target: str) -> Callable[..., Any]:
    """A function stored by value (``cloudpickle``), ready to call."""
    import pickle

    try:
        fn = pickle.loads(code)
    except Exception as exc:  # noqa: BLE001 - a module it needs is missing here, or another Python made it
        raise TargetError(f"the stored code of {target!r} cannot be loaded here: {type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise TargetError(f"the stored code of {target!r} is a {type(fn).__name__}, not a callable")
    return fn


def _import(module_name: str) -> Any:
    """Import a module; one next to the caller (the current directory) is found as ``python -m`` would,
    but after installed packages, so a file there never shadows a library."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        top = module_name.partition(".")[0]
        if exc.name != top or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        try:
            return importlib.import_module(module_name)
        except ImportError:
            sys.path.remove(here)
            raise


def resolve(target: str) -> Callable[..., Any]:
    """Import ``pkg.module:fn`` or ``pkg.module.fn`` and return the callable."""
    if by_value(target):
        raise TargetError(
            f"{target!r} is defined in a script or notebook (or inside a function): only its stored code can run it"
        )
    target = target.partition("@")[0]  # a call's version (``mod:fn@v2``) is part of its identity, not its name
    if ":" in target:
        module_name, _, attr = target.partition(":")
    else:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise TargetError(f"target {target!r} is not of the form 'package.module:function'")
    try:
        module = _import(module_name)
    except ImportError as exc:
        raise TargetError(f"cannot import module {module_name!r} of target {target!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a module that raises on import
        raise TargetError(f"importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TargetError(f"target {target!r} is a {type(obj).__name__}, not a callable")
    return obj


_SIGNATURES: dict[Any, inspect.Signature | None] = {}


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature(fn)``, remembered: a worker works it out once, not in every forked job."""
    try:
        return _SIGNATURES[fn]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable
        return _signature_of(fn)
    sig = _SIGNATURES[fn] = _signature_of(fn)
    return sig


def _signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def takes_state_and_channel(fn: Callable[..., Any]) -> bool:
    """True for jobman's ``fn(state, channel)`` signature, False for keyword functions."""
    sig = _signature(fn)
    if sig is None:
        return True
    names = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:2] == ["state", "channel"]


def unaccepted(fn: Callable[..., Any], names: Iterable[str]) -> str | None:
    """The sentence refusing the first parameter ``fn`` cannot take (no such keyword, no ``**kwargs``),
    or None when it takes them all. ``fn(state, channel)`` takes any state, so any parameter."""
    sig = _signature(fn)
    if sig is None or takes_state_and_channel(fn) or any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    takes = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in dict.fromkeys(n.split(".", 1)[0] for n in names):  # a dotted parameter is its group's
        if name in takes or name == RESERVED:
            continue
        own = f"{getattr(fn, '__name__', 'the target')}() takes {', '.join(takes) if takes else 'no parameters'}"
        close = difflib.get_close_matches(name, takes, n=1)
        return f"{name}: {own}" + (f"; did you mean {close[0]}?" if close else "")
    return None


@dataclass
class CallEnd:
    """How a call of a job's function ended. ``status`` is DONE, INCOMPLETE or FAILED (the first
    three of ``jobdb.status.Outcome``, which also has what only a worker can see: CRASHED, REQUEUE)."""

    status: str
    results: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def why(self) -> str | None:
        """The line the job's event log gets for a failure; None for any other ending."""
        return failure_why(self.error) if self.status == "FAILED" else None


def failure_why(error: str | None) -> str:
    """A failure's reason in one line, for the event log: the last line of its error text."""
    return ((error or "").strip().splitlines() or ["failed"])[-1][:300]


def call(fn: Callable[..., Any], state: DD, channel: Channel) -> CallEnd:
    """Run ``fn`` on ``state`` and turn whatever it does into a :class:`CallEnd`."""
    channel.bind(state)
    refused = unaccepted(fn, channel.params)
    if refused is not None:  # run with its defaults, the job would answer another question than was asked
        return CallEnd("FAILED", _safe_results(channel, state), refused)
    try:
        if takes_state_and_channel(fn):
            ret = fn(state, channel)
        else:
            ret = _call_with_keywords(fn, state, channel)
    except Exception:  # noqa: BLE001 - the job's own error, whatever it is, becomes its FAILED record
        return CallEnd("FAILED", _safe_results(channel, state), traceback.format_exc(limit=20))
    if isinstance(ret, Mapping):
        state.update(ret)
        ret = COMPLETE
    return ending_of(ret, _safe_results(channel, state), channel.pruned, channel.stop_reason)


def ending_of(ret: Any, results: dict[str, Any], pruned: bool = False, stop_reason: str | None = None) -> CallEnd:
    """How a call that returned ``ret`` (not a dict: that is merged into the results first) ended,
    given its results and whether the search pruned it."""
    # Compared as text only: ``==`` on an array returned by mistake is an array, not a truth value.
    said = ret if isinstance(ret, str) else None
    if pruned and (ret is None or said in (COMPLETE, INCOMPLETE)):  # a pruned job is done, not to be resumed
        return CallEnd("DONE", {**results, "pruned": True, "pruned_why": stop_reason})
    if ret is None or said == COMPLETE:
        return CallEnd("DONE", results)
    if said == INCOMPLETE:
        return CallEnd("INCOMPLETE", results)
    shown = repr(ret) if isinstance(ret, (str, int, float)) else f"a {type(ret).__name__}"
    return CallEnd("FAILED", results, f"the job returned {shown}; expected None, a dict, COMPLETE or INCOMPLETE")


def _call_with_keywords(fn: Callable[..., Any], state: DD, channel: Channel) -> Any:
    sig = _signature(fn) or inspect.signature(fn)
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    # state.jobman goes only to a function that names it: a **kwargs function gets its parameters alone.
    kwargs = {k: v for k, v in state.items() if k in sig.parameters or (accepts_any and k != RESERVED)}
    if "channel" in sig.parameters and "channel" not in kwargs:
        kwargs["channel"] = channel
    return fn(**kwargs)


def resumed(results: Mapping[str, Any] | None, artifacts: Any) -> Mapping[str, Any] | None:
    """What a job saved before, as it saved it: each artifact its checkpoint refers to read back, so a
    resumed job finds its model, not a reference. ValueError (one sentence) if one is gone."""
    if not results or artifacts is None:
        return results
    try:
        return load_refs(results, artifacts)
    except Exception as exc:  # noqa: BLE001 - gone, damaged, or a class its module no longer has
        raise ValueError(f"the job's checkpoint cannot be read back: {exc}") from None


def given(taken: Mapping[str, Any] | None, artifacts: Any) -> Mapping[str, Any] | None:
    """The values of the calls a job takes (``taken``, by parameter), each artifact read back once, in the
    job's own process. ValueError (one sentence) if one is gone."""
    if not taken or artifacts is None:
        return taken
    try:
        return load_refs(dict(taken), artifacts)  # type: ignore[no-any-return,unused-ignore]
    except Exception as exc:  # noqa: BLE001 - gone, damaged, or a class its module no longer has
        raise ValueError(f"a value the job takes from another call cannot be read back: {exc}") from None


def _safe_results(channel: Channel, state: DD) -> dict[str, Any]:
    return keepable(channel.results_of(state), channel.artifacts)

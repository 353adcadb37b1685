"""A job's parameters with the trainer's defaults filled in, typed like the defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobman.dispatch.channel import DD


def settings(state: Mapping[str, Any], *defaults: Mapping[str, Any]) -> DD:
    """The defaults, overridden by whatever ``state`` sets; numbers take the default's type.

    The result is a separate dict: defaults are never written back into ``state``,
    whose new keys are the job's results.
    """
    out = DD()
    for d in defaults:
        out.update(d)
    for key, default in list(out.items()):
        if key in state:
            out[key] = _coerce(key, state[key], default)
    return out


def job_params(state: Mapping[str, Any], channel: Any) -> dict[str, Any]:
    """The job's parameters: ``state`` overlaid with ``channel.params``.

    A resumed job's state also holds the results it saved, and a result may share
    a parameter's name (``epochs``: the limit asked for, the number run); the
    channel's copy of the parameters is the one to trust.
    """
    return {**state, **(getattr(channel, "params", None) or {})}


def _coerce(key: str, value: Any, default: Any) -> Any:
    if value is None or default is None:
        return value
    if isinstance(default, bool):
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)
    if isinstance(value, (list, tuple)) or (isinstance(value, str) and "," in value):
        return value  # layer sizes: "256,128" or [256, 128]
    if isinstance(default, (int, float)):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"parameter {key} must be a number, not {value!r}") from None
        if isinstance(default, float):
            return number
        if number != int(number):
            raise ValueError(f"parameter {key} must be an integer, not {value!r}")
        return int(number)
    return value


def int_list(value: Any) -> list[int]:
    """``256``, ``[256, 128]`` or ``"256,128"`` as a list of ints (layer sizes)."""
    if isinstance(value, str):
        return [int(v) for v in value.replace(" ", "").split(",") if v]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


# Parameters that change how a run reports, or only how long it goes on, not what it computes up to
# a point: a checkpoint stays valid across them (a run continued to more epochs resumes from it).
COSMETIC = frozenset({"checkpoint_every", "progress_every", "epochs"})


def fingerprint(p: Mapping[str, Any], keys: Any = None) -> dict[str, Any]:
    """The parameters that identify a run's computation (``keys`` only, if given), for checkpoint matching."""
    return {k: p[k] for k in sorted(p) if k not in COSMETIC and (keys is None or k in keys)}

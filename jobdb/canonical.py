"""Canonical JSON: how parameters and results are stored, and what a job's identity is hashed from.

Sorted keys, ``", "`` and ``": "`` separators, ASCII, no NaN or infinity: the text
``json.dumps(value, sort_keys=True, allow_nan=False)`` gives, made faster for the
flat dicts of a sweep.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import UsageError

_ENCODER = json.JSONEncoder(sort_keys=True, allow_nan=False)


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The standard library's C encoder, made once with the settings of _ENCODER: encode() would make
# a new one per call, which is half the cost of encoding a sweep's 100,000 small dicts.
_C_ENCODER = (json.encoder.c_make_encoder(None, _not_json, json.encoder.encode_basestring_ascii, None, ": ", ", ",
                                          True, False, False)
              if json.encoder.c_make_encoder is not None else None)


def dump_json(value: Any, what: str = "value") -> str:
    """Canonical JSON (sorted keys, no NaN), or a UsageError naming what could not be stored."""
    try:
        if _C_ENCODER is not None and type(value) is dict:
            return "".join(_C_ENCODER(value, 0))
        return _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise UsageError(f"the {what} cannot be stored as JSON: {exc}") from None


_SCAN = json.scanner.c_make_scanner(json.JSONDecoder()) if json.scanner.c_make_scanner is not None else None


def load_json(text: str) -> Any:
    """Stored JSON back to Python, as ``json.loads`` gives it.

    Through the standard library's C scanner directly: ``json.loads`` spends four times as
    long around it, and a worker decodes every job it claims.
    """
    if _SCAN is not None:
        try:
            value, end = _SCAN(text, 0)
            if end == len(text):
                return value
        except (StopIteration, ValueError):
            pass  # not JSON: json.loads says why
    return json.loads(text)


def encode_value(value: Any) -> str:
    """One value's canonical JSON; ValueError or TypeError if JSON cannot hold it."""
    return _ENCODER.encode(value)

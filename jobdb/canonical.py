"""Canonical JSON: how parameters and results are stored, and what a job's identity is hashed from.

Sorted keys, ``", "`` and ``": "`` separators, ASCII, no NaN or infinity: the text
``json.dumps(value, sort_keys=True, allow_nan=False)`` gives, made faster for the
flat dicts of a sweep.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

from .errors import UsageError

_ENCODER = json.JSONEncoder(sort_keys=True, allow_nan=False)


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# The standard library's C encoder, made once with the settings of _ENCODER: encode() would make
# a new one per call, which is half the cost of encoding a sweep's 100,000 small dicts. (The C
# accelerators are not in the standard library's stubs.)
_c_make_encoder = json.encoder.c_make_encoder  # type: ignore[attr-defined]
_C_ENCODER = (
    _c_make_encoder(None, _not_json, json.encoder.encode_basestring_ascii, None, ": ", ", ", True, False, False)
    if _c_make_encoder is not None
    else None
)


def dump_json(value: Any, what: str = "value") -> str:
    """Canonical JSON (sorted keys, no NaN), or a UsageError naming what could not be stored."""
    try:
        if _C_ENCODER is not None and type(value) is dict:
            text = "".join(_C_ENCODER(value, 0))
        else:
            text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise UsageError(f"the {what} cannot be stored as JSON: {exc}") from None
    check_nul(text, value, what)
    return text


# JSON has no NaN or infinity, and PostgreSQL's jsonb refuses Python's NaN and Infinity tokens: a result
# that is one is stored as this one-key object, which every reader of results turns back into the float.
NONFINITE = "$float"
_NONFINITE_TEXT = f'"{NONFINITE}"'


def dump_results(value: Any, what: str = "job results") -> str:
    """:func:`dump_json` of a job's results, NaN and the infinities kept (as ``{"$float": "nan"}``, ...)."""
    try:
        return dump_json(value, what)
    except UsageError:
        tagged = _tagged(value)
        if tagged is value:
            raise
    return dump_json(tagged, what)


def load_results(text: str) -> Any:
    """Stored results back to Python, NaN and the infinities as floats again."""
    value = load_json(text)
    return _untagged(value) if _NONFINITE_TEXT in text else value


def _tagged(value: Any) -> Any:
    """``value`` with each NaN or infinite float replaced by its tag; ``value`` itself if it holds none."""
    if type(value) is float:
        return value if math.isfinite(value) else {NONFINITE: repr(value)}
    if isinstance(value, dict):
        items = {k: _tagged(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else items
    if isinstance(value, (list, tuple)):
        seq = [_tagged(v) for v in value]
        return value if all(a is b for a, b in zip(seq, value)) else seq
    return value


def _untagged(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and value.get(NONFINITE) in ("nan", "inf", "-inf"):
            return float(value[NONFINITE])
        return {k: _untagged(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    return value


def found_by_json_path(key: str, dialect: str) -> bool:
    """Whether a JSON path of ``dialect`` finds the stored key ``key``.

    SQLite (3.40, as Python bundles it) matches a path's label against the key as the stored
    text spells it, escapes included, so a key that the ASCII encoder escapes (a letter beyond
    ASCII, a quote, a backslash, a control character) is not found by ``$."key"``: such keys are
    compared in Python. PostgreSQL's ``->`` takes the key itself; a quote is kept out of both.
    """
    if '"' in key:
        return False
    return dialect == "postgresql" or _ENCODER.encode(key)[1:-1] == key


# A NUL character, as the ASCII encoder writes it. PostgreSQL's jsonb (and its text columns) cannot
# hold one, so it is refused on every engine alike, before anything is written.
_NUL_ESCAPE = "\\u0000"


def check_nul(text: str, value: Any, what: str) -> None:
    """Refuse ``value`` (encoded as ``text``) if a key or a string in it holds a NUL character."""
    if _NUL_ESCAPE not in text:  # the common case: one C-speed scan of the text
        return
    where = _nul_path(value, "")
    if where is not None:
        raise UsageError(
            f"the {what} cannot be stored: {where or 'the value'!s} contains a NUL character "
            "(\\x00), which jobman does not store on any database"
        )


def check_nul_all(texts: Sequence[str], values: Iterable[Any], what: str) -> None:
    """:func:`check_nul` over many encoded values: one C-speed pass when none holds a NUL (a sweep's 100,000)."""
    if any(map(operator.contains, texts, itertools.repeat(_NUL_ESCAPE))):
        for text, value in zip(texts, values):
            check_nul(text, value, what)


def _nul_path(value: Any, path: str) -> str | None:
    """The dotted path of the first key or string holding a NUL, '' for ``value`` itself, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{path}.{key}" if path else str(key)
            if "\x00" in str(key):
                return repr(name)
            found = _nul_path(item, name)
            if found is not None:
                return found if found.startswith("'") else repr(found)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _nul_path(item, f"{path}[{index}]")
            if found is not None:
                return found if found.startswith("'") else repr(found)
    return None


_c_make_scanner = json.scanner.c_make_scanner  # type: ignore[attr-defined]  # not in the stubs either
_SCAN = _c_make_scanner(json.JSONDecoder()) if _c_make_scanner is not None else None


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

"""The words a selection of jobs is spoken in: the ``--where`` language, which parameters are folds, seeds
or outer folds, how parameter values compare and order, and how values and results are printed.

Shared by the report, the dashboard's reads, the CLI and the web pages, and kept at the bottom of
``jobdb`` (it imports nothing of ours at load time) so that opening a store never imports the report.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import UsageError

_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(==|!=|<=|>=|<|>|=)\s*(.*?)\s*$")
_COUNT_PREFIXES = ("nb_", "n_", "num_", "number_", "max_", "min_")

#: Significant digits of a parameter value: a report and a sweep show six, a crowded job listing four.
PARAM_DIGITS = 6
LIST_DIGITS = 4


# -- the --where language -------------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    """``key OP value`` on a job's parameters; a job without the key never matches."""

    key: str
    op: str
    value: Any

    def test(self, params: Mapping[str, Any]) -> bool:
        if self.key not in params:
            return False
        have, want = params[self.key], self.value
        if self.op in ("==", "!="):
            equal = same_value(have, want)
            return equal if self.op == "==" else not equal
        if is_number(have) and is_number(want) or isinstance(have, str) and isinstance(want, str):
            return {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want}[self.op]
        return False

    def __str__(self) -> str:
        return f"{self.key}{self.op}{format_param(self.value)}"


def parse_where(text: str) -> Condition:
    """``nhid>=128``, ``act==tanh``, ``lr!=0.1`` (``=`` means ``==``); values are typed as in a sweep."""
    from .sweep import parse_value  # the sweep grammar is large: read only when a filter is given

    match = _WHERE.match(text)
    if not match or not match.group(3):
        raise UsageError(
            f"--where {text!r}: write KEY OP VALUE with OP one of ==, !=, <, <=, >, >= (for example nhid>=128)"
        )
    key, op, raw = match.groups()
    if raw[0] in "<>=!":
        raise UsageError(f"--where {text!r}: {op + raw[0]!r} is not an operator; use ==, !=, <, <=, >, >=")
    try:
        value = parse_value(raw)
    except ValueError as exc:
        message = str(exc).rsplit("@", 1)[0]
        raise UsageError(f"--where {text!r}: the value {raw!r} is malformed ({message})") from None
    return Condition(key, "==" if op == "=" else op, value)


# -- folds, seeds and outer folds -------------------------------------------------------------------


def group_kind(key: str) -> str | None:
    """``fold`` or ``seed`` when the parameter names one (``fold``, ``*_fold``, ``fold_*``, ...), else None:
    never a count (``nb_*``, ``n_*``, ...) and never an outer fold."""
    name = key.lower()
    if is_outer_key(name) or name.startswith(_COUNT_PREFIXES):
        return None
    for word in ("fold", "seed"):
        if name == word or name.endswith("_" + word) or name.startswith(word + "_"):
            return word
    return None


def is_outer_key(key: str) -> bool:
    """Whether the parameter names an outer fold of nested cross-validation (``id_outer_fold``, ...)."""
    parts = key.lower().split("_")
    return "outer" in parts and any(p.startswith("fold") for p in parts) and not key.lower().startswith(_COUNT_PREFIXES)


def default_group_keys(keys: Iterable[str]) -> list[str]:
    """The parameters that look like a fold or a seed (not outer folds, not counts)."""
    return sorted(k for k in set(keys) if group_kind(k) is not None)


def default_outer_key(keys: Iterable[str]) -> str | None:
    """The parameter naming an outer fold of nested cross-validation, if exactly one does."""
    found = sorted(k for k in set(keys) if is_outer_key(k))
    return found[0] if len(found) == 1 else None


# -- comparing and ordering values ----------------------------------------------------------------


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool): what a report averages and a chart draws."""
    return (type(v) is float or type(v) is int) and math.isfinite(v)


def same_value(a: Any, b: Any) -> bool:
    """Equality as a filter means it: True is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def frozen(v: Any) -> Any:
    """A hashable stand-in for a parameter value; True and 1 stay apart."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (list, dict)):
        return ("json", json.dumps(v, sort_keys=True))
    return v


def frozen_items(params: Mapping[str, Any], skip: set[str]) -> tuple:
    """The parameters but ``skip`` as sorted, hashable (key, value) pairs."""
    return tuple(sorted((k, frozen(v)) for k, v in params.items() if k not in skip))


def sort_key(v: Any) -> tuple:
    """Orders values of mixed types deterministically (numbers, then text, then the rest)."""
    if v is None:
        return (0, 0)
    if is_number(v) or isinstance(v, bool):
        return (1, float(v))
    if isinstance(v, str):
        return (2, v)
    return (3, json.dumps(v, sort_keys=True, default=str))


# -- printing --------------------------------------------------------------------------------------


def format_number(value: float | None, digits: int = 4) -> str:
    """A result as the report prints it: four significant digits for a mean, two for a spread."""
    if value is None:
        return ""
    if value == 0:
        return "0"
    if digits < 4:  # a spread keeps its trailing zero: 0.0030, not 0.003
        return f"{value:#.{digits}g}".rstrip(".")
    return f"{value:.{digits}g}"


def format_param(value: Any, digits: int = PARAM_DIGITS) -> str:
    """A parameter value as a user would type it in a sweep; a float to ``digits`` significant digits
    (``PARAM_DIGITS``, or ``LIST_DIGITS`` where many share a line)."""
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def listing(keys: Iterable[str]) -> str:
    """``parameters: a, b, c``: what an error about an unknown parameter lists."""
    keys = sorted(keys)
    return "parameters: " + (", ".join(keys) if keys else "none")

"""A job's priority: a finite number, whole or fractional, that the database can hold."""

from __future__ import annotations

import math

from .errors import UsageError

_INT64 = 2**63


def check_priority(value: object) -> int | float:
    """The priority itself, or one sentence saying why it cannot be one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"a priority is a number, not {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UsageError(f"a priority is a finite number, not {value!r}")
    if isinstance(value, int) and not -_INT64 <= value < _INT64:
        raise UsageError(f"the priority {value} is past what a database holds (64-bit integers)")
    return value


def parse_priority(text: str) -> int | float:
    """A priority typed by a user: ``5``, ``-3`` or ``1.5``."""
    raw = text.strip()
    try:
        value: int | float = int(raw)
    except ValueError:
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"a priority is a number (such as 5, -3 or 1.5), not {text!r}") from None
    return check_priority(value)

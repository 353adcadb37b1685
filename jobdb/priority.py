"""A job's priority (a finite number, whole or fractional, that the database can hold) and its ranks
(how many processes run it together), checked before anything is written."""

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


# Past this, no machine jobman dispatches to gives one job its processes; it also keeps the column's
# integer far from any database's limit.
MAX_RANKS = 1 << 16


def check_ranks(value: object) -> int:
    """The number of ranks itself, or one sentence saying why a job cannot have it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"ranks is a whole number of processes, not {value!r}")
    if not 1 <= value <= MAX_RANKS:
        raise UsageError(f"ranks must be between 1 and {MAX_RANKS} processes, not {value}")
    return value

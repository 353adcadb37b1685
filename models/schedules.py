"""When a plugin runs: schedules over an interval of a timeline, combined with ``&``, ``|``, ``~``.

A schedule is asked about the interval ``(prev, now]`` between two consecutive
evaluation points (two iterations of the loop) on one timeline. ``each(n)``
fires when a multiple of ``n`` lies in the interval, ``at(a, b, ...)`` when one
of its points does; so a schedule on wall time or on examples seen fires once
per crossing however unevenly the loop advances. ``a & b``, ``a | b`` and ``~a``
combine the answers for the same interval.
"""

from __future__ import annotations

import math


class Schedule:
    """Base class: ``fires(prev, now)`` is True when the schedule triggers in ``(prev, now]``."""

    def fires(self, prev: float, now: float) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def __and__(self, other: Schedule) -> Schedule:
        return _All(self, other)

    def __or__(self, other: Schedule) -> Schedule:
        return _Any(self, other)

    def __invert__(self) -> Schedule:
        return _Not(self)


class each(Schedule):  # lower case: reads as a word in plugin declarations
    """Fires when one of ``start, start + n, start + 2n, ...`` is crossed (``each(5)``: 5, 10, ...)."""

    def __init__(self, n: float, start: float | None = None) -> None:
        if not n > 0:
            raise ValueError(f"each(n) needs n > 0, not {n}")
        self.n = n
        self.start = n if start is None else start

    def _count(self, x: float) -> int:
        """How many of the schedule's points are <= x."""
        return math.floor((x - self.start) / self.n) + 1 if x >= self.start else 0

    def fires(self, prev: float, now: float) -> bool:
        return self._count(now) > self._count(prev)

    def __repr__(self) -> str:
        return f"each({self.n!r})" if self.start == self.n else f"each({self.n!r}, start={self.start!r})"


class at(Schedule):
    """Fires when one of the given points is crossed."""

    def __init__(self, *points: float) -> None:
        self.points = tuple(sorted(points))

    def fires(self, prev: float, now: float) -> bool:
        return any(prev < p <= now for p in self.points)

    def __repr__(self) -> str:
        return f"at({', '.join(map(repr, self.points))})"


class always(Schedule):
    """Fires at every evaluation point."""

    def fires(self, prev: float, now: float) -> bool:
        return True

    def __repr__(self) -> str:
        return "always()"


class never(Schedule):
    """Never fires (a disabled plugin)."""

    def fires(self, prev: float, now: float) -> bool:
        return False

    def __repr__(self) -> str:
        return "never()"


class _All(Schedule):
    def __init__(self, *parts: Schedule) -> None:
        self.parts = parts

    def fires(self, prev: float, now: float) -> bool:
        return all(s.fires(prev, now) for s in self.parts)

    def __repr__(self) -> str:
        return "(" + " & ".join(map(repr, self.parts)) + ")"


class _Any(Schedule):
    def __init__(self, *parts: Schedule) -> None:
        self.parts = parts

    def fires(self, prev: float, now: float) -> bool:
        return any(s.fires(prev, now) for s in self.parts)

    def __repr__(self) -> str:
        return "(" + " | ".join(map(repr, self.parts)) + ")"


class _Not(Schedule):
    def __init__(self, inner: Schedule) -> None:
        self.inner = inner

    def fires(self, prev: float, now: float) -> bool:
        return not self.inner.fires(prev, now)

    def __repr__(self) -> str:
        return f"~{self.inner!r}"

"""How an axis is scaled, decided once for every place that draws one: the dashboard's SVG charts,
``report --plot`` and the figures a notebook gets from ``Experiment.plot``.

Pure arithmetic on the values drawn: no drawing library here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..distributions import Distribution

LOG_RATIO_TWO = 10.0  # two values this far apart (0.001 and 0.01) sit on a log axis
LOG_RATIO_MANY = 4.0  # three or more: spanning this much, and more even in log than in linear terms
SINGLE_MARGIN = 0.1  # one value alone: the axis spans it ± this fraction of itself


def _distinct(values: Iterable[float]) -> list[float]:
    return sorted({float(v) for v in values if math.isfinite(float(v))})


def looks_log_spaced(values: Iterable[float]) -> bool:
    """Positive values a sweep most likely spaced by factors: two a factor of 10 or more apart, or
    several spanning a factor of 4 or more whose logarithms are more evenly spaced than they are."""
    distinct = _distinct(values)
    if len(distinct) < 2 or distinct[0] <= 0:
        return False
    ratio = distinct[-1] / distinct[0]
    if len(distinct) == 2:
        return ratio >= LOG_RATIO_TWO
    if ratio < LOG_RATIO_MANY:
        return False
    lin = [b - a for a, b in zip(distinct, distinct[1:])]
    log = [math.log(b) - math.log(a) for a, b in zip(distinct, distinct[1:])]
    return _spread(log) < _spread(lin)


def _spread(gaps: list[float]) -> float:
    """The coefficient of variation of the gaps: 0 for evenly spaced values."""
    mean = sum(gaps) / len(gaps)
    return math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps)) / mean


def log_axis(values: Iterable[float], drawn: Distribution | None = None) -> bool:
    """True when a parameter's axis is logarithmic: the distribution it was drawn from is log-scaled
    (``loguniform``), or, without one, its values look log-spaced. Never for a non-positive value."""
    values = list(values)
    if any(float(v) <= 0 for v in values):
        return False
    if drawn is not None and drawn.name != "choice":
        return bool(drawn.log_scale)
    return looks_log_spaced(values)


def span(lo: float, hi: float, *, log: bool = False) -> tuple[float, float]:
    """The range an axis shows for values from ``lo`` to ``hi``, never empty: a single value is
    shown within ± 10 % of itself (a learning curve's one point at 0.03 spans 0.027 to 0.033, not
    -0.97 to 1.03), half a decade each way on a log axis, and ± 1 around zero."""
    if hi > lo:
        return lo, hi
    if log:
        return lo / math.sqrt(10), hi * math.sqrt(10)
    margin = abs(lo) * SINGLE_MARGIN or 1.0
    return lo - margin, hi + margin

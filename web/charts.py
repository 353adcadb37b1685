"""Charts drawn as SVG on the server: no charting script, nothing fetched from elsewhere.

Each function takes plain numbers and labels and returns markup; every label is escaped.
A point is a ``circle.pt``, a curve a ``polyline.curve``, a configuration in the parallel
coordinates a ``polyline.pc``, so a page (or a test) can count what was drawn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from markupsafe import Markup, escape

from jobman.jobdb.report.scales import log_axis, span
from jobman.jobdb.selection import is_number

PALETTE = ("#1f5fa8", "#d4552b", "#2b9a4a", "#8a3fb0", "#c49a00", "#178f99", "#b0306a", "#5a5a5a")
W, H = 360, 230
INSET = 6  # pixels between a numeric axis's end and its first or last value
MAX_TICKS = 5  # numeric axes with at most this many distinct values get a tick at each
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 12, 38


class Axis:
    """Positions along one axis: linear, logarithmic or categorical. ``log`` None decides as
    ``report --plot`` does (:func:`~jobman.jobdb.report.scales.log_axis`), from the values; a
    parameter's chart passes what the distribution it was drawn from says."""

    def __init__(
        self, values: Sequence[Any], lo_px: float, hi_px: float, *, log: bool | None = None, each: bool = False
    ) -> None:
        self.lo_px, self.hi_px = lo_px, hi_px
        self.each = each  # a parameter's axis: a tick at each of a few values
        numbers = [v for v in values if is_number(v)]
        self.categories: list[Any] | None = None
        self.log = False
        self.distinct: list[float] = []
        if len(numbers) < len(values) or not values:
            self.categories = sorted({_key(v) for v in values}, key=str)
            return
        inset = INSET if hi_px > lo_px else -INSET  # points clear of the frame, as matplotlib's margins keep them
        self.lo_px, self.hi_px = lo_px + inset, hi_px - inset
        self.log = (log_axis(numbers) if log is None else log) and min(numbers) > 0
        self.distinct = sorted(set(numbers))
        lo, hi = span(min(numbers), max(numbers), log=self.log)
        if self.log:
            lo, hi = math.log10(lo), math.log10(hi)
        self.lo, self.hi = lo, hi

    def __call__(self, value: Any) -> float:
        if self.categories is not None:
            n = len(self.categories)
            frac = (self.categories.index(_key(value)) + 0.5) / n
        else:
            v = math.log10(value) if self.log else value
            frac = (v - self.lo) / (self.hi - self.lo)
        return self.lo_px + frac * (self.hi_px - self.lo_px)

    def ticks(self) -> list[tuple[float, str]]:
        if self.categories is not None:
            step = math.ceil(len(self.categories) / 8)
            shown = self.categories if len(self.categories) <= 8 else self.categories[::step]
            return [(self(c), _label(c)) for c in shown]
        if self.each and len(self.distinct) <= MAX_TICKS:  # a sweep's few values: a tick at each
            return [(self(v), _label(v)) for v in self.distinct]
        if self.log and self.hi - self.lo >= 2:  # a tick at each power of ten
            first, last = math.ceil(self.lo - 1e-9), math.floor(self.hi + 1e-9)
            step = max(1, math.ceil((last - first + 1) / 6))
            return [(self(10.0**e), _label(10.0**e)) for e in range(first, last + 1, step)]
        out = []
        for i in range(3):
            v = self.lo + (self.hi - self.lo) * i / 2
            out.append((self.lo_px + (self.hi_px - self.lo_px) * i / 2, _label(10**v if self.log else v)))
        return out


def scatter(
    points: Sequence[tuple[Any, float | None, str]],
    xlabel: str,
    ylabel: str,
    *,
    best: str | None = None,
    log: bool | None = None,
) -> Markup:
    """One point per (x, y, title); the point titled ``best`` is ringed, a point without a y is left out.
    ``log``: whether x is drawn on a log axis (None: as its values suggest)."""
    pts = [p for p in points if is_number(p[1])]
    if not pts:
        return Markup('<p class="empty">nothing to plot yet</p>')
    x = Axis([p[0] for p in pts], LEFT, W - RIGHT, log=log, each=True)
    y = Axis([p[1] for p in pts], H - BOTTOM, TOP, log=False)  # as report --plot draws the metric
    body = [_frame(x, y, xlabel, ylabel)]
    for px, py, title in pts:
        cls = "pt best" if best is not None and title == best else "pt"
        body.append(
            f'<circle class="{cls}" cx="{x(px):.1f}" cy="{y(py):.1f}" r="{5 if "best" in cls else 3.2}">'
            f"<title>{escape(title)}</title></circle>"
        )
    return _svg(body, f"{ylabel} against {xlabel}")


def lines(series: Sequence[tuple[str, Sequence[tuple[float, float]]]], xlabel: str, ylabel: str) -> Markup:
    """Curves of (x, y) points, one colour per series, with a legend."""
    series = [(name, [p for p in pts if is_number(p[1])]) for name, pts in series]
    series = [(name, pts) for name, pts in series if pts]
    if not series:
        return Markup('<p class="empty">no learning curve logged yet</p>')
    xs = [p[0] for _, pts in series for p in pts]
    ys = [p[1] for _, pts in series for p in pts]
    x = Axis(xs, LEFT, W - RIGHT, log=False, each=True)  # steps: a tick at each of a few
    y = Axis(ys, H - BOTTOM, TOP, log=_orders_apart(ys))
    body = [_frame(x, y, xlabel, ylabel)]
    for i, (name, pts) in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        coords = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        body.append(
            f'<polyline class="curve" fill="none" stroke="{colour}" stroke-width="1.6" points="{coords}">'
            f"<title>{escape(name)}</title></polyline>"
        )
        if len(pts) <= 3:  # too short to read as a line
            body.extend(f'<circle class="mark" cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{colour}"/>' for a, b in pts)
        if i < 8:
            body.append(
                f'<text class="legend" x="{W - RIGHT - 4}" y="{TOP + 10 + 12 * i}" text-anchor="end" '
                f'fill="{colour}">{escape(name)}</text>'
            )
    return _svg(body, f"{ylabel} against {xlabel}")


def parallel(axes: Sequence[str], rows: Sequence[tuple[Sequence[Any], float | None, str]], metric: str) -> Markup:
    """Parallel coordinates: one line per configuration across its parameters and the metric (last axis);
    a configuration without the metric is left out.

    Lines are coloured by the metric, darkest for the lowest value.
    """
    rows = [r for r in rows if is_number(r[1])]
    if not rows or not axes:
        return Markup('<p class="empty">nothing to plot yet</p>')
    names = list(axes) + [metric]
    width = max(W, 110 * len(names))
    step = (width - 2 * 40) / max(len(names) - 1, 1)
    columns = [[r[0][i] for r in rows] for i in range(len(axes))] + [[r[1] for r in rows]]
    scales = [Axis(col, H - BOTTOM, TOP + 6, each=i < len(axes)) for i, col in enumerate(columns)]
    m = Axis([r[1] for r in rows], 0.0, 1.0)
    body = []
    for i, (name, scale) in enumerate(zip(names, scales)):
        xpos = 40 + step * i
        body.append(f'<line class="axis" x1="{xpos:.1f}" y1="{TOP + 6}" x2="{xpos:.1f}" y2="{H - BOTTOM}"/>')
        body.append(f'<text class="axis-name" x="{xpos:.1f}" y="{H - 8}" text-anchor="middle">{escape(name)}</text>')
        for pos, label in scale.ticks():
            body.append(f'<text class="tick" x="{xpos + 4:.1f}" y="{pos + 3:.1f}">{escape(label)}</text>')
    for values, value, title in rows:
        shade = m(value) if m.categories is None else 0.5
        coords = " ".join(f"{40 + step * i:.1f},{scales[i](v):.1f}" for i, v in enumerate(list(values) + [value]))
        body.append(
            f'<polyline class="pc" fill="none" stroke="{_shade(shade)}" stroke-width="1.3" '
            f'points="{coords}"><title>{escape(title)}</title></polyline>'
        )
    return _svg(body, f"parallel coordinates of {metric}", width=width)


def _orders_apart(values: Sequence[float]) -> bool:
    """A curve's values spanning 100x or more (a loss falling by orders of magnitude): a log axis."""
    return min(values) > 0 and max(values) / min(values) >= 100


def _frame(x: Axis, y: Axis, xlabel: str, ylabel: str) -> str:
    parts = [
        f'<line class="axis" x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}"/>',
        f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}"/>',
    ]
    for pos, label in x.ticks():
        parts.append(
            f'<text class="tick" x="{pos:.1f}" y="{H - BOTTOM + 13}" text-anchor="middle">{escape(label)}</text>'
        )
    for pos, label in y.ticks():
        parts.append(f'<text class="tick" x="{LEFT - 4}" y="{pos + 3:.1f}" text-anchor="end">{escape(label)}</text>')
    log_x = " (log)" if x.log else ""
    log_y = " (log)" if y.log else ""
    parts.append(
        f'<text class="label" x="{(LEFT + W - RIGHT) / 2}" y="{H - 6}" text-anchor="middle">'
        f"{escape(xlabel)}{log_x}</text>"
    )
    parts.append(
        f'<text class="label" transform="translate(12,{(TOP + H - BOTTOM) / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(ylabel)}{log_y}</text>'
    )
    return "".join(parts)


def _svg(body: list[str], title: str, width: int = W) -> Markup:
    return Markup(
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{H}" '
        f'viewBox="0 0 {width} {H}" role="img"><title>{escape(title)}</title>{"".join(body)}</svg>'
    )


def _shade(frac: float) -> str:
    """Dark blue (0) to pale orange (1)."""
    a, b = (31, 95, 168), (240, 170, 110)
    return "#" + "".join(f"{round(p + (q - p) * frac):02x}" for p, q in zip(a, b))


def _key(v: Any) -> Any:
    return v if isinstance(v, (str, int, float, bool)) or v is None else str(v)


def _label(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)

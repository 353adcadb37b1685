"""Charts drawn as SVG on the server: no charting script, nothing fetched from elsewhere.

Each function takes plain numbers and labels and returns markup; every label is escaped.
A point is a ``circle.pt``, a curve a ``polyline.curve``, a configuration in the parallel
coordinates a ``polyline.pc``, a point on a Pareto front a ``circle.pt.front``, an importance a
``rect.bar``, so a page (or a test) can count what was drawn. In a graph of calls a node is an
``a.node`` (a ``.call`` or a ``.group``) around its box, and a dependency a ``path.edge``.
"""

from __future__ import annotations

import graphlib
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

from jobman.jobdb.notebook import COLOURS
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
        self,
        values: Sequence[Any],
        lo_px: float,
        hi_px: float,
        *,
        log: bool | None = None,
        each: bool = False,
        inset: bool = True,
        whole: bool = False,
    ) -> None:
        self.lo_px, self.hi_px = lo_px, hi_px
        self.each = each  # a parameter's axis: a tick at each of a few values
        self.whole = whole  # counts (evaluations): ticks at whole numbers only
        numbers = [v for v in values if is_number(v)]
        self.categories: list[Any] | None = None
        self.log = False
        self.distinct: list[float] = []
        if len(numbers) < len(values) or not values:
            self.categories = sorted({_key(v) for v in values}, key=str)
            return
        if inset:  # points clear of the frame, as matplotlib's margins keep them
            gap = INSET if hi_px > lo_px else -INSET
            self.lo_px, self.hi_px = lo_px + gap, hi_px - gap
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
        if self.whole:
            return [(self(v), str(v)) for v in sorted({round(self.lo + (self.hi - self.lo) * i / 2) for i in range(3)})]
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
    m = Axis([r[1] for r in rows], 0.0, 1.0, inset=False)  # a shade from 0 to 1, no pixels
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


def best_so_far(values: Sequence[float], metric: str, direction: str) -> Markup:
    """A learning search's evaluations of its first metric in the order proposed: each one a point, the
    best so far (lowest, or highest for ``max``) a step curve, as ``report --plot`` draws it."""
    values = [v for v in values if is_number(v)]
    if not values:
        return Markup('<p class="empty">no evaluation finished yet</p>')
    pick = max if direction == "max" else min
    best: list[float] = []
    for v in values:
        best.append(v if not best else pick(best[-1], v))
    n = len(values)
    x = Axis(list(range(1, n + 1)), LEFT, W - RIGHT, log=False, whole=True)
    y = Axis(values, H - BOTTOM, TOP, log=False)  # as report --plot draws the metric
    body = [_frame(x, y, "evaluations", metric)]
    body.extend(
        f'<circle class="pt eval" cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.6"><title>evaluation {i}: '
        f"{escape(_label(v))}</title></circle>"
        for i, v in enumerate(values, 1)
    )
    steps = []
    for i, b in enumerate(best, 1):
        steps.append(f"{x(i):.1f},{y(b):.1f}")
        if i < n:
            steps.append(f"{x(i + 1):.1f},{y(b):.1f}")
    body.append(
        f'<polyline class="curve best-so-far" fill="none" stroke="{PALETTE[0]}" stroke-width="1.8" '
        f'points="{" ".join(steps)}"><title>best so far: {escape(_label(best[-1]))}</title></polyline>'
    )
    return _svg(body, f"best {metric} so far against evaluations")


def pareto(
    evaluated: Sequence[tuple[float, float, str]], front: Sequence[tuple[float, float, str]], xlabel: str, ylabel: str
) -> Markup:
    """A multi-objective search's evaluations on two metrics, (x, y, title) each; those on its Pareto
    front (``front``) marked and joined in order of x."""
    evaluated = [p for p in evaluated if is_number(p[0]) and is_number(p[1])]
    front = [p for p in front if is_number(p[0]) and is_number(p[1])]
    if not evaluated and not front:
        return Markup('<p class="empty">no evaluation finished yet</p>')
    everything = list(evaluated) + list(front)
    x = Axis([p[0] for p in everything], LEFT, W - RIGHT, log=False)
    y = Axis([p[1] for p in everything], H - BOTTOM, TOP, log=False)
    on = {title for _, _, title in front}
    body = [_frame(x, y, xlabel, ylabel)]
    body.extend(
        f'<circle class="pt eval" cx="{x(a):.1f}" cy="{y(b):.1f}" r="3"><title>{escape(t)}</title></circle>'
        for a, b, t in evaluated
        if t not in on
    )
    ordered = sorted(front, key=lambda p: (p[0], p[1]))
    coords = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b, _ in ordered)
    body.append(
        f'<polyline class="front-line" fill="none" stroke="{PALETTE[1]}" stroke-width="1.4" points="{coords}"/>'
    )
    body.extend(
        f'<circle class="pt front" cx="{x(a):.1f}" cy="{y(b):.1f}" r="4"><title>{escape(t)}</title></circle>'
        for a, b, t in ordered
    )
    return _svg(body, f"Pareto front of {xlabel} and {ylabel}")


BAR_ROW = 18  # pixels per parameter in an importance chart
BAR_LEFT = 96  # room for the parameters' names
BAR_W = 300  # narrower than the other charts: three of a search's charts side by side fit a 1,180 px window


def bars(values: Sequence[tuple[str, float]], xlabel: str) -> Markup:
    """One horizontal bar per (name, value), in the order given, each labelled with its value."""
    values = [(n, v) for n, v in values if is_number(v)]
    if not values:
        return Markup('<p class="empty">too few evaluations to tell</p>')
    height = TOP + BAR_ROW * len(values) + 26
    top = max(max(v for _, v in values), 1e-12)
    room = BAR_W - RIGHT - 40 - BAR_LEFT  # the value's label after the longest bar
    body = [f'<line class="axis" x1="{BAR_LEFT}" y1="{TOP}" x2="{BAR_LEFT}" y2="{height - 26}"/>']
    for i, (name, v) in enumerate(values):
        y = TOP + BAR_ROW * i
        length = max(room * max(v, 0.0) / top, 0.0)
        shown = name if len(name) <= 14 else name[:13] + "…"
        body.append(
            f'<text class="tick" x="{BAR_LEFT - 4}" y="{y + 12}" text-anchor="end">{escape(shown)}</text>'
            f'<rect class="bar" x="{BAR_LEFT}" y="{y + 3}" width="{length:.1f}" height="{BAR_ROW - 6}" '
            f'fill="{PALETTE[0]}"><title>{escape(name)}: {escape(_label(v))}</title></rect>'
            f'<text class="tick" x="{BAR_LEFT + length + 4:.1f}" y="{y + 12}">{escape(_label(v))}</text>'
        )
    body.append(f'<text class="label" x="{BAR_W / 2}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>')
    return _svg(body, xlabel, width=BAR_W, height=height)


@dataclass(frozen=True)
class Node:
    """A node of a graph of calls: one call (``status`` fills its box) or a group of calls (``counts``
    draws a bar of them by status, each segment a link: (status, how many, href))."""

    key: Hashable
    label: str
    detail: str
    href: str
    title: str
    status: str | None = None
    counts: Sequence[tuple[str, int, str]] = ()


NODE_W, NODE_H, GROUP_H = 150, 28, 44  # a node's box
COL_GAP, ROW_GAP, PAD = 40, 8, 8
SEGMENT_MIN = 4  # pixels of a status's segment in a group's bar, however few its calls
LAYER_ROWS = 16  # nodes stacked in one column; a longer layer takes several columns side by side


def graph(nodes: Sequence[Node], edges: Sequence[tuple[Hashable, Hashable, int | None]], title: str) -> Markup:
    """A graph of calls, left to right: each node in the column of its longest path from a call that takes
    none (``graphlib``'s topological generations), a dependency an arrow from the call taken to the call
    taking it, labelled with how many it stands for when given."""
    if not nodes:
        return Markup('<p class="empty">no call yet</p>')
    by_key = {n.key: n for n in nodes}
    edges = [e for e in edges if e[0] in by_key and e[1] in by_key]
    layers = _generations([n.key for n in nodes], [(a, b) for a, b, _ in edges])
    parents: dict[Hashable, list[Hashable]] = {}
    for a, b, _ in edges:
        parents.setdefault(b, []).append(a)
    height = GROUP_H if any(n.counts for n in nodes) else NODE_H
    pos: dict[Hashable, tuple[float, float]] = {}
    place: dict[Hashable, float] = {}  # a node's place in its layer, 0 (first) to 1
    column, rows = 0, 0.0
    for layer in layers:
        # Each node near the mean place of what it takes, so that arrows cross less (one barycentre pass).
        def rank(key: Hashable) -> float:
            taken = [place[p] for p in parents.get(key, []) if p in place]
            return sum(taken) / len(taken) if taken else 0.0

        ordered = sorted(layer, key=rank)
        columns = math.ceil(len(ordered) / LAYER_ROWS)
        per = math.ceil(len(ordered) / columns)  # a long layer split evenly, in order, column by column
        for i, key in enumerate(ordered):
            place[key] = i / len(ordered)
            # Every other column of a split layer half a row lower: an arrow passing it runs between boxes.
            shift = (i // per) % 2 * (height + ROW_GAP) / 2
            pos[key] = (PAD + (column + i // per) * (NODE_W + COL_GAP), PAD + (i % per) * (height + ROW_GAP) + shift)
        rows = max(rows, per + (0.5 if columns > 1 else 0))
        column += columns
    width = PAD * 2 + column * (NODE_W + COL_GAP) - COL_GAP
    total_h = math.ceil(PAD * 2 + rows * (height + ROW_GAP) - ROW_GAP)
    body = [
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#99a2ad"/></marker></defs>'
    ]
    for a, b, n in edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        x1, y1, y2 = x1 + NODE_W, y1 + height / 2, y2 + height / 2
        if a == b:  # a function taking its own calls: a loop over its box
            d = f"M{x1 - 20:.1f},{y1 - height / 2:.1f} c0,-14 -30,-14 -30,0"
            mid = (x1 - 35, y1 - height / 2 - 12)
        else:
            bend = max((x2 - x1) / 2, 20)
            d = f"M{x1:.1f},{y1:.1f} C{x1 + bend:.1f},{y1:.1f} {x2 - bend:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
            mid = ((x1 + x2) / 2, (y1 + y2) / 2 - 3)
        label = f"{by_key[a].label} → {by_key[b].label}" + (f": {n}" if n is not None else "")
        body.append(
            f'<path class="edge" d="{d}" fill="none" stroke="#99a2ad" stroke-width="1.2" marker-end="url(#arrow)">'
            f"<title>{escape(label)}</title></path>"
        )
        if n is not None:
            body.append(
                f'<text class="tick edge-count" x="{mid[0]:.1f}" y="{mid[1]:.1f}" text-anchor="middle">{n}</text>'
            )
    for node in nodes:
        body.append(_node(node, *pos[node.key], height))
    return _svg(body, title, width=max(width, 200), height=max(total_h, 40), kind="chart graph")


def _node(node: Node, x: float, y: float, height: int) -> str:
    fill = COLOURS.get(node.status, "#ffffff") if node.status else "#ffffff"
    ink = "#1d232b" if node.status in (None, "RUNNING", "WAITING") else "#ffffff"
    kind = "call" if node.status else "group"
    status = f' data-status="{escape(node.status)}"' if node.status else ""
    parts = [
        f'<a class="node {kind}" href="{escape(node.href)}" data-key="{escape(str(node.key))}"{status}>'
        f"<title>{escape(node.title)}</title>"
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{height}" rx="4" fill="{fill}" stroke="#66707c" '
        'stroke-width="0.8"/>',
        f'<text class="node-label" x="{x + 6:.1f}" y="{y + 12:.1f}" fill="{ink}">{escape(_fit(node.label, 24))}</text>',
        f'<text class="node-detail" x="{x + 6:.1f}" y="{y + 23:.1f}" fill="{ink}">'
        f"{escape(_fit(node.detail, 26))}</text>",
        "</a>",
    ]
    total = sum(n for _, n, _ in node.counts)
    left = x + 6
    # Each status at least SEGMENT_MIN wide, so that one FAILED call among a thousand shows.
    room = NODE_W - 12 - SEGMENT_MIN * len(node.counts)
    for status_name, n, href in node.counts:  # the group's calls by status, each segment a link to them
        w = SEGMENT_MIN + room * n / total
        parts.append(
            f'<a class="segment" href="{escape(href)}" data-status="{escape(status_name)}" data-count="{n}">'
            f"<title>{n} {escape(status_name)}</title>"
            f'<rect x="{left:.1f}" y="{y + height - 14:.1f}" width="{w:.2f}" height="8" '
            f'fill="{COLOURS.get(status_name, "#888888")}"/></a>'
        )
        left += w
    return "".join(parts)


def _generations(keys: Sequence[Hashable], edges: Sequence[tuple[Hashable, Hashable]]) -> list[list[Hashable]]:
    """The keys by topological generation, each in the order given; a cycle (a function taking its own
    calls, among groups) is broken by keeping only the arrows that go forward in that order."""
    order = {k: i for i, k in enumerate(keys)}
    for forward_only in (False, True):
        sorter: graphlib.TopologicalSorter = graphlib.TopologicalSorter({k: () for k in keys})
        for a, b in edges:
            if a != b and (not forward_only or order[a] < order[b]):
                sorter.add(b, a)
        try:
            sorter.prepare()
        except graphlib.CycleError:
            continue
        layers = []
        while sorter.is_active():
            ready = sorted(sorter.get_ready(), key=order.__getitem__)
            layers.append(ready)
            sorter.done(*ready)
        return layers
    raise AssertionError("arrows that only go forward make no cycle")


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


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


def _svg(body: list[str], title: str, width: int = W, height: int = H, kind: str = "chart") -> Markup:
    return Markup(
        f'<svg class="{kind}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>{"".join(body)}</svg>'
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

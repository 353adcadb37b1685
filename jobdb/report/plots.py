"""The plots of a report, as matplotlib figures (``report --plot`` writes them to PNG, ``Experiment.plot``
returns them to a notebook): the metric against each hyperparameter, the rungs of a successive-halving
search, and learning curves of the best configurations.

matplotlib is an optional extra (``pip install 'jobman-sql[plot]'``). The figures are made without
pyplot, so they draw without a display, on a cluster node as well as on a laptop, and a notebook shows
the ones it is given, not every one made along the way. How each axis is scaled is
:mod:`.scales`' decision, shared with the dashboard.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..distributions import Distribution
from ..errors import UsageError
from ..halving import Rungs
from ..selection import format_param
from ..status import Status
from .model import ConfigRow, Report
from .scales import log_axis, span

if TYPE_CHECKING:
    from ..store import Store

MAX_CURVE_PANELS = 4  # learning-curve metrics drawn side by side, the report's metric first
MAX_LEGEND = 10  # learning curves named in the legend; more are drawn unnamed
MAX_CATEGORIES = 40  # beyond this many distinct values, a categorical axis labels every other one
MAX_TICKS = 12  # numeric axes with at most this many distinct values get a tick at each
MetricFetcher = Callable[[Sequence[int]], list[tuple[int, int, str, float]]]
# Each DONE job's id, when it finished and its value of the metric: the order a search found its results in.
FinishFetcher = Callable[[], list[tuple[int, float, Any]]]


def require_matplotlib() -> None:
    """Fail in one sentence when the plotting extra is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("plotting needs matplotlib, which is not installed: pip install 'jobman-sql[plot]'") from None


def figures(
    report: Report,
    fetch_metrics: MetricFetcher,
    *,
    curves: int = 5,
    space: Mapping[str, Distribution] | None = None,
    searches: Sequence[Rungs] = (),
    finished: FinishFetcher | None = None,
    learned: Sequence[Any] = (),
) -> list[tuple[str, Any]]:
    """Every plot of ``report`` as (file name, matplotlib figure), not yet saved.

    ``space``: the distributions the sweeps drew their parameters from (a log axis for a log-scale
    one); ``searches``: the successive-halving searches, drawn rung by rung; ``learned``: the
    learning searches (``Front``s), each drawn as its best so far against evaluations and, with
    several metrics, as its Pareto front; ``finished``: for another search (something was drawn or
    halved), the jobs' results in the order they finished, drawn with the best so far.
    """
    require_matplotlib()
    space = space or {}
    out = []
    rows = [r for r in report.rows if r.n]
    resources = {s.rules.resource for s in searches}
    for key in report.varying:
        if key == report.outer:
            continue
        by = next((r for r in report.varying if r in resources and r != key), None)
        fig = metric_vs_figure(report, rows, key, space.get(key), by=by)
        if fig is not None:
            out.append((_file_name(f"{report.metric}_vs_{key}.png"), fig))
    for search in searches:
        fig = rungs_figure(search, space)
        if fig is not None:
            suffix = f"_search{search.search_id}" if len(searches) > 1 else ""
            out.append((_file_name(f"{search.rules.metric}_rungs{suffix}.png"), fig))
    for front in learned:
        suffix = f"_search{front.search_id}" if len(learned) > 1 else ""
        fig = search_best_so_far_figure(front)
        if fig is not None:
            out.append((_file_name(f"{front.objectives[0][0]}_best_so_far{suffix}.png"), fig))
        fig = front_figure(front)
        if fig is not None:
            out.append((_file_name(f"pareto_front{suffix}.png"), fig))
        fig = importances_figure(front)
        if fig is not None:
            out.append((_file_name(f"{front.objectives[0][0]}_importances{suffix}.png"), fig))
    if finished is not None and not learned and (space or searches):
        shown = {i for r in report.rows for i in r.all_job_ids}  # as the report selected them (--where, phase)
        fig = best_so_far_figure(report, [(t, v) for i, t, v in finished() if i in shown])
        if fig is not None:
            out.append((_file_name(f"{report.metric}_best_so_far.png"), fig))
    if curves:
        top = sorted(rows, key=lambda r: (not r.eligible, r.rank, str(r.outer)))[:curves]
        ids = [i for r in top for i in r.job_ids]
        points = fetch_metrics(ids) if ids else []
        fig = learning_curves_figure(report, top, points)
        if fig is not None:
            out.append((_file_name(f"{report.metric}_learning_curves.png"), fig))
    return out


def write_plots(
    report: Report,
    outdir: Path,
    fetch_metrics: MetricFetcher,
    *,
    curves: int = 5,
    space: Mapping[str, Distribution] | None = None,
    searches: Sequence[Rungs] = (),
    finished: FinishFetcher | None = None,
    learned: Sequence[Any] = (),
) -> list[Path]:
    """Draw every plot of ``report`` into ``outdir``; return the files written."""
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures(
        report,
        fetch_metrics,
        curves=curves,
        space=space,
        searches=searches,
        finished=finished,
        learned=learned,
    ):
        fig.savefig(outdir / name)
        written.append(outdir / name)
    return written


def search_best_so_far_figure(front: Any) -> Any:
    """A learning search's best value of its first metric after each finished evaluation."""
    metric, direction = front.objectives[0]
    values = [p.values[metric] for p in front.evaluated]
    if not values:
        return None
    best: list[float] = []
    pick = max if direction == "max" else min
    for v in values:
        best.append(v if not best else pick(best[-1], v))
    fig, ax = _sized(6, 4)
    ax.plot(range(1, len(values) + 1), values, "o", color="0.7", markersize=3, label="each evaluation")
    ax.step(range(1, len(best) + 1), best, where="post", color="C0", label="best so far")
    ax.set_xlabel("evaluations (finished, in the order proposed)")
    ax.set_ylabel(metric)
    ax.set_title(f"search {front.search_id}: {metric}, {'highest' if direction == 'max' else 'lowest'} best")
    ax.legend()
    fig.tight_layout()
    return fig


def importances_figure(front: Any) -> Any:
    """A learning search's parameters by their importance for its first metric (Optuna's evaluator)."""
    if not front.importances:
        return None
    names = [n for n, _ in front.importances][::-1]
    fig, ax = _sized(6, 1 + 0.4 * len(names))
    ax.barh(names, [v for _, v in front.importances][::-1], color="C0")
    ax.set_xlabel(f"importance for {front.objectives[0][0]} (sums to 1)")
    ax.set_title(f"search {front.search_id}: {len(front.evaluated)} evaluations")
    fig.tight_layout()
    return fig


def front_figure(front: Any) -> Any:
    """A multi-objective search's evaluations on its first two metrics, its Pareto front marked."""
    if len(front.objectives) < 2 or not front.evaluated:
        return None
    (m1, _), (m2, _) = front.objectives[:2]
    fig, ax = _sized(6, 5)
    ax.plot([p.values[m1] for p in front.evaluated], [p.values[m2] for p in front.evaluated], "o", color="0.7")
    on = sorted(front.points, key=lambda p: p.values[m1])
    ax.plot([p.values[m1] for p in on], [p.values[m2] for p in on], "o-", color="C3", label="Pareto front")
    ax.set_xlabel(m1)
    ax.set_ylabel(m2)
    ax.set_title(f"search {front.search_id}: {len(on)} of {len(front.evaluated)} on the front")
    ax.legend()
    fig.tight_layout()
    return fig


def metric_vs_figure(  # noqa: C901
    report: Report,
    rows: list[ConfigRow],
    key: str,
    drawn: Distribution | None = None,
    by: str | None = None,
) -> Any:
    """Mean ± std of the metric per configuration against one hyperparameter; None if nothing to draw.

    ``drawn``: the distribution the parameter was sampled from, whose scale the axis takes (without
    one, a log axis when the values look log-spaced). ``by``: a parameter whose values get a colour
    each (the resource of a successive-halving search: one colour per rung).
    """
    rows = [r for r in rows if key in r.params]
    if not rows:
        return None
    values = [r.params[key] for r in rows]
    means = np.array([r.mean for r in rows], dtype=float)
    stds = np.array([r.std if r.std is not None else 0.0 for r in rows], dtype=float)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    continuous = drawn is not None and drawn.name not in ("choice", "randint")
    fig, ax = _figure()
    rng = np.random.default_rng(0)
    if numeric:
        x = np.array(values, dtype=float)
        log = log_axis(x.tolist(), drawn)
        tx = np.log10(x) if log else x  # where the values sit, in axis units
        distinct = np.unique(tx)
        if distinct.size > 1:
            gap = float(np.min(np.diff(distinct)))
        else:
            gap = 0.3 if log else max(abs(float(distinct[0])) * 0.1, 0.1)
        jitter = rng.uniform(-0.12, 0.12, size=x.size) * gap if len(rows) > distinct.size else np.zeros(x.size)
        xs = 10 ** (tx + jitter) if log else x + jitter
        if log:
            ax.set_xscale("log")
        slot = np.searchsorted(distinct, tx)
        line_x = 10**distinct if log else distinct
        if distinct.size <= MAX_TICKS:  # few values: a tick at each, labelled as in the sweep
            from matplotlib.ticker import NullLocator

            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(line_x)
            ax.set_xticklabels([format_param(_plain(v)) for v in line_x])
        elif log and x.max() / x.min() < 1000:  # within a few decades: ticks at 1, 2 and 5 of each, in plain numbers
            from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_param(_plain(v))))
            ax.xaxis.set_minor_formatter(NullFormatter())
        xlabel = key + (" (log scale)" if log else "")
        if drawn is not None:
            xlabel += f", drawn from {_spelled(drawn)}"
    else:
        labels = sorted({format_param(v) for v in values}, key=_natural)
        per_label = {lab: i for i, lab in enumerate(labels)}
        slot = np.array([per_label[format_param(v)] for v in values])
        jitter = rng.uniform(-0.15, 0.15, size=slot.size) if len(rows) > len(labels) else np.zeros(slot.size)
        xs = slot + jitter
        line_x = np.arange(len(labels))
        step = 1 if len(labels) <= MAX_CATEGORIES else 2
        ax.set_xticks(line_x[::step])
        ax.set_xticklabels(
            labels[::step],
            rotation=30 if max(map(len, labels)) > 6 else 0,
            ha="right" if max(map(len, labels)) > 6 else "center",
        )
        xlabel = key
    alpha = 1.0 if len(rows) <= 20 else max(0.2, 20 / len(rows))
    eligible = np.array([r.eligible for r in rows])
    levels = (
        sorted({r.params.get(by) for r in rows}, key=lambda v: (v is None, _natural(format_param(v)))) if by else []
    )
    if by and len(levels) > 1:  # one colour per rung: the configurations that went on stand out
        colors = _colormap("viridis", len(levels))
        for i, level in enumerate(levels):
            here = eligible & np.array([r.params.get(by) == level for r in rows])
            if here.any():
                ax.errorbar(
                    xs[here],
                    means[here],
                    yerr=stds[here],
                    fmt="o",
                    ms=4,
                    color=colors(i),
                    alpha=alpha,
                    elinewidth=1,
                    capsize=2,
                    label=f"{by}={format_param(level)} (mean ± std)",
                )
    else:
        ax.errorbar(
            xs[eligible],
            means[eligible],
            yerr=stds[eligible],
            fmt="o",
            ms=4,
            color="tab:blue",
            ecolor="tab:blue",
            alpha=alpha,
            elinewidth=1,
            capsize=2,
            label="configuration (mean ± std)",
        )
    if (~eligible).any():
        ax.errorbar(
            xs[~eligible],
            means[~eligible],
            yerr=stds[~eligible],
            fmt="o",
            ms=4,
            mfc="none",
            color="tab:gray",
            alpha=alpha,
            elinewidth=1,
            capsize=2,
            label="incomplete (not eligible)",
        )
    pick = np.argmin if report.mode == "min" else np.argmax
    envelope = []
    for i in range(len(line_x)):
        at = np.flatnonzero((slot == i) & eligible) if eligible.any() else np.flatnonzero(slot == i)
        if at.size:
            envelope.append((line_x[i], means[at][pick(means[at])]))
    if len(envelope) > 1 and not continuous:  # a line through every draw of a continuous one says nothing
        ex, ey = zip(*envelope)
        ax.plot(ex, ey, "-", color="tab:orange", lw=1.5, label=f"best {report.metric} at each {key}")
    winners = [i for i, r in enumerate(rows) if r.best]
    if winners:
        ax.plot(
            xs[winners],
            means[winners],
            "*",
            color="tab:red",
            ms=14,
            mec="black",
            mew=0.6,
            label="best configuration" if len(winners) == 1 else "best per outer fold",
            zorder=5,
        )
    better = "lower" if report.mode == "min" else "higher"
    if report.group_over:
        over = f"over {', '.join(report.group_over)}"
    else:
        over = "over copies" if report.jobs > report.configurations else "one job each"
    ax.set_title(
        f"{report.metric} vs {key}\n{len(rows)} configurations, mean ± sample std {over}; {better} is better",
        fontsize=11,
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(report.metric)
    if numeric and distinct.size == 1:  # one value: centred in a range that says which, not ± 0.05
        ax.set_xlim(*span(float(x[0]), float(x[0]), log=log))
    _fit_single(ax, means[np.isfinite(means)], stds)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.8)
    fig.tight_layout()
    return fig


def rungs_figure(search: Rungs, space: Mapping[str, Distribution] | None = None) -> Any:
    """A successive-halving search rung by rung: each configuration's mean metric against the resource,
    one line per configuration, coloured by the highest rung it reached; None if nothing finished."""
    rules = search.rules
    points = {
        c: [(rules.rungs[k], m) for k, m in sorted(by_rung.items()) if m is not None and k < len(rules.rungs)]
        for c, by_rung in search.means.items()
    }
    points = {c: p for c, p in points.items() if p}
    if not points:
        return None
    reached = {c: max(search.means[c]) for c in points}
    last = len(rules.rungs) - 1
    fig, ax = _figure()
    colors = _colormap("viridis", max(2, last + 1))
    sign = -1.0 if rules.mode == "max" else 1.0
    labelled: set[int] = set()
    for config in sorted(points, key=lambda c: (reached[c], -sign * points[c][-1][1])):
        xs, ys = zip(*points[config])
        top = reached[config]
        went_on = top > 0
        label = None
        if top not in labelled:
            labelled.add(top)
            label = (
                f"{rules.resource}={format_param(rules.rungs[0])} only"
                if not went_on
                else f"promoted to {rules.resource}={format_param(rules.rungs[top])}"
            )
        (line,) = ax.plot(
            xs,
            ys,
            "-o",
            color=colors(top) if went_on else "tab:gray",
            lw=1 + top,
            ms=3 + top,
            alpha=0.9 if went_on else 0.45,
            label=label,
            zorder=2 + top,
        )
        line.set_gid(f"config:{config}")
    at_top = [
        (sign * points[c][-1][1], c)
        for c in points
        if points[c][-1][0] == rules.rungs[reached[c]] and reached[c] == max(reached.values())
    ]
    if at_top:
        best = min(at_top)[1]
        (star,) = ax.plot(
            [points[best][-1][0]],
            [points[best][-1][1]],
            "*",
            color="tab:red",
            ms=14,
            mec="black",
            mew=0.6,
            zorder=10,
            label="best at the highest rung reached: " + _short(_config_label(search.params.get(best, {}), space), 40),
        )
        star.set_gid("best")
    ax.set_xscale("log")  # the rungs are MIN, MIN*eta, ...: evenly spaced on a log axis
    from matplotlib.ticker import NullLocator

    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(list(rules.rungs))
    ax.set_xticklabels([format_param(_plain(v)) for v in rules.rungs])
    better = "lower" if rules.mode == "min" else "higher"
    how = "asynchronous (ASHA)" if rules.asynchronous else "synchronous"
    ax.set_title(
        f"{rules.metric} at each rung: successive halving, {how}, eta {rules.eta}\n"
        f"{len(points)} configurations, mean over their runs; {better} is better",
        fontsize=11,
    )
    ax.set_xlabel(f"{rules.resource} (log scale)")
    ax.set_ylabel(rules.metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.8)
    fig.tight_layout()
    return fig


def finish_order(store: Store, metric: str, phase: int | None = None) -> list[tuple[int, float, Any]]:
    """(id, finish time, value of ``metric``) of every DONE job of ``store``'s experiment (of one phase)."""
    jobs = store.jobs(status=[Status.DONE], phase=phase, with_deps=False)
    return [(j.id, j.finished_at or 0.0, (j.results or {}).get(metric)) for j in jobs]


def best_so_far_figure(report: Report, points: Sequence[tuple[float, Any]]) -> Any:
    """Each finished job's metric in the order the jobs finished, and the best of them so far: how a
    search converged. A value that is not a finite number is never best and not drawn; None if no
    job has one."""
    ordered = [float(v) for _, v in sorted(points, key=lambda p: p[0]) if _finite(v)]
    if not ordered:
        return None
    values = np.array(ordered)
    best = np.minimum.accumulate(values) if report.mode == "min" else np.maximum.accumulate(values)
    n = np.arange(1, values.size + 1)
    fig, ax = _figure()
    ax.plot(n, values, "o", ms=3, color="tab:gray", alpha=0.6, label=f"{report.metric} of a job")
    ax.step(n, best, where="post", color="tab:red", lw=2, label="best so far")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if values.size == 1:
        ax.set_xlim(*span(1.0, 1.0))
    _fit_single(ax, values, np.zeros(values.size))
    better = "lower" if report.mode == "min" else "higher"
    ax.set_title(
        f"{report.metric} in the order the jobs finished, and the best so far\n"
        f"{values.size} jobs, each on its own (not averaged over folds or seeds); {better} is better",
        fontsize=11,
    )
    ax.set_xlabel("jobs finished")
    ax.set_ylabel(report.metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.8)
    fig.tight_layout()
    return fig


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and bool(np.isfinite(value))


def _config_label(params: Mapping[str, Any], space: Mapping[str, Distribution] | None) -> str:
    """A configuration in a few words: its drawn parameters (all of them when nothing was drawn)."""
    keys = [k for k in params if space and k in space] or list(params)
    return ", ".join(f"{k}={format_param(params[k])}" for k in keys)


def _spelled(drawn: Distribution) -> str:
    return f"{drawn.name}({','.join(format_param(a) for a in drawn.args)})"


def learning_curves_figure(report: Report, rows: list[ConfigRow], points: list[tuple[int, int, str, float]]) -> Any:
    """Per logged metric, the mean over a configuration's runs at each step (band: ± std); None if none."""
    names = sorted({name for _, _, name, _ in points})
    if not names:
        return None
    names = ([report.metric] if report.metric in names else []) + [n for n in names if n != report.metric]
    names = names[:MAX_CURVE_PANELS]
    config_of = {job_id: i for i, r in enumerate(rows) for job_id in r.job_ids}
    series: dict[tuple[int, str], dict[int, list[float]]] = {}
    for job_id, step, name, value in points:
        if name in names and job_id in config_of:
            series.setdefault((config_of[job_id], name), {}).setdefault(int(step), []).append(float(value))
    fig, axes = _figure(6 * len(names) if len(names) > 1 else 8, panels=len(names))
    from matplotlib.ticker import MaxNLocator

    colors = _colormap("tab10" if len(rows) <= 10 else "viridis", max(len(rows), 10))
    for ax, name in zip(axes[0], names):
        drawn_steps: list[float] = []
        drawn_values: list[float] = []
        for i, row in enumerate(rows):
            by_step = series.get((i, name))
            if not by_step:
                continue
            steps = np.array(sorted(by_step))
            mean = np.array([np.mean(by_step[s]) for s in steps])
            spread = np.array([np.std(by_step[s], ddof=1) if len(by_step[s]) > 1 else 0.0 for s in steps])
            label = _short(
                f"#{row.rank} {report.label(row)}"
                + (f" ({report.outer}={format_param(row.outer)})" if report.outer else "")
            )
            color = colors(i)
            ax.plot(
                steps,
                mean,
                "-o" if steps.size <= 3 else "-",  # too short to read as a line
                ms=4,
                color=color,
                lw=2 if row.best else 1.2,
                label=label if i < MAX_LEGEND else None,
            )
            ax.fill_between(steps, mean - spread, mean + spread, color=color, alpha=0.15, lw=0)
            drawn_steps.extend(steps.tolist())
            drawn_values.extend(mean[np.isfinite(mean)].tolist())
        if len(set(drawn_steps)) == 1:
            ax.set_xlim(*span(drawn_steps[0], drawn_steps[0]))
        _fit_single(ax, np.array(drawn_values), np.zeros(len(drawn_values)))
        ax.set_title(name, fontsize=11)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="best", framealpha=0.8)
    fig.suptitle(
        f"Learning curves of the {len(rows)} best configurations by {report.metric} (mean over runs, band ± std)",
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def _figure(width: float = 8, panels: int | None = None) -> tuple[Any, Any]:
    """A figure and its axes (a row of ``panels`` of them), made without pyplot: nothing to close, and
    shown by a notebook only when returned."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 5), dpi=100)
    return fig, fig.subplots() if panels is None else fig.subplots(1, panels, squeeze=False)


def _sized(width: float, height: float) -> tuple[Any, Any]:
    """A figure of one panel of this size, made without pyplot (as :func:`_figure`)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.subplots()


def _colormap(name: str, n: int) -> Any:
    import matplotlib

    return matplotlib.colormaps[name].resampled(n)


def _fit_single(ax: Any, values: np.ndarray, spreads: np.ndarray) -> None:
    """One value on the y axis (one point, or all equal): the range :func:`.scales.span` gives it."""
    if values.size and not np.any(spreads[np.isfinite(spreads)] > 0) and np.unique(values).size == 1:
        ax.set_ylim(*span(float(values[0]), float(values[0])))


def _plain(value: float) -> float | int:
    """A tick value as the sweep wrote it: 64, not 64.0; 0.003, not 0.0030000000000000005."""
    value = float(f"{value:.10g}")
    return int(value) if value.is_integer() else value


def _natural(label: str) -> tuple[Any, ...]:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


def _short(text: str, width: int = 48) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)

"""PNG plots of a report: the metric against each hyperparameter, and learning curves of the best configurations.

matplotlib is an optional extra (``pip install 'jobman-sql[plot]'``); the Agg backend
draws without a display, on a cluster node as well as on a laptop.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from jobman.jobdb.errors import UsageError
from jobman.jobdb.report import ConfigRow, Report, format_param

MAX_CURVE_PANELS = 4  # learning-curve metrics drawn side by side, the report's metric first
MAX_LEGEND = 10  # learning curves named in the legend; more are drawn unnamed
MAX_CATEGORIES = 40  # beyond this many distinct values, a categorical axis labels every other one
MAX_TICKS = 12  # numeric axes with at most this many distinct values get a tick at each
MetricFetcher = Callable[[Sequence[int]], list[tuple[int, int, str, float]]]


def require_matplotlib() -> None:
    """Fail in one sentence when the plotting extra is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("plotting needs matplotlib, which is not installed: pip install 'jobman-sql[plot]'") from None
    matplotlib.use("Agg")


def write_plots(report: Report, outdir: Path, fetch_metrics: MetricFetcher, *, curves: int = 5) -> list[Path]:
    """Draw every plot of ``report`` into ``outdir``; return the files written."""
    require_matplotlib()
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    rows = [r for r in report.rows if r.n]
    for key in report.varying:
        if key == report.outer:
            continue
        path = outdir / _file_name(f"{report.metric}_vs_{key}.png")
        if plot_metric_vs(report, rows, key, path):
            written.append(path)
    if curves:
        top = sorted(rows, key=lambda r: (not r.eligible, r.rank, str(r.outer)))[:curves]
        ids = [i for r in top for i in r.job_ids]
        points = fetch_metrics(ids) if ids else []
        path = outdir / _file_name(f"{report.metric}_learning_curves.png")
        if plot_learning_curves(report, top, points, path):
            written.append(path)
    return written


def plot_metric_vs(report: Report, rows: list[ConfigRow], key: str, path: Path) -> bool:
    """Mean ± std of the metric per configuration against one hyperparameter; False if nothing to draw."""
    import matplotlib.pyplot as plt

    rows = [r for r in rows if key in r.params]
    if not rows:
        return False
    values = [r.params[key] for r in rows]
    means = np.array([r.mean for r in rows], dtype=float)
    stds = np.array([r.std if r.std is not None else 0.0 for r in rows], dtype=float)
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    rng = np.random.default_rng(0)
    if numeric:
        x = np.array(values, dtype=float)
        log = _looks_log_spaced(x)
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
        line_x = 10 ** distinct if log else distinct
        if distinct.size <= MAX_TICKS:  # few values: a tick at each, labelled as in the sweep
            from matplotlib.ticker import NullLocator

            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticks(line_x)
            ax.set_xticklabels([format_param(_plain(v)) for v in line_x])
        xlabel = key + (" (log scale)" if log else "")
    else:
        labels = sorted({format_param(v) for v in values}, key=_natural)
        per_label = {lab: i for i, lab in enumerate(labels)}
        slot = np.array([per_label[format_param(v)] for v in values])
        jitter = rng.uniform(-0.15, 0.15, size=slot.size) if len(rows) > len(labels) else np.zeros(slot.size)
        xs = slot + jitter
        line_x = np.arange(len(labels))
        step = 1 if len(labels) <= MAX_CATEGORIES else 2
        ax.set_xticks(line_x[::step])
        ax.set_xticklabels(labels[::step], rotation=30 if max(map(len, labels)) > 6 else 0, ha="right"
                           if max(map(len, labels)) > 6 else "center")
        xlabel = key
    alpha = 1.0 if len(rows) <= 20 else max(0.2, 20 / len(rows))
    eligible = np.array([r.eligible for r in rows])
    ax.errorbar(xs[eligible], means[eligible], yerr=stds[eligible], fmt="o", ms=4, color="tab:blue",
                ecolor="tab:blue", alpha=alpha, elinewidth=1, capsize=2, label="configuration (mean ± std)")
    if (~eligible).any():
        ax.errorbar(xs[~eligible], means[~eligible], yerr=stds[~eligible], fmt="o", ms=4, mfc="none",
                    color="tab:gray", alpha=alpha, elinewidth=1, capsize=2, label="incomplete (not eligible)")
    pick = np.argmin if report.mode == "min" else np.argmax
    envelope = []
    for i in range(len(line_x)):
        here = np.flatnonzero((slot == i) & eligible) if eligible.any() else np.flatnonzero(slot == i)
        if here.size:
            envelope.append((line_x[i], means[here][pick(means[here])]))
    if len(envelope) > 1:
        ex, ey = zip(*envelope)
        ax.plot(ex, ey, "-", color="tab:orange", lw=1.5, label=f"best {report.metric} at each {key}")
    winners = [i for i, r in enumerate(rows) if r.best]
    if winners:
        ax.plot(xs[winners], means[winners], "*", color="tab:red", ms=14, mec="black", mew=0.6,
                label="best configuration" if len(winners) == 1 else "best per outer fold", zorder=5)
    better = "lower" if report.mode == "min" else "higher"
    over = f"over {', '.join(report.group_over)}" if report.group_over else "one job each"
    ax.set_title(f"{report.metric} vs {key}\n{len(rows)} configurations, mean ± sample std {over}; "
                 f"{better} is better", fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(report.metric)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def plot_learning_curves(report: Report, rows: list[ConfigRow], points: list[tuple[int, int, str, float]],
                         path: Path) -> bool:
    """Per logged metric, the mean over a configuration's runs at each step (band: ± std)."""
    import matplotlib.pyplot as plt

    names = sorted({name for _, _, name, _ in points})
    if not names:
        return False
    names = ([report.metric] if report.metric in names else []) + [n for n in names if n != report.metric]
    names = names[:MAX_CURVE_PANELS]
    config_of = {job_id: i for i, r in enumerate(rows) for job_id in r.job_ids}
    series: dict[tuple[int, str], dict[int, list[float]]] = {}
    for job_id, step, name, value in points:
        if name in names and job_id in config_of:
            series.setdefault((config_of[job_id], name), {}).setdefault(int(step), []).append(float(value))
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names) if len(names) > 1 else 8, 5), dpi=100,
                             squeeze=False)
    from matplotlib.ticker import MaxNLocator

    colors = plt.get_cmap("tab10" if len(rows) <= 10 else "viridis", max(len(rows), 10))
    for ax, name in zip(axes[0], names):
        for i, row in enumerate(rows):
            by_step = series.get((i, name))
            if not by_step:
                continue
            steps = np.array(sorted(by_step))
            mean = np.array([np.mean(by_step[s]) for s in steps])
            spread = np.array([np.std(by_step[s], ddof=1) if len(by_step[s]) > 1 else 0.0 for s in steps])
            label = _short(f"#{row.rank} {report.label(row)}"
                           + (f" ({report.outer}={format_param(row.outer)})" if report.outer else ""))
            color = colors(i)
            ax.plot(steps, mean, "-", color=color, lw=2 if row.best else 1.2,
                    label=label if i < MAX_LEGEND else None)
            ax.fill_between(steps, mean - spread, mean + spread, color=color, alpha=0.15, lw=0)
        ax.set_title(name, fontsize=11)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="best", framealpha=0.8)
    fig.suptitle(f"Learning curves of the {len(rows)} best configurations by {report.metric} "
                 f"(mean over runs, band ± std)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def _looks_log_spaced(x: np.ndarray) -> bool:
    """Positive values spanning a factor of 4 or more, more evenly spaced in log than in linear terms."""
    distinct = np.unique(x)
    if distinct.size < 2 or distinct[0] <= 0:
        return False
    if distinct.size == 2:
        return bool(distinct[1] / distinct[0] >= 100)
    if distinct[-1] / distinct[0] < 4:
        return False
    lin, log = np.diff(distinct), np.diff(np.log(distinct))
    return bool(np.std(log) / np.mean(log) < np.std(lin) / np.mean(lin))


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

"""``jobman report``: configurations ranked by a metric, as a table, CSV, JSON or Markdown, and plots."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import IO, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobman.jobdb import report as rp
from jobman.jobdb.report import ConfigRow, Report
from jobman.jobdb.selection import format_number, format_param
from jobman.jobdb.store import Store

from .common import Database, err, out, with_database

TABLE_ROWS = 30  # rows per table shown by default in table and markdown formats
TABLE_RESULTS = 5  # result columns in table and markdown formats, the metric first
STREAMED_AFTER = 1000  # csv and json rows held before the rest is streamed from the database


def run_report(
    store: Store,
    *,
    metric: str,
    mode: str = "min",
    phase: int | None = None,
    group_over: list[str] | None = None,
    outer: str | None = rp.AUTO,
    where: tuple[str, ...] = (),
    allow_incomplete: bool = False,
    fmt: str = "table",
    top: int | None = None,
    stream: IO[str] | None = None,
    keep_all: bool = False,
) -> Report:
    """Rank the experiment's configurations in the database and write the report in ``fmt``.

    Only the rows shown are held (and, with ``keep_all``, every one: the plots draw them all); csv and
    json write every configuration as the database streams them.
    """
    if top is None:
        top = TABLE_ROWS if fmt in ("table", "markdown") else 0
    keep = None if keep_all or (not top and fmt in ("table", "markdown")) else (top or STREAMED_AFTER)
    writer = {"table": write_table, "markdown": write_markdown, "csv": write_csv, "json": write_json}[fmt]
    with rp.open_report(
        store,
        metric,
        mode,
        group_over,
        phase=phase,
        outer=outer,
        allow_incomplete=allow_incomplete,
        where=where,
        keep=keep,
        parallel=fmt in ("table", "markdown"),
    ) as report:
        writer(report, stream or sys.stdout, top=top, experiment=store.experiment, where=where)
    if fmt in ("table", "markdown"):
        for line in [*store.search_summaries(), *mixed_code_lines(store, report.rows)]:
            print(("- " if fmt == "markdown" else "") + line, file=stream or sys.stdout)
        for front in store.search_fronts():
            for line in front_lines(front):
                print(("- " if fmt == "markdown" else "") + line, file=stream or sys.stdout)
    return report


MIXED_SHOWN = 5


def mixed_code_lines(store: Store, rows: list[ConfigRow]) -> list[str]:
    """A line per configuration shown whose runs ran different code (source, commit or diff)."""
    versions = store.versions_run([i for row in rows for i in row.job_ids])
    lines = []
    for row in rows:
        ran = {versions[i] for i in row.job_ids if i in versions}
        if len(ran) > 1:
            name = " ".join(f"{k}={format_param(v)}" for k, v in row.params.items()) or "the configuration"
            ids = ", ".join(str(i) for i in row.job_ids)
            lines.append(f"{name}: its runs ran {len(ran)} versions of the code (jobs {ids}; jobman show ID)")
    if len(lines) > MIXED_SHOWN:
        lines[MIXED_SHOWN:] = [f"… and {len(lines) - MIXED_SHOWN} more configurations whose runs ran different code"]
    return lines


def front_lines(front: Any) -> list[str]:
    """A multi-objective search's Pareto front: a heading, then one line per configuration on it."""
    goals = ", ".join(f"{m} {'highest' if d == 'max' else 'lowest'} best" for m, d in front.objectives)
    if front.constraints:
        goals += "; feasible: " + ", ".join(f"{n}{op}{b:g}" for n, op, b in front.constraints)
    what = "Pareto front" if len(front.objectives) > 1 else "best"
    lines = [f"search {front.search_id}: {what} ({goals}): {len(front.points)} configurations"]
    for point in front.points:
        params = " ".join(
            f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(point.params.items())
        )
        values = ", ".join(f"{m} {v:.4g}" for m, v in point.values.items())
        jobs = ",".join(map(str, point.job_ids))
        lines.append(f"  {params} — {values} (job{'s' if len(point.job_ids) > 1 else ''} {jobs})")
    return lines


def _group_option(value: str | None) -> list[str] | None:
    if value is None:
        return None
    if value.strip().lower() in ("", "none"):
        return []
    return [k.strip() for k in value.split(",") if k.strip()]


def _outer_option(value: str | None) -> str | None:
    if value is None:
        return rp.AUTO
    return None if value.strip().lower() in ("", "none") else value.strip()


@click.command("report")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
@click.option(
    "--metric", "-m", default="valid_error", show_default=True, help="The numeric result that ranks configurations."
)
@click.option("--max", "mode", flag_value="max", help="Higher is better (accuracies).")
@click.option("--min", "mode", flag_value="min", default=True, help="Lower is better (errors, losses; the default).")
@click.option("--phase", type=int, help="Only jobs of this phase.")
@click.option(
    "--top",
    type=click.IntRange(0),
    default=None,
    help=f"Show the best N configurations (per outer fold); 0: all. "
    f"Default: {TABLE_ROWS} in table and markdown, all in csv and json.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "csv", "json", "markdown"]), default="table", show_default=True
)
@click.option(
    "--group-over",
    metavar="K1,K2",
    help="Parameters whose jobs are averaged together ('none': no grouping). "
    "Default: the fold and seed parameters (id_cross_fold, fold, seed, *_seed, ...).",
)
@click.option(
    "--outer",
    metavar="KEY",
    help="Outer fold of nested cross-validation, reported separately then overall "
    "('none': not nested). Default: a parameter like id_outer_fold.",
)
@click.option(
    "--where",
    multiple=True,
    metavar="EXPR",
    help="Only jobs whose parameters satisfy EXPR: nhid>=128, act==tanh (==, !=, <, <=, >, >=); repeat to AND.",
)
@click.option(
    "--allow-incomplete", is_flag=True, help="Let a configuration with missing or failed runs be chosen as best."
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Write PNGs to DIR: the metric against each hyperparameter (a log axis for one drawn "
    "from a log-scale distribution), the rungs of a successive-halving search, and learning "
    "curves (needs matplotlib: pip install 'jobman-sql[plot]').",
)
@click.option(
    "--curves",
    type=click.IntRange(0),
    default=5,
    show_default=True,
    help="With --plot: learning curves of this many best configurations.",
)
def report(
    database: Database,
    metric: str,
    mode: str,
    phase: int | None,
    top: int | None,
    fmt: str,
    group_over: str | None,
    outer: str | None,
    where: tuple[str, ...],
    allow_incomplete: bool,
    plot_dir: str | None,
    curves: int,
) -> None:
    """Rank configurations by a metric: mean ± std over folds and seeds, the best one in words.

    \b
    Jobs that differ only by a fold or seed parameter are one configuration; its
    numeric results are averaged over its DONE jobs (sample std, ddof=1), and jobs
    that failed or have not finished are counted, never averaged. A configuration
    with missing or failed runs is not chosen as best unless --allow-incomplete.
    Ties go to more runs, then the lower std, then the one scheduled first.
    \b
    Example:
      jobman report 'sqlite:///sweeps.db?table=mlp' --metric valid_error
      jobman report 'sqlite:///sweeps.db?table=mlp' --metric accuracy --max --top 10
      jobman report 'sqlite:///sweeps.db?table=mlp' --where 'nhid>=128' --format markdown
      jobman report 'sqlite:///sweeps.db?table=mlp' --plot report/
    """
    if plot_dir is not None:
        from jobman.jobdb.report import plots

        plots.require_matplotlib()
    store = database.open()
    result = run_report(
        store,
        metric=metric,
        mode=mode,
        phase=phase,
        group_over=_group_option(group_over),
        outer=_outer_option(outer),
        where=where,
        allow_incomplete=allow_incomplete,
        fmt=fmt,
        top=top,
        keep_all=plot_dir is not None,
    )
    if plot_dir is not None:
        from jobman.jobdb.report import plots

        written = plots.write_plots(
            result,
            Path(plot_dir),
            store.metrics,
            curves=curves,
            space=store.search_space(),
            searches=store.search_rungs(),
            finished=lambda: plots.finish_order(store, metric, phase),
            learned=store.search_fronts(every=True),
        )
        names = ", ".join(p.name for p in written) if written else "none (nothing to plot)"
        err.print(f"[dim]plots in {escape(str(plot_dir))}: {escape(names)}[/]")


# -- the formats ---------------------------------------------------------------------------


def _sections(report: Report, top: int) -> list[tuple[Any, list[ConfigRow], int]]:
    """(outer value, shown rows, all rows) per outer fold; a single section when not nested."""
    if report.outer is None:
        groups = [(None, report.rows)]
    else:
        groups = [(v, [r for r in report.rows if r.outer == v]) for v in report.outer_values]
    return [(v, rows[:top] if top else rows, report.with_metric(v)[0]) for v, rows in groups]


def _param_columns(report: Report) -> list[str]:
    return [k for k in report.varying if k != report.outer]


def _scope_columns(report: Report) -> list[str]:
    scopes = report.scopes
    cols = []
    if len({p for p, _ in scopes}) > 1:
        cols.append("phase")
    if len({t for _, t in scopes}) > 1:
        cols.append("target")
    return cols


def _result_columns(report: Report) -> tuple[list[str], int]:
    """The result columns a table shows (the metric first), and how many others it leaves out."""
    constant = report.constant_results
    varying = [c for c in report.columns if c not in constant]
    shown = varying[:TABLE_RESULTS]
    return shown, len(varying) - len(shown)


def _n_cell(row: ConfigRow) -> str:
    text = str(row.n) if row.n == row.expected else f"{row.n}/{row.expected}"
    extra = ", ".join(f"+{n} {word}" for word, n in row.not_done().items())
    return f"{text} ({extra})" if extra else text


def _stat_cell(row: ConfigRow, name: str) -> str:
    stat = row.stats.get(name)
    if stat is None:
        return ""
    return format_number(stat.mean) + (f" ± {format_number(stat.std, 2)}" if stat.std is not None else "")


def _header_lines(report: Report, experiment: str, where: tuple[str, ...]) -> list[str]:
    better = "lower" if report.mode == "min" else "higher"
    lines = [
        f"{experiment}: {report.jobs} jobs in {report.configurations} configurations; "
        f"{report.metric}, {better} is better"
    ]
    if where:
        lines.append("where " + " and ".join(where))
    if report.constant:
        lines.append("all configurations: " + " ".join(f"{k}={format_param(v)}" for k, v in report.constant.items()))
    constant = report.constant_results
    if constant:
        lines.append("every run: " + " ".join(f"{k}={format_number(v)}" for k, v in constant.items()))
    if report.group_over:
        lines.append(f"averaged over {', '.join(report.group_over)}: mean ± sample std (ddof={rp.STD_DDOF})")
    elif report.jobs > report.configurations:
        lines.append(
            f"no fold or seed parameter: copies of a job (equal parameters, sqlschedule -r) are averaged: "
            f"mean ± sample std (ddof={rp.STD_DDOF})"
        )
    else:
        lines.append("no grouping: one job per configuration")
    if report.outer:
        lines.append(f"nested cross-validation: ranked per {report.outer}, then over the outer folds' winners")
    for phase, target, n in report.dropped:
        lines.append(
            f"left out: phase {phase} {target or ''} ({n} job{'s' if n != 1 else ''}), which reports no {report.metric}"
        )
    return lines


def write_table(report: Report, stream: IO[str], *, top: int, experiment: str, where: tuple[str, ...] = ()) -> None:
    """Rich tables: one per outer fold; the best row marked, ineligible rows dim, then the verdict."""
    if stream is sys.stdout and out.is_terminal:
        console = out.console
    else:  # a pipe or a file: as wide as the table needs, never squeezed to 80 columns
        console = Console(file=stream, soft_wrap=True, width=250, color_system=None)
    for line in _header_lines(report, experiment, where):
        console.print(f"[dim]{escape(line)}[/]")
    params, scopes = _param_columns(report), _scope_columns(report)
    results, hidden = _result_columns(report)
    any_ineligible = False
    for outer, rows, total in _sections(report, top) if report.rows else ():
        title = f"{report.outer}={format_param(outer)}" if report.outer else None
        grid = Table(title=title, header_style="bold", box=None, pad_edge=False, title_justify="left")
        grid.add_column("", no_wrap=True)
        grid.add_column("#", justify="right", no_wrap=True)
        for col in scopes + params:
            grid.add_column(col, overflow="fold", min_width=min(len(col), 12))
        grid.add_column("n", no_wrap=True)
        for name in results:
            grid.add_column(name, justify="right", no_wrap=True)
        for row in rows:
            any_ineligible |= not row.eligible
            cells = ["★" if row.best else "", str(row.rank)]
            cells += [str(row.phase) if c == "phase" else str(row.target) for c in scopes]
            cells += [format_param(row.params[k]) if k in row.params else "" for k in params]
            cells += [_n_cell(row)] + [_stat_cell(row, name) for name in results]
            style = "bold green" if row.best else ("dim" if not row.eligible else None)
            grid.add_row(*map(escape, cells), style=style)
        console.print(grid)
        if total > len(rows):
            console.print(f"[dim]… {total - len(rows)} more configurations (--top 0 shows all)[/]")
    notes = []
    if hidden:
        notes.append(f"{hidden} more result columns in --format csv or json")
    if any_ineligible:
        notes.append("configurations with missing or failed runs are not eligible for best (--allow-incomplete)")
    for note in notes:
        console.print(f"[dim]{escape(note)}[/]")
    for line in report.summary_lines():
        console.print(f"[bold]{escape(line)}[/]" if line.startswith(("best", "overall")) else escape(line))


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def write_markdown(report: Report, stream: IO[str], *, top: int, experiment: str, where: tuple[str, ...] = ()) -> None:
    """A GitHub-flavoured Markdown table (one, with the outer fold as a column when nested)."""
    lines = [f"- {_md(line)}" for line in _header_lines(report, experiment, where)] + [""]
    params, scopes = _param_columns(report), _scope_columns(report)
    results, _ = _result_columns(report)
    head = ["best", "#"] + scopes + ([report.outer] if report.outer else []) + params + ["n"] + results
    lines.append("| " + " | ".join(_md(h) for h in head) + " |")
    lines.append(
        "|"
        + "|".join("---" if i < 2 + len(scopes) + len(params) + bool(report.outer) else "--:" for i in range(len(head)))
        + "|"
    )
    for _outer, rows, _total in _sections(report, top):
        for row in rows:
            cells = ["★" if row.best else "", str(row.rank)]
            cells += [str(row.phase) if c == "phase" else str(row.target) for c in scopes]
            cells += [format_param(row.outer)] if report.outer else []
            cells += [format_param(row.params[k]) if k in row.params else "" for k in params]
            cells += [_n_cell(row)] + [_stat_cell(row, name) for name in results]
            if row.best:
                cells = [f"**{c}**" if c else c for c in cells]
            lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines.append("")
    lines += [
        f"**{_md(line)}**" if line.startswith(("best", "overall")) else _md(line) for line in report.summary_lines()
    ]
    stream.write("\n".join(lines) + "\n")


def write_csv(report: Report, stream: IO[str], *, top: int, experiment: str, where: tuple[str, ...] = ()) -> None:
    """One line per configuration: every parameter, counts, and mean/std/n of every numeric result."""
    keys = sorted({*report.constant, *report.varying})
    failed_words = ("failed", "crashed", "canceled", "blocked")
    writer = csv.writer(stream, lineterminator="\n")
    head = ["rank", "best", "eligible", "phase", "target", *keys, "n", "expected", "failed", "unfinished"]
    for name in report.columns:
        head += [f"{name}_mean", f"{name}_std", f"{name}_n"]
    writer.writerow(head)
    rows = report.iter_rows() if not top else (r for _o, rows, _t in _sections(report, top) for r in rows)
    for r in rows:
        others = r.not_done()
        line = [
            r.rank,
            int(r.best),
            int(r.eligible),
            r.phase,
            r.target,
            *[_csv_value(r.params[k]) if k in r.params else "" for k in keys],
            r.n,
            r.expected,
            sum(n for w, n in others.items() if w in failed_words),
            sum(n for w, n in others.items() if w not in failed_words),
        ]
        for name in report.columns:
            s = r.stats.get(name)
            line += [repr(s.mean), "" if s.std is None else repr(s.std), s.n] if s else ["", "", 0]
        writer.writerow(line)


def _csv_value(value: Any) -> Any:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return value
    return json.dumps(value)


def write_json(report: Report, stream: IO[str], *, top: int, experiment: str, where: tuple[str, ...] = ()) -> None:
    """The whole report for scripts: rows with n, mean, std, min, max of every result, and the verdict."""
    data = {"experiment": experiment, "where": list(where), **report.to_dict()}
    if top:
        keep = {id(r) for _o, rows, _t in _sections(report, top) for r in rows}
        data["rows"] = [r.to_dict() for r in report.rows if id(r) in keep]
    elif not report.holds_all:  # every configuration, as the database streams them
        data["rows"] = _ROWS
        head, tail = json.dumps(data, default=str).split(json.dumps(_ROWS))
        stream.write(head + "[")
        sep = ""
        for rows in report.iter_json_lists():  # thousands of rows a write
            if rows:
                stream.write(sep + ", ".join(rows))
                sep = ", "
        stream.write("]" + tail + "\n")
        return
    # Indented for a reader; compact (and several times faster to write) beyond a thousand rows.
    stream.write(json.dumps(data, indent=2 if len(data["rows"]) <= 1000 else None, default=str) + "\n")


_ROWS = "\x00rows\x00"


COMMANDS = [report]

"""Choosing hyperparameters: jobs grouped into configurations, their results aggregated and ranked.

Jobs whose parameters differ only by a fold or seed key (the *group keys*) are one
configuration. Each numeric result of a configuration's DONE jobs is summarised by
n, mean, sample standard deviation (ddof=1; blank when n=1), min and max; jobs that
are not DONE are counted, never averaged.

Conventions, fixed here so the CLI, the plots and fan-in jobs agree:

- Default group keys: parameters named ``fold``, ``*_fold``, ``fold_*``, ``seed``,
  ``*_seed`` or ``seed_*``; never counts (``nb_*``, ``n_*``, ``num_*``) and never outer
  folds. A parameter naming an outer fold (``id_outer_fold``, ``outer_fold``) splits
  the report: nested cross-validation is ranked per outer fold, then summarised over
  the outer folds' winners.
- A configuration is complete when every one of its jobs is DONE with the metric and it
  has as many jobs as the largest configuration of its scope (phase, target and outer
  fold). Only complete configurations are eligible for best, unless ``allow_incomplete``.
- Ranking: the better mean (compared to 12 significant digits), then more runs, then
  the lower std (unknown std last), then the configuration scheduled first (lowest id).
- Jobs of a phase and target where no DONE job reports the metric are left out
  (a pretraining phase, a fan-in job), and said so in :attr:`Report.dropped`.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from sqlalchemy import text as sa_text

from . import aggregates
from .errors import JobmanError, UsageError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from .store import Store

STD_DDOF = 1  # sample standard deviation, the usual for cross-validation
AUTO = "auto"
_COUNT_PREFIXES = ("nb_", "n_", "num_", "number_", "max_", "min_")
_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(==|!=|<=|>=|<|>|=)\s*(.*?)\s*$")
_PLAIN_TYPES = frozenset((int, float, str, type(None)))  # parameter values hashable as they are
_UNFINISHED = {"WAITING": "pending", "QUEUED": "pending", "RUNNING": "running"}


class NothingEligible(JobmanError):
    """No configuration is eligible for best: none has all its runs finished with the metric."""


class UnknownMetric(UsageError):
    """No finished job reports that metric."""


# -- what a report holds ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Stat:
    """One numeric result over a configuration's DONE jobs. ``std`` is None when n is 1."""

    n: int
    mean: float
    std: float | None
    min: float
    max: float

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "std": self.std, "min": self.min, "max": self.max}


@dataclass(slots=True)
class ConfigRow:
    """One configuration: jobs equal in every parameter but the group keys.

    ``n``, ``mean``, ``std`` and ``job_ids`` are those of the report's metric: the DONE
    jobs whose value of it was averaged. ``status`` counts every job of the
    configuration by status; ``expected`` is how many jobs a complete one has.
    """

    params: dict[str, Any]
    phase: int | None
    target: str | None
    outer: Any
    metric: str
    stats: dict[str, Stat]
    job_ids: list[int]
    all_job_ids: list[int]
    status: dict[str, int]
    expected: int
    complete: bool
    eligible: bool
    first_id: int
    rank: int = 0
    best: bool = False

    @property
    def n(self) -> int:
        stat = self.stats.get(self.metric)
        return stat.n if stat else 0

    @property
    def mean(self) -> float | None:
        stat = self.stats.get(self.metric)
        return stat.mean if stat else None

    @property
    def std(self) -> float | None:
        stat = self.stats.get(self.metric)
        return stat.std if stat else None

    @property
    def done(self) -> int:
        return self.status.get("DONE", 0)

    def not_done(self) -> dict[str, int]:
        """Jobs that are not DONE, by the word a reader expects (failed, crashed, running, pending...)."""
        words: Counter[str] = Counter()
        for status, count in self.status.items():
            if status != "DONE":
                words[_UNFINISHED.get(status, status.lower())] += count
        return dict(sorted(words.items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank, "best": self.best, "eligible": self.eligible, "complete": self.complete,
            "phase": self.phase, "target": self.target, "outer": self.outer, "params": self.params,
            "n": self.n, "expected": self.expected, "status": self.status, "mean": self.mean, "std": self.std,
            "job_ids": self.job_ids, "results": {k: s.to_dict() for k, s in self.stats.items()},
        }


@dataclass
class Overview:
    """What the database counted of every configuration of a report that holds only its first rows."""

    outer_values: list[Any]
    scopes: set[tuple[int | None, str | None]]
    constant_results: dict[str, float]
    with_metric: dict[Any, tuple[int, int]]  # outer fold (None: not nested) -> (configurations, with the metric)


@dataclass
class Report:
    """Every configuration of a selection of jobs, ranked by one metric."""

    metric: str
    mode: str
    group_over: list[str]
    outer: str | None
    allow_incomplete: bool
    rows: list[ConfigRow]  # per outer fold (sorted), best first; rows without the metric last
    constant: dict[str, Any]  # parameters every configuration shares
    varying: list[str]  # parameters that differ between configurations
    columns: list[str]  # numeric results, the metric first
    jobs: int  # jobs reported on
    dropped: list[tuple[int | None, str | None, int]] = field(default_factory=list)  # (phase, target, jobs)
    best_by_outer: dict[Any, ConfigRow] = field(default_factory=dict)
    overall: dict[str, Stat] = field(default_factory=dict)  # nested CV: over the outer folds' winners
    # A report the database ranked may hold only its first rows (see ``jobdb.aggregates``); then
    # what the writers need of every configuration was counted there, and is given here.
    configurations: int = -1  # every configuration, held in ``rows`` or not
    sample: list[ConfigRow] = field(default_factory=list)  # see ``open_report``
    summary: "Overview | None" = None
    _stream: Callable[[], Iterator[ConfigRow]] | None = field(default=None, repr=False)
    _stream_json: Callable[[], Iterator[list[str]]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.configurations < 0:
            self.configurations = len(self.rows)

    @property
    def holds_all(self) -> bool:
        """Whether ``rows`` is every configuration."""
        return len(self.rows) == self.configurations

    def iter_rows(self) -> Iterator[ConfigRow]:
        """Every configuration, best first (per outer fold): from ``rows``, or streamed from the database
        while the report is open (``report.open_report``)."""
        if self.holds_all or self._stream is None:
            return iter(self.rows)
        return self._stream()

    def iter_json(self) -> Iterator[str]:
        """The JSON text of every row's :meth:`ConfigRow.to_dict`, as :meth:`iter_rows` would give them."""
        return (text for part in self.iter_json_lists() for text in part)

    def iter_json_lists(self) -> Iterator[list[str]]:
        """:meth:`iter_json` in lists of rows (those the database streams: thousands at a time)."""
        if self.holds_all or self._stream_json is None:
            return iter([[json.dumps(r.to_dict(), default=str) for r in self.rows]])
        return self._stream_json()

    @property
    def best(self) -> ConfigRow | None:
        """The winner; with outer folds, None (see :attr:`best_by_outer`)."""
        if self.outer is not None:
            return None
        return self.best_by_outer.get(None)

    @property
    def outer_values(self) -> list[Any]:
        if self.summary is not None:
            return self.summary.outer_values
        return sorted({r.outer for r in self.rows}, key=_sort_key)

    @cached_property
    def scopes(self) -> list[tuple[int | None, str | None]]:
        """The (phase, target) pairs reported on (found once: ``label`` asks for every row)."""
        found = self.summary.scopes if self.summary is not None else {(r.phase, r.target) for r in self.rows}
        return sorted(found, key=lambda s: (_sort_key(s[0]), str(s[1])))

    @cached_property
    def constant_results(self) -> dict[str, float]:
        """Results with one value in every run of every configuration (an epoch budget): said once."""
        if self.summary is not None:
            return self.summary.constant_results
        found = {}
        for name in self.columns[1:]:
            stats = [r.stats.get(name) for r in self.rows]
            if all(s is not None for s in stats) and len({s.min for s in stats} | {s.max for s in stats}) == 1:
                found[name] = stats[0].min
        return found

    def with_metric(self, outer: Any = None) -> tuple[int, int]:
        """(configurations, those with the metric) of one outer fold, or of all when not nested."""
        if self.summary is not None:
            return self.summary.with_metric.get(_frozen(outer) if self.outer is not None else None, (0, 0))
        rows = [r for r in self.rows if r.outer == outer] if self.outer is not None else self.rows
        return len(rows), sum(1 for r in rows if r.n)

    def unit(self, n: int) -> str:
        """What a run of a configuration is called: fold, seed, or run."""
        kinds = {_group_kind(k) for k in self.group_over}
        word = kinds.pop() if len(kinds) == 1 else "run"
        return word if n == 1 else word + "s"

    def label(self, row: ConfigRow) -> str:
        """The parameters that tell ``row`` apart from the other configurations."""
        keys = [k for k in self.varying if k != self.outer]
        text = " ".join(f"{k}={format_param(row.params[k])}" for k in keys if k in row.params)
        if len(self.scopes) > 1:
            text = f"phase {row.phase} {row.target} " + text
        return text.strip() or "the only configuration"

    def describe(self, row: ConfigRow) -> str:
        """One line in words: ``lr=0.01 nhid=256 — valid_error 0.021 ± 0.004 over 5 folds``."""
        value = format_number(row.mean)
        if row.std is not None:
            value += f" ± {format_number(row.std, 2)}"
        text = f"{self.label(row)} — {self.metric} {value} over {row.n} {self.unit(row.n)}"
        if not row.complete:
            text += f" (incomplete: {row.n} of {row.expected})"
        return text

    def summary_lines(self) -> list[str]:
        """The closing lines: the best configuration (per outer fold), or why there is none."""
        if self.outer is None:
            row = self.best
            return [f"best: {self.describe(row)}" if row else self.why_none()]
        lines = []
        for value in self.outer_values:
            row = self.best_by_outer.get(value)
            head = f"{self.outer}={format_param(value)}"
            lines.append(f"best for {head}: {self.describe(row)}" if row else f"{head}: {self.why_none(value)}")
        if self.overall.get(self.metric):
            parts = []
            for name in [self.metric] + [c for c in self.columns if c != self.metric][:4]:
                stat = self.overall.get(name)
                if stat is not None:
                    spread = f" ± {format_number(stat.std, 2)}" if stat.std is not None else ""
                    parts.append(f"{name} {format_number(stat.mean)}{spread}")
            n = self.overall[self.metric].n
            lines.append(f"overall: {', '.join(parts)} over {n} outer fold{'s' if n != 1 else ''} "
                         "(each outer fold's best configuration)")
        return lines

    def why_none(self, outer: Any = None) -> str:
        rows, with_metric = self.with_metric(outer)
        if not rows:
            return "no configuration to report on"
        if not with_metric:
            return f"no configuration has a {self.metric} yet"
        return (f"no configuration is eligible for best: all {with_metric} with a {self.metric} are missing "
                "runs or have failed ones (--allow-incomplete accepts them)")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metric": self.metric, "mode": self.mode, "group_over": self.group_over, "outer": self.outer,
            "std": f"sample standard deviation (ddof={STD_DDOF}); null when n is 1",
            "allow_incomplete": self.allow_incomplete, "jobs": self.jobs, "constant": self.constant,
            "varying": self.varying, "columns": self.columns,
            "dropped": [{"phase": p, "target": t, "jobs": n} for p, t, n in self.dropped],
            "rows": [r.to_dict() for r in self.rows],
        }
        if self.outer is None:
            out["best"] = self.best.to_dict() if self.best else None
        else:
            out["best_by_outer"] = [{"outer": v, "best": r.to_dict()} for v, r in self.best_by_outer.items()]
            out["overall"] = {k: s.to_dict() for k, s in self.overall.items()}
        out["summary"] = self.summary_lines()
        return out


# -- filters ------------------------------------------------------------------------------

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
            equal = _same(have, want)
            return equal if self.op == "==" else not equal
        if _is_number(have) and _is_number(want) or isinstance(have, str) and isinstance(want, str):
            return {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want}[self.op]
        return False

    def __str__(self) -> str:
        return f"{self.key}{self.op}{format_param(self.value)}"


def parse_where(text: str) -> Condition:
    """``nhid>=128``, ``act==tanh``, ``lr!=0.1`` (``=`` means ``==``); values are typed as in a sweep."""
    from .sweep import parse_value

    match = _WHERE.match(text)
    if not match or not match.group(3):
        raise UsageError(f"--where {text!r}: write KEY OP VALUE with OP one of ==, !=, <, <=, >, >= "
                         "(for example nhid>=128)")
    key, op, raw = match.groups()
    if raw[0] in "<>=!":
        raise UsageError(f"--where {text!r}: {op + raw[0]!r} is not an operator; use ==, !=, <, <=, >, >=")
    try:
        value = parse_value(raw)
    except ValueError as exc:
        message = str(exc).rsplit("@", 1)[0]
        raise UsageError(f"--where {text!r}: the value {raw!r} is malformed ({message})") from None
    return Condition(key, "==" if op == "=" else op, value)


# -- the selection ---------------------------------------------------------------------

def default_group_keys(keys: Iterable[str]) -> list[str]:
    """The parameters that look like a fold or a seed (not outer folds, not counts)."""
    return sorted(k for k in set(keys) if _group_kind(k) is not None)


def default_outer_key(keys: Iterable[str]) -> str | None:
    """The parameter naming an outer fold of nested cross-validation, if exactly one does."""
    found = sorted(k for k in set(keys) if _is_outer(k))
    return found[0] if len(found) == 1 else None


def build_report(records: Iterable[Any], metric: str, mode: str = "min", group_over: Sequence[str] | None = None,
                 *, outer: str | None = AUTO, allow_incomplete: bool = False,
                 where: Sequence[str | Condition] = ()) -> Report:
    """Group ``records`` into configurations and rank them by ``metric`` (``mode`` min or max).

    ``records`` are mappings (or objects) with ``params``, ``results`` and ``status``
    (missing: DONE, as for a fan-in job's parents), and optionally ``job_id``, ``phase``
    and ``target``. ``group_over`` None picks the fold and seed keys; ``outer`` "auto"
    finds an outer-fold key, None reports everything as one.
    """
    return _build(_Records.from_records(records), metric, mode, group_over, outer, allow_incomplete, where)


def summarize(records: Iterable[Any], metric: str, mode: str = "min", group_over: Sequence[str] | None = None,
              *, outer: str | None = AUTO, allow_incomplete: bool = False,
              where: Sequence[str | Condition] = ()) -> list[ConfigRow]:
    """The configurations of ``records``, best first (per outer fold): see :func:`build_report`."""
    return build_report(records, metric, mode, group_over, outer=outer, allow_incomplete=allow_incomplete,
                        where=where).rows


def best(records: Iterable[Any], metric: str = "valid_error", mode: str = "min",
         group_over: Sequence[str] | None = None, allow_incomplete: bool = False) -> ConfigRow:
    """The best configuration of ``records`` by ``metric``: what a fan-in job retrains.

    The result has ``.params`` (without the group keys), ``.mean``, ``.std``, ``.n`` and
    ``.job_ids``. An outer-fold key is an ordinary parameter here: pass one outer fold's
    records to choose within it. Raises :class:`NothingEligible` when no configuration
    has all its runs DONE with the metric (or any, with ``allow_incomplete``).
    """
    report = build_report(records, metric, mode, group_over, outer=None, allow_incomplete=allow_incomplete)
    winner = report.best
    if winner is None:
        raise NothingEligible(report.why_none().replace("--allow-incomplete", "allow_incomplete=True"))
    return winner


def from_store(store: "Store", metric: str, mode: str = "min", group_over: Sequence[str] | None = None, *,
               phase: int | None = None, outer: str | None = AUTO, allow_incomplete: bool = False,
               where: Sequence[str | Condition] = ()) -> Report:
    """The report of a store's experiment, optionally of one phase, ranked by the database (every
    configuration held: see :func:`open_report` for a report too large for that)."""
    with open_report(store, metric, mode, group_over, phase=phase, outer=outer, allow_incomplete=allow_incomplete,
                     where=where) as rep:
        return rep


def from_store_in_python(store: "Store", metric: str, mode: str = "min", group_over: Sequence[str] | None = None,
                         *, phase: int | None = None, outer: str | None = AUTO, allow_incomplete: bool = False,
                         where: Sequence[str | Condition] = ()) -> Report:
    """The same report from every job read into Python (one query): what the database path must agree
    with, and the path for filters SQL cannot say the same way (a value that is a list)."""
    return _build(_Records.from_rows(store.report_rows(phase)), metric, mode, group_over, outer,
                  allow_incomplete, where)


@contextlib.contextmanager
def open_report(store: "Store", metric: str, mode: str = "min", group_over: Sequence[str] | None = None, *,
                phase: int | None = None, outer: str | None = AUTO, allow_incomplete: bool = False,
                where: Sequence[str | Condition] = (), keep: int | None = None,
                sample: int = 0, parallel: bool = False) -> Iterator[Report]:
    """The report of a store's experiment, grouped and ranked by the database, open for reading.

    With ``keep``, the report holds only the first ``keep`` configurations of each outer fold (and
    what is said of all of them: counts, constant parameters and results, the winners); while the
    context is open, :meth:`Report.iter_rows` streams every configuration from the database. With
    ``sample``, :attr:`Report.sample` holds that many configurations with the metric, evenly spaced
    over the ranking (what a chart of every configuration draws).

    With ``parallel``, SQLite groups the two halves of a large experiment's jobs on two connections at
    once (faster on two cores); a configuration's sums then add its jobs in another order, so a mean can
    differ in its last bit from the one-pass report. For reports that show rounded figures (a table,
    the web page); csv and json keep one order. (PostgreSQL may read the jobs with parallel workers in
    any report: its sums add each configuration's jobs in the order of their ids all the same.)
    """
    if mode not in ("min", "max"):
        raise UsageError(f"mode {mode!r}: use 'min' (errors, losses) or 'max' (accuracies)")
    conditions = [c if isinstance(c, Condition) else parse_where(c) for c in where]
    with aggregates.reading(store) as (conn, exp):
        rep = _build_in_database(conn, exp, metric, mode, group_over, phase, outer, allow_incomplete, conditions,
                                 keep, sample=sample, parallel=parallel)
        if rep is not None:
            try:
                yield rep
            finally:
                rep._stream = rep._stream_json = _closed
            return
    rep = from_store_in_python(store, metric, mode, group_over, phase=phase, outer=outer,
                               allow_incomplete=allow_incomplete, where=conditions)
    if sample:
        rep.sample = _spread(iter(rep.rows), sum(1 for r in rep.rows if r.n), sample)
    yield rep


def _closed() -> Iterator[Any]:
    raise UsageError("the report's rows beyond the first ones are read while it is open (report.open_report); "
                     "report.from_store holds them all")


def _spread(rows: Iterator[ConfigRow], with_metric: int, count: int) -> list[ConfigRow]:
    """``count`` of the rows with the metric, evenly spaced (every k-th)."""
    step = with_metric // count + 1
    out = []
    i = 0
    for row in rows:
        if row.mean is None:
            continue
        if i % step == 0:
            out.append(row)
        i += 1
    return out


def _build_in_database(conn: Any, exp: int, metric: str, mode: str, group_over: Sequence[str] | None, phase: int | None,
                       outer: str | None, allow_incomplete: bool, conditions: list[Condition],
                       keep: int | None, exact_keys: dict[str, Any] | None = None, sample: int = 0,
                       exact_results: bool = False, parallel: bool = False) -> Report | None:
    """:func:`_build`, its grouping and sums done by the database (``jobdb.aggregates``); None when a
    filter cannot be said in SQL.

    The parameter and result keys are first read from a job or two (by index) and checked on every
    job while grouping; when the check fails, the keys of every job are read and the jobs grouped
    again (``exact_keys``, ``exact_results``)."""
    sql = aggregates.Sql(conn.dialect.name)
    base = f"job.experiment_id = {sql.bind(exp)}" + ("" if phase is None else f" AND job.phase = {sql.bind(phase)}")
    base_binds = dict(sql.binds)
    named = [*(group_over or ()), *([outer] if outer not in (None, AUTO) else []), *(c.key for c in conditions)]
    sampled = exact_keys is None
    if sampled:
        keys_all = aggregates.sampled_keys(conn, base, sql.binds)
        if any(k not in keys_all for k in named):
            sampled = False
    if not sampled:
        keys_all = exact_keys or aggregates.param_keys(conn, base, base_binds)
    all_keys = set(keys_all)
    if not aggregates.sql_able(conditions, [*all_keys, *named, metric], conn.dialect.name):
        return None
    for cond in conditions:
        if cond.key not in all_keys and all_keys:
            raise UsageError(f"--where {cond}: no job has a parameter {cond.key!r} ({_listing(all_keys)})")
    selected = base + "".join(f" AND {sql.condition(c)}" for c in conditions)
    if conditions and all_keys:
        if not conn.execute(sa_text(f"SELECT count(*) FROM job WHERE {selected}"), sql.binds).scalar():
            raise UsageError(f"no job matches --where {' and '.join(map(str, conditions))}")
    outer_key, groups = _outer_and_groups(all_keys, outer, group_over, bool(all_keys))

    # The results of the first and the last DONE job: when they hold the metric as a number, every
    # scope is assumed to report it and no job to report a result they lack, which the grouping checks.
    results = None if exact_results else aggregates.sampled_results(conn, selected, sql.binds)
    if results is not None and not (results.get(metric) and aggregates.sql_able([], results, conn.dialect.name)):
        results = None
    dropped: list[tuple[int | None, str | None, int]] = []
    if results is not None:
        columns = [metric, *sorted(k for k, number in results.items()
                                   if number and k != metric and not k.startswith("_"))]
        guarded, unseen = set(columns), aggregates.unseen_results(sql, results)
    else:
        exact = _exact_results(conn, sql, selected, metric)
        if exact is None:
            return None
        selected, kept, dropped, columns, guarded, has_metric = exact
        unseen = None
    keys = keys_all
    if (conditions or dropped) and not sampled:  # constant within the selection
        keys = aggregates.param_keys(conn, selected, sql.binds)
    aggregates.group(conn, sql, selected, groups, columns, guarded, unseen, parallel=parallel, scope=base)
    differ = None
    if sampled:
        seen, same = aggregates.constant_candidates(conn, sql, selected, groups)
        keys = {k: aggregates.KeyStats(-1, k in same) for k in seen}
        if set(keys) <= all_keys:
            differ = aggregates.keys_differ(sql, list(keys), same)
    survey = aggregates.survey(conn, sql, outer_key, columns, unseen=results is not None, differ=differ)
    if results is not None:
        if survey.scopes is not None:
            kept, has_metric = survey.scopes, True
        else:
            # A scope without the metric, or a job with a result the two sampled lack: the result keys of
            # every job say whether the grouping stands (the result is never a number) or is made again.
            exact = _exact_results(conn, sql, selected, metric)
            if exact is None:
                return None
            if exact[2] or exact[3] != columns:
                aggregates.drop(conn)
                return _build_in_database(conn, exp, metric, mode, group_over, phase, outer, allow_incomplete,
                                          conditions, keep, exact_keys, sample, exact_results=True,
                                          parallel=parallel)
            kept, has_metric = exact[1], exact[5]
    if sampled and (differ is None or not survey.keys_hold):
        # A configuration has a parameter the first and the last have not, or another value of one
        # they share, or one the job sampled lacks: the keys of every job, then the grouping again.
        aggregates.drop(conn)
        return _build_in_database(conn, exp, metric, mode, group_over, phase, outer, allow_incomplete, conditions,
                                  keep, aggregates.param_keys(conn, base, base_binds), sample, exact_results,
                                  parallel)
    configs, jobs, constant_results = survey.configurations, survey.jobs, survey.constant_results
    sections = survey.sections
    shown = columns if has_metric else []
    grouped = set(groups)

    def section_rows(section: aggregates.Section) -> Iterator[ConfigRow]:
        rows = aggregates.ranked(conn, sql, section, columns, mode, allow_incomplete)
        for rank, raw in enumerate(aggregates.in_python_order(rows, len(columns)), 1):
            yield _row_of(raw, rank, metric, shown, outer_key, sql.pg)

    held: list[ConfigRow] = []
    winners: dict[Any, ConfigRow] = {}
    for section in sections:
        if keep is None or section.configurations <= keep:
            rows = list(section_rows(section))
        else:
            rows = [_row_of(raw, rank, metric, shown, outer_key, sql.pg) for rank, raw in enumerate(
                aggregates.first_ranked(conn, sql, section, columns, mode, allow_incomplete, keep), 1)]
        if rows and rows[0].best:
            winners[rows[0].outer] = rows[0]
        held.extend(rows)

    def stream() -> Iterator[ConfigRow]:
        for section in sections:
            yield from section_rows(section)

    def stream_json() -> Iterator[list[str]]:
        to_json = _RowJson(shown, outer_key, len(columns))
        for section in sections:
            rank = 1
            batches = aggregates.ranked_batches(conn, sql, section, columns, mode, allow_incomplete)
            for batch in aggregates.in_python_order_batches(batches, len(columns)):
                yield to_json.rows(batch, rank)
                rank += len(batch)

    constant: dict[str, Any] = {}
    varying: list[str] = []
    if held:
        first = held[0].params
        order = list(dict.fromkeys([*first, *sorted(k for k in keys if k not in grouped)]))
        constant = {k: first[k] for k in order if configs > 1 and k in first and keys[k].one_value
                    and (sampled or keys[k].jobs == jobs)}
        varying = [k for k in order if k not in constant]
    summary = Overview(outer_values=[s.value for s in sections], scopes=kept,
                       constant_results=constant_results,
                       with_metric={(_frozen(s.value) if outer_key is not None else None): (s.configurations,
                                                                                           s.with_metric)
                                    for s in sections})
    report = Report(metric=metric, mode=mode, group_over=groups, outer=outer_key, allow_incomplete=allow_incomplete,
                    rows=held, constant=constant, varying=varying, columns=shown, jobs=jobs, dropped=dropped,
                    best_by_outer=winners, configurations=configs, summary=summary, _stream=stream,
                    _stream_json=stream_json)
    if outer_key is not None:
        report.overall = _over_winners(list(winners.values()), shown)
    if sample and report.holds_all:
        report.sample = _spread(iter(held), sum(s.with_metric for s in sections), sample)
    elif sample:  # picked by the database: only the ones drawn are read
        step = sum(s.with_metric for s in sections) // sample + 1
        for section in sections:
            for i, raw in enumerate(aggregates.ranked(conn, sql, section, columns, mode, allow_incomplete, every=step)):
                report.sample.append(_row_of(raw, 1 + i * step, metric, shown, outer_key, sql.pg))
    return report


def _exact_results(conn: Any, sql: aggregates.Sql, selected: str, metric: str) -> tuple | None:
    """From the result keys of every job: (the selection without the scopes that lack the metric, the
    scopes kept, those dropped, the result columns, the results to read with their type checked,
    whether any job has the metric); None when a key cannot be said in SQL."""
    scopes = aggregates.scope_counts(conn, selected, sql.binds)
    found = aggregates.result_keys(conn, selected, sql.binds)
    if not aggregates.sql_able([], (key for _, _, key, _ in found), conn.dialect.name):
        return None
    numeric = set(sql.numeric)
    with_metric = {(p, t) for p, t, k, kind in found if k == metric and kind in numeric}
    dropped: list[tuple[int | None, str | None, int]] = []
    if not with_metric:
        if any(done for _, _, _, done in scopes):
            names = sorted({k for _, _, k, kind in found if kind in numeric and not k.startswith("_")})
            listing = ", ".join(names) if names else "none"
            raise UnknownMetric(f"no finished job reports {metric!r} (numeric results: {listing})")
    else:
        dropped = sorted(((p, t, n) for p, t, n, _ in scopes if (p, t) not in with_metric),
                         key=lambda d: (_sort_key(d[0]), str(d[1])))
    kept = {(p, t) for p, t, _, _ in scopes} - {(p, t) for p, t, _ in dropped}
    if dropped:
        selected += " AND (" + " OR ".join(f"(job.phase = {sql.bind(p)} AND job.target = {sql.bind(t)})"
                                           for p, t in sorted(kept, key=str)) + ")"
    others = sorted({k for p, t, k, kind in found
                     if (p, t) in kept and kind in numeric and not k.startswith("_")} - {metric})
    guarded = {k for _, _, k, kind in found if kind not in numeric}
    return selected, kept, dropped, [metric, *others], guarded, bool(with_metric)


def _row_of(raw: Sequence[Any], rank: int, metric: str, columns: Sequence[str], outer_key: str | None,
            resort: bool) -> ConfigRow:
    """One configuration from a row of ``aggregates.ranked``."""
    phase, target, cfg, jobs, first_id, others, ids, metric_ids = raw[:8]
    params = json.loads(cfg)
    if resort:  # jsonb's own key order: back to the stored (sorted) one
        params = dict(sorted(params.items()))
    stats = {}
    for i, name in enumerate(columns):
        n, s, q, lo, hi = raw[8 + 5 * i: 13 + 5 * i]
        if n:
            mean, std = aggregates.stat_of(n, s, q, lo, hi)
            stats[name] = Stat(n, mean, std, lo, hi)
    status: dict[str, int] = dict(Counter(others.split(","))) if others else {}
    done = jobs - sum(status.values())
    if done:
        status["DONE"] = done
    expected, cls = raw[-4], raw[-3]
    n = stats[metric].n if metric in stats else 0
    eligible = cls == 0
    return ConfigRow(params=params, phase=phase, target=target,
                     outer=params.get(outer_key) if outer_key is not None else None, metric=metric, stats=stats,
                     job_ids=sorted(map(int, metric_ids.split(","))) if metric_ids else [],
                     all_job_ids=sorted(map(int, ids.split(","))), status=dict(sorted(status.items())),
                     expected=expected, complete=n == jobs == expected, eligible=eligible, first_id=first_id,
                     rank=rank, best=rank == 1 and eligible)


class _RowJson:
    """Rows of ``aggregates.ranked`` as the JSON text of their ``ConfigRow.to_dict()``, written directly,
    a list of rows at a time: a million rows are written in seconds, not in the minutes their objects
    would take.

    The loop over a list of rows is compiled once per report for its number of results (a row of
    ``width`` results unpacks into that many names), with the results' names as constants: per row
    it is then a few comparisons, a ``repr`` per number and one f-string."""

    def __init__(self, columns: Sequence[str], outer_key: str | None, width: int) -> None:
        self.outer_key = outer_key
        self.targets: dict[Any, str] = {}
        names = ["phase", "target", "cfg", "jobs", "_first", "others", "_ids", "mids"]
        names += [f"{v}{i}" for i in range(width) for v in ("n", "s", "q", "lo", "hi")]
        names += ["expected", "cls", "_mean", "_var"]
        lines = ["def rows(batch, rank):", "    out = []", "    append = out.append",
                 f"    for ({', '.join(names)},) in batch:"]
        if columns:
            lines.append(_one_run_rows(len(columns), bool(outer_key)))
        for i in range(len(columns)):
            lines += [f"        if n{i}:",
                      f"            if lo{i} == hi{i}:  # one value (one run, or equal runs): written once",
                      f"                m{i} = repr(lo{i}) if finite(lo{i}) else num(lo{i})",
                      f"                sd{i} = '0.0' if n{i} > 1 else 'null'",
                      f"                r{i} = f'{{K{i}}}: {{{{\"n\": {{n{i}}}, \"mean\": {{m{i}}}, \"std\": {{sd{i}}}, "
                      f"\"min\": {{m{i}}}, \"max\": {{m{i}}}}}}}'",
                      "            else:",
                      f"                r{i}, m{i}, sd{i} = spread(K{i}, n{i}, s{i}, q{i}, lo{i}, hi{i})",
                      "        else:",
                      f"            r{i}, m{i}, sd{i} = '', 'null', 'null'"]
        if columns:
            every = " and ".join(f"n{i}" for i in range(len(columns)))
            lines += ["        nm = n0",
                      f"        if {every}:",
                      "            results = " + " + ', ' + ".join(f"r{i}" for i in range(len(columns))),
                      "        else:",
                      "            results = ', '.join([r for r in (" + "".join(f"r{i}, " for i in range(len(columns)))
                      + ") if r])"]
        else:
            lines += ["        nm, m0, sd0, results = 0, 'null', 'null', ''"]
        lines += ["        status = statuses(others, jobs) if others else f'{{\"DONE\": {jobs}}}'",
                  "        if not mids:",
                  "            ids = '[]'",
                  "        elif ',' in mids:",
                  "            ids = job_ids(mids)",
                  "        else:",
                  "            ids = '[' + mids + ']'",
                  "        t = targets.get(target) or add_target(target)",
                  "        o = outer(cfg) if outer else 'null'",
                  "        ok = cls == 0",
                  "        append(f'{{\"rank\": {rank}, \"best\": {TRUTH[rank == 1 and ok]}, \"eligible\": {TRUTH[ok]}, '",
                  "               f'\"complete\": {TRUTH[nm == jobs == expected]}, \"phase\": {phase}, \"target\": {t}, '",
                  "               f'\"outer\": {o}, \"params\": {cfg}, \"n\": {nm}, \"expected\": {expected}, '",
                  "               f'\"status\": {status}, \"mean\": {m0}, \"std\": {sd0}, \"job_ids\": {ids}, '",
                  "               f'\"results\": {{{results}}}}}')",
                  "        rank += 1",
                  "    return out"]
        scope: dict[str, Any] = {f"K{i}": json.dumps(c) for i, c in enumerate(columns)}
        scope.update(finite=math.isfinite, num=_num, spread=_json_spread, statuses=_statuses, job_ids=_job_ids,
                     targets=self.targets, add_target=self._target, outer=self._outer if outer_key else None,
                     TRUTH=_TRUTH)
        exec("\n".join(lines), scope)  # noqa: S102 - our own source: names and values are constants in scope
        self.rows: Callable[[Sequence[Sequence[Any]], int], list[str]] = scope["rows"]

    def _target(self, target: Any) -> str:
        text = self.targets[target] = json.dumps(target)
        return text

    def _outer(self, cfg: str) -> str:
        return json.dumps(json.loads(cfg).get(self.outer_key))


# The rows of one DONE job with every result (a sweep without folds or seeds), in the loop of
# ``_RowJson``: most of their text is known. A finite number's repr ends in a digit ('inf', 'nan' do not).
_ONE_RUN = """\
        if jobs == 1 and others is None and ONES:
REPRS
            if FINITE:
                if rank > 1 and cls == 0 and expected == 1:
                    head = f'{{"rank": {rank}, "best": false, "eligible": true, "complete": true, "phase": {phase}, '
                else:
                    ok = cls == 0
                    head = (f'{{"rank": {rank}, "best": {TRUTH[rank == 1 and ok]}, "eligible": {TRUTH[ok]}, '
                            f'"complete": {TRUTH[expected == 1]}, "phase": {phase}, ')
                append(f'{head}"target": {targets.get(target) or add_target(target)}, "outer": OUTER, '
                       f'"params": {cfg}, "n": 1, "expected": {expected}, "status": {{"DONE": 1}}, "mean": {m0}, '
                       f'"std": null, "job_ids": [{mids}], "results": {{RESULTS}}}}')
                rank += 1
                continue"""


def _one_run_rows(width: int, nested: bool) -> str:
    """The source of ``_ONE_RUN`` for ``width`` results."""
    results = ", ".join('{K%d}: {{"n": 1, "mean": {m%d}, "std": null, "min": {m%d}, "max": {m%d}}}' % (i, i, i, i)
                        for i in range(width))
    return (_ONE_RUN.replace("ONES", " and ".join(f"n{i} == 1" for i in range(width)))
            .replace("REPRS", "\n".join(f"            m{i} = repr(lo{i})" for i in range(width)))
            .replace("FINITE", " and ".join(f"m{i}[-1] <= '9'" for i in range(width)))
            .replace("OUTER", "{outer(cfg)}" if nested else "null")
            .replace("RESULTS", results))


def _json_spread(name: str, n: int, s: float, q: float, lo: float, hi: float) -> tuple[str, str, str]:
    """The JSON of a result whose runs differ: (its text, its mean, its std)."""
    mean = s / n
    std = math.sqrt(max((q - s * s / n) / (n - 1), 0.0))
    if math.isfinite(q) and math.isfinite(s):  # then so are the mean, std, min and max
        m, sd, lo_, hi_ = repr(mean), repr(std), repr(lo), repr(hi)
    else:
        m, sd, lo_, hi_ = _num(mean), _num(std), _num(lo), _num(hi)
    return f'{name}: {{"n": {n}, "mean": {m}, "std": {sd}, "min": {lo_}, "max": {hi_}}}', m, sd


def _statuses(others: str, jobs: int) -> str:
    """The status counts of a configuration some of whose jobs are not DONE."""
    counts = Counter(others.split(","))
    done = jobs - sum(counts.values())
    if done:
        counts["DONE"] = done
    return json.dumps(dict(sorted(counts.items())))


def _job_ids(ids: str) -> str:
    return "[" + ", ".join(map(str, sorted(map(int, ids.split(","))))) + "]"


_TRUTH = {True: "true", False: "false"}


def _num(x: float) -> str:
    return float.__repr__(x) if math.isfinite(x) else json.dumps(x)


def _outer_and_groups(all_keys: set[str], outer: str | None, group_over: Sequence[str] | None,
                      any_jobs: bool) -> tuple[str | None, list[str]]:
    """The outer-fold key and the keys to group over, checked against the parameters jobs have."""
    outer_key = default_outer_key(all_keys) if outer == AUTO else outer
    if outer_key is not None and outer_key not in all_keys:
        raise UsageError(f"outer fold {outer_key!r}: no job has that parameter ({_listing(all_keys)})")
    if group_over is None:
        return outer_key, [k for k in default_group_keys(all_keys) if k != outer_key]
    groups = list(dict.fromkeys(group_over))
    missing = [k for k in groups if k not in all_keys]
    if missing and any_jobs:
        raise UsageError(f"group over {missing[0]!r}: no job has that parameter ({_listing(all_keys)})")
    if outer_key in groups:
        raise UsageError(f"{outer_key!r} cannot be both the outer fold and a key to group over")
    return outer_key, groups


# -- the work ----------------------------------------------------------------------------

class _Records:
    """Records as parallel lists: decoded once, filtered cheaply."""

    __slots__ = ("ids", "phases", "targets", "statuses", "params", "results")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.phases: list[int | None] = []
        self.targets: list[str | None] = []
        self.statuses: list[str] = []
        self.params: list[Mapping[str, Any]] = []
        self.results: list[Mapping[str, Any] | None] = []

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> "_Records":
        """From ``(id, phase, status, target, params JSON, results JSON)`` rows."""
        recs = cls()
        rows = list(rows)
        if not rows:
            return recs
        ids, phases, statuses, targets, params, results = (list(col) for col in zip(*rows))
        recs.ids, recs.phases, recs.statuses, recs.targets = ids, phases, statuses, targets
        # One decode of a JSON array of them all: far cheaper than one json.loads per job.
        recs.params = json.loads("[" + ",".join(params) + "]")
        recs.results = json.loads("[" + ",".join(r or "null" for r in results) + "]")
        return recs

    @classmethod
    def from_records(cls, records: Iterable[Any]) -> "_Records":
        recs = cls()
        for index, rec in enumerate(records):
            params = _get(rec, "params", None)
            if not isinstance(params, Mapping):
                raise UsageError(f"record {index} has no params mapping")
            job_id = _get(rec, "job_id", None)
            if job_id is None:
                job_id = _get(rec, "id", index)
            recs.ids.append(job_id)
            recs.phases.append(_get(rec, "phase", None))
            recs.targets.append(_get(rec, "target", None))
            recs.statuses.append(str(_get(rec, "status", "DONE")).upper())
            recs.params.append(params)
            recs.results.append(_get(rec, "results", None))
        return recs

    def keep(self, mask: Sequence[bool]) -> "_Records":
        out = _Records()
        for name in self.__slots__:
            setattr(out, name, [v for v, k in zip(getattr(self, name), mask) if k])
        return out

    def __len__(self) -> int:
        return len(self.ids)


def _build(recs: _Records, metric: str, mode: str, group_over: Sequence[str] | None, outer: str | None,
           allow_incomplete: bool, where: Sequence[str | Condition]) -> Report:
    if mode not in ("min", "max"):
        raise UsageError(f"mode {mode!r}: use 'min' (errors, losses) or 'max' (accuracies)")
    conditions = [c if isinstance(c, Condition) else parse_where(c) for c in where]
    all_keys: set[str] = set()
    for p in recs.params:
        all_keys.update(p)
    for cond in conditions:
        if cond.key not in all_keys and recs.params:
            raise UsageError(f"--where {cond}: no job has a parameter {cond.key!r} ({_listing(all_keys)})")
    if conditions and len(recs):
        recs = recs.keep([all(c.test(p) for c in conditions) for p in recs.params])
        if not len(recs):
            raise UsageError(f"no job matches --where {' and '.join(map(str, conditions))}")

    outer_key, groups = _outer_and_groups(all_keys, outer, group_over, bool(recs.params))

    recs, dropped = _drop_scopes_without(recs, metric)
    grouped = set(groups)

    # Configurations: one index per (phase, target, parameters but the group keys).
    plain = _PLAIN_TYPES.issuperset
    config_keys = [(phase, target, tuple(sorted(kv for kv in p.items() if kv[0] not in grouped)
                                         if plain(map(type, p.values())) else _frozen_items(p, grouped)))
                   for phase, target, p in zip(recs.phases, recs.targets, recs.params)]
    index: dict[tuple, int] = {}
    cfg_of = [index.setdefault(key, len(index)) for key in config_keys]
    keys = list(index)
    first_rec = [0] * len(keys)
    all_ids: list[list[Any]] = [[] for _ in keys]
    status_counts: list[dict[str, int]] = [{} for _ in keys]
    for i, (c, job_id, status) in enumerate(zip(cfg_of, recs.ids, recs.statuses)):
        ids = all_ids[c]
        if not ids:
            first_rec[c] = i
        ids.append(job_id)
        counts = status_counts[c]
        counts[status] = counts.get(status, 0) + 1
    n_cfg = len(keys)

    # Numeric results of DONE jobs, column by column.
    values: dict[str, tuple[list[int], list[float]]] = {}
    metric_ids: list[list[Any]] = [[] for _ in range(n_cfg)]
    for i, (status, res) in enumerate(zip(recs.statuses, recs.results)):
        if status != "DONE" or not res:
            continue
        c = cfg_of[i]
        for name, v in res.items():
            if (type(v) is float or type(v) is int) and not name.startswith("_") and math.isfinite(v):
                slot = values.get(name)
                if slot is None:
                    slot = values[name] = ([], [])
                slot[0].append(c)
                slot[1].append(v)
                if name == metric:
                    metric_ids[c].append(recs.ids[i])
    import numpy as np  # here, not at the top: every jobman command imports this module

    columns = [metric] * (metric in values) + sorted(k for k in values if k != metric)
    stats = {name: [a.tolist() for a in _aggregate(np.asarray(values[name][0], dtype=np.int64),
                                                   np.asarray(values[name][1], dtype=np.float64), n_cfg)]
             for name in columns}

    rows: list[ConfigRow] = []
    for c in range(n_cfg):
        i = first_rec[c]
        params = {k: v for k, v in recs.params[i].items() if k not in grouped}
        row_stats = {}
        for name in columns:
            count, mean, std, lo, hi = stats[name]
            n = count[c]
            if n:
                row_stats[name] = Stat(n, mean[c], None if n < 2 else std[c], lo[c], hi[c])
        ids = all_ids[c]
        rows.append(ConfigRow(
            params=params, phase=recs.phases[i], target=recs.targets[i],
            outer=params.get(outer_key) if outer_key is not None else None, metric=metric, stats=row_stats,
            job_ids=metric_ids[c], all_job_ids=ids, status=dict(sorted(status_counts[c].items())),
            expected=0, complete=False, eligible=False, first_id=_first(ids)))

    _judge(rows, allow_incomplete)
    rows, winners = _rank(rows, mode)
    report = Report(metric=metric, mode=mode, group_over=groups, outer=outer_key, allow_incomplete=allow_incomplete,
                    rows=rows, constant={}, varying=[], columns=columns, jobs=len(recs), dropped=dropped,
                    best_by_outer=winners)
    report.constant, report.varying = _split_constant([k[2] for k in keys], [r.params for r in rows])
    if outer_key is not None:
        report.overall = _over_winners(list(winners.values()), columns)
    return report


def _drop_scopes_without(recs: _Records, metric: str) -> tuple[_Records, list[tuple[int | None, str | None, int]]]:
    """Keep the (phase, target) scopes where some DONE job reports ``metric``."""
    scopes = list(zip(recs.phases, recs.targets))
    done = [i for i, s in enumerate(recs.statuses) if s == "DONE"]
    with_metric = {scopes[i] for i in done if _is_number((recs.results[i] or {}).get(metric))}
    if not with_metric:
        if done:
            found = sorted({k for i in done for k, v in (recs.results[i] or {}).items()
                            if _is_number(v) and not k.startswith("_")})
            listing = ", ".join(found) if found else "none"
            raise UnknownMetric(f"no finished job reports {metric!r} (numeric results: {listing})")
        return recs, []
    counts = Counter(s for s in scopes if s not in with_metric)
    dropped = sorted(((p, t, n) for (p, t), n in counts.items()), key=lambda d: (_sort_key(d[0]), str(d[1])))
    if not dropped:
        return recs, []
    return recs.keep([s in with_metric for s in scopes]), dropped


def _aggregate(cfg: np.ndarray, vals: np.ndarray, n_cfg: int) -> tuple[np.ndarray, ...]:
    """Per configuration: count, mean, sample std, min and max of one result (NaN where absent)."""
    import numpy as np

    count = np.bincount(cfg, minlength=n_cfg)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.bincount(cfg, weights=vals, minlength=n_cfg) / count
        dev = vals - mean[cfg]
        std = np.sqrt(np.bincount(cfg, weights=dev * dev, minlength=n_cfg) / (count - STD_DDOF))
    lo = np.full(n_cfg, np.nan)
    hi = np.full(n_cfg, np.nan)
    present = count > 0
    if present.any():
        order = np.argsort(cfg, kind="stable")
        starts = (np.cumsum(count) - count)[present]
        lo[present] = np.minimum.reduceat(vals[order], starts)
        hi[present] = np.maximum.reduceat(vals[order], starts)
    std[lo == hi] = 0.0  # equal values: no rounding noise in their spread
    mean[lo == hi] = lo[lo == hi]
    return count, mean, std, lo, hi


def _judge(rows: list[ConfigRow], allow_incomplete: bool) -> None:
    """Completeness: as many jobs as the largest configuration of the scope, all DONE with the metric."""
    largest: dict[tuple, int] = {}
    for r in rows:
        scope = (r.phase, r.target, _frozen(r.outer))
        largest[scope] = max(largest.get(scope, 0), len(r.all_job_ids))
    for r in rows:
        r.expected = largest[(r.phase, r.target, _frozen(r.outer))]
        r.complete = r.n == len(r.all_job_ids) == r.expected
        r.eligible = r.n > 0 and (r.complete or allow_incomplete)


def _rank(rows: list[ConfigRow], mode: str) -> tuple[list[ConfigRow], dict[Any, ConfigRow]]:
    """Sort per outer fold: eligible rows by merit, then ineligible ones, then those without the metric."""
    sign = 1.0 if mode == "min" else -1.0

    def merit(r: ConfigRow) -> tuple:
        if not r.n:
            return (2, 0.0, 0, math.inf, _sort_key(r.first_id))
        std = r.std if r.std is not None else math.inf
        return (0 if r.eligible else 1, sign * float(f"{r.mean:.12g}"), -r.n, std, _sort_key(r.first_id))

    out: list[ConfigRow] = []
    winners: dict[Any, ConfigRow] = {}
    by_outer: dict[Any, list[ConfigRow]] = {}
    for r in rows:
        by_outer.setdefault(_frozen(r.outer), []).append(r)
    for key in sorted(by_outer, key=_sort_key):
        scope = sorted(by_outer[key], key=merit)
        for rank, r in enumerate(scope, 1):
            r.rank = rank
        if scope and scope[0].eligible:
            scope[0].best = True
            winners[scope[0].outer] = scope[0]
        out.extend(scope)
    return out, winners


def _over_winners(winners: list[ConfigRow], columns: list[str]) -> dict[str, Stat]:
    """Nested CV: each result over the outer folds' winners (their means), sample std."""
    import numpy as np

    overall = {}
    for name in columns:
        vals = np.array([w.stats[name].mean for w in winners if name in w.stats])
        if vals.size:
            std = float(vals.std(ddof=STD_DDOF)) if vals.size > 1 else None
            overall[name] = Stat(int(vals.size), float(vals.mean()), std, float(vals.min()), float(vals.max()))
    return overall


def _split_constant(keys: list[tuple], params: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Parameters equal in every configuration, and the ones that vary (in first-seen order).

    ``keys`` are the configurations' frozen (key, value) items, ``params`` their parameters.
    """
    if not keys:
        return {}, []
    seen: dict[str, set] = {}
    present: Counter[str] = Counter()
    for items in keys:
        for k, v in items:
            bucket = seen.get(k)
            if bucket is None:
                bucket = seen[k] = set()
            bucket.add(v)
        present.update(k for k, _ in items)
    order = list(dict.fromkeys(k for p in params[:1] for k in p)) + sorted(seen)
    order = list(dict.fromkeys(order))
    constant = {k: params[0][k] for k in order
                if len(seen[k]) == 1 and present[k] == len(keys) and len(keys) > 1}
    varying = [k for k in order if k not in constant]
    return constant, varying


# -- small helpers ----------------------------------------------------------------------

def _first(ids: list[Any]) -> Any:
    """The id of the job scheduled first (the lowest)."""
    try:
        return min(ids)
    except TypeError:
        return min(ids, key=_sort_key)


def _get(rec: Any, name: str, default: Any) -> Any:
    if isinstance(rec, Mapping):
        return rec.get(name, default)
    return getattr(rec, name, default)


def _group_kind(key: str) -> str | None:
    name = key.lower()
    if _is_outer(name) or name.startswith(_COUNT_PREFIXES):
        return None
    for word in ("fold", "seed"):
        if name == word or name.endswith("_" + word) or name.startswith(word + "_"):
            return word
    return None


def _is_outer(key: str) -> bool:
    parts = key.lower().split("_")
    return "outer" in parts and any(p.startswith("fold") for p in parts) and not key.lower().startswith(
        _COUNT_PREFIXES)


def _is_number(v: Any) -> bool:
    return (type(v) is float or type(v) is int) and math.isfinite(v)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _frozen_items(params: Mapping[str, Any], skip: set[str]) -> tuple:
    return tuple(sorted((k, _frozen(v)) for k, v in params.items() if k not in skip))


def _frozen(v: Any) -> Any:
    """A hashable stand-in for a parameter value; True and 1 stay apart."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (list, dict)):
        return ("json", json.dumps(v, sort_keys=True))
    return v


def _sort_key(v: Any) -> tuple:
    """Orders values of mixed types deterministically (numbers, then text, then the rest)."""
    if v is None:
        return (0, 0)
    if _is_number(v) or isinstance(v, bool):
        return (1, float(v))
    if isinstance(v, str):
        return (2, v)
    return (3, json.dumps(v, sort_keys=True, default=str))


def _listing(keys: Iterable[str]) -> str:
    keys = sorted(keys)
    return "parameters: " + (", ".join(keys) if keys else "none")


def format_number(value: float | None, digits: int = 4) -> str:
    """A result as the report prints it: four significant digits for a mean, two for a spread."""
    if value is None:
        return ""
    if value == 0:
        return "0"
    if digits < 4:  # a spread keeps its trailing zero: 0.0030, not 0.003
        return f"{value:#.{digits}g}".rstrip(".")
    return f"{value:.{digits}g}"


def format_param(value: Any) -> str:
    """A parameter value as a user would type it in a sweep."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return value
    return json.dumps(value)


__all__ = ["best", "summarize", "build_report", "from_store", "parse_where", "default_group_keys",
           "default_outer_key", "ConfigRow", "Report", "Stat", "Condition", "NothingEligible", "UnknownMetric",
           "STD_DDOF"]

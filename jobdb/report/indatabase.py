"""The report's in-database engine: a store's experiment grouped, counted and ranked by the database.

The same report as :mod:`.inpython` gives (its reference), without holding the jobs: the statements
are :mod:`.queries`'; here are the steps between them. The parameter and result keys are first read
from a job or two (by index) and checked on every job while grouping; when the check fails, the keys
of every job are read and the jobs grouped again (at most twice more, never recursively).
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection

from ..errors import UsageError
from ..selection import Condition, frozen, listing, parse_where, sort_key
from ..status import Status
from . import queries
from .inpython import check_mode, from_store_in_python, outer_and_groups, over_winners, spread
from .jsonrows import RowJson
from .model import AUTO, ConfigRow, Overview, Report, Stat, UnknownMetric

if TYPE_CHECKING:  # pragma: no cover
    from ..store import Store

Scope = tuple[Any, Any]  # (phase, target)


def from_store(
    store: Store,
    metric: str,
    mode: str = "min",
    group_over: Sequence[str] | None = None,
    *,
    phase: int | None = None,
    outer: str | None = AUTO,
    allow_incomplete: bool = False,
    where: Sequence[str | Condition] = (),
) -> Report:
    """The report of a store's experiment, optionally of one phase, ranked by the database (every
    configuration held: see :func:`open_report` for a report too large for that)."""
    with open_report(
        store, metric, mode, group_over, phase=phase, outer=outer, allow_incomplete=allow_incomplete, where=where
    ) as rep:
        return rep


@contextlib.contextmanager
def open_report(
    store: Store,
    metric: str,
    mode: str = "min",
    group_over: Sequence[str] | None = None,
    *,
    phase: int | None = None,
    outer: str | None = AUTO,
    allow_incomplete: bool = False,
    where: Sequence[str | Condition] = (),
    keep: int | None = None,
    sample: int = 0,
    parallel: bool = False,
) -> Iterator[Report]:
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
    check_mode(mode)
    conditions = [c if isinstance(c, Condition) else parse_where(c) for c in where]
    with queries.reading(store) as (conn, exp):
        ask = _Request(metric, mode, group_over, phase, outer, allow_incomplete, conditions, keep, sample, parallel)
        rep = InDatabase(conn, exp, ask).build()
        if rep is not None:
            try:
                yield rep
            finally:
                rep._stream = rep._stream_json = _closed
            return
    rep = from_store_in_python(
        store, metric, mode, group_over, phase=phase, outer=outer, allow_incomplete=allow_incomplete, where=conditions
    )
    if sample:
        rep.sample = spread(iter(rep.rows), sum(1 for r in rep.rows if r.n), sample)
    yield rep


def _closed() -> Iterator[Any]:
    raise UsageError(
        "the report's rows beyond the first ones are read while it is open (report.open_report); "
        "report.from_store holds them all"
    )


@dataclass(frozen=True)
class _Request:
    """What a report was asked for."""

    metric: str
    mode: str
    group_over: Sequence[str] | None
    phase: int | None
    outer: str | None
    allow_incomplete: bool
    conditions: list[Condition]
    keep: int | None
    sample: int
    parallel: bool


@dataclass
class _Grouping:
    """One grouping of the selected jobs into the temporary table, and what it was made from."""

    sql: queries.Sql
    base: str  # SQL: the experiment's jobs (of the phase)
    selected: str  # SQL: those the filters keep (and whose scope reports the metric)
    sampled: bool  # the parameter keys were read from one job, to be checked
    keys: dict[str, queries.KeyStats]
    outer_key: str | None
    groups: list[str]
    columns: list[str]
    sampled_results: dict[str, bool] | None  # the result keys read from two jobs, to be checked; None: exact
    dropped: list[tuple[int | None, str | None, int]] = field(default_factory=list)
    kept: set[Scope] | None = None
    has_metric: bool = True
    differ: str | None = None
    survey: queries.Survey | None = None


class _Again(Exception):
    """The keys a grouping was made from do not hold on every job: group again with exact ones."""

    def __init__(self, exact_keys: dict[str, queries.KeyStats] | None, exact_results: bool) -> None:
        super().__init__("group again")
        self.exact_keys, self.exact_results = exact_keys, exact_results


class _NotSql(Exception):
    """A filter or a key SQL cannot say the way the in-Python engine tests it."""


class InDatabase:
    """One report of experiment ``exp`` built by the database on ``conn`` (a read transaction)."""

    def __init__(self, conn: Connection, exp: int, ask: _Request) -> None:
        self.conn, self.exp, self.ask = conn, exp, ask
        self.dialect = conn.dialect.name

    def build(self) -> Report | None:
        """The report; None when a filter or a key cannot be said in SQL (the in-Python engine's then)."""
        exact_keys: dict[str, queries.KeyStats] | None = None
        exact_results = False
        while True:
            try:
                grouping = self._group(exact_keys, exact_results)
                self._check(grouping)
            except _NotSql:
                return None
            except _Again as again:
                queries.drop(self.conn)
                exact_keys = again.exact_keys or exact_keys
                exact_results = exact_results or again.exact_results
                continue
            return self._report(grouping)

    # -- the grouping ------------------------------------------------------------------------------

    def _group(self, exact_keys: dict[str, queries.KeyStats] | None, exact_results: bool) -> _Grouping:
        """The selected jobs grouped into configurations, from the keys sampled or ``exact_keys``."""
        ask, conn = self.ask, self.conn
        sql = queries.Sql(self.dialect)
        base = sql.experiment_jobs(self.exp, ask.phase)
        base_binds = dict(sql.binds)
        named = [
            *(ask.group_over or ()),
            *([ask.outer] if ask.outer not in (None, AUTO) else []),
            *(c.key for c in ask.conditions),
        ]
        sampled = exact_keys is None
        if sampled:
            keys_all = queries.sampled_keys(conn, base, sql.binds)
            if any(k not in keys_all for k in named):
                sampled = False
        if not sampled:
            keys_all = exact_keys or queries.param_keys(conn, base, base_binds)
        all_keys = set(keys_all)
        if not queries.sql_able(ask.conditions, [*all_keys, *named, ask.metric], self.dialect):
            raise _NotSql()
        selected = self._filtered(sql, base, all_keys)
        outer_key, groups = outer_and_groups(all_keys, ask.outer, ask.group_over, bool(all_keys))

        # The results of the first and the last DONE job: when they hold the metric as a number, every
        # scope is assumed to report it and no job to report a result they lack, which the grouping checks.
        results = None if exact_results else queries.sampled_results(conn, selected, sql.binds)
        if results is not None and not (results.get(ask.metric) and queries.sql_able([], results, self.dialect)):
            results = None
        if results is not None:
            columns = [
                ask.metric,
                *sorted(k for k, number in results.items() if number and k != ask.metric and not k.startswith("_")),
            ]
            grouping = _Grouping(sql, base, selected, sampled, keys_all, outer_key, groups, columns, results)
            guarded, unseen = set(columns), queries.unseen_results(sql, results)
        else:
            grouping = _Grouping(sql, base, selected, sampled, keys_all, outer_key, groups, [], None)
            guarded = self._exact_results(grouping)
            unseen = None
        if (ask.conditions or grouping.dropped) and not sampled:  # constant within the selection
            grouping.keys = queries.param_keys(conn, grouping.selected, sql.binds)
        queries.group(
            conn, sql, grouping.selected, groups, grouping.columns, guarded, unseen, parallel=ask.parallel, scope=base
        )
        if sampled:
            seen, same = queries.constant_candidates(conn, sql, grouping.selected, groups)
            grouping.keys = {k: queries.KeyStats(-1, k in same) for k in seen}
            if set(grouping.keys) <= all_keys:
                grouping.differ = queries.keys_differ(sql, list(grouping.keys), same)
        grouping.survey = queries.survey(
            conn, sql, outer_key, grouping.columns, unseen=results is not None, differ=grouping.differ
        )
        return grouping

    def _filtered(self, sql: queries.Sql, base: str, all_keys: set[str]) -> str:
        """SQL of the jobs the ``--where`` filters keep, refused when a filter names no parameter or
        keeps no job."""
        conditions = self.ask.conditions
        for cond in conditions:
            if cond.key not in all_keys and all_keys:
                raise UsageError(f"--where {cond}: no job has a parameter {cond.key!r} ({listing(all_keys)})")
        selected = base + "".join(f" AND {sql.condition(c)}" for c in conditions)
        if conditions and all_keys and not queries.count_jobs(self.conn, selected, sql.binds):
            raise UsageError(f"no job matches --where {' and '.join(map(str, conditions))}")
        return selected

    def _exact_results(self, grouping: _Grouping) -> set[str]:
        """From the result keys of every job: the selection narrowed to the scopes that report the metric,
        those kept and dropped, the result columns, and whether any job has the metric, set on
        ``grouping``; the results whose type the grouping must check are returned."""
        conn, sql, metric = self.conn, grouping.sql, self.ask.metric
        scopes = queries.scope_counts(conn, grouping.selected, sql.binds)
        found = queries.result_keys(conn, grouping.selected, sql.binds)
        if not queries.sql_able([], (key for _, _, key, _ in found), self.dialect):
            raise _NotSql()
        numeric = set(sql.numeric)
        with_metric = {(p, t) for p, t, k, kind in found if k == metric and kind in numeric}
        dropped: list[tuple[int | None, str | None, int]] = []
        if not with_metric:
            if any(done for _, _, _, done in scopes):
                names = sorted({k for _, _, k, kind in found if kind in numeric and not k.startswith("_")})
                raise UnknownMetric(
                    f"no finished job reports {metric!r} (numeric results: {', '.join(names) if names else 'none'})"
                )
        else:
            dropped = sorted(
                ((p, t, n) for p, t, n, _ in scopes if (p, t) not in with_metric),
                key=lambda d: (sort_key(d[0]), str(d[1])),
            )
        kept = {(p, t) for p, t, _, _ in scopes} - {(p, t) for p, t, _ in dropped}
        if dropped:
            grouping.selected += " AND " + sql.in_scopes(sorted(kept, key=str))
        others = sorted(
            {k for p, t, k, kind in found if (p, t) in kept and kind in numeric and not k.startswith("_")} - {metric}
        )
        grouping.dropped, grouping.kept, grouping.has_metric = dropped, kept, bool(with_metric)
        grouping.columns = [metric, *others]
        return {k for _, _, k, kind in found if kind not in numeric}

    def _check(self, grouping: _Grouping) -> None:
        """Whether the keys the grouping was made from hold on every job; :class:`_Again` when not."""
        survey = grouping.survey
        assert survey is not None
        if grouping.sampled_results is not None:
            if survey.scopes is not None:
                grouping.kept, grouping.has_metric = survey.scopes, True
            else:
                # A scope without the metric, or a job with a result the two sampled lack: the result keys
                # of every job say whether the grouping stands (the result is never a number) or is made again.
                columns = grouping.columns
                exact = _Grouping(
                    grouping.sql,
                    grouping.base,
                    grouping.selected,
                    grouping.sampled,
                    grouping.keys,
                    grouping.outer_key,
                    grouping.groups,
                    [],
                    None,
                )
                self._exact_results(exact)
                if exact.dropped or exact.columns != columns:
                    raise _Again(None, exact_results=True)
                grouping.kept, grouping.has_metric = exact.kept, exact.has_metric
        if grouping.sampled and (grouping.differ is None or not survey.keys_hold):
            # A configuration has a parameter the first and the last have not, or another value of one
            # they share, or one the job sampled lacks: the keys of every job, then the grouping again.
            sql = queries.Sql(self.dialect)
            base = sql.experiment_jobs(self.exp, self.ask.phase)
            raise _Again(queries.param_keys(self.conn, base, sql.binds), exact_results=False)

    # -- the report --------------------------------------------------------------------------------

    def _report(self, g: _Grouping) -> Report:
        """The report of a grouping that holds: its first rows, and the streams of every row."""
        ask, conn, sql = self.ask, self.conn, g.sql
        survey = g.survey
        assert survey is not None and g.kept is not None
        shown = g.columns if g.has_metric else []
        held: list[ConfigRow] = []
        winners: dict[Any, ConfigRow] = {}
        for section in survey.sections:
            if ask.keep is None or section.configurations <= ask.keep:
                rows = list(self._section_rows(g, section, shown))
            else:
                rows = [
                    self._row(raw, rank, shown, g.outer_key)
                    for rank, raw in enumerate(
                        queries.first_ranked(conn, sql, section, g.columns, ask.mode, ask.allow_incomplete, ask.keep), 1
                    )
                ]
            if rows and rows[0].best:
                winners[rows[0].outer] = rows[0]
            held.extend(rows)

        def stream() -> Iterator[ConfigRow]:
            for section in survey.sections:
                yield from self._section_rows(g, section, shown)

        def stream_json() -> Iterator[list[str]]:
            to_json = RowJson(shown, g.outer_key, len(g.columns))
            for section in survey.sections:
                rank = 1
                batches = queries.ranked_batches(conn, sql, section, g.columns, ask.mode, ask.allow_incomplete)
                for batch in queries.in_python_order_batches(batches, len(g.columns)):
                    yield to_json.rows(batch, rank)
                    rank += len(batch)

        constant, varying = self._constant(g, held, survey.configurations, survey.jobs)
        summary = Overview(
            outer_values=[s.value for s in survey.sections],
            scopes=g.kept,
            constant_results=survey.constant_results,
            with_metric={
                (frozen(s.value) if g.outer_key is not None else None): (s.configurations, s.with_metric)
                for s in survey.sections
            },
        )
        report = Report(
            metric=ask.metric,
            mode=ask.mode,
            group_over=g.groups,
            outer=g.outer_key,
            allow_incomplete=ask.allow_incomplete,
            rows=held,
            constant=constant,
            varying=varying,
            columns=shown,
            jobs=survey.jobs,
            dropped=g.dropped,
            best_by_outer=winners,
            configurations=survey.configurations,
            summary=summary,
            _stream=stream,
            _stream_json=stream_json,
        )
        if g.outer_key is not None:
            report.overall = over_winners(list(winners.values()), shown)
        if ask.sample:
            report.sample = self._sample(g, report, shown)
        return report

    def _section_rows(self, g: _Grouping, section: queries.Section, shown: list[str]) -> Iterator[ConfigRow]:
        rows = queries.ranked(self.conn, g.sql, section, g.columns, self.ask.mode, self.ask.allow_incomplete)
        for rank, raw in enumerate(queries.in_python_order(rows, len(g.columns)), 1):
            yield self._row(raw, rank, shown, g.outer_key)

    def _constant(
        self, g: _Grouping, held: list[ConfigRow], configs: int, jobs: int
    ) -> tuple[dict[str, Any], list[str]]:
        """The parameters every configuration shares, and those that vary (first row's order first)."""
        if not held:
            return {}, []
        grouped = set(g.groups)
        first = held[0].params
        order = list(dict.fromkeys([*first, *sorted(k for k in g.keys if k not in grouped)]))
        constant = {
            k: first[k]
            for k in order
            if configs > 1 and k in first and g.keys[k].one_value and (g.sampled or g.keys[k].jobs == jobs)
        }
        return constant, [k for k in order if k not in constant]

    def _sample(self, g: _Grouping, report: Report, shown: list[str]) -> list[ConfigRow]:
        """Every k-th configuration with the metric: from the rows held, or picked by the database."""
        assert g.survey is not None
        sections = g.survey.sections
        with_metric = sum(s.with_metric for s in sections)
        if report.holds_all:
            return spread(iter(report.rows), with_metric, self.ask.sample)
        step = with_metric // self.ask.sample + 1
        out = []
        for section in sections:  # only the ones drawn are read
            for i, raw in enumerate(
                queries.ranked(
                    self.conn, g.sql, section, g.columns, self.ask.mode, self.ask.allow_incomplete, every=step
                )
            ):
                out.append(self._row(raw, 1 + i * step, shown, g.outer_key))
        return out

    def _row(self, raw: Sequence[Any], rank: int, columns: Sequence[str], outer_key: str | None) -> ConfigRow:
        """One configuration from a row of ``queries.ranked``."""
        metric = self.ask.metric
        phase, target, cfg, jobs, first_id, others, ids, metric_ids = raw[:8]
        params = json.loads(cfg)
        if self.dialect == "postgresql":  # jsonb's own key order: back to the stored (sorted) one
            params = dict(sorted(params.items()))
        stats = {}
        for i, name in enumerate(columns):
            n, s, q, lo, hi = raw[8 + 5 * i : 13 + 5 * i]
            if n:
                mean, std = queries.stat_of(n, s, q, lo, hi)
                stats[name] = Stat(n, mean, std, lo, hi)
        status: dict[str, int] = dict(Counter(others.split(","))) if others else {}
        done = jobs - sum(status.values())
        if done:
            status[Status.DONE.value] = done
        expected, cls = raw[-4], raw[-3]
        n = stats[metric].n if metric in stats else 0
        eligible = cls == 0
        return ConfigRow(
            params=params,
            phase=phase,
            target=target,
            outer=params.get(outer_key) if outer_key is not None else None,
            metric=metric,
            stats=stats,
            job_ids=sorted(map(int, metric_ids.split(","))) if metric_ids else [],
            all_job_ids=sorted(map(int, ids.split(","))),
            status=dict(sorted(status.items())),
            expected=expected,
            complete=n == jobs == expected,
            eligible=eligible,
            first_id=first_id,
            rank=rank,
            best=rank == 1 and eligible,
        )

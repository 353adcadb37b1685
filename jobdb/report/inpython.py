"""The report's in-Python engine: records grouped into configurations, aggregated and ranked in memory.

The reference the in-database engine (:mod:`.indatabase`) must agree with, the path of a fan-in job
(its parents' records), and the fallback for a filter SQL cannot say the same way.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..canonical import load_results
from ..errors import UsageError
from ..selection import (
    Condition,
    default_group_keys,
    default_outer_key,
    frozen,
    frozen_items,
    is_number,
    listing,
    parse_where,
    sort_key,
)
from ..status import Status
from .model import AUTO, STD_DDOF, ConfigRow, NothingEligible, Report, Stat, UnknownMetric

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from ..store import Store

_PLAIN_TYPES = frozenset((int, float, str, type(None)))  # parameter values hashable as they are
_DONE = Status.DONE.value


def check_mode(mode: str) -> None:
    """Refuse a ranking direction other than min and max."""
    if mode not in ("min", "max"):
        raise UsageError(f"mode {mode!r}: use 'min' (errors, losses) or 'max' (accuracies)")


def build_report(
    records: Iterable[Any],
    metric: str,
    mode: str = "min",
    group_over: Sequence[str] | None = None,
    *,
    outer: str | None = AUTO,
    allow_incomplete: bool = False,
    where: Sequence[str | Condition] = (),
) -> Report:
    """Group ``records`` into configurations and rank them by ``metric`` (``mode`` min or max).

    ``records`` are mappings (or objects) with ``params``, ``results`` and ``status``
    (missing: DONE, as for a fan-in job's parents), and optionally ``job_id``, ``phase``
    and ``target``. ``group_over`` None picks the fold and seed keys; ``outer`` "auto"
    finds an outer-fold key, None reports everything as one.
    """
    return _build(_Records.from_records(records), metric, mode, group_over, outer, allow_incomplete, where)


def summarize(
    records: Iterable[Any],
    metric: str,
    mode: str = "min",
    group_over: Sequence[str] | None = None,
    *,
    outer: str | None = AUTO,
    allow_incomplete: bool = False,
    where: Sequence[str | Condition] = (),
) -> list[ConfigRow]:
    """The configurations of ``records``, best first (per outer fold): see :func:`build_report`."""
    return build_report(
        records, metric, mode, group_over, outer=outer, allow_incomplete=allow_incomplete, where=where
    ).rows


def best(
    records: Iterable[Any],
    metric: str = "valid_error",
    mode: str = "min",
    group_over: Sequence[str] | None = None,
    allow_incomplete: bool = False,
) -> ConfigRow:
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


def from_store_in_python(
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
    """The same report from every job read into Python (one query): what the database path must agree
    with, and the path for filters SQL cannot say the same way (a value that is a list)."""
    return _build(
        _Records.from_rows(store.report_rows(phase)), metric, mode, group_over, outer, allow_incomplete, where
    )


def spread(rows: Iterator[ConfigRow], with_metric: int, count: int) -> list[ConfigRow]:
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


def outer_and_groups(
    all_keys: set[str], outer: str | None, group_over: Sequence[str] | None, any_jobs: bool
) -> tuple[str | None, list[str]]:
    """The outer-fold key and the keys to group over, checked against the parameters jobs have."""
    outer_key = default_outer_key(all_keys) if outer == AUTO else outer
    if outer_key is not None and outer_key not in all_keys:
        raise UsageError(f"outer fold {outer_key!r}: no job has that parameter ({listing(all_keys)})")
    if group_over is None:
        return outer_key, [k for k in default_group_keys(all_keys) if k != outer_key]
    groups = list(dict.fromkeys(group_over))
    missing = [k for k in groups if k not in all_keys]
    if missing and any_jobs:
        raise UsageError(f"group over {missing[0]!r}: no job has that parameter ({listing(all_keys)})")
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
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> _Records:
        """From ``(id, phase, status, target, params JSON, results JSON)`` rows."""
        recs = cls()
        rows = list(rows)
        if not rows:
            return recs
        ids, phases, statuses, targets, params, results = (list(col) for col in zip(*rows))
        recs.ids, recs.phases, recs.statuses, recs.targets = ids, phases, statuses, targets
        # One decode of a JSON array of them all: far cheaper than one json.loads per job.
        recs.params = json.loads("[" + ",".join(params) + "]")
        recs.results = load_results("[" + ",".join(r or "null" for r in results) + "]")
        return recs

    @classmethod
    def from_records(cls, records: Iterable[Any]) -> _Records:
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
            recs.statuses.append(str(_get(rec, "status", _DONE)).upper())
            recs.params.append(params)
            recs.results.append(_get(rec, "results", None))
        return recs

    def keep(self, mask: Sequence[bool]) -> _Records:
        out = _Records()
        for name in self.__slots__:
            setattr(out, name, [v for v, k in zip(getattr(self, name), mask) if k])
        return out

    def __len__(self) -> int:
        return len(self.ids)


def _build(  # noqa: C901
    recs: _Records,
    metric: str,
    mode: str,
    group_over: Sequence[str] | None,
    outer: str | None,
    allow_incomplete: bool,
    where: Sequence[str | Condition],
) -> Report:
    check_mode(mode)
    conditions = [c if isinstance(c, Condition) else parse_where(c) for c in where]
    all_keys: set[str] = set()
    for p in recs.params:
        all_keys.update(p)
    for cond in conditions:
        if cond.key not in all_keys and recs.params:
            raise UsageError(f"--where {cond}: no job has a parameter {cond.key!r} ({listing(all_keys)})")
    if conditions and len(recs):
        recs = recs.keep([all(c.test(p) for c in conditions) for p in recs.params])
        if not len(recs):
            raise UsageError(f"no job matches --where {' and '.join(map(str, conditions))}")

    outer_key, groups = outer_and_groups(all_keys, outer, group_over, bool(recs.params))

    recs, dropped = _drop_scopes_without(recs, metric)
    grouped = set(groups)

    # Configurations: one index per (phase, target, parameters but the group keys).
    plain = _PLAIN_TYPES.issuperset
    config_keys = [
        (
            phase,
            target,
            tuple(
                sorted(kv for kv in p.items() if kv[0] not in grouped)
                if plain(map(type, p.values()))
                else frozen_items(p, grouped)
            ),
        )
        for phase, target, p in zip(recs.phases, recs.targets, recs.params)
    ]
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
        if status != _DONE or not res:
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
    import numpy as np  # here, not at the top: a report without rows needs none

    columns = [metric] * (metric in values) + sorted(k for k in values if k != metric)
    stats = {
        name: [
            a.tolist()
            for a in _aggregate(
                np.asarray(values[name][0], dtype=np.int64), np.asarray(values[name][1], dtype=np.float64), n_cfg
            )
        ]
        for name in columns
    }

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
        rows.append(
            ConfigRow(
                params=params,
                phase=recs.phases[i],
                target=recs.targets[i],
                outer=params.get(outer_key) if outer_key is not None else None,
                metric=metric,
                stats=row_stats,
                job_ids=metric_ids[c],
                all_job_ids=ids,
                status=dict(sorted(status_counts[c].items())),
                expected=0,
                complete=False,
                eligible=False,
                first_id=_first(ids),
            )
        )

    _judge(rows, allow_incomplete)
    rows, winners = _rank(rows, mode)
    report = Report(
        metric=metric,
        mode=mode,
        group_over=groups,
        outer=outer_key,
        allow_incomplete=allow_incomplete,
        rows=rows,
        constant={},
        varying=[],
        columns=columns,
        jobs=len(recs),
        dropped=dropped,
        best_by_outer=winners,
    )
    report.constant, report.varying = _split_constant([k[2] for k in keys], [r.params for r in rows])
    if outer_key is not None:
        report.overall = over_winners(list(winners.values()), columns)
    return report


def _drop_scopes_without(recs: _Records, metric: str) -> tuple[_Records, list[tuple[int | None, str | None, int]]]:
    """Keep the (phase, target) scopes where some DONE job reports ``metric``."""
    scopes = list(zip(recs.phases, recs.targets))
    done = [i for i, s in enumerate(recs.statuses) if s == _DONE]
    with_metric = {scopes[i] for i in done if is_number((recs.results[i] or {}).get(metric))}
    if not with_metric:
        if done:
            found = sorted(
                {k for i in done for k, v in (recs.results[i] or {}).items() if is_number(v) and not k.startswith("_")}
            )
            listing = ", ".join(found) if found else "none"
            raise UnknownMetric(f"no finished job reports {metric!r} (numeric results: {listing})")
        return recs, []
    counts = Counter(s for s in scopes if s not in with_metric)
    dropped = sorted(((p, t, n) for (p, t), n in counts.items()), key=lambda d: (sort_key(d[0]), str(d[1])))
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
        scope = (r.phase, r.target, frozen(r.outer))
        largest[scope] = max(largest.get(scope, 0), len(r.all_job_ids))
    for r in rows:
        r.expected = largest[(r.phase, r.target, frozen(r.outer))]
        r.complete = r.n == len(r.all_job_ids) == r.expected
        r.eligible = r.n > 0 and (r.complete or allow_incomplete)


def _rank(rows: list[ConfigRow], mode: str) -> tuple[list[ConfigRow], dict[Any, ConfigRow]]:
    """Sort per outer fold: eligible rows by merit, then ineligible ones, then those without the metric."""
    sign = 1.0 if mode == "min" else -1.0

    def merit(r: ConfigRow) -> tuple:
        if not r.n:
            return (2, 0.0, 0, math.inf, sort_key(r.first_id))
        std = r.std if r.std is not None else math.inf
        return (0 if r.eligible else 1, sign * float(f"{r.mean:.12g}"), -r.n, std, sort_key(r.first_id))

    out: list[ConfigRow] = []
    winners: dict[Any, ConfigRow] = {}
    by_outer: dict[Any, list[ConfigRow]] = {}
    for r in rows:
        by_outer.setdefault(frozen(r.outer), []).append(r)
    for key in sorted(by_outer, key=sort_key):
        scope = sorted(by_outer[key], key=merit)
        for rank, r in enumerate(scope, 1):
            r.rank = rank
        if scope and scope[0].eligible:
            scope[0].best = True
            winners[scope[0].outer] = scope[0]
        out.extend(scope)
    return out, winners


def over_winners(winners: list[ConfigRow], columns: list[str]) -> dict[str, Stat]:
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
    constant = {k: params[0][k] for k in order if len(seen[k]) == 1 and present[k] == len(keys) and len(keys) > 1}
    varying = [k for k in order if k not in constant]
    return constant, varying


# -- small helpers ----------------------------------------------------------------------


def _first(ids: list[Any]) -> Any:
    """The id of the job scheduled first (the lowest)."""
    try:
        return min(ids)
    except TypeError:
        return min(ids, key=sort_key)


def _get(rec: Any, name: str, default: Any) -> Any:
    if isinstance(rec, Mapping):
        return rec.get(name, default)
    return getattr(rec, name, default)

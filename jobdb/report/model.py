"""What a report holds: a configuration's statistics, its row, and the ranked report of an experiment.

Both engines (:mod:`.inpython` and :mod:`.indatabase`) build these; the CLI, the web pages and a
fan-in job read them.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..errors import JobmanError, UsageError
from ..selection import format_number, format_param, frozen, group_kind, sort_key
from ..status import Status

STD_DDOF = 1  # sample standard deviation, the usual for cross-validation
AUTO = "auto"
# How a configuration's jobs that are not DONE are named to a reader (others: their status in lower case).
_UNFINISHED = {Status.WAITING.value: "pending", Status.QUEUED.value: "pending", Status.RUNNING.value: "running"}


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
        return self.status.get(Status.DONE.value, 0)

    def not_done(self) -> dict[str, int]:
        """Jobs that are not DONE, by the word a reader expects (failed, crashed, running, pending...)."""
        words: Counter[str] = Counter()
        for status, count in self.status.items():
            if status != Status.DONE.value:
                words[_UNFINISHED.get(status, status.lower())] += count
        return dict(sorted(words.items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "best": self.best,
            "eligible": self.eligible,
            "complete": self.complete,
            "phase": self.phase,
            "target": self.target,
            "outer": self.outer,
            "params": self.params,
            "n": self.n,
            "expected": self.expected,
            "status": self.status,
            "mean": self.mean,
            "std": self.std,
            "job_ids": self.job_ids,
            "results": {k: s.to_dict() for k, s in self.stats.items()},
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
    # A report the database ranked may hold only its first rows (see ``report.indatabase``); then
    # what the writers need of every configuration was counted there, and is given here.
    configurations: int = -1  # every configuration, held in ``rows`` or not
    sample: list[ConfigRow] = field(default_factory=list)  # see ``open_report``
    summary: Overview | None = None
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
        return sorted({r.outer for r in self.rows}, key=sort_key)

    @cached_property
    def scopes(self) -> list[tuple[int | None, str | None]]:
        """The (phase, target) pairs reported on (found once: ``label`` asks for every row)."""
        found = self.summary.scopes if self.summary is not None else {(r.phase, r.target) for r in self.rows}
        return sorted(found, key=lambda s: (sort_key(s[0]), str(s[1])))

    @cached_property
    def constant_results(self) -> dict[str, float]:
        """Results with one value in every run of every configuration (an epoch budget): said once."""
        if self.summary is not None:
            return self.summary.constant_results
        found = {}
        for name in self.columns[1:]:
            stats = [s for r in self.rows if (s := r.stats.get(name)) is not None]
            if len(stats) == len(self.rows) and len({s.min for s in stats} | {s.max for s in stats}) == 1:
                found[name] = stats[0].min
        return found

    def with_metric(self, outer: Any = None) -> tuple[int, int]:
        """(configurations, those with the metric) of one outer fold, or of all when not nested."""
        if self.summary is not None:
            return self.summary.with_metric.get(frozen(outer) if self.outer is not None else None, (0, 0))
        rows = [r for r in self.rows if r.outer == outer] if self.outer is not None else self.rows
        return len(rows), sum(1 for r in rows if r.n)

    def unit(self, n: int) -> str:
        """What a run of a configuration is called: fold, seed, or run."""
        kinds = {group_kind(k) for k in self.group_over}
        word = kinds.pop() if len(kinds) == 1 else None
        word = word or "run"
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
            lines.append(
                f"overall: {', '.join(parts)} over {n} outer fold{'s' if n != 1 else ''} "
                "(each outer fold's best configuration)"
            )
        return lines

    def why_none(self, outer: Any = None) -> str:
        rows, with_metric = self.with_metric(outer)
        if not rows:
            return "no configuration to report on"
        if not with_metric:
            return f"no configuration has a {self.metric} yet"
        return (
            f"no configuration is eligible for best: all {with_metric} with a {self.metric} are missing "
            "runs or have failed ones (--allow-incomplete accepts them)"
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metric": self.metric,
            "mode": self.mode,
            "group_over": self.group_over,
            "outer": self.outer,
            "std": f"sample standard deviation (ddof={STD_DDOF}); null when n is 1",
            "allow_incomplete": self.allow_incomplete,
            "jobs": self.jobs,
            "constant": self.constant,
            "varying": self.varying,
            "columns": self.columns,
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

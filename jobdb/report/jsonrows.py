"""The JSON of a report's rows written straight from the database's rows, a list at a time.

A million configurations are written in seconds, not in the minutes their ``ConfigRow`` objects and
``json.dumps`` would take. The text is the one ``json.dumps(ConfigRow.to_dict())`` gives, key for key.
What is known once per report (each result's name, the text around its numbers) is made into format
strings here; per row there is then a few comparisons, a ``repr`` per number and one f-string.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Sequence

from ..status import Status

_TRUTH = {True: "true", False: "false"}
_DONE = Status.DONE.value


class RowJson:
    """Rows of ``queries.ranked`` (as ``ranked_query(ids=False)`` reads them) as JSON text."""

    def __init__(self, columns: Sequence[str], outer_key: str | None, width: int) -> None:
        self.outer_key = outer_key
        self.width = width
        self.shown = len(columns)  # the results shown: all ``width`` of them, or none (no metric)
        self.keys = [json.dumps(c) for c in columns]
        self.targets: dict[Any, str] = {}

    def rows(self, batch: Sequence[Sequence[Any]], rank: int) -> list[str]:
        """The JSON of each row of ``batch``, ranked from ``rank`` on."""
        if self.shown and batch:
            fast = self._one_run_rows(batch, rank)
            if fast is not None:
                return fast
        out: list[str] = []
        append = out.append
        end = 8 + 5 * self.width
        shown = self.shown
        targets, target_text, outer_of = self.targets, self._target, self._outer if self.outer_key else None
        for row in batch:
            phase, target, cfg, jobs, _, others, _, mids = row[:8]
            expected, cls = row[end], row[end + 1]
            t = targets.get(target) or target_text(target)
            o = outer_of(cfg) if outer_of else "null"
            if shown:
                nm, mean, std, results = self._results(row, end)
            else:
                nm, mean, std, results = 0, "null", "null", ""
            status = _statuses(others, jobs) if others else f'{{"{_DONE}": {jobs}}}'
            ids = "[]" if not mids else _job_ids(mids) if "," in mids else "[" + mids + "]"
            ok = cls == 0
            append(f'{{"rank": {rank}, "best": {_TRUTH[rank == 1 and ok]}, "eligible": {_TRUTH[ok]}, '
                   f'"complete": {_TRUTH[nm == jobs == expected]}, "phase": {phase}, "target": {t}, '
                   f'"outer": {o}, "params": {cfg}, "n": {nm}, "expected": {expected}, '
                   f'"status": {status}, "mean": {mean}, "std": {std}, "job_ids": {ids}, '
                   f'"results": {{{results}}}}}')
            rank += 1
        return out

    def _one_run_rows(self, batch: Sequence[Sequence[Any]], rank: int) -> list[str] | None:
        """The rows of a batch whose every row is one DONE job with every result finite (a sweep without
        folds or seeds), written a column at a time; None for any other batch."""
        end = 8 + 5 * self.width
        cols = list(zip(*batch))
        size = len(batch)
        jobs, others = cols[3], cols[5]
        if jobs.count(1) != size or others.count(None) != size:
            return None
        if any(cols[at].count(1) != size for at in range(8, end, 5)):
            return None
        means = [list(map(repr, cols[at + 3])) for at in range(8, end, 5)]
        if any("n" in "".join(m) for m in means):  # 'inf' or 'nan': not finite, written otherwise
            return None
        texts = [[f'{key}: {{"n": 1, "mean": {m}, "std": null, "min": {m}, "max": {m}}}' for m in column]
                 for key, column in zip(self.keys, means)]
        results = texts[0] if len(texts) == 1 else list(map(", ".join, zip(*texts)))
        targets, target_text = self.targets, self._target
        outer = list(map(self._outer, cols[2])) if self.outer_key else ["null"] * size
        out: list[str] = []
        append = out.append
        for phase, target, cfg, mids, o, expected, cls, mean, res in zip(
                cols[0], cols[1], cols[2], cols[7], outer, cols[end], cols[end + 1], means[0], results):
            t = targets.get(target) or target_text(target)
            ok = cls == 0
            append(f'{{"rank": {rank}, "best": {_TRUTH[rank == 1 and ok]}, "eligible": {_TRUTH[ok]}, '
                   f'"complete": {_TRUTH[expected == 1]}, "phase": {phase}, "target": {t}, "outer": {o}, '
                   f'"params": {cfg}, "n": 1, "expected": {expected}, "status": {{"DONE": 1}}, '
                   f'"mean": {mean}, "std": null, "job_ids": [{mids}], "results": {{{res}}}}}')
            rank += 1
        return out

    def _results(self, row: Sequence[Any], end: int) -> tuple[int, str, str, str]:
        """(runs with the metric, the metric's mean and std as JSON, every result's JSON) of one row."""
        parts = []
        mean = std = "null"
        for i, (key, at) in enumerate(zip(self.keys, range(8, end, 5))):
            n, s, q, lo, hi = row[at:at + 5]
            if not n:
                m, sd = "null", "null"
            elif lo == hi:  # one value (one run, or equal runs): mean, min and max are one number
                m = repr(lo) if math.isfinite(lo) else _num(lo)
                sd = "0.0" if n > 1 else "null"
                parts.append(f'{key}: {{"n": {n}, "mean": {m}, "std": {sd}, "min": {m}, "max": {m}}}')
            else:
                text, m, sd = _spread(key, n, s, q, lo, hi)
                parts.append(text)
            if i == 0:
                mean, std = m, sd
        return row[8], mean, std, ", ".join(parts)

    def _target(self, target: Any) -> str:
        text = self.targets[target] = json.dumps(target)
        return text

    def _outer(self, cfg: str) -> str:
        return json.dumps(json.loads(cfg).get(self.outer_key))


def _spread(name: str, n: int, s: float, q: float, lo: float, hi: float) -> tuple[str, str, str]:
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
        counts[_DONE] = done
    return json.dumps(dict(sorted(counts.items())))


def _job_ids(ids: str) -> str:
    return "[" + ", ".join(map(str, sorted(map(int, ids.split(","))))) + "]"


def _num(x: float) -> str:
    return float.__repr__(x) if math.isfinite(x) else json.dumps(x)

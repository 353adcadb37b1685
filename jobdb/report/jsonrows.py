"""The JSON of a report's rows written straight from the database's rows, a list at a time.

A million configurations are written in seconds, not in the minutes their ``ConfigRow`` objects and
``json.dumps`` would take. The text is the one ``json.dumps(ConfigRow.to_dict())`` gives, key for key.
Each row is unpacked in the loop's target, the metric's numbers by name: per row there is then a few
comparisons, a ``repr`` per number and one f-string.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

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
        self.more_keys = self.keys[1:]  # the results after the metric
        self.targets: dict[Any, str] = {}

    def rows(self, batch: Sequence[Sequence[Any]], rank: int) -> list[str]:
        """The JSON of each row of ``batch``, ranked from ``rank`` on.

        A row is (phase, target, cfg, jobs, first id, others, ids, metric ids, then n, sum, sum of
        squares, min and max of the metric and of each other result, then expected, class, mean,
        variance): the metric's five are named, the other results' are ``more``."""
        out: list[str] = []
        append = out.append
        shown, k0, more_keys = self.shown, self.keys[0] if self.keys else "", self.more_keys
        targets, target_text, outer_of = self.targets, self._target, self._outer if self.outer_key else None
        for phase, target, cfg, jobs, _, others, _, mids, n0, s0, q0, lo0, hi0, *more, expected, cls, _, _ in batch:
            t = targets.get(target) or target_text(target)
            o = outer_of(cfg) if outer_of else "null"
            ok = cls == 0
            if shown and jobs == 1 and others is None and n0 == 1:
                # One DONE job with every result (a sweep without folds or seeds): most of its text is known.
                m0 = repr(lo0)
                rest: str | None = ""
                if more:  # the results after the metric
                    text = ""
                    for key, at in zip(more_keys, range(0, len(more), 5)):
                        m = repr(more[at + 3])
                        if more[at] != 1 or m[-1] > "9":  # missing, or 'inf' or 'nan'
                            rest = None
                            break
                        text += f', {key}: {{"n": 1, "mean": {m}, "std": null, "min": {m}, "max": {m}}}'
                    else:
                        rest = text
                if m0[-1] <= "9" and rest is not None:  # finite: a finite number's repr ends in a digit
                    if ok and expected == 1 and rank > 1:  # most rows of such a sweep
                        head = f'{{"rank": {rank}, "best": false, "eligible": true, "complete": true, '
                    else:
                        head = (
                            f'{{"rank": {rank}, "best": {_TRUTH[rank == 1 and ok]}, "eligible": {_TRUTH[ok]}, '
                            f'"complete": {_TRUTH[expected == 1]}, '
                        )
                    append(
                        f'{head}"phase": {phase}, "target": {t}, "outer": {o}, '
                        f'"params": {cfg}, "n": 1, "expected": {expected}, "status": {{"DONE": 1}}, '
                        f'"mean": {m0}, "std": null, "job_ids": [{mids}], "results": {{{k0}: {{"n": 1, '
                        f'"mean": {m0}, "std": null, "min": {m0}, "max": {m0}}}{rest}}}}}'
                    )
                    rank += 1
                    continue
            if shown:
                results, m0, sd0 = _result(k0, n0, s0, q0, lo0, hi0)
                if more:
                    rest = self._results(more)
                    results = results + rest if results else rest[2:]
                nm = n0
            else:
                nm, m0, sd0, results = 0, "null", "null", ""
            status = _statuses(others, jobs) if others else f'{{"{_DONE}": {jobs}}}'
            ids = "[]" if not mids else _job_ids(mids) if "," in mids else "[" + mids + "]"
            append(
                f'{{"rank": {rank}, "best": {_TRUTH[rank == 1 and ok]}, "eligible": {_TRUTH[ok]}, '
                f'"complete": {_TRUTH[nm == jobs == expected]}, "phase": {phase}, "target": {t}, '
                f'"outer": {o}, "params": {cfg}, "n": {nm}, "expected": {expected}, '
                f'"status": {status}, "mean": {m0}, "std": {sd0}, "job_ids": {ids}, '
                f'"results": {{{results}}}}}'
            )
            rank += 1
        return out

    def _results(self, more: list[Any]) -> str:
        """The results after the metric of any row, each that is there after ", "."""
        texts = [_result(key, *more[at : at + 5])[0] for key, at in zip(self.more_keys, range(0, len(more), 5))]
        return "".join([", " + text for text in texts if text])

    def _target(self, target: Any) -> str:
        text = self.targets[target] = json.dumps(target)
        return text

    def _outer(self, cfg: str) -> str:
        return json.dumps(json.loads(cfg).get(self.outer_key))


def _result(name: str, n: int, s: float, q: float, lo: float, hi: float) -> tuple[str, str, str]:
    """The JSON of one result of a configuration: (its text, empty when no run has it; its mean; its std)."""
    if not n:
        return "", "null", "null"
    if lo == hi:  # one value (one run, or equal runs): mean, min and max are one number
        m = repr(lo) if math.isfinite(lo) else _num(lo)
        sd = "0.0" if n > 1 else "null"
        return f'{name}: {{"n": {n}, "mean": {m}, "std": {sd}, "min": {m}, "max": {m}}}', m, sd
    return _spread(name, n, s, q, lo, hi)


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

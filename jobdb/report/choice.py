"""What a report ranks by when nobody said: the result a researcher most likely means, min or max,
and the phase. The dashboard and a notebook's view of an experiment choose alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..dashboard import job_page
from ..errors import UsageError
from ..status import Status
from .model import Report

if TYPE_CHECKING:
    from ..store import Store

_PREFERRED = ("valid_error", "val_error", "valid_loss", "val_loss", "error", "loss", "test_error", "accuracy")
_HIGHER_IS_BETTER = ("acc", "score", "auc", "f1", "r2", "reward", "precision", "recall")


def guess_metric(results: dict[str, Any] | None) -> str | None:
    """The result a researcher most likely ranks by: a validation error if there is one."""
    numeric = sorted(k for k, v in (results or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    for name in _PREFERRED:
        if name in numeric:
            return name
    return numeric[0] if numeric else None


def guess_mode(metric: str) -> str:
    return "max" if any(word in metric.lower() for word in _HIGHER_IS_BETTER) else "min"


@dataclass(frozen=True)
class Choice:
    """What a report ranks: a metric, min or max, and a phase (None: every phase)."""

    metric: str | None
    mode: str
    phase: int | None


def choose(
    store: Store,
    metric: str | None = None,
    mode: str | None = None,
    phase: str | None = None,
    *,
    counts: dict[tuple[int, str], int] | None = None,
) -> Choice:
    """The report a reader most likely wants, unless asked otherwise: the phase with the most DONE
    jobs that carry a result, ranked by its validation error if it has one. A learning search says
    what it optimises: its first metric, in the direction it was told (``f1`` is then an error to
    lower, not a score)."""
    if mode not in (None, "min", "max"):
        raise UsageError("the mode is min or max")
    told = store.search_objectives()
    metric = metric or (told[0][0] if told else None)
    mode = mode or dict(told).get(metric or "")
    asked = None if phase in (None, "", "all") else _whole_number(phase)
    done: dict[int, int] = {}
    for (p, status), n in (store.counts() if counts is None else counts).items():
        if status == Status.DONE.value:
            done[p] = n
    chosen: int | None = None
    for p in [asked] if asked is not None else sorted(done, key=lambda p: (-done[p], p)):
        # The newest DONE job of the phase by id: read from the end of an index, not sorted.
        sample = job_page(store, status=[Status.DONE], phase=p, sort="id", descending=True, limit=1, count=False)
        results = sample.jobs[0].results if sample.jobs else None
        found = metric if metric and metric in (results or {}) else guess_metric(results) if not metric else None
        if found:
            metric, chosen = found, p
            break
    if asked is None and phase not in (None, ""):
        chosen = None  # "all"
    elif asked is not None:
        chosen = asked
    return Choice(metric, mode or (guess_mode(metric) if metric else "min"), chosen)


def best_of(rep: Report | None) -> dict[str, Any] | None:
    if rep is None:
        return None
    winner = rep.best or next(iter(rep.best_by_outer.values()), None)
    if not winner or winner.mean is None:
        return None
    return {
        "metric": rep.metric,
        "mode": rep.mode,
        "value": winner.mean,
        "std": winner.std,
        "label": rep.label(winner),
        "job_id": winner.first_id,
    }


def _whole_number(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise UsageError(f"the phase must be a whole number, not {text!r}") from None

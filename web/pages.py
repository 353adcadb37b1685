"""What each page shows, gathered through the store's verbs, ``jobdb.dashboard`` and ``jobdb.report``.

No SQL here: a page is a dict for its template, built from the same reads the CLI makes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from jobman.dispatch.jobfiles import read_tail
from jobman.jobdb import dashboard, report, selection
from jobman.jobdb.errors import JobmanError, UsageError
from jobman.jobdb.status import Status, parse_status
from jobman.jobdb.store import Store
from jobman.jobdb.url import DbTarget, parse_db

from . import charts

PAGE_SIZE = 50
TAIL_BYTES = 4000
REPORT_ROWS = 50  # configurations listed in the report view (all of them feed its best)
CHART_POINTS = 1000  # configurations drawn in a scatter; more are thinned evenly
PARALLEL_LINES = 200
CURVES = 8  # learning curves overlaid by default
BEST_TTL = 10.0  # seconds a best result of the experiments page is kept while jobs keep finishing
_PREFERRED = ("valid_error", "val_error", "valid_loss", "val_loss", "error", "loss", "test_error", "accuracy")
_HIGHER_IS_BETTER = ("acc", "score", "auc", "f1", "r2", "reward", "precision", "recall")


@dataclass
class Database:
    """The database a server shows: one engine shared by a store per experiment."""

    url: str
    target: DbTarget
    engine: Engine

    @classmethod
    def open(cls, url: str) -> Database:
        target = parse_db(url)
        store = Store(target, create=False)  # refuses a missing database or an old schema, in one sentence
        return cls(url, target, store.engine)

    def store(self, experiment: str) -> Store:
        return Store(parse_db(self.url, experiment), engine=self.engine, check_schema=False)

    def any_store(self) -> Store:
        return Store(self.target, engine=self.engine, check_schema=False)


def guess_metric(results: dict[str, Any] | None) -> str | None:
    """The result a researcher most likely ranks by: a validation error if there is one."""
    numeric = sorted(k for k, v in (results or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    for name in _PREFERRED:
        if name in numeric:
            return name
    return numeric[0] if numeric else None


def guess_mode(metric: str) -> str:
    return "max" if any(word in metric.lower() for word in _HIGHER_IS_BETTER) else "min"


class ReportCache:
    """Reports already built, by experiment, metric and mode: each holds the configurations shown and
    a spread of them for the charts, while the database ranks them all.

    One is built again when its experiment's status counts changed, but not more often than every
    FRESH seconds while jobs keep finishing, and at least every STALE seconds (a reset and a new
    run can leave the counts as they were).
    """

    FRESH, STALE = 10.0, 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[tuple, tuple[tuple, float, report.Report]] = {}
        self._drawn: dict[tuple, tuple[report.Report, Any]] = {}
        self.bests: dict[str, dict[str, Any] | None] = {}  # the experiments page's, as last found

    def drawn(self, experiment: str, choice: Choice, rep: report.Report, draw: Callable[[], Any]) -> Any:
        """What ``draw`` makes of ``rep`` (its charts), made once per report built."""
        key = (experiment, choice)
        with self._lock:
            found = self._drawn.get(key)
        if found is None or found[0] is not rep:
            found = (rep, draw())
            with self._lock:
                self._drawn[key] = found
        return found[1]

    def get(self, store: Store, choice: Choice, counts: dict[str, int]) -> report.Report:
        key, version, now = (store.experiment, choice), tuple(sorted(counts.items())), time.time()
        with self._lock:
            found = self._built.get(key)
        if found and now - found[1] < (self.STALE if found[0] == version else self.FRESH):
            return found[2]
        assert choice.metric is not None
        # The configurations shown and a spread of them for the charts; the rest stays in the database.
        with report.open_report(
            store,
            choice.metric,
            choice.mode,
            phase=choice.phase,
            allow_incomplete=True,
            keep=REPORT_ROWS,
            sample=CHART_POINTS,
            parallel=True,
        ) as built:
            pass
        with self._lock:
            self._built[key] = (version, now, built)
        return built


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
    jobs that carry a result, ranked by its validation error if it has one."""
    if mode not in (None, "min", "max"):
        raise UsageError("the mode is min or max")
    asked = None if phase in (None, "", "all") else whole_number(phase, "phase")
    done: dict[int, int] = {}
    for (p, status), n in (store.counts() if counts is None else counts).items():
        if status == Status.DONE.value:
            done[p] = n
    chosen: int | None = None
    for p in [asked] if asked is not None else sorted(done, key=lambda p: (-done[p], p)):
        # The newest DONE job of the phase by id: read from the end of an index, not sorted.
        sample = dashboard.job_page(
            store, status=[Status.DONE], phase=p, sort="id", descending=True, limit=1, count=False
        )
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


def best_of(rep: report.Report | None) -> dict[str, Any] | None:
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


def experiments(db: Database, reports: ReportCache, *, build: bool = True) -> dict[str, Any]:
    """Every experiment's summary and best result; without ``build``, only the bests already known
    (the first paint of the page does not wait for a report of 100,000 jobs)."""
    rows = []
    for s in dashboard.experiment_summaries(db.any_store()):
        best, pending = None, False
        if s.counts.get(Status.DONE.value) and build:
            store = db.store(s.name)
            choice = choose(store)
            if choice.metric:
                try:
                    best = best_of(reports.get(store, choice, s.counts))
                except JobmanError:
                    best = None
            reports.bests[s.name] = best
        elif s.counts.get(Status.DONE.value):
            pending = s.name not in reports.bests
            best = reports.bests.get(s.name)
        rows.append({"s": s, "best": best, "pending": pending})
    return {"experiments": rows}


@dataclass
class Listing:
    """The experiment page's job-table query, read from the page's URL."""

    status: list[Status]
    phase: int | None
    where: list[selection.Condition]
    sort: str
    descending: bool
    page: int

    @classmethod
    def from_query(cls, q: dict[str, str]) -> Listing:
        statuses = [parse_status(v) for v in q.get("status", "").split(",") if v.strip()]
        phase = whole_number(q.get("phase"), "phase") if q.get("phase", "").strip() else None
        where = [selection.parse_where(w.strip()) for w in q.get("where", "").split(",") if w.strip()]
        sort = q.get("sort", "id") or "id"
        page = whole_number(q.get("page", "0") or "0", "page")
        if page < 0:
            raise UsageError("the page number is 0 or more")
        return cls(statuses, phase, where, sort.lstrip("-"), sort.startswith("-"), page)

    def query(self, **change: Any) -> dict[str, str]:
        """The URL query of this listing with some of it changed (for links: next page, sort by)."""
        values = {
            "status": ",".join(s.value for s in self.status),
            "phase": "" if self.phase is None else str(self.phase),
            "where": ",".join(str(c) for c in self.where),
            "sort": ("-" if self.descending else "") + self.sort,
            "page": str(self.page),
        }
        values.update({k: str(v) for k, v in change.items()})
        return {k: v for k, v in values.items() if v not in ("", "0") or k == "phase" and v == "0"}


def job_table(store: Store, listing: Listing) -> dict[str, Any]:
    found = dashboard.job_page(
        store,
        status=listing.status,
        phase=listing.phase,
        where=listing.where,
        sort=listing.sort,
        descending=listing.descending,
        offset=listing.page * PAGE_SIZE,
        limit=PAGE_SIZE,
    )
    keys: list[str] = []
    for j in found.jobs:
        keys.extend(k for k in j.params if k not in keys)
    result_keys: list[str] = []
    for j in found.jobs:
        result_keys.extend(
            k
            for k, v in (j.results or {}).items()
            if k not in result_keys and isinstance(v, (int, float)) and not isinstance(v, bool)
        )
    return {
        "page": found,
        "listing": listing,
        "param_keys": keys[:8],
        "result_keys": result_keys[:4],
        "pages": max((found.total + PAGE_SIZE - 1) // PAGE_SIZE, 1),
    }


def progress(store: Store, counts: dict[tuple[int, str], int]) -> dict[str, Any]:
    phases = sorted({p for p, _ in counts})
    by_phase = {p: {s: n for (q, s), n in counts.items() if q == p} for p in phases}
    total: dict[str, int] = {}
    for (_, s), n in counts.items():
        total[s] = total.get(s, 0) + n
    return {"by_phase": by_phase, "total": total, "links": dashboard.phase_links(store)}


def report_view(
    store: Store, reports: ReportCache, choice: Choice, counts: dict[tuple[int, str], int]
) -> dict[str, Any]:
    if choice.metric is None:
        return {"report": None, "why": "no job has a numeric result yet"}
    totals: dict[str, int] = {}
    for (_, status), n in counts.items():
        totals[status] = totals.get(status, 0) + n
    rep = reports.get(store, choice, totals)
    return {
        "report": rep,
        "rows": rep.rows[:REPORT_ROWS],
        "charts": reports.drawn(store.experiment, choice, rep, lambda: _charts(rep)),
    }


def _charts(rep: report.Report) -> dict[str, Any]:
    rows = rep.sample  # at most CHART_POINTS configurations with the metric, evenly spaced over the ranking
    best = rep.best
    # Parameters every plotted configuration has (a one-off extra parameter makes no axis).
    keys = [k for k in rep.varying if k != rep.outer and all(k in r.params for r in rows)]
    labels = [rep.label(r) for r in rows]  # once per configuration, not once per chart
    scatters = []
    for key in keys:
        pts = [(r.params[key], r.mean, label) for r, label in zip(rows, labels)]
        scatters.append((key, charts.scatter(pts, key, rep.metric, best=rep.label(best) if best else None)))
    lines = rows[:PARALLEL_LINES]
    par = (
        charts.parallel(
            keys, [([r.params.get(k) for k in keys], r.mean, label) for r, label in zip(lines, labels)], rep.metric
        )
        if keys
        else None
    )
    return {"scatters": scatters, "parallel": par, "points": len(rows)}


def curves(store: Store, job_ids: list[int]) -> dict[str, Any]:
    """The learning curves (``job_metric``) of some jobs, one chart per metric name."""
    by_name: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for job_id, step, name, value in store.metrics(job_ids):
        by_name.setdefault(name, {}).setdefault(job_id, []).append((step, value))
    return {
        "curve_ids": job_ids,
        "curve_charts": [
            (name, charts.lines([(f"job {j}", pts) for j, pts in sorted(per_job.items())], "step", name))
            for name, per_job in sorted(by_name.items())
        ],
    }


def default_curve_ids(store: Store) -> list[int]:
    """Jobs whose curves the experiment page overlays when none were chosen: running ones, then the newest done."""
    running = store.jobs(status=[Status.RUNNING], with_deps=False, limit=CURVES)
    ids = [j.id for j in running]
    if len(ids) < CURVES:
        latest = dashboard.job_page(store, status=[Status.DONE], sort="id", descending=True, limit=CURVES, count=False)
        ids += [j.id for j in latest.jobs][: CURVES - len(ids)]
    return sorted(ids)


def job_view(store: Store, job_id: int) -> dict[str, Any]:
    job = store.job(job_id)
    workdir = own_workdir(job.workdir, job_id, store.experiment)
    return {
        "job": job,
        "events": store.events(job_id),
        "parents": store.parents(job_id),
        "children": store.children(job_id),
        "files": workdir_files(workdir),
        "tails": tails(workdir, job.log_path),
        "diff": code_diff(store, job.code),
        **curves(store, [job_id]),
    }


DIFF_SHOWN = 200_000  # characters of a diff shown on the page; all of it from ``jobman show ID --diff``


def code_diff(store: Store, record: dict[str, Any] | None) -> str | None:
    """The uncommitted changes the job's code record names, cut for the page, or None."""
    key = ((record or {}).get("code") or {}).get("diff")
    found = store.code_text(key) if isinstance(key, str) else None
    if found is None:
        return None
    body = found[1]
    return body if len(body) <= DIFF_SHOWN else body[:DIFF_SHOWN] + "\n[cut: jobman show ID --diff prints all of it]"


def own_workdir(workdir: str | None, job_id: int, experiment: str) -> Path | None:
    """The job's workdir as stored, if it is where jobman makes one (RUNS/EXPERIMENT/ID): a value
    changed in the database must not turn the dashboard into a reader of any folder."""
    if not workdir:
        return None
    path = Path(os.path.abspath(workdir))
    return path if path.name == str(job_id) and path.parent.name == experiment else None


def workdir_files(workdir: Path | None) -> list[tuple[str, int]]:
    """(name, bytes) of the files a job left in its working directory, if this host can see it.
    Symlinks are listed as themselves (never followed), so no file outside shows through them."""
    if workdir is None or not workdir.is_dir():
        return []
    out = []
    for root, _, files in os.walk(workdir):
        for name in files:
            path = Path(root) / name
            try:
                out.append((str(path.relative_to(workdir)), path.lstat().st_size))
            except OSError:
                continue
            if len(out) >= 200:
                return sorted(out)
    return sorted(out)


def tails(workdir: Path | None, log_path: str | None) -> list[tuple[str, str]]:
    """The last few kilobytes of a job's stdout and stderr (regular files inside its workdir only),
    and of its backend's log (inside the run folder the workdir belongs to)."""
    if workdir is None:
        return []
    paths = [(workdir / "stdout.txt", workdir), (workdir / "stderr.txt", workdir)]
    if log_path:
        paths.append((Path(log_path), workdir.parent))
    out = []
    for path, root in paths:
        try:
            text = read_tail(path, root, TAIL_BYTES).decode("utf-8", "replace")
        except OSError:  # missing, or not to be shown (a FIFO, a device, a symlink leading out)
            continue
        if text.strip():
            out.append((path.name, text))
    return out


def whole_number(text: str | None, what: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise UsageError(f"the {what} must be a whole number, not {text!r}") from None

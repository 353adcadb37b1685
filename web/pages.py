"""What each page shows, gathered through the store's verbs, ``jobdb.browse`` and ``jobdb.report``.

No SQL here: a page is a dict for its template, built from the same reads the CLI makes.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from jobman.jobdb import browse, report
from jobman.jobdb.errors import JobmanError, UsageError
from jobman.jobdb.status import Status, parse_status
from jobman.jobdb.store import Store
from jobman.jobdb.url import DbTarget, parse_db

from . import charts

PAGE_SIZE = 50
TAIL_BYTES = 4000
REPORT_ROWS = 50  # configurations listed in the report view (all of them feed its best)
CHART_POINTS = 2000  # configurations drawn in a scatter; more are thinned evenly
PARALLEL_LINES = 400
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
    def open(cls, url: str) -> "Database":
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


class BestCache:
    """Each experiment's best result, recomputed when its jobs changed and at most every BEST_TTL seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[tuple, float, Any]] = {}

    def get(self, db: Database, summary: browse.ExperimentSummary) -> dict[str, Any] | None:
        key = (summary.counts.get("DONE", 0), summary.last_finished)
        with self._lock:
            seen = self._seen.get(summary.name)
        if seen and (seen[0] == key or time.time() - seen[1] < BEST_TTL):
            return seen[2]
        value = best_of(db.store(summary.name)) if key[0] else None
        with self._lock:
            self._seen[summary.name] = (key, time.time(), value)
        return value


def best_of(store: Store, metric: str | None = None, mode: str | None = None) -> dict[str, Any] | None:
    done = store.jobs(status=[Status.DONE], with_deps=False, limit=1)
    metric = metric or guess_metric(done[0].results if done else None)
    if metric is None:
        return None
    try:
        rep = report.from_store(store, metric, mode or guess_mode(metric), allow_incomplete=True)
    except JobmanError:
        return None
    winner = rep.best or next(iter(rep.best_by_outer.values()), None)
    if winner is None or winner.mean is None:
        return None
    return {"metric": metric, "mode": rep.mode, "value": winner.mean, "std": winner.std, "label": rep.label(winner),
            "job_id": winner.first_id}


def experiments(db: Database, cache: BestCache) -> dict[str, Any]:
    rows = []
    for s in browse.experiment_summaries(db.any_store()):
        rows.append({"s": s, "best": cache.get(db, s)})
    return {"experiments": rows}


@dataclass
class Listing:
    """The experiment page's job-table query, read from the page's URL."""

    status: list[Status]
    phase: int | None
    where: list[report.Condition]
    sort: str
    descending: bool
    page: int

    @classmethod
    def from_query(cls, q: dict[str, str]) -> "Listing":
        statuses = [parse_status(v) for v in q.get("status", "").split(",") if v.strip()]
        phase = _int(q.get("phase"), "phase") if q.get("phase", "").strip() else None
        where = [report.parse_where(w.strip()) for w in q.get("where", "").split(",") if w.strip()]
        sort = q.get("sort", "id") or "id"
        page = _int(q.get("page", "0") or "0", "page")
        if page < 0:
            raise UsageError("the page number is 0 or more")
        return cls(statuses, phase, where, sort.lstrip("-"), sort.startswith("-"), page)

    def query(self, **change: Any) -> dict[str, str]:
        """The URL query of this listing with some of it changed (for links: next page, sort by)."""
        values = {"status": ",".join(s.value for s in self.status), "phase": "" if self.phase is None else str(self.phase),
                  "where": ",".join(str(c) for c in self.where),
                  "sort": ("-" if self.descending else "") + self.sort, "page": str(self.page)}
        values.update({k: str(v) for k, v in change.items()})
        return {k: v for k, v in values.items() if v not in ("", "0") or k == "phase" and v == "0"}


def job_table(store: Store, listing: Listing) -> dict[str, Any]:
    found = browse.job_page(store, status=listing.status, phase=listing.phase, where=listing.where,
                            sort=listing.sort, descending=listing.descending,
                            offset=listing.page * PAGE_SIZE, limit=PAGE_SIZE)
    keys: list[str] = []
    for j in found.jobs:
        keys.extend(k for k in j.params if k not in keys)
    result_keys: list[str] = []
    for j in found.jobs:
        result_keys.extend(k for k, v in (j.results or {}).items()
                           if k not in result_keys and isinstance(v, (int, float)) and not isinstance(v, bool))
    return {"page": found, "listing": listing, "param_keys": keys[:8], "result_keys": result_keys[:4],
            "pages": max((found.total + PAGE_SIZE - 1) // PAGE_SIZE, 1)}


def progress(store: Store) -> dict[str, Any]:
    counts = store.counts()
    phases = sorted({p for p, _ in counts})
    by_phase = {p: {s: n for (q, s), n in counts.items() if q == p} for p in phases}
    total: dict[str, int] = {}
    for (_, s), n in counts.items():
        total[s] = total.get(s, 0) + n
    return {"by_phase": by_phase, "total": total, "links": browse.phase_links(store)}


def report_view(store: Store, metric: str | None, mode: str | None) -> dict[str, Any]:
    done = store.jobs(status=[Status.DONE], with_deps=False, limit=1)
    metric = metric or guess_metric(done[0].results if done else None)
    if metric is None:
        return {"report": None, "why": "no job has a numeric result yet"}
    mode = mode or guess_mode(metric)
    if mode not in ("min", "max"):
        raise UsageError("the mode is min or max")
    rep = report.from_store(store, metric, mode, allow_incomplete=True)
    return {"report": rep, "metric": metric, "mode": mode, "rows": rep.rows[:REPORT_ROWS], "charts": _charts(rep)}


def _charts(rep: report.Report) -> dict[str, Any]:
    rows = [r for r in rep.rows if r.mean is not None]
    if len(rows) > CHART_POINTS:
        rows = rows[:: len(rows) // CHART_POINTS + 1]
    best = rep.best
    # Parameters every plotted configuration has (a one-off extra parameter makes no axis).
    keys = [k for k in rep.varying if k != rep.outer and all(k in r.params for r in rows)]
    scatters = []
    for key in keys:
        pts = [(r.params[key], r.mean, rep.label(r)) for r in rows]
        scatters.append((key, charts.scatter(pts, key, rep.metric, best=rep.label(best) if best else None)))
    lines = rows[:PARALLEL_LINES]
    par = charts.parallel(keys, [([r.params.get(k) for k in keys], r.mean, rep.label(r)) for r in lines], rep.metric) \
        if keys else None
    return {"scatters": scatters, "parallel": par, "points": len(rows)}


def curves(store: Store, job_ids: list[int]) -> dict[str, Any]:
    """The learning curves (``job_metric``) of some jobs, one chart per metric name."""
    by_name: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for job_id, step, name, value in store.metrics(job_ids):
        by_name.setdefault(name, {}).setdefault(job_id, []).append((step, value))
    return {"curve_ids": job_ids,
            "curve_charts": [(name, charts.lines([(f"job {j}", pts) for j, pts in sorted(per_job.items())],
                                                 "step", name)) for name, per_job in sorted(by_name.items())]}


def default_curve_ids(store: Store) -> list[int]:
    """Jobs whose curves the experiment page overlays when none were chosen: running ones, then the latest done."""
    running = store.jobs(status=[Status.RUNNING], with_deps=False, limit=CURVES)
    ids = [j.id for j in running]
    if len(ids) < CURVES:
        latest = browse.job_page(store, status=[Status.DONE], sort="finished_at", descending=True, limit=CURVES)
        ids += [j.id for j in latest.jobs][: CURVES - len(ids)]
    return sorted(ids)


def job_view(store: Store, job_id: int) -> dict[str, Any]:
    job = store.job(job_id)
    return {"job": job, "events": store.events(job_id), "parents": store.parents(job_id),
            "children": store.children(job_id), "files": workdir_files(job.workdir),
            "tails": tails(job.workdir, job.log_path), **curves(store, [job_id])}


def workdir_files(workdir: str | None) -> list[tuple[str, int]]:
    """(name, bytes) of the files a job left in its working directory, if this host can see it."""
    if not workdir or not os.path.isdir(workdir):
        return []
    out = []
    for root, _, files in os.walk(workdir):
        for name in files:
            path = Path(root) / name
            try:
                out.append((str(path.relative_to(workdir)), path.stat().st_size))
            except OSError:
                continue
            if len(out) >= 200:
                return sorted(out)
    return sorted(out)


def tails(workdir: str | None, log_path: str | None) -> list[tuple[str, str]]:
    """The last few kilobytes of a job's stdout, stderr and backend log."""
    paths = []
    if workdir:
        paths += [Path(workdir) / "stdout.txt", Path(workdir) / "stderr.txt"]
    if log_path:
        paths.append(Path(log_path))
    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(size - TAIL_BYTES, 0))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        if text.strip():
            out.append((path.name, text))
    return out


def _int(text: str | None, what: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise UsageError(f"the {what} must be a whole number, not {text!r}") from None

"""What each page shows, gathered through the store's verbs, ``jobdb.dashboard`` and ``jobdb.report``.

No SQL here: a page is a dict for its template, built from the same reads the CLI makes.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from sqlalchemy.engine import Engine

from jobman.dispatch.gang import RANK_LOG, rank_places
from jobman.dispatch.jobfiles import read_tail
from jobman.jobdb import artifacts, dashboard, report, selection
from jobman.jobdb.engine import bound_lock_waits
from jobman.jobdb.errors import JobmanError, UsageError
from jobman.jobdb.report.choice import Choice, best_of, choose
from jobman.jobdb.report.scales import log_axis
from jobman.jobdb.status import DISPLAY_ORDER, Status, parse_status
from jobman.jobdb.store import Store
from jobman.jobdb.url import DbTarget, parse_db

from . import charts

PAGE_SIZE = 50
TAIL_BYTES = 4000
REPORT_ROWS = 50  # configurations listed in the report view (all of them feed its best)
CHART_POINTS = 1000  # configurations drawn in a scatter; more are thinned evenly
PARALLEL_LINES = 200
CURVES = 8  # learning curves overlaid by default
FILE_READ_SECONDS = 2.0  # a page waits this long at most for a job's files
FILE_READERS = 4  # reads of job files under way at once, stuck ones included
LOCK_WAIT_SECONDS = 5.0  # a page waits this long at most for a lock held elsewhere (PostgreSQL)
BEST_TTL = 10.0  # seconds a best result of the experiments page is kept while jobs keep finishing


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
        bound_lock_waits(store.engine, lock_wait())  # a page a lock would hold answers with an error instead
        return cls(url, target, store.engine)

    def store(self, experiment: str) -> Store:
        return Store(parse_db(self.url, experiment), engine=self.engine, check_schema=False)

    def any_store(self) -> Store:
        return Store(self.target, engine=self.engine, check_schema=False)


def lock_wait() -> float:
    """Seconds a page waits for a lock held elsewhere (``JOBMAN_SERVE_LOCK_WAIT``; 0: no limit)."""
    given = os.environ.get("JOBMAN_SERVE_LOCK_WAIT", "").strip()
    try:
        return float(given) if given else LOCK_WAIT_SECONDS
    except ValueError:
        raise UsageError(f"JOBMAN_SERVE_LOCK_WAIT must be a number of seconds, not {given!r}") from None


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
    target: str | None = None  # one function's calls (a box of the graph of calls)

    @classmethod
    def from_query(cls, q: dict[str, str]) -> Listing:
        statuses = [parse_status(v) for v in q.get("status", "").split(",") if v.strip()]
        phase = whole_number(q.get("phase"), "phase") if q.get("phase", "").strip() else None
        where = [selection.parse_where(w.strip()) for w in q.get("where", "").split(",") if w.strip()]
        sort = q.get("sort", "id") or "id"
        page = whole_number(q.get("page", "0") or "0", "page")
        if page < 0:
            raise UsageError("the page number is 0 or more")
        target = q.get("target", "").strip() or None
        return cls(statuses, phase, where, sort.lstrip("-"), sort.startswith("-"), page, target)

    def query(self, **change: Any) -> dict[str, str]:
        """The URL query of this listing with some of it changed (for links: next page, sort by)."""
        values = {
            "status": ",".join(s.value for s in self.status),
            "phase": "" if self.phase is None else str(self.phase),
            "where": ",".join(str(c) for c in self.where),
            "sort": ("-" if self.descending else "") + self.sort,
            "page": str(self.page),
            "target": self.target or "",
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
        target=listing.target,
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


class GraphLinks:
    """The dependencies between the groups of each big experiment's graph of calls, as last read: they
    change when jobs are added or deleted, not when they run, so a page redrawn every few seconds reads
    only the statuses. Kept while the experiment's number of jobs is the same, for STALE seconds at most
    (a deletion and an addition may leave the number as it was)."""

    STALE = 60.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[int, float, Any]] = {}

    def known(self, experiment: str) -> Callable[[int], Any]:
        def links(total: int) -> Any:
            with self._lock:
                found = self._kept.get(experiment)
            if found and found[0] == total and time.monotonic() - found[1] < self.STALE:
                return found[2]
            return None

        return links

    def keep(self, experiment: str, total: int, links: Any) -> None:
        with self._lock:
            found = self._kept.get(experiment)
            if not found or found[0] != total or found[2] is not links:
                self._kept[experiment] = (total, time.monotonic(), links)


def call_graph(store: Store, base: str, kept: GraphLinks | None = None) -> dict[str, Any]:
    """The experiment's graph of calls drawn, when its jobs depend on each other: each job a node linking
    to its page, or, past ``dashboard.CALLS_DRAWN`` jobs, each function of each phase a node with its calls
    by status (each status a link to them in the job table). ``kept``: the server's links between groups."""
    found = dashboard.call_graph(store, links=kept.known(store.experiment) if kept else None)
    if found is not None and found.links is not None and kept is not None:
        kept.keep(store.experiment, found.total, found.links)
    if found is None:
        return {"graph": None}
    page = f"{base}/e/{quote(store.experiment, safe='')}"
    if not found.grouped:
        varying = _varying(found.calls)
        nodes = [
            charts.Node(
                c.id,
                f"{c.id} · {c.name}",
                " ".join(f"{k}={selection.format_param(c.params[k])}" for k in varying[c.target] if k in c.params),
                f"{page}/job/{c.id}",
                f"job {c.id}: {c.target} {c.status}",
                status=c.status,
            )
            for c in found.calls
        ]
        edges: list[tuple[Any, Any, int | None]] = [(a, b, None) for a, b in found.edges]
        what = f"{len(nodes)} calls and {len(edges)} dependencies"
    else:
        nodes = []
        for g in found.groups:
            name = dashboard.call_name(g.target)
            where = {"phase": g.phase, "target": g.target}
            counts = [
                (s.value, g.counts[s.value], f"{page}?{urlencode({**where, 'status': s.value})}#jobs")
                for s in DISPLAY_ORDER
                if g.counts.get(s.value)
            ]
            nodes.append(
                charts.Node(
                    g.key,
                    f"{name} (phase {g.phase})",
                    f"{g.total} call{'s' if g.total != 1 else ''}",
                    f"{page}?{urlencode(where)}#jobs",
                    f"{g.target}, phase {g.phase}: " + ", ".join(f"{n} {s}" for s, n, _ in counts),
                    counts=counts,
                )
            )
        edges = [(a, b, n) for a, b, n in found.group_edges]
        what = f"{found.total} calls of {found.groups_total} function{'s' if found.groups_total != 1 else ''} by phase"
    return {
        "graph": charts.graph(nodes, edges, f"graph of calls: {what}"),
        "graph_found": found,
    }


def _varying(calls: list[dashboard.Call]) -> dict[str, list[str]]:
    """The parameters that tell a function's calls apart (all of them for a function called once), a few."""
    by_target: dict[str, list[dict[str, Any]]] = {}
    for c in calls:
        by_target.setdefault(c.target, []).append(c.params)
    out = {}
    for target, params in by_target.items():
        keys = list(dict.fromkeys(k for p in params for k in p))
        differ = [k for k in keys if len({selection.format_param(p.get(k)) for p in params}) > 1]
        out[target] = (differ if len(params) > 1 else keys)[:3]
    return out


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
        "charts": reports.drawn(
            store.experiment, choice, rep, lambda: {**_charts(rep, store.search_space()), "searches": searches(store)}
        ),
    }


def searches(store: Store) -> list[dict[str, Any]]:
    """Each learning search's charts, as ``report --plot`` draws them: its first metric's best so far
    against evaluations, the parameters' importances for it, and, with two metrics or more, its Pareto
    front on the first two. None without Optuna (``jobman-sql[search]``), which fits the model."""
    if not store.search_objectives():  # no learning search: Optuna is not even imported
        return []
    out = []
    for front in store.search_fronts(every=True):
        (metric, direction), *others = front.objectives
        values = [p.values[metric] for p in front.evaluated]
        drawn: dict[str, Any] = {
            "id": front.search_id,
            "objectives": front.objectives,
            "evaluated": len(front.evaluated),
            "on_front": len(front.points),
            "best_so_far": charts.best_so_far(values, metric, direction),
            "importances": charts.bars(list(front.importances), f"importance for {metric} (sums to 1)")
            if front.importances
            else None,
            "front": None,
        }
        if others:
            m2 = others[0][0]

            def label(p: Any) -> str:
                shown = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in p.params.items())
                return f"{shown} — jobs {', '.join(map(str, p.job_ids))}"

            drawn["front"] = charts.pareto(
                [(p.values[metric], p.values[m2], label(p)) for p in front.evaluated],
                [(p.values[metric], p.values[m2], label(p)) for p in front.points],
                metric,
                m2,
            )
        out.append(drawn)
    return out


def _charts(rep: report.Report, space: dict[str, Any]) -> dict[str, Any]:
    """The report's charts; ``space``: the distributions its parameters were drawn from (a log axis for
    a log-scaled one, as ``report --plot`` draws it)."""
    rows = rep.sample  # at most CHART_POINTS configurations with the metric, evenly spaced over the ranking
    best = rep.best
    # Parameters every plotted configuration has (a one-off extra parameter makes no axis).
    keys = [k for k in rep.varying if k != rep.outer and all(k in r.params for r in rows)]
    labels = [rep.label(r) for r in rows]  # once per configuration, not once per chart
    scatters = []
    for key in keys:
        pts = [(r.params[key], r.mean, label) for r, label in zip(rows, labels)]
        numbers = [p[0] for p in pts if selection.is_number(p[0])]
        log = log_axis(numbers, space.get(key)) if len(numbers) == len(pts) else False
        scatters.append((key, charts.scatter(pts, key, rep.metric, best=rep.label(best) if best else None, log=log)))
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
    diverged: dict[tuple[int, str], list[str]] = {}  # NaN and infinities: named, since a chart cannot draw them
    for job_id, step, name, value in store.metrics(job_ids):
        by_name.setdefault(name, {}).setdefault(job_id, []).append((step, value))
        if not math.isfinite(value):
            diverged.setdefault((job_id, name), []).append(f"{value} at step {step}")
    return {
        "curve_notes": [
            f"job {job_id} {name}: {', '.join(points[:3])}"
            + (f" and {len(points) - 3} more" if len(points) > 3 else "")
            for (job_id, name), points in sorted(diverged.items())
        ],
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
    seen = off_thread(lambda: (workdir_files(workdir), tails(workdir, job.log_path, job.ranks), places(workdir, job)))
    files, job_tails, ranks = seen if seen is not None else ([], [], [])
    return {
        "job": job,
        "events": store.events(job_id),
        "around": dashboard.neighbours(store, job_id),
        "files": files,
        "artifacts": sorted(artifacts.refs_in(job.results or {})),
        "tails": job_tails,
        "ranks": ranks,
        "files_unread": seen is None,
        "file_seconds": f"{FILE_READ_SECONDS:g}",
        "diff": code_diff(store, job.code),
        **curves(store, [job_id]),
    }


_file_readers = threading.BoundedSemaphore(FILE_READERS)


def off_thread(read: Callable[[], Any], seconds: float | None = None) -> Any | None:
    """What ``read()`` gives, read on a thread of its own; None if that takes more than ``seconds``
    (or ``FILE_READERS`` reads are already under way, stuck ones included). A job's files may lie on a
    filesystem that hangs: a page then answers without them, on time, and a read that never returns
    holds neither a request thread nor the server's exit (its thread is a daemon). An error of the
    read is raised here. ``seconds``: FILE_READ_SECONDS."""
    seconds = FILE_READ_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + seconds
    if not _file_readers.acquire(timeout=seconds):
        return None
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = read()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
            box["error"] = exc
        finally:
            _file_readers.release()
            done.set()

    threading.Thread(target=run, name="jobman-file-read", daemon=True).start()
    if not done.wait(max(0.0, deadline - time.monotonic())):
        return None
    if "error" in box:
        raise box["error"]
    return box["value"]


def artifact_download(store: Store, target: DbTarget, job_id: int, name: str) -> tuple[Any, dict[str, Any]]:
    """One of a job's artifacts, found by its name in the job's results (never by a path): an open file
    of the database's store, and its reference."""
    found = dict(artifacts.refs_in(store.job(job_id).results or {}))
    if name not in found:
        raise NoSuchArtifact(f"job {job_id} has no artifact {name!r}")
    ref = found[name]
    return artifacts.for_database(target).open(ref[artifacts.REF]), ref


class NoSuchArtifact(JobmanError):
    """No such artifact."""


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


def places(workdir: Path | None, job: Any) -> list[dict[str, Any]]:
    """A gang job's ranks: where each ran and its log (none for a job of one process)."""
    return rank_places(str(workdir), job.ranks) if workdir is not None and job.ranks > 1 else []


def tails(workdir: Path | None, log_path: str | None, ranks: int = 1) -> list[tuple[str, str]]:
    """The last few kilobytes of a job's stdout and stderr (regular files inside its workdir only),
    each other rank's log for a gang, and of its backend's log (inside the run folder the workdir
    belongs to)."""
    if workdir is None:
        return []
    paths = [(workdir / "stdout.txt", workdir), (workdir / "stderr.txt", workdir)]
    paths += [(workdir / RANK_LOG.format(rank=rank), workdir) for rank in range(1, ranks)]
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

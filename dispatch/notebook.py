"""An experiment in a Jupyter notebook: its HTML view, a wait with a live progress bar, its learning
curves as a DataFrame and its report's plots as figures.

The markup is :mod:`jobman.jobdb.notebook`'s, the best result is chosen as the dashboard chooses it
(:mod:`jobman.jobdb.report.choice`), the plots are ``report --plot``'s (:mod:`jobman.jobdb.report.plots`),
and the dashboard's link is found as :mod:`jobman.jobdb.serving` describes. Nothing here needs
IPython: a notebook is recognised when one is running, and text is shown otherwise.
"""

from __future__ import annotations

import base64
import concurrent.futures
import io
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from jobman.jobdb import dashboard
from jobman.jobdb import notebook as views
from jobman.jobdb.errors import NoSuchExperiment, UsageError
from jobman.jobdb.serving import dashboard_link
from jobman.jobdb.url import mask_password

if TYPE_CHECKING:
    from jobman.jobdb.store import Store

    from .futures import Experiment, JobFuture

METRIC_BATCH = 900  # job ids per read of their learning curves (SQLite's bound parameters)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython with a kernel attached), where HTML is shown."""
    ipython = sys.modules.get("IPython")  # never imported here: a kernel has imported it already
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def status_totals(store: Store) -> dict[str, int]:
    """Jobs per status over every phase; none for an experiment not made yet (no call so far)."""
    totals: dict[str, int] = {}
    try:
        counts = store.counts()
    except NoSuchExperiment:
        return totals
    for (_, status), n in counts.items():
        totals[status] = totals.get(status, 0) + n
    return totals


def best_so_far(store: Store) -> dict[str, Any] | None:
    """The best configuration so far, as the dashboard shows it (its metric guessed the same way)."""
    from jobman.jobdb.report import from_store
    from jobman.jobdb.report.choice import best_of, choose

    choice = choose(store)
    if choice.metric is None:
        return None
    return best_of(from_store(store, choice.metric, choice.mode, phase=choice.phase, outer=None, allow_incomplete=True))


def experiment_html(exp: Experiment) -> str:
    """The experiment now: its jobs by status, the best result so far, and its dashboard."""
    store = exp.store
    try:
        counts = status_totals(store)
        best = best_so_far(store) if counts.get("DONE") else None
        link = dashboard_link(store.target)
    except Exception as exc:  # noqa: BLE001 - a view must show something, whatever the database says
        return f"<pre>{escape(repr(exp))}: cannot be read now ({escape(type(exc).__name__)}: {escape(str(exc))})</pre>"
    return views.experiment_html(
        exp.name,
        store.target.display,
        counts,
        best,
        link,
        backend=exp.backend,
        serve_hint=f"jobman serve {shlex.quote(mask_password(store.target.with_table()))}",  # outputs get shared
    )


def future_html(future: JobFuture) -> str:
    """A future: its job as it is now, the calls holding it back (WAITING or BLOCKED), and its page on a
    serving dashboard."""
    exp = future._experiment()
    if exp is None:
        return f"<pre>{escape(repr(future))}</pre>"
    try:
        job = exp.store.job(future.job_id)
        held = dashboard.held_by(exp.store, job.id, job.status)
        link = dashboard_link(exp.store.target, job.id)
    except Exception as exc:  # noqa: BLE001 - a deleted job, a database gone: said, not raised
        return f"<pre>{escape(repr(future))}: {escape(str(exc))}</pre>"
    return views.job_html(job, link, title="Future of job", held=held)


# -- waiting -------------------------------------------------------------------------------------


class ProgressView:
    """A progress bar updated in place: an HTML display in a notebook, a line of text elsewhere
    (rewritten on a terminal, one line per change in a log)."""

    TEXT_EVERY = 5.0  # seconds between lines written to a log that is not a terminal

    def __init__(self, total: int, *, html: bool) -> None:
        self.total = total
        self.started = time.monotonic()
        self.html = html
        self._handle: Any = None
        self._last: tuple[int, int] | None = None
        self._last_line = 0.0
        self._tty = not html and sys.stderr.isatty()

    def update(self, done: int, failed: int, *, final: bool = False) -> None:
        seconds = time.monotonic() - self.started
        if self.html:
            from IPython.display import HTML, display

            shown = HTML(views.wait_html(done, failed, self.total, seconds))
            if self._handle is None:
                self._handle = display(shown, display_id=True)
            elif (done, failed) != self._last or final:
                self._handle.update(shown)
        else:
            line = views.wait_text(done, failed, self.total, seconds)
            if self._tty:
                sys.stderr.write("\r" + line + ("\n" if final else ""))
            elif final or ((done, failed) != self._last and time.monotonic() - self._last_line >= self.TEXT_EVERY):
                sys.stderr.write(line + "\n")
                self._last_line = time.monotonic()
            sys.stderr.flush()
        self._last = (done, failed)


def _ended_badly(f: concurrent.futures.Future) -> bool:
    return f.cancelled() or f.exception() is not None


def wait(
    fs: Iterable[concurrent.futures.Future],
    timeout: float | None = None,
    return_when: str = concurrent.futures.ALL_COMPLETED,
    *,
    progress: bool | None = None,
) -> Any:
    """:func:`concurrent.futures.wait`, showing how many futures have finished while it waits: a
    live bar in a notebook (``progress=None``: only there), a line of text on stderr elsewhere
    (``progress=True``). Returns (done, not_done) sets, as the standard one does."""
    futures = set(fs)
    show = in_notebook() if progress is None else progress
    if not show:
        return concurrent.futures.wait(futures, timeout, return_when)
    view = ProgressView(len(futures), html=in_notebook())
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        done, not_done = concurrent.futures.wait(futures, 0)
        failed = sum(1 for f in done if _ended_badly(f))
        if (
            not not_done
            or (return_when == concurrent.futures.FIRST_COMPLETED and done)
            or (return_when == concurrent.futures.FIRST_EXCEPTION and failed)
            or (deadline is not None and time.monotonic() >= deadline)
        ):
            view.update(len(done), failed, final=True)
            return done, not_done
        view.update(len(done), failed)
        step = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
        concurrent.futures.wait(not_done, step, concurrent.futures.FIRST_COMPLETED)


# -- learning curves and plots -------------------------------------------------------------------


def history(
    exp: Experiment, metric: str | None = None, *, phase: int | None = None, as_frame: bool | None = None
) -> Any:
    """The learning curves the jobs logged (``channel.log``): one row per (job, step, metric) with
    the job's ``id``, ``step``, ``metric`` and ``value``, then its ``params_<name>`` to group by.

    ``metric``: only that curve. A pandas DataFrame when pandas is installed (``as_frame=None``) or
    asked for (``True``), else a list of dicts.
    """
    store = exp.store
    jobs = {j.id: j for j in store.jobs(phase=phase, with_deps=False)}
    ids = sorted(jobs)
    points: list[tuple[int, int, str, float]] = []
    for start in range(0, len(ids), METRIC_BATCH):
        points.extend(store.metrics(ids[start : start + METRIC_BATCH]))
    if metric is not None:
        names = sorted({name for _, _, name, _ in points})
        if metric not in names:
            logged = ", ".join(names) if names else "none"
            raise UsageError(f"no job of {exp.name!r} logged a curve named {metric!r}; logged: {logged}")
    rows = [
        {
            "id": job_id,
            "step": step,
            "metric": name,
            "value": value,
            **{f"params_{k}": v for k, v in jobs[job_id].params.items()},
        }
        for job_id, step, name, value in sorted(points, key=lambda p: (p[0], p[2], p[1]))
        if metric is None or name == metric
    ]
    return _frame(rows, as_frame, ["id", "step", "metric", "value"])


def _frame(rows: list[dict[str, Any]], as_frame: bool | None, columns: Sequence[str]) -> Any:
    if as_frame is False:
        return rows
    try:
        import pandas
    except ImportError:
        if as_frame:
            raise UsageError("as_frame=True needs pandas: pip install pandas") from None
        return rows
    return pandas.DataFrame(rows) if rows else pandas.DataFrame(columns=list(columns))


class Figures(dict):
    """The plots of a report by file name, as ``report --plot`` names them; a notebook shows them all."""

    def _repr_html_(self) -> str:
        if not self:
            return "<p><i>nothing to plot yet</i></p>"
        out = []
        for name, fig in self.items():
            buf = io.BytesIO()
            fig.savefig(buf, format="png")
            data = base64.b64encode(buf.getvalue()).decode("ascii")
            out.append(
                f'<figure class="jobman-plot" data-name="{escape(name)}" style="margin:0 0 8px">'
                f'<img alt="{escape(name)}" src="data:image/png;base64,{data}" style="max-width:100%"></figure>'
            )
        return "".join(out)


def plot(
    exp: Experiment,
    metric: str | None = None,
    mode: str | None = None,
    *,
    phase: int | None = None,
    group_over: Sequence[str] | None = None,
    curves: int = 5,
) -> Figures:
    """What ``jobman report --plot`` draws, as matplotlib figures: the metric against each parameter,
    the rungs of a successive-halving search and the learning curves of the best configurations.
    Without ``metric``, the one the dashboard would rank by."""
    from jobman.jobdb.report import from_store, plots
    from jobman.jobdb.report.choice import choose, guess_mode

    plots.require_matplotlib()
    if mode not in (None, "min", "max"):
        raise UsageError(f"mode {mode!r} is 'min' or 'max'")
    store = exp.store
    if metric is None:
        choice = choose(store)
        if choice.metric is None:
            raise UsageError(f"no job of {exp.name!r} has a numeric result yet: there is nothing to plot")
        metric, mode = choice.metric, mode or choice.mode
        phase = choice.phase if phase is None else phase
    report = from_store(
        store, metric, mode or guess_mode(metric), group_over, phase=phase, outer=None, allow_incomplete=True
    )
    made = plots.figures(
        report,
        store.metrics,
        curves=curves,
        space=store.search_space(),
        searches=store.search_rungs(),
        finished=lambda: plots.finish_order(store, report.metric, phase),
    )
    return Figures(made)

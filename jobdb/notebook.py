"""What a Jupyter notebook shows of an experiment, a job and a wait: small HTML fragments with their
style inline (a notebook has no stylesheet of ours), coloured as the dashboard colours a status.

Pure: each takes what it shows (counts, a job record, a best result, a link) and returns markup,
every value escaped. The reads are the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from .selection import format_number, format_param
from .status import DISPLAY_ORDER, ENDED, Status

if TYPE_CHECKING:
    from .dashboard import CallRef
    from .records import Job

# The dashboard's colours (web/static/style.css), so a status reads the same in both.
COLOURS = {
    "DONE": "#2b9a4a",
    "RUNNING": "#e0a800",
    "QUEUED": "#5aa0d8",
    "WAITING": "#c5ccd4",
    "FAILED": "#d4552b",
    "CRASHED": "#8a3fb0",
    "BLOCKED": "#aa3333",
    "CANCELED": "#888888",
}
MAX_ITEMS = 12  # parameters or results listed in a job's view; the rest are counted
BOX = "font-family:system-ui,sans-serif;font-size:13px;line-height:1.45;max-width:720px"


def badge(status: str) -> str:
    colour = COLOURS.get(status, "#888888")
    text = "#1d232b" if status in ("RUNNING", "WAITING") else "#fff"
    return (
        f'<span class="jobman-status" data-status="{escape(status)}" style="background:{colour};color:{text};'
        f'border-radius:3px;padding:0 5px;font-size:11px;font-weight:600">{escape(status)}</span>'
    )


def progress_bar(counts: Mapping[str, int]) -> str:
    """A bar of the jobs by status, each status its share of the width, in the dashboard's order."""
    total = sum(counts.values())
    order = [s.value for s in DISPLAY_ORDER] + sorted(set(counts) - {s.value for s in DISPLAY_ORDER})
    segments = "".join(
        f'<span class="jobman-seg" data-status="{escape(s)}" data-count="{counts[s]}" '
        f'style="display:block;height:100%;width:{100 * counts[s] / total:.2f}%;'
        f'background:{COLOURS.get(s, "#888888")}"></span>'
        for s in order
        if counts.get(s)
    )
    title = ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))
    return (
        f'<div class="jobman-bar" title="{escape(title)}" style="display:flex;height:10px;border-radius:5px;'
        f'overflow:hidden;background:#eceff2;min-width:160px;margin:4px 0">{segments}</div>'
    )


def counts_line(counts: Mapping[str, int]) -> str:
    order = [s.value for s in DISPLAY_ORDER] + sorted(set(counts) - {s.value for s in DISPLAY_ORDER})
    return " ".join(f"{badge(s)}&nbsp;{counts[s]}" for s in order if counts.get(s))


def finished_of(counts: Mapping[str, int]) -> int:
    """Jobs that have ended, as the dashboard and ``jobman dispatch`` count them."""
    return sum(counts.get(s.value, 0) for s in ENDED)


def experiment_html(
    name: str,
    where: str,
    counts: Mapping[str, int],
    best: Mapping[str, Any] | None,
    link: str | None,
    *,
    backend: str | None = None,
    serve_hint: str | None = None,
) -> str:
    """An experiment: its jobs by status, a progress bar, the best result so far and its dashboard.

    ``best``: the dashboard's summary of the best configuration (metric, mode, value, std, label,
    job_id); ``link``: the experiment's page on a serving dashboard; ``serve_hint``: the command
    that would serve one, shown when none is.
    """
    total = sum(counts.values())
    head = (
        f'<div class="jobman-experiment" style="{BOX}"><b>Experiment</b> <code>{escape(name)}</code> '
        f"<small style='color:#66707c'>{escape(where)}"
        + (f", backend {escape(str(backend))}" if backend else "")
        + "</small>"
    )
    if not total:
        body = '<div class="jobman-empty" style="color:#66707c"><i>no job yet</i></div>'
    else:
        body = (
            progress_bar(counts)
            + f'<div class="jobman-counts">{finished_of(counts)} of {total} finished: {counts_line(counts)}</div>'
        )
    body += best_html(best)
    if link:
        body += (
            f'<div><a class="jobman-dashboard" href="{escape(link)}" target="_blank">open in the dashboard</a></div>'
        )
    elif serve_hint:
        body += "<div style='color:#66707c'><small>no dashboard is serving it: "
        body += f"<code>{escape(serve_hint)}</code></small></div>"
    return head + body + "</div>"


def best_html(best: Mapping[str, Any] | None) -> str:
    if not best:
        return ""
    spread = f" ± {format_number(best['std'], 2)}" if best.get("std") is not None else ""
    return (
        f'<div class="jobman-best" data-metric="{escape(str(best["metric"]))}" data-value="{best["value"]!r}">'
        f"best so far ({escape(str(best['mode']))} {escape(str(best['metric']))}): "
        f"<b>{escape(format_number(best['value']))}{escape(spread)}</b> at {escape(str(best['label']))}"
        f" (job {int(best['job_id'])})</div>"
    )


def job_html(
    job: Job,
    link: str | None = None,
    *,
    title: str = "Job",
    held: tuple[Sequence[CallRef], int] | None = None,
) -> str:
    """One job: its status, target, parameters, results (or error) and times. ``held``: the calls holding
    it back and how many there are (:func:`~jobman.jobdb.dashboard.held_by`), named as those it waits
    for (WAITING) or those that blocked it (BLOCKED)."""
    status = job.status.value
    rows = [
        ("target", f"<code>{escape(job.target)}</code>"),
        ("parameters", _items(job.params)),
    ]
    if job.results:
        rows.append(("results", _items(job.results)))
    if job.error and job.status is not Status.DONE:
        last = job.error.strip().splitlines()[-1] if job.error.strip() else ""
        rows.append(("error", f'<code style="color:#a3241b">{escape(last[:300])}</code>'))
    ran = []
    if job.host:
        ran.append(f"on {escape(job.host)}")
    if job.started_at and job.finished_at:
        ran.append(f"{format_number(job.finished_at - job.started_at, 3)} s")
    ran.append(f"attempt {job.attempt}/{job.max_attempts}")
    rows.append(("run", ", ".join(ran)))
    if job.depends_on:
        rows.append(("depends on", ", ".join(f"job {d}" for d in job.depends_on)))
    if held is not None and job.status in (Status.WAITING, Status.BLOCKED):
        calls, total = held
        named = ", ".join(f"job {c.id} <code>{escape(c.name)}</code> {badge(c.status)}" for c in calls)
        more = f" <small>and {total - len(calls)} more</small>" if total > len(calls) else ""
        what = "waits for" if job.status is Status.WAITING else "blocked by"
        rows.append((what, f'<span class="jobman-held">{named or "<i>nothing now</i>"}{more}</span>'))
    table = "".join(
        f'<tr><th style="text-align:left;color:#66707c;font-weight:600;padding:1px 10px 1px 0;vertical-align:top">'
        f"{escape(k)}</th><td style='text-align:left;padding:1px 0'>{v}</td></tr>"
        for k, v in rows
    )
    open_link = (
        f' <a class="jobman-dashboard" href="{escape(link)}" target="_blank">open in the dashboard</a>' if link else ""
    )
    return (
        f'<div class="jobman-job" data-id="{job.id}" data-status="{escape(status)}" style="{BOX}">'
        f"<b>{escape(title)} {job.id}</b> {badge(status)}{open_link}<table style='border-collapse:collapse'>"
        f"{table}</table></div>"
    )


def _items(values: Mapping[str, Any]) -> str:
    shown = list(values.items())[:MAX_ITEMS]
    more = len(values) - len(shown)
    text = ", ".join(f"{escape(str(k))}={escape(_short(_value(v)))}" for k, v in shown)
    return (text or "<i>none</i>") + (f" <small>and {more} more</small>" if more > 0 else "")


def _value(v: Any) -> str:
    if isinstance(v, float):
        return format_number(v)
    if isinstance(v, (int, str, bool)) or v is None:
        return format_param(v)
    return format_param(v) if isinstance(v, (list, dict)) else type(v).__name__


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def wait_html(done: int, failed: int, total: int, seconds: float) -> str:
    """A wait on futures: how many ended well, how many badly, of how many, after how long."""
    counts = {"DONE": done - failed, "FAILED": failed, "QUEUED": total - done}
    bar = progress_bar(counts) if total else ""
    failures = f", {failed} failed" if failed else ""
    state = "done" if done == total else "waiting"
    return (
        f'<div class="jobman-wait" data-done="{done}" data-total="{total}" data-failed="{failed}" style="{BOX}">'
        f"{bar}<small>{state}: {done} of {total} finished{failures} ({seconds:.0f} s)</small></div>"
    )


def wait_text(done: int, failed: int, total: int, seconds: float, width: int = 30) -> str:
    """The same in plain text, for a terminal or a log."""
    filled = round(width * done / total) if total else width
    failures = f", {failed} failed" if failed else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} finished{failures} ({seconds:.0f} s)"

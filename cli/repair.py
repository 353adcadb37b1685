"""Repairing an experiment by hand: reset, retry, cancel, set-status, set-priority, rm.

Every command takes jobs as ids (``12``, ``12,13``, ``10-20``) and/or selectors
(``--status``, ``--phase``, ``--all``). Those that may touch many jobs preview with
``--dry-run`` (the real change, rolled back); those that lose something ask first
(``--yes`` answers for scripts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from jobman.jobdb import artifacts, reclaim
from jobman.jobdb.errors import UsageError
from jobman.jobdb.priority import parse_priority
from jobman.jobdb.status import Status, parse_status
from jobman.jobdb.store import Store

from .common import Database, confirm, out, parse_ids, styled_status, with_database

SHOWN_CHANGES = 25


def selection_options(fn: Callable) -> Callable:
    """``--status``, ``--phase`` and ``--all``: choose jobs without listing their ids."""
    fn = click.option("--all", "everything", is_flag=True, help="Every job of the experiment.")(fn)
    fn = click.option("--phase", type=int, default=None, help="Only jobs of this phase.")(fn)
    fn = click.option(
        "--status",
        "-s",
        "status",
        multiple=True,
        metavar="STATUS",
        help="Only jobs with this status (comma-separated or repeated).",
    )(fn)
    return fn


def dry_run_option(fn: Callable) -> Callable:
    return click.option("--dry-run", is_flag=True, help="Show what would change; change nothing.")(fn)


def yes_option(fn: Callable) -> Callable:
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (scripts).")(fn)


def choose(store: Store, ids: list[int], status: tuple[str, ...], phase: int | None, everything: bool) -> list[int]:
    """The ids named, narrowed (or found) by the selectors; refuses an empty choice."""
    statuses = [parse_status(v) for value in status for v in value.split(",") if v]
    if not (ids or statuses or phase is not None or everything):
        raise UsageError("name the jobs: ids (12, 12,13 or 10-20), --status, --phase or --all")
    if not (statuses or phase is not None or everything):
        return sorted(set(ids))
    found = store.select_ids(status=statuses, phase=phase)
    if ids:
        wanted = set(ids)
        found = [i for i in found if i in wanted]
    if not found:
        raise UsageError("no job matches the selection; nothing was changed")
    return found


def finals(changes: list[dict[str, Any]]) -> dict[int, str]:
    """Each changed job's last status in a list of changes."""
    last: dict[int, str] = {}
    for c in changes:
        last[c["job_id"]] = c["to_status"]
    return last


def summary(changes: list[dict[str, Any]], roots: list[int], what: str) -> str:
    """``3 jobs reset: 2 QUEUED, 1 WAITING; 4 downstream: 4 WAITING``."""
    last = finals(changes)
    chosen = set(roots)
    mine = Counter(s for j, s in last.items() if j in chosen)
    down = Counter(s for j, s in last.items() if j not in chosen)
    text = f"{sum(mine.values())} job(s) {what}" + (": " + _counted(mine) if mine else "")
    if down:
        text += f"; {sum(down.values())} downstream: {_counted(down)}"
    return text


def _counted(counter: Counter) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(counter.items()))


def show_changes(changes: list[dict[str, Any]], limit: int = SHOWN_CHANGES) -> None:
    grid = Table(box=None, header_style="bold", pad_edge=False)
    for col in ("job", "from", "", "to", "why"):
        grid.add_column(col, overflow="fold")
    for c in changes[:limit]:
        grid.add_row(
            str(c["job_id"]), styled_status(c["from_status"] or "-"), "→", styled_status(c["to_status"]), c["why"]
        )
    out.print(grid)
    if len(changes) > limit:
        out.print(f"[dim]… and {len(changes) - limit} more changes[/]")


def apply(
    store: Store,
    verb: Callable[[], Any],
    *,
    dry_run: bool,
    what: str,
    roots: list[int],
    yes: bool = False,
    ask_if: Callable[[list[dict[str, Any]]], str | None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``verb`` and print its changes; on --dry-run only preview them; ask first if ``ask_if`` has a question."""
    if dry_run or ask_if is not None:
        _, preview = store.changes_of(verb, dry_run=True)
        if dry_run:
            show_changes(preview)
            out.print(f"[bold]dry run[/]: {summary(preview, roots, 'would be ' + what)}; nothing was changed")
            return preview
        question = ask_if(preview) if ask_if is not None else None
        if question:
            confirm(question, yes)
    _, changes = store.changes_of(verb)
    if len(changes) <= SHOWN_CHANGES:
        show_changes(changes)
    out.print(summary(changes, roots, what))
    return changes


def done_lost(changes: list[dict[str, Any]]) -> str | None:
    """The question to ask before DONE jobs lose their status (their results go to the event log)."""
    done = sorted({c["job_id"] for c in changes if c["from_status"] == Status.DONE.value})
    if not done:
        return None
    shown = ", ".join(map(str, done[:8])) + (" …" if len(done) > 8 else "")
    return f"run {len(done)} DONE job(s) again ({shown}), their results moved to the event log?"


# -- the commands ----------------------------------------------------------------------------


@click.command("reset")
@click.argument("args", nargs=-1, metavar="[DB] [ID]...")
@with_database("args")
@selection_options
@click.option(
    "--cascade/--no-cascade",
    default=True,
    show_default=True,
    help="Put every job downstream back to WAITING too (their inputs are about to change); "
    "without, only BLOCKED dependents are released.",
)
@click.option("--force", is_flag=True, help="Reset RUNNING jobs too: their workers lose them at the next heartbeat.")
@dry_run_option
@yes_option
def reset(
    args: tuple[str, ...],
    database: Database,
    status: tuple[str, ...],
    phase: int | None,
    everything: bool,
    cascade: bool,
    force: bool,
    dry_run: bool,
    yes: bool,
) -> int:
    """Run jobs again from scratch: fresh attempts, results cleared, dependents back to WAITING.

    \b
    Examples:
      jobman reset 12                    # and everything downstream of it
      jobman reset 12 --no-cascade       # its DONE dependents stay DONE
      jobman reset --status FAILED --phase 1 --dry-run
    Results cleared are kept in the event log (jobman show ID). Resetting DONE jobs asks first.
    """
    store = database.open()
    ids = choose(store, parse_ids(args), status, phase, everything)
    apply(
        store,
        lambda: store.reset(ids, cascade=cascade, force_running=force),
        dry_run=dry_run,
        yes=yes,
        what="reset",
        roots=ids,
        ask_if=done_lost,
    )
    return 0


@click.command("retry")
@click.argument("args", nargs=-1, metavar="[DB] [ID]...")
@with_database("args")
@click.option("--crashed", is_flag=True, help="Retry CRASHED jobs (the default when neither flag is given).")
@click.option("--failed", is_flag=True, help="Retry FAILED jobs.")
@click.option("--phase", type=int, default=None, help="Only jobs of this phase.")
@click.option("--ids", "id_opts", multiple=True, metavar="IDS", help="Only these jobs (12, 12,13 or 10-20).")
@click.option("--fresh", is_flag=True, help="Start over (reset) instead of resuming from the last checkpoint.")
@dry_run_option
@yes_option
def retry(
    args: tuple[str, ...],
    database: Database,
    crashed: bool,
    failed: bool,
    phase: int | None,
    id_opts: tuple[str, ...],
    fresh: bool,
    dry_run: bool,
    yes: bool,
) -> int:
    """Queue CRASHED (and, with --failed, FAILED) jobs again; their dependents go back to WAITING.

    \b
    Examples:
      jobman retry 'sqlite:///sweeps.db?table=mlp'          # every CRASHED job
      jobman retry --failed --crashed --phase 1
      jobman retry --failed --ids 10-20 --dry-run
    A retried job resumes from its checkpoint in its workdir and keeps its attempt count,
    whatever its attempt limit (--fresh starts it over).
    """
    store = database.open()
    wanted = ([Status.CRASHED] if crashed or not failed else []) + ([Status.FAILED] if failed else [])
    named = set(parse_ids(args) + parse_ids(id_opts))
    ids = [i for i in store.select_ids(status=wanted, phase=phase) if not named or i in named]
    if not ids:
        names = " or ".join(s.value for s in wanted)
        out.print(f"no {names} job matches; nothing to retry")
        return 0
    why = "retried by hand, from scratch" if fresh else "retried by hand"
    apply(
        store,
        lambda: store.retry(ids, why, fresh=fresh),
        dry_run=dry_run,
        yes=yes,
        what="retried",
        roots=ids,
        ask_if=done_lost,
    )
    return 0


@click.command("cancel")
@click.argument("args", nargs=-1, metavar="[DB] [ID]...")
@with_database("args")
@selection_options
@click.option(
    "--running",
    is_flag=True,
    help="Also stop RUNNING jobs: their worker sees it at the next heartbeat, sends the job SIGTERM "
    "(should_stop() turns true) and kills it after its grace; the job ends CANCELED.",
)
@dry_run_option
def cancel(
    args: tuple[str, ...],
    database: Database,
    status: tuple[str, ...],
    phase: int | None,
    everything: bool,
    running: bool,
    dry_run: bool,
) -> int:
    """Cancel jobs that have not finished; their dependents become BLOCKED.

    \b
    Examples:
      jobman cancel 12
      jobman cancel 12 --running
      jobman cancel --phase 1 --status WAITING,QUEUED
    Finished jobs are left as they are. `jobman reset` undoes a cancel.
    """
    store = database.open()
    ids = choose(store, parse_ids(args), status, phase, everything)
    changes = apply(store, lambda: store.cancel(ids, running=running), dry_run=dry_run, what="cancelled", roots=ids)
    stopping = sorted({c["job_id"] for c in changes if c["from_status"] == c["to_status"] == Status.RUNNING.value})
    if stopping and not dry_run:
        out.print(
            f"asked {len(stopping)} running job(s) to stop: {', '.join(map(str, stopping[:10]))}"
            + (" …" if len(stopping) > 10 else "")
        )
    untouched = len(set(ids) - set(finals(changes)))
    if untouched:
        out.print(f"[dim]{untouched} job(s) had already finished and were left as they are[/]")
    return 0


@click.command("set-status")
@click.argument("args", nargs=-1, required=True, metavar="[DB] [ID]... STATUS")
@with_database("args")
@selection_options
@dry_run_option
def set_status(
    args: tuple[str, ...],
    database: Database,
    status: tuple[str, ...],
    phase: int | None,
    everything: bool,
    dry_run: bool,
) -> int:
    """Force jobs to a status (jobman's --set_status), keeping their dependents consistent.

    \b
    Examples:
      jobman set-status 12 DONE          # its ready dependents are queued
      jobman set-status 12,13 FAILED     # their dependents are BLOCKED
      jobman set-status --status CRASHED --phase 1 CANCELED
    STATUS is a name, a jobman code (0 START, 2 DONE, 5 ERR_RUN, -1 CANCELED) or START/ERR_RUN.
    A job becomes RUNNING only when a worker claims it. To run jobs again use reset or retry.
    """
    if not args:
        raise UsageError("give the status to set, after the job ids")
    new = parse_status(args[-1])
    store = database.open()
    ids = choose(store, parse_ids(args[:-1]), status, phase, everything)
    apply(store, lambda: store.set_status(ids, new), dry_run=dry_run, what="set", roots=ids)
    return 0


@click.command("set-priority", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, required=True, metavar="[DB] [ID]... PRIORITY")
@with_database("args")
@selection_options
def set_priority(
    args: tuple[str, ...], database: Database, status: tuple[str, ...], phase: int | None, everything: bool
) -> int:
    """Set the priority of jobs: among QUEUED jobs, higher runs first (default 0; may be negative).

    \b
    Examples:
      jobman set-priority 12 5
      jobman set-priority --phase 1 -3
    """
    if not args:
        raise UsageError("give the priority, after the job ids")
    priority = parse_priority(args[-1])
    store = database.open()
    ids = choose(store, parse_ids(args[:-1]), status, phase, everything)
    n = store.set_priority(ids, priority)
    out.print(f"{n} job(s) now have priority {priority}")
    return 0


@click.command("rm")
@click.argument("args", nargs=-1, metavar="[DB] [ID]...")
@with_database("args")
@selection_options
@dry_run_option
@yes_option
def rm(
    args: tuple[str, ...],
    database: Database,
    status: tuple[str, ...],
    phase: int | None,
    everything: bool,
    dry_run: bool,
    yes: bool,
) -> int:
    """Delete jobs with their events and metrics; their dependents lose that dependency, and their
    artifacts that no other job refers to are removed.

    \b
    Examples:
      jobman rm 12 --yes
      jobman rm --status CANCELED --dry-run
    Asks first (there is no undo); a RUNNING job's worker finds it gone when it finishes.
    """
    store = database.open()
    ids = choose(store, parse_ids(args), status, phase, everything)
    chosen = set(ids)
    running = [i for i in store.select_ids(status=[Status.RUNNING]) if i in chosen]
    n, released = store.changes_of(lambda: store.delete(ids), dry_run=True)
    if dry_run:
        out.print(
            f"[bold]dry run[/]: would delete {n} job(s): {_ids(ids)}"
            + (f" ({len(running)} RUNNING)" if running else "")
        )
        if released:
            show_changes(released)
        out.print("nothing was changed")
        return 0
    confirm(
        f"delete {n} job(s) ({_ids(ids)})"
        + (f", {len(running)} of them RUNNING," if running else "")
        + " with their events and metrics, for good?",
        yes,
    )
    theirs = reclaim.referenced_by(store, ids)
    n, released = store.changes_of(lambda: store.delete(ids))
    freed = reclaim.collect(store, artifacts.for_database(database.target), among=theirs) if theirs else None
    out.print(
        f"deleted {n} job(s)"
        + (f"; their dependents: {_counted(Counter(finals(released).values()))}" if released else "")
        + (f"; {len(freed.removed)} artifact(s) no other job refers to removed" if freed and freed.removed else "")
    )
    return 0


def _ids(ids: list[int], shown: int = 10) -> str:
    return ", ".join(map(str, ids[:shown])) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


COMMANDS = [reset, retry, cancel, set_status, set_priority, rm]

"""Looking at jobs: ``jobman list``, ``jobman show``, and jobman's ``sqlstatus``."""

from __future__ import annotations

import csv
import dataclasses
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.cells import cell_len
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from jobman.dispatch.gang import rank_logs, rank_places
from jobman.jobdb.artifacts import REF
from jobman.jobdb.callrefs import call_refs, replace_refs, takes_calls
from jobman.jobdb.errors import UsageError
from jobman.jobdb.status import CODES, Status, in_display_order, parse_status
from jobman.jobdb.store import Job, Store
from jobman.jobdb.url import mask_password

from .artifacts import artifacts_of, describe, shown_results
from .common import (
    Database,
    confirm,
    fmt_age,
    fmt_params,
    fmt_time,
    fmt_value,
    job_json,
    out,
    parse_ids,
    plain_number,
    print_json,
    styled_status,
    with_database,
)
from .provenance import code_json, code_lines, named_text

PANEL_EDGES = 4  # a panel's border and padding, left and right


def _statuses(values: tuple[str, ...]) -> list[Status]:
    return [parse_status(v) for value in values for v in value.split(",") if v]


def _varying_keys(jobs: list[Job]) -> set[str]:
    """Parameters that differ between jobs (the others are printed once above the table)."""
    seen: dict[str, set[str]] = {}
    for j in jobs:
        for k, v in j.params.items():
            seen.setdefault(k, set()).add(json.dumps(v, sort_keys=True))
    return {k for k, vals in seen.items() if len(vals) > 1 or any(k not in j.params for j in jobs)}


def _results_summary(results: dict | None, width: int = 3) -> list[str]:
    """The headline numbers of a job's results, as ``name=value`` pairs."""
    if not results:
        return []
    headline = ("valid_error", "test_error", "train_error", "loss", "accuracy")
    items = [
        (k, v)
        for k, v in results.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.startswith("_")
    ]
    items.sort(key=lambda kv: headline.index(kv[0]) if kv[0] in headline else len(headline))
    return [f"{k}={fmt_value(v)}" for k, v in items[:width]]


def _pieces(pair: str, level: int) -> list[str]:
    """A ``name=value`` pair as the pieces a line may end after: whole (level 0), or after its '='
    (level 1 and up; at level 2 a name longer than its column is folded, never a value)."""
    name, sep, value = pair.partition("=")
    return [name + sep, value] if level and sep and value else [pair]


def _fit_widths(columns: list[list[list[str]]], room: int) -> tuple[list[int], int]:
    """Widths of the wrapped columns (each cell a list of pairs) within ``room`` characters, and the level
    of breaking that needs (see :func:`_pieces`): whole pairs if they fit, else pairs broken after their
    '=', else names folded; a value is never cut. Each column gets at least its widest unbreakable
    piece, the rest in proportion to what it would take unwrapped."""
    natural = [max((len(" ".join(cell)) for cell in cells), default=0) for cells in columns]
    if sum(natural) <= room:
        return natural, 0
    for level in (0, 1, 2):
        least = [
            max(
                (len(p) for cell in cells for pair in cell for p in _pieces(pair, level)[level == 2 :]),
                default=0,
            )
            for cells in columns
        ]
        if sum(least) <= room:
            break
    spare = max(0, room - sum(least))
    wants = [n - m for n, m in zip(natural, least)]
    total = sum(wants) or 1
    return [m + spare * w // total for m, w in zip(least, wants)], level


def _wrapped(pairs: list[str], width: int, level: int) -> str:
    """``pairs`` on lines of at most ``width``, broken between pairs (and as ``level`` allows)."""
    lines: list[str] = []
    line = ""
    for pair in pairs:
        for i, piece in enumerate(_pieces(pair, level)):
            glue = "" if i else " "
            if line and len(line) + len(glue) + len(piece) > width:
                lines.append(line)
                line = ""
            while len(piece) > width and not line:  # a name wider than the column, folded
                lines.append(piece[:width])
                piece = piece[width:]
            line = line + glue + piece if line else piece
    return "\n".join([*lines, line] if line else lines)


@click.command("list")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
@click.option(
    "--status",
    "-s",
    "status",
    multiple=True,
    metavar="STATUS",
    help="Only these statuses (names, jobman codes or START/ERR_RUN; comma-separated or repeated).",
)
@click.option("--phase", type=int, help="Only this phase.")
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only jobs whose parameter KEY has this value (lr=0.1; repeat to AND).",
)
@click.option("--limit", type=click.IntRange(1), help="At most this many jobs: the first, by id.")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
def list_jobs(
    database: Database, status: tuple[str, ...], phase: int | None, params: tuple[str, ...], limit: int | None, fmt: str
) -> None:
    """One row per job: id, phase, status, attempt, parameters, results.

    \b
    Example:
      jobman list --db sqlite:///sweeps.db --table mlp --status RUNNING,FAILED
      jobman list 'sqlite:///sweeps.db?table=mlp' --format json | jq '.[].status'
      jobman list --param lr=0.1 --status DONE --limit 20
    """
    wanted = _param_filter(params)
    store = database.open()
    jobs = store.jobs(status=_statuses(status), phase=phase, limit=limit, params=wanted or None)
    if fmt == "json":
        print_json([job_json(j) for j in jobs])
        return
    if fmt == "csv":
        keys = sorted({k for j in jobs for k in j.params})
        rkeys = sorted({k for j in jobs for k in (j.results or {})})
        writer = csv.writer(sys.stdout)
        writer.writerow(["id", "phase", "status", "attempt", "depends_on", *keys, *rkeys])
        for j in jobs:
            writer.writerow(
                [
                    j.id,
                    j.phase,
                    j.status.value,
                    j.attempt,
                    " ".join(map(str, j.depends_on)),
                    *[json.dumps(j.params.get(k)) for k in keys],
                    *[json.dumps((j.results or {}).get(k)) for k in rkeys],
                ]
            )
        return
    jobs = _calls_shown(store, jobs)
    varying = _varying_keys(jobs)
    if jobs:
        common = {k: v for k, v in jobs[0].params.items() if k not in varying}
        if common and len(jobs) > 1:
            out.print(f"[dim]all jobs:[/] {fmt_params(common)}")
    rungs = store.rungs([j.id for j in jobs])  # jobs of successive-halving searches: their rung shows beside the phase
    on_gpus = any(j.gpus for j in jobs)
    gangs = any(j.ranks > 1 for j in jobs)
    rows = []
    for j in jobs:
        shown = j.params if len(jobs) == 1 else {k: v for k, v in j.params.items() if k in varying}
        rows.append(
            (
                [
                    str(j.id),
                    str(j.phase),
                    *((f"{rungs[j.id][0]}/{rungs[j.id][1] - 1}" if j.id in rungs else "",) if rungs else ()),
                    j.status.value,
                    *((str(j.ranks),) if gangs else ()),
                    f"{j.attempt}/{j.max_attempts}",
                    ",".join(map(str, j.depends_on[:4])) + ("…" if len(j.depends_on) > 4 else ""),
                ],
                [[f"{k}={fmt_value(v)}" for k, v in shown.items()], _results_summary(j.results)],
                [
                    _where(j) if j.status is Status.RUNNING and j.host else "",
                    *((j.gpus or "",) if on_gpus else ()),
                ],
            )
        )
    before = ["id", "phase", *(("rung",) if rungs else ()), "status", *(("ranks",) if gangs else ()), "try", "after"]
    after = ["where", *(("gpu",) if on_gpus else ())]
    # A column no job fills is left out: at 80 columns its room is the numbers'.
    keep_after = any(cells[-1] for cells, _, _ in rows)
    keep_where = any(cells[0] for _, _, cells in rows)
    if not keep_after:
        before.pop()
        rows = [(cells[:-1], pairs, tail) for cells, pairs, tail in rows]
    if not keep_where:
        after.pop(0)
        rows = [(head, pairs, tail[1:]) for head, pairs, tail in rows]
    fixed = [max([len(head), *(len(cells[i]) for cells, _, _ in rows)]) for i, head in enumerate(before)]
    fixed += [max([len(head), *(len(cells[i]) for _, _, cells in rows)]) for i, head in enumerate(after)]
    # Numbers are never cut in two: the params and results columns are wrapped here, between pairs.
    room = out.width - sum(fixed) - 2 * (len(fixed) + 1)
    wrapped = [[cells[k] for _, cells, _ in rows] for k in range(2)]
    widths, level = _fit_widths(wrapped, max(room, len("params") + len("results")))
    widths = [max(w, len(head)) for w, head in zip(widths, ("params", "results"))]
    grid = Table(box=None, header_style="bold", pad_edge=False)
    for col in before:
        grid.add_column(col, no_wrap=True)
    for col, width in zip(("params", "results"), widths):
        grid.add_column(col, width=width, no_wrap=True, overflow="fold")
    for col in after:
        grid.add_column(col, no_wrap=True)
    at = before.index("status")
    for head, pairs, tail in rows:
        head[at] = styled_status(head[at])
        grid.add_row(*head, *(_wrapped(p, w, level) for p, w in zip(pairs, widths)), *tail)
    out.print(grid)
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.status.value] = counts.get(j.status.value, 0) + 1
    # No total of a large experiment here: counting every matching job would read them all.
    more = " (the first by id; more may follow: raise --limit)" if limit and len(jobs) == limit else ""
    out.print(f"[dim]{len(jobs)} jobs{more}: " + ", ".join(f"{n} {s}" for s, n in in_display_order(counts)) + "[/]")


def _param_filter(given: tuple[str, ...]) -> dict:
    """``--param lr=0.1 --param act=tanh`` as the values to match, typed as a sweep types them."""
    from jobman.jobdb.sweep import parse_value

    out: dict = {}
    for item in given:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--param {item!r}: write KEY=VALUE, such as lr=0.1")
        try:
            out[key] = parse_value(raw)
        except ValueError as exc:  # 'message@position'
            message, _, pos = str(exc).rpartition("@")
            raise UsageError(f"--param {item!r}: {message} at character {len(key) + 2 + int(pos)}") from None
        if not isinstance(out[key], (int, float, str, bool, list, type(None))):
            raise UsageError(f"--param {item!r}: a filter matches one value, not a distribution")
    return out


@click.command("show")
@click.argument("args", nargs=-1, required=True, metavar="[DB] ID")
@with_database("args")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--diff", "diff", is_flag=True, help="Print the uncommitted changes of the tree the job's code came from."
)
@click.option("--packages", is_flag=True, help="Print the packages installed where the job ran (name==version).")
def show(args: tuple[str, ...], database: Database, fmt: str, diff: bool, packages: bool) -> None:
    """One job, whole: parameters, results, dependencies, where it ran, the code and environment it
    ran, its status history.

    \b
    Example:
      jobman show 7 --db 'sqlite:///sweeps.db?table=mlp'
      jobman show 7 --diff > job7.patch
    """
    ids = parse_ids(args)
    if len(ids) != 1:
        raise click.UsageError("give exactly one job id")
    if diff and packages:
        raise click.UsageError("give --diff or --packages, not both")
    store = database.open()
    job = store.job(ids[0])
    if diff or packages:
        click.echo(named_text(store, job, "diff" if diff else "packages"), nl=False)
        return
    children = store.children(job.id)
    events = store.events(job.id)
    if fmt == "json":
        print_json(show_json(store, job, children, events))
        return
    # A line wider than the terminal is cut, and says so: "…" at its end, and a pointer to all of it.
    body = Text.from_markup("\n".join(show_lines(store, job, children)), overflow="ellipsis")
    body.no_wrap = True
    out.print(Panel(body, expand=False))
    if any(cell_len(line) > out.width - PANEL_EDGES for line in body.plain.splitlines()):
        out.print(f"[dim]… marks a line cut to fit: `jobman show {job.id} --format json` shows it whole[/]")
    print_artifacts(database, job)
    if job.error:
        out.print("[bold red]error[/]")
        out.print(job.error.rstrip(), markup=False, highlight=False)
    history = Table(title="history", box=None, header_style="bold")
    for col in ("when", "from", "to", "try", "why", "by"):
        history.add_column(col, overflow="fold")
    for e in events:
        history.add_row(
            fmt_time(e.at), e.from_status or "", e.to_status or "", str(e.attempt or ""), e.why, e.source or ""
        )
    out.print(history)


def _where(job: Job) -> str:
    """Where a running job runs: host:pid, or for a gang each host and the pids of its ranks there."""
    if job.ranks > 1 and job.workdir:
        hosts: dict[str, list[str]] = {}
        for place in rank_places(job.workdir, job.ranks):
            if place["host"]:
                hosts.setdefault(place["host"], []).append(str(place["pid"]))
        if hosts:
            return " ".join(f"{host}:{','.join(pids)}" for host, pids in hosts.items())
    return f"{job.host}:{job.pid}"


def _calls_shown(store: Store, jobs: list[Job]) -> list[Job]:
    """``jobs`` with each parameter that is another call's value shown as that call's job
    (``<job 3>``), not as the identity it is stored by."""
    taking = [j for j in jobs if takes_calls(j.params)]
    if not taking:
        return jobs
    id_of = {h: i for i, h in store.identities(sorted({d for j in taking for d in j.depends_on})).items()}
    if any(not j.depends_on for j in taking):  # read without their dependencies: look them up by identity
        wanted = {h for j in taking for h in call_refs(j.params)} - set(id_of)
        id_of.update((h, job.id) for h, job in store.find(sorted(wanted)).items())
    shown = {j.id: replace_refs(j.params, lambda h: f"<job {id_of[h]}>" if h in id_of else "<gone>") for j in taking}
    return [dataclasses.replace(j, params=shown[j.id]) if j.id in shown else j for j in jobs]


def _call_lines(store: Store, job: Job, children: list[int]) -> list[str]:
    """`show`'s lines on the calls a job takes (by parameter) and the calls that take it."""
    lines = []
    if takes_calls(job.params):
        by_identity = {p.identity: p for p in store.parents(job.id)}
        for name, value in job.params.items():
            taken = [by_identity.get(h) for h in dict.fromkeys(call_refs(value))]
            said = ", ".join(f"job {p.id} ({p.target})" if p else "a call no longer here" for p in taken)
            if said:
                lines.append(f"takes     {name} = {said}")
    if children and job.identity:
        takers = [c for c in store.jobs(ids=children, with_deps=False) if job.identity in set(call_refs(c.params))]
        if takers:
            lines.append(f"taken by  {', '.join(f'job {c.id} ({c.target})' for c in takers)}")
    return lines


def show_json(store: Store, job: Job, children: list[int], events: list[Any]) -> dict[str, Any]:
    """What `show --format json` prints of one job."""
    data = job_json(job)
    if job.ranks > 1 and job.workdir:
        data["rank_logs"] = rank_logs(job.workdir, job.ranks)
        data["rank_places"] = rank_places(job.workdir, job.ranks)
    data["children"] = children
    rung = store.rungs([job.id]).get(job.id)
    data["rung"] = None if rung is None else {"rung": rung[0], "last": rung[1] - 1, "resource": rung[2]}
    data["code"], data["environment"] = code_json(job)
    data["events"] = [e.__dict__ for e in events]
    data["artifacts"] = [
        {"name": name, "digest": ref[REF], **{k: v for k, v in ref.items() if k != REF}}
        for name, ref in artifacts_of(job)
    ]
    return data


def show_lines(store: Store, job: Job, children: list[int]) -> list[str]:
    """The lines of `show`'s panel for one job."""
    lines = [
        f"[bold]job {job.id}[/]  phase {job.phase}  {styled_status(job.status)}  attempt {job.attempt}/"
        f"{job.max_attempts}  priority {plain_number(job.priority)}",
        f"target    {job.kind} {job.target}",
        f"params    {fmt_params(_calls_shown(store, [job])[0].params) or '-'}",
        f"results   {json.dumps(shown_results(job.results), sort_keys=True) if job.results else '-'}",
        f"after     {', '.join(map(str, job.depends_on)) or '-'}     before  {', '.join(map(str, children)) or '-'}",
        *_call_lines(store, job, children),
        f"ran on    {job.host or '-'} pid {job.pid or '-'}  backend {job.backend or '-'} {job.backend_id or ''}"
        + (f"  GPU {job.gpus}" if job.gpus else ""),
        f"workdir   {job.workdir or '-'}",
        *code_lines(job),
    ]
    rung = store.rungs([job.id]).get(job.id)
    if rung is not None:
        continued = store.continues_from(job.id) if rung[0] else None
        lines.append(
            f"search    successive halving, rung {rung[0]} of {rung[1] - 1} ({rung[2]}="
            f"{job.params.get(rung[2])})"
            + (
                f"; continues job {job.depends_on[0]} from its workdir {continued} and the state it saved"
                if rung[0] and job.depends_on
                else ""
            )
        )
    if job.ranks > 1:
        lines.append(f"ranks     {job.ranks}, started together; rank 0's results are the job's")
        if job.workdir:
            for place in rank_places(job.workdir, job.ranks):
                where = f"{place['host']} pid {place['pid']}" if place["host"] else "not started"
                lines.append(f"  rank {place['rank']}  {where}  {place['log']}")
    if job.log_path:
        lines.append(f"output    {job.log_path}")
    elif job.workdir and job.kind == "cmd":
        lines.append(f"output    {job.workdir}/stdout.txt, {job.workdir}/stderr.txt")
    heartbeat = fmt_age(job.heartbeat_at) + " ago" if job.heartbeat_at else "-"
    lines.append(
        f"times     created {fmt_time(job.created_at)}  started {fmt_time(job.started_at)}  "
        f"heartbeat {heartbeat}  finished {fmt_time(job.finished_at)}"
    )
    if job.exit_code is not None:
        lines.append(f"exit code {job.exit_code}")
    return lines


def print_artifacts(database: Database, job: Job) -> None:
    """`show`'s table of a job's artifacts, and how to fetch one."""
    kept = artifacts_of(job)
    if not kept:
        return
    table = Table(title="artifacts", box=None, header_style="bold", title_justify="left")
    for col in ("name", "size", "what", "digest"):
        table.add_column(col, overflow="fold")
    for name, ref in kept:
        size, _, rest = describe(ref).partition("  ")
        what, _, digest = rest.rpartition("  ")
        table.add_row(name, size, what, digest)
    out.print(table)
    url = shlex.quote(mask_password(database.target.with_table()))
    out.print(f"fetch one: jobman artifact {url} {job.id} NAME -o PATH", markup=False, highlight=False)


@click.command("sqlstatus")
@click.argument("args", nargs=-1, metavar="[DB] [ID]...")
@with_database("args")
@click.option(
    "--status",
    "status",
    multiple=True,
    metavar="STATUS",
    help="Only jobs with this status (START, RUNNING, DONE, ERR_RUN, ERR_START, CANCELED, a code, or a name).",
)
@click.option(
    "--select",
    "select",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only jobs whose parameter or result KEY equals VALUE (dotted names; repeat to AND).",
)
@click.option(
    "--fselect",
    "fselect",
    multiple=True,
    metavar="KEY=LAMBDA",
    help="Only jobs where LAMBDA(value of KEY) is true: --fselect 'lr=lambda v: v < 0.1'.",
)
@click.option("--set_status", "--set-status", "set_to", metavar="STATUS", help="Set the selected jobs to STATUS.")
@click.option(
    "--restart", is_flag=True, help="Set the selected jobs back to START; each resumes from the state it saved."
)
@click.option(
    "--reset_prio",
    "--reset-prio",
    "reset_prio",
    is_flag=True,
    help="Set the selected jobs' priority back to 0, sqlschedule's default.",
)
@click.option("--print", "print_key", multiple=True, metavar="KEY", help="Print KEY's value for each job.")
@click.option(
    "--print_keys",
    "--print-keys",
    "print_keys",
    is_flag=False,
    flag_value="*",
    default=None,
    metavar="[K1,K2]",
    help="Print these keys' values; alone, list the keys the jobs have.",
)
@click.option("--ret_nb_jobs", "--count", "count", is_flag=True, help="Print only the number of jobs.")
@click.option(
    "--all", "everything", is_flag=True, help="Every job of the experiment (to change them all, it asks first)."
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (scripts).")
def sqlstatus(
    args: tuple[str, ...],
    database: Database,
    status: tuple[str, ...],
    select: tuple[str, ...],
    fselect: tuple[str, ...],
    set_to: str | None,
    restart: bool,
    reset_prio: bool,
    print_key: tuple[str, ...],
    print_keys: str | None,
    count: bool,
    everything: bool,
    yes: bool,
) -> None:
    """jobman's status view: jobs with their numeric status codes; --restart, --set_status, --reset_prio.

    \b
    Example:
      jobman sqlstatus 'sqlite:///sweeps.db?table=mlp' --status START
      jobman sqlstatus 'sqlite:///sweeps.db?table=mlp' 3 4 --restart
      jobman sqlstatus 'sqlite:///sweeps.db?table=mlp' --select hyper.nhid=20 --print valid_error
    --set_status, --restart and --reset_prio change the jobs named by ids, --status, --select or
    --fselect; every job only with --all.
    """
    if restart and set_to is not None:
        raise UsageError("--restart is --set_status START: give one of them")
    if restart:
        set_to = "START"
    ids = parse_ids(args)
    statuses = _statuses(status)
    tests = [*_select_tests(select), *_fselect_tests(fselect)]
    named = bool(ids or statuses or tests)
    changing = set_to is not None or reset_prio
    new = parse_status(set_to) if set_to is not None else None
    if changing and not (named or everything):
        raise UsageError("name the jobs to change: ids (12, 12,13 or 10-20), --status, --select, or --all")
    store = database.open()
    jobs = store.jobs(status=statuses, ids=ids, with_deps=False)
    jobs = [j for j in jobs if all(test({**j.params, **(j.results or {})}) for test in tests)]
    if changing:
        if not jobs:
            raise UsageError("no job matches; nothing was changed")
        if everything and not named:
            what = f"set to {new.value}" if new is not None else "back to priority 0"
            confirm(f"every job of experiment {store.experiment!r} ({len(jobs)}) {what}?", yes)
        if new is not None:
            changed = store.set_status([j.id for j in jobs], new)
            click.echo(f"{len(changed)} job(s) set to {new.value} ({CODES[new]})")
        if reset_prio:
            n = store.set_priority([j.id for j in jobs], 0)
            click.echo(f"{n} job(s) back to priority 0")
        return
    if count:
        click.echo(str(len(jobs)))
        return
    if print_keys == "*":
        keys = sorted({k for j in jobs for k in {**j.params, **(j.results or {})}})
        click.echo(" ".join(keys) if keys else "no job has any key")
        return
    keys = [k for k in (print_keys or "").split(",") if k] + list(print_key)
    for j in jobs:
        extra = " ".join(f"{k}={fmt_value({**j.params, **(j.results or {})}.get(k))}" for k in keys)
        click.echo(
            f"Job {j.id}: status {CODES[j.status]} ({j.status.value}) phase {j.phase}" + (f" {extra}" if extra else "")
        )
    if not jobs:
        click.echo("no job matches")


_MISSING = object()


def _select_tests(selects: tuple[str, ...]) -> list:
    from jobman.jobdb.sweep import parse_value

    tests = []
    for sel in selects:
        key, eq, raw = sel.partition("=")
        if not eq or not key:
            raise UsageError(f"--select {sel!r}: write KEY=VALUE, such as lr=0.1")
        try:
            value = parse_value(raw)
        except ValueError:
            value = raw
        tests.append(lambda state, key=key, value=value: state.get(key, _MISSING) == value)
    return tests


def _fselect_tests(fselects: tuple[str, ...]) -> list:
    tests = []
    for sel in fselects:
        key, eq, source = sel.partition("=")
        if not eq or not key or not source.strip():
            raise UsageError(f"--fselect {sel!r}: write KEY=LAMBDA, such as 'lr=lambda v: v < 0.1'")
        try:
            fn = eval(compile(source, "--fselect", "eval"), {"__builtins__": __builtins__})  # the user's own code
        except Exception as exc:  # noqa: BLE001 - any error in the user's expression
            raise UsageError(f"--fselect {sel!r}: {type(exc).__name__}: {exc}") from None
        if not callable(fn):
            raise UsageError(f"--fselect {sel!r}: {source.strip()!r} is not a function (write lambda v: ...)")

        def test(state: dict[str, Any], key: str = key, fn: Callable[[Any], Any] = fn, sel: str = sel) -> bool:
            if key not in state:
                return False
            try:
                return bool(fn(state[key]))
            except Exception as exc:  # noqa: BLE001
                raise UsageError(f"--fselect {sel!r} raised {type(exc).__name__}: {exc}") from None

        tests.append(test)
    return tests


COMMANDS = [list_jobs, show, sqlstatus]

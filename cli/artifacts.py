"""A job's artifacts: ``jobman artifact`` fetches one, ``jobman gc`` reclaims what nothing references."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from jobman.jobdb import artifacts, reclaim
from jobman.jobdb.errors import UsageError
from jobman.jobdb.store import Job

from .common import Database, out, parse_ids, with_database


def store_of(database: Database) -> artifacts.ArtifactStore:
    """The artifact store of the command's database (``--artifacts``, ``?artifacts=``, or its default)."""
    return artifacts.for_database(database.target)


def artifacts_of(job: Job) -> list[tuple[str, dict[str, Any]]]:
    """``(name, reference)`` of each artifact a job's results refer to, by name."""
    return sorted(artifacts.refs_in(job.results or {}))


def fmt_size(size: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size = size / 1000  # type: ignore[assignment]
    return str(size)  # pragma: no cover - the loop returns


def describe(ref: dict[str, Any]) -> str:
    """One artifact in a few words: its size and what it is."""
    what = {"npy": "array (.npy)", "pickle": f"pickled {ref.get('type', 'object')}", "file": "file"}[ref["kind"]]
    if ref["kind"] == "file":
        what += f" {ref.get('filename', '')}"
    return f"{fmt_size(int(ref.get('size', 0)))}  {what}  {ref[artifacts.REF][:12]}"


def shown_results(value: Any) -> Any:
    """Results to print: each artifact reference as a short mark (its kind and size, listed in full below)."""
    if artifacts.is_ref(value):
        return f"<{value['kind']} {fmt_size(int(value.get('size', 0)))}>"
    if isinstance(value, dict):
        return {k: shown_results(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown_results(v) for v in value]
    return value


@click.command("artifact")
@click.argument("args", nargs=-1, required=True, metavar="[DB] ID NAME")
@with_database("args")
@click.option("-o", "--output", metavar="PATH", help="Write it to PATH (a folder: under its own name); default stdout.")
def artifact(args: tuple[str, ...], database: Database, output: str | None) -> int:
    """Fetch one of a job's artifacts (a value it returned that JSON cannot hold, a file it attached).

    \b
    Examples:
      jobman artifact 'sqlite:///runs.db?table=mlp' 7 weights -o weights.npy
      jobman artifact 7 plot > plot.png
    An array is written as a .npy file (numpy.load reads it), another object as a pickle, a file as it was.
    """
    if len(args) != 2:
        raise click.UsageError("give a job id and an artifact name")
    job_id = parse_ids(args[:1])[0]
    name = args[1]
    job = database.open().job(job_id)
    found = dict(artifacts_of(job))
    ref = found.get(name)
    if ref is None:
        names = ", ".join(found) or "none"
        raise UsageError(f"job {job.id} has no artifact {name!r} (its artifacts: {names})")
    store = store_of(database)
    if output is None:
        if sys.stdout.isatty():
            raise UsageError(f"artifact {name!r} is binary: give -o PATH, or redirect the output")
        store.copy_to(ref[artifacts.REF], sys.stdout.buffer)
        sys.stdout.buffer.flush()
        return 0
    target = Path(output)
    if not target.is_dir() and not target.parent.is_dir():
        raise UsageError(f"cannot write {output}: there is no folder {str(target.parent)!r}")
    if target.is_dir():
        target = target / artifacts.file_name(name, ref)
    # Written beside the target and moved there once whole and checked: a damaged artifact leaves nothing.
    fd, tmp = tempfile.mkstemp(dir=target.parent if str(target.parent) else ".", prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            size = store.copy_to(ref[artifacts.REF], fh)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    click.echo(f"wrote {target} ({fmt_size(size)})", err=True)
    return 0


@click.command("gc")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
@click.option("--dry-run", "-n", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option(
    "--grace",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    metavar="SECONDS",
    help="Keep what was written this recently too (for a store on another machine's clock).",
)
def gc(database: Database, dry_run: bool, grace: float) -> int:
    """Remove the artifacts no job of the database refers to any more.

    \b
    Example:
      jobman gc 'postgresql://u@host/db' --artifacts /shared/jobman/artifacts --dry-run
    What a running job may still refer to is kept. The whole database's jobs count, every experiment.
    """
    store = database.open()
    done = reclaim.collect(store, store_of(database), grace=grace, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    out.print(
        f"{verb} {len(done.removed)} artifact(s), {fmt_size(done.bytes)}; kept {done.kept}"
        + (f"; {done.unfinished} unfinished write(s) cleared" if done.unfinished else "")
    )
    return 0


COMMANDS = [artifact, gc]

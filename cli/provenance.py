"""A job's code and environment record, shown: the lines of ``jobman show``, its JSON, and the
texts it names (``show --diff``, ``show --packages``)."""

from __future__ import annotations

from typing import Any

from jobman.jobdb.errors import UsageError
from jobman.jobdb.records import Job
from jobman.jobdb.status import Status

UNKNOWN = "unknown: its run was recorded before jobman kept the code a job ran"


def code_json(job: Job) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The ``code`` and ``environment`` objects of ``show --format json`` (None when unknown); a
    job not run yet has only where its target was found."""
    record = job.code or {}
    code = dict(record.get("code") or {})
    if record.get("where") and "where" not in code:
        code["where"] = record["where"]
    return code or None, record.get("environment")


def code_lines(job: Job) -> list[str]:
    """The lines of ``jobman show`` that say what code and environment the job ran."""
    code, env = code_json(job)
    if env is None:
        ran = job.status is Status.RUNNING or job.finished_at is not None
        if ran:
            return [f"code      {UNKNOWN}"]
        where = (code or {}).get("where")
        return ["code      not run yet" + (f"; its target was found in {where}" if where else "")]
    assert code is not None
    lines = [f"code      source {code['source'][:12] if code.get('source') else 'unknown'}"]
    if code.get("commit"):
        dirty = code.get("dirty")
        state = " + uncommitted changes (--diff)" if dirty else " clean" if dirty is False else ""
        lines.append(f"git       {code['commit'][:12]}{state}")
    else:
        lines.append("git       no commit yet" if code.get("repo") else "git       not in a git tree")
    if code.get("file") or code.get("repo"):
        lines.append(f"from      {code.get('file') or code.get('repo')}")
    lines.append(f"env       Python {env.get('python')}  jobman {env.get('jobman') or '?'}  host {env.get('host')}")
    lines.append(f"packages  {str(env.get('packages'))[:12]} (--packages)")
    return lines


def named_text(store: Any, job: Job, kind: str) -> str:
    """The diff or the package list the job's record names; a UsageError saying why there is none."""
    code, env = code_json(job)
    if env is None:
        raise UsageError(f"job {job.id} has no code record: {UNKNOWN.partition(': ')[2]}")
    key = (code or {}).get("diff") if kind == "diff" else env.get("packages")
    if not key:
        if kind == "diff":
            raise UsageError(f"job {job.id} ran a tree without uncommitted changes (or not in a git tree): no diff")
        raise UsageError(f"job {job.id} has no package list recorded")
    found = store.code_text(key)
    if found is None:
        raise UsageError(f"the {kind} of job {job.id} ({key[:12]}) is not kept in this database")
    return found[1]

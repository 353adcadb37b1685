"""The code and environment jobs ran, as the database keeps them: texts many jobs share (a diff, a
package list) kept once by digest, and the DONE jobs of a sweep that ran another version of their
target than the one being scheduled."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .records import code_of
from .schema import code_text as t_text
from .schema import job as t_job
from .status import Status
from .txn import chunks


def keep_texts(conn: Connection, texts: dict[str, tuple[str, str]], now: float) -> None:
    """Insert the texts not kept yet (``{digest: (kind, body)}``); one already kept is left as is."""
    have = set(conn.execute(sa.select(t_text.c.digest).where(t_text.c.digest.in_(list(texts)))).scalars())
    rows = [
        {"digest": key, "kind": kind, "body": body, "stored_at": now}
        for key, (kind, body) in texts.items()
        if key not in have
    ]
    if rows:  # two workers may keep the same text at once: the second's is the same, and is left out
        if conn.dialect.name == "postgresql":
            from sqlalchemy.dialects import postgresql as dialect
        else:
            from sqlalchemy.dialects import sqlite as dialect  # type: ignore[no-redef]
        conn.execute(dialect.insert(t_text).on_conflict_do_nothing(index_elements=["digest"]), rows)


def code_text(conn: Connection, digest: str) -> tuple[str, str] | None:
    """A kept text as ``(kind, body)``, or None."""
    row = conn.execute(sa.select(t_text.c.kind, t_text.c.body).where(t_text.c.digest == digest)).first()
    return (row.kind, row.body) if row is not None else None


def ran_before(conn: Connection, exp: int, targets: Iterable[str]) -> bool:
    """Whether any DONE job of these targets in experiment ``exp`` has its code recorded: only then
    can scheduling them again meet jobs that ran older code."""
    found = conn.execute(
        sa.select(t_job.c.id)
        .where(
            t_job.c.experiment_id == exp,
            t_job.c.target.in_(list(targets)),
            t_job.c.status == Status.DONE.value,
            t_job.c.code.is_not(None),
        )
        .limit(1)
    ).first()
    return found is not None


def ran_other_source(conn: Connection, ids: Iterable[int], source: str) -> list[int]:
    """Of the jobs ``ids``, the DONE ones whose run recorded a source digest other than ``source``
    (a job recorded before code was kept, whose code is unknown, is not among them)."""
    stale = []
    for batch in chunks(list(ids), 900):
        for job_id, raw in conn.execute(
            sa.select(t_job.c.id, t_job.c.code).where(t_job.c.id.in_(batch), t_job.c.status == Status.DONE.value)
        ):
            ran = (code_of(raw) or {}).get("code", {}).get("source")
            if ran is not None and ran != source:
                stale.append(job_id)
    return sorted(stale)


def where_found(conn: Connection, exp: int, targets: set[str], folder: str, after_id: int) -> None:
    """Record on the jobs of a target (``targets``: its spellings) just scheduled (ids past
    ``after_id``) the directory it was found from (a command's: where it was scheduled), for workers
    that run elsewhere; a job that has a record keeps it."""
    conn.execute(
        sa.update(t_job)
        .where(
            t_job.c.experiment_id == exp,
            t_job.c.id > after_id,
            t_job.c.target.in_(sorted(targets)),
            t_job.c.code.is_(None),
        )
        .values(code=json.dumps({"where": folder}))
    )


def versions_run(conn: Connection, ids: Iterable[int]) -> dict[int, tuple[Any, ...]]:
    """The version of the code each of the jobs ``ids`` ran, as (source, commit, diff), for those
    whose run was recorded with its code."""
    out = {}
    for batch in chunks(list(ids), 900):
        for job_id, raw in conn.execute(sa.select(t_job.c.id, t_job.c.code).where(t_job.c.id.in_(batch))):
            code = (code_of(raw) or {}).get("code")
            if code:
                out[job_id] = (code.get("source"), code.get("commit"), code.get("diff"))
    return out

"""The dependency graph: what a job's parents make of it, and what a job's end does downstream.

Functions of one transaction's connection and its event log (``log``, :meth:`Transactions.log`):
``refresh`` re-derives WAITING/QUEUED/BLOCKED of jobs not started from their parents;
``block_many`` blocks everything downstream of jobs that ended badly; ``descendants`` finds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .schema import job as t_job
from .schema import job_dep as t_dep
from .status import BLOCKING, PENDING, Status, names_of
from .txn import chunks, in_list_size

Log = Callable[[Connection, list[dict[str, Any]]], None]  # writes status changes (Transactions.log)


_P = t_job.alias("p")  # a job's parent; made once: an alias copies every column of the table
_BAD_PARENT = sa.exists().where(
    t_dep.c.job_id == t_job.c.id, t_dep.c.depends_on == _P.c.id, _P.c.status.in_(names_of(BLOCKING))
)
_OPEN_PARENT = sa.exists().where(
    t_dep.c.job_id == t_job.c.id, t_dep.c.depends_on == _P.c.id, _P.c.status != Status.DONE.value
)


def refresh(conn: Connection, log: Log, job_ids: Sequence[int], why: str) -> None:
    """Re-derive WAITING/BLOCKED/QUEUED of not-started jobs from their parents."""
    if not job_ids:
        return
    blocked: set[int] = set()
    size = in_list_size(conn)
    for _round in range(64):  # a job's parents may be in the set and move too: repeat until nothing moves
        moved = False
        for chunk in chunks(list(job_ids), size):
            rows = conn.execute(
                sa.select(
                    t_job.c.id,
                    t_job.c.status,
                    t_job.c.attempt,
                    sa.case(
                        (_BAD_PARENT, Status.BLOCKED.value),
                        (_OPEN_PARENT, Status.WAITING.value),
                        else_=Status.QUEUED.value,
                    ).label("want"),
                ).where(t_job.c.id.in_(chunk), t_job.c.status.in_(names_of(PENDING)))
            ).all()
            moves: dict[str, list[int]] = {}
            events = []
            for r in rows:
                if r.want != r.status:
                    moves.setdefault(r.want, []).append(r.id)
                    events.append(
                        {"job_id": r.id, "from_status": r.status, "to_status": r.want, "attempt": r.attempt, "why": why}
                    )
            now = time.time()
            for status, ids in moves.items():
                values: dict[str, Any] = {"status": status}
                if status == Status.QUEUED.value:
                    values["queued_at"] = now
                conn.execute(sa.update(t_job).where(t_job.c.id.in_(ids)).values(**values))
            log(conn, events)
            blocked.update(moves.get(Status.BLOCKED.value, []))
            moved = moved or bool(moves)
        if not moved or len(job_ids) == 1:
            break
    if blocked:  # their dependents outside the set can no longer run either
        still = [
            i
            for chunk in chunks(sorted(blocked), size)
            for i in conn.execute(
                sa.select(t_job.c.id).where(t_job.c.id.in_(chunk), t_job.c.status == Status.BLOCKED.value)
            ).scalars()
        ]
        block_many(conn, log, still, "a dependency is BLOCKED")


def dependents(conn: Connection, job_ids: Sequence[int]) -> list[int]:
    """The jobs that depend directly on any of ``job_ids``, by id."""
    out: set[int] = set()
    for chunk in chunks(list(job_ids)):
        out.update(conn.execute(sa.select(t_dep.c.job_id).where(t_dep.c.depends_on.in_(chunk))).scalars())
    return sorted(out)


def parent_ids(conn: Connection, job_id: int) -> list[int]:
    """The ids of the jobs ``job_id`` depends on, in order."""
    return sorted(conn.execute(sa.select(t_dep.c.depends_on).where(t_dep.c.job_id == job_id)).scalars())


def with_parent_outside(conn: Connection, job_ids: Sequence[int], among: set[int]) -> list[int]:
    """Those of ``job_ids`` that depend on some job not in ``among`` (job_dep's key, read in chunks)."""
    out: set[int] = set()
    for chunk in chunks(list(job_ids), in_list_size(conn)):
        out.update(
            child
            for child, parent in conn.execute(
                sa.select(t_dep.c.job_id, t_dep.c.depends_on).where(t_dep.c.job_id.in_(chunk))
            )
            if parent not in among
        )
    return sorted(out)


def descendants(conn: Connection, roots: Sequence[int]) -> list[int]:
    """Every job downstream of ``roots`` (not the roots themselves), one recursive query."""
    if not roots:
        return []
    out: set[int] = set()
    for chunk in chunks(list(roots)):
        down = sa.select(t_dep.c.job_id.label("id")).where(t_dep.c.depends_on.in_(chunk)).cte("down", recursive=True)
        down = down.union(sa.select(t_dep.c.job_id).join(down, t_dep.c.depends_on == down.c.id))
        out.update(conn.execute(sa.select(down.c.id)).scalars())
    return sorted(out - set(roots))


def block_many(conn: Connection, log: Log, dead: Sequence[int], why: str) -> int:
    """Block the WAITING and QUEUED dependents of many jobs: one recursive query, not one per job."""
    if not dead:
        return 0
    down = descendants(conn, list(dead))
    events, ids = [], []
    size = in_list_size(conn)
    for chunk in chunks(down, size):
        for r in conn.execute(
            sa.select(t_job.c.id, t_job.c.status, t_job.c.attempt).where(
                t_job.c.id.in_(chunk), t_job.c.status.in_([Status.WAITING.value, Status.QUEUED.value])
            )
        ):
            ids.append(r.id)
            events.append(
                {
                    "job_id": r.id,
                    "from_status": r.status,
                    "to_status": Status.BLOCKED.value,
                    "attempt": r.attempt,
                    "why": why,
                }
            )
    for chunk in chunks(ids, size):
        conn.execute(sa.update(t_job).where(t_job.c.id.in_(chunk)).values(status=Status.BLOCKED.value))
    log(conn, events)
    return len(ids)

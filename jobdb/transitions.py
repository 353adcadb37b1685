"""The status machine: every move of a job's status, and its rules, in one place.

Each function runs inside the caller's write transaction (``conn``) and writes every status
change it makes to the event log (``log``, :meth:`Transactions.log`) in that transaction, then
moves the graph on (:mod:`jobdb.graph`): a DONE job queues its ready dependents, a job that ends
badly blocks everything downstream, a job put back in the queue is re-derived from its parents.
The store's verbs (:mod:`jobdb.store`) open the transaction and call these; the checks a move
needs (ids of the experiment, the caller's lease, no RUNNING job reset by hand) live here too.
Moves of many jobs are batch-first: one locked read, one statement per chunk of ids, one insert
of events, and the graph moved on once for the set.

The moves::

    claim            QUEUED -> RUNNING                  (jobdb/hot.py: the claim statement; claim_job: a given job)
    assign           QUEUED -> QUEUED                   (an allocation made for the job, which it waits for)
    finish           RUNNING -> DONE | FAILED | CRASHED | QUEUED (INCOMPLETE, REQUEUE) | CANCELED (stop asked,
                                                         unless the run ended DONE)
    crash_found      RUNNING -> CRASHED | CANCELED      (the monitor: found dead)
    relaunch_crashed CRASHED -> QUEUED                  (within max_attempts, keeping the checkpoint)
    release          QUEUED -> QUEUED | CRASHED         (an allocation ended without claiming its job)
    reset            any -> WAITING, downstream too      (a relaunch keeps the checkpoint, a reset by hand not)
    cancel           WAITING | QUEUED | BLOCKED -> CANCELED; RUNNING: stop requested
    set_status       any -> any but RUNNING             (a job becomes RUNNING only by a claim)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import graph
from .canonical import dump_results
from .errors import LeaseLost, NoSuchJob, StateTooLarge, UsageError
from .graph import Log
from .hot import HotStatements, claim_args, claim_values, owned
from .records import CLAIMED_ATTEMPT, Claimed, Found, Job, WorkerInfo
from .schema import job as t_job
from .schema import job_dep as t_dep
from .schema import job_event as t_event
from .schema import job_metric as t_metric
from .shape import shape_problem
from .status import BLOCKING, PENDING, REQUEUED, Outcome, Status, names_of
from .txn import chunks, in_list_size

MAX_STATE_BYTES = 4 * 1024 * 1024  # a job's results/checkpoint JSON; weights belong in its workdir
# The worker loop's status names, read once (an Enum's ``value`` is a property).
_QUEUED, _RUNNING, _DONE = Status.QUEUED.value, Status.RUNNING.value, Status.DONE.value
_RECHECK = "its dependencies are not all DONE"
Clock = Callable[[Connection], float]  # the time to stamp a move with (the store's: the database server's)
Ended = Callable[[Connection, int], None]  # told of a job that ended, in the transaction that ends it


def _local_time(_conn: Connection) -> float:
    return time.time()


def check_settable(status: Status) -> None:
    """The rule of ``set_status``: no RUNNING by hand (a RUNNING job with no worker, pid or heartbeat
    would never end, and the monitor could not find it)."""
    if status is Status.RUNNING:
        raise UsageError("a job becomes RUNNING only when a worker claims it; set QUEUED to have it run")


def current(conn: Connection, job_ids: Sequence[int]) -> list[Any]:
    """Jobs' id, status and attempt as they are now in this transaction, by id, their rows locked."""
    rows: list[Any] = []
    for chunk in chunks(sorted(set(job_ids))):
        rows.extend(
            conn.execute(
                sa.select(t_job.c.id, t_job.c.status, t_job.c.attempt)
                .where(t_job.c.id.in_(chunk))
                .order_by(t_job.c.id)
                .with_for_update()
            )
        )
    return rows


def named(ids: Sequence[int]) -> str:
    """``job 3``, or ``jobs 1, 2, 3, 4, 5 and 7 more``: jobs named in a reason."""
    if len(ids) == 1:
        return f"job {ids[0]}"
    return "jobs " + ", ".join(map(str, ids[:5])) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


# -- the claim ------------------------------------------------------------------------------


def claim(
    conn: Connection,
    log: Log,
    hot: HotStatements,
    exp: int,
    worker: WorkerInfo,
    workdir_root: str | None,
    now: float,
    pending: list[dict[str, Any]] | None = None,
    skip: frozenset[str] = frozenset(),
) -> Found | None:
    """Take the first QUEUED job of ``exp`` (by priority, then order, then id) whose target is not
    in ``skip``, or None. With ``pending``, its event is left there for the caller to write; the
    answer becomes a :class:`Claimed` (``records.to_claimed``) once the write lock is released."""
    rows = hot.claim_skipping(skip).rows(conn, exp=exp, **claim_args(worker, workdir_root, now))
    if not rows:
        return None
    row = rows[0]
    log_claim(conn, log, row[0], row[CLAIMED_ATTEMPT], worker, pending)
    parents = [dict(zip(hot.parent_columns, r)) for r in hot.parent_rows.rows(conn, id=row[0])] if row[-1] else []
    return row, parents, now


def claim_job(
    conn: Connection,
    log: Log,
    exp: int,
    job_id: int,
    worker: WorkerInfo,
    workdir_root: str | None,
    now: float,
    assigned_to: str | None = None,
) -> Claimed | None:
    """Take one given QUEUED job, or None; with ``assigned_to``, only if that backend id is the job's."""
    where = [t_job.c.id == job_id, t_job.c.experiment_id == exp, t_job.c.status == _QUEUED]
    if assigned_to is not None:
        where.append(t_job.c.backend_id == assigned_to)
    row = conn.execute(
        sa.update(t_job).where(*where).values(**claim_values()).returning(*t_job.c),
        claim_args(worker, workdir_root, now),
    ).first()
    if row is None:
        return None
    job = Job.from_row(row, graph.parent_ids(conn, row.id))
    log_claim(conn, log, job.id, job.attempt, worker)
    return Claimed(job, job.lease)


def log_claim(
    conn: Connection,
    log: Log,
    job_id: int,
    attempt: int,
    worker: WorkerInfo,
    pending: list[dict[str, Any]] | None = None,
) -> None:
    """Log a claim (QUEUED -> RUNNING) in the claiming transaction, or leave its event in ``pending``."""
    event = {
        "job_id": job_id,
        "from_status": _QUEUED,
        "to_status": _RUNNING,
        "attempt": attempt,
        "why": f"claimed by {worker.host}:{worker.pid}"
        + (f" ({worker.backend} {worker.backend_id})" if worker.backend_id else ""),
    }
    if pending is None:
        log(conn, [event])
    else:
        pending.append(event)


def assign(
    conn: Connection, log: Log, exp: int, job_id: int, backend: str, backend_id: str, log_path: str | None
) -> bool:
    """Allocation ``backend_id`` was made to run this QUEUED job; False if the job is not QUEUED any
    more or another allocation already waits for it."""
    row = conn.execute(
        sa.update(t_job)
        .where(
            t_job.c.id == job_id,
            t_job.c.experiment_id == exp,
            t_job.c.status == _QUEUED,
            sa.or_(t_job.c.backend_id.is_(None), t_job.c.pid.isnot(None)),
        )
        .values(backend=backend, backend_id=backend_id, log_path=log_path, host=None, pid=None, pid_started_at=None)
        .returning(t_job.c.attempt)
    ).first()
    if row is not None:
        log(
            conn,
            [
                {
                    "job_id": job_id,
                    "from_status": _QUEUED,
                    "to_status": _QUEUED,
                    "attempt": row.attempt,
                    "why": f"submitted as {backend} job {backend_id}",
                }
            ],
        )
    return row is not None


# -- a run's writes, under its lease -----------------------------------------------------------


def refusal(conn: Connection, job_id: int, lease: int, what: str) -> LeaseLost:
    """The error for a write (``what``) from lease ``lease`` of a job the caller no longer owns."""
    row = conn.execute(sa.select(t_job.c.status, t_job.c.lease, t_job.c.attempt).where(t_job.c.id == job_id)).first()
    if row is None:
        return LeaseLost(f"job {job_id} was deleted while it ran; its {what} was dropped")
    return LeaseLost(f"job {job_id} is {row.status} at lease {row.lease}; the {what} of lease {lease} was refused")


def refuse_logged(conn: Connection, log: Log, job_id: int, lease: int, what: str) -> LeaseLost:
    """Record a refused write from a caller that lost the job, then return the error to raise."""
    err = refusal(conn, job_id, lease, what)
    if conn.execute(sa.select(t_job.c.id).where(t_job.c.id == job_id)).first() is not None:
        log(
            conn,
            [
                {
                    "job_id": job_id,
                    "from_status": None,
                    "to_status": None,
                    "why": f"refused a stale {what} from lease {lease}",
                }
            ],
        )
    return err


def checkpoint_blob(job_id: int, results: dict[str, Any]) -> str:
    """A checkpoint as stored JSON; one too large to keep is refused."""
    problem = shape_problem(results)
    if problem is not None:
        raise StateTooLarge(f"job {job_id}'s state cannot be stored: {problem}")
    blob = dump_results(results, "job state")
    if len(blob) > MAX_STATE_BYTES:
        raise StateTooLarge(
            f"job {job_id}'s state is {len(blob)} bytes, over the {MAX_STATE_BYTES}-byte "
            "limit: keep large arrays in files in the job's workdir"
        )
    return blob


def result_blob(
    results: dict[str, Any] | None, outcome: str, error: str | None, why: str | None
) -> tuple[str | None, str, str | None, str | None]:
    """The results as stored JSON; results too large to keep make the run FAILED with why. The error
    and why texts as they can be stored: a NUL character (which PostgreSQL refuses) spelled \\x00."""
    problem = shape_problem(results)
    if problem is not None:  # results no reader could walk: the run's bad return
        error = "\n".join(e for e in (error, f"the job's results cannot be stored: {problem}") if e)
        results, outcome, why = None, Outcome.FAILED.value, f"the job's results cannot be stored: {problem}"
    blob = dump_results(results, "job results") if results is not None else None
    error, why = _no_nul(error), _no_nul(why)
    if blob is not None and len(blob) > MAX_STATE_BYTES:
        error = (
            f"the job's results are {len(blob)} bytes, over the {MAX_STATE_BYTES}-byte "
            "limit: keep large arrays in files in its workdir"
        )
        blob, outcome = None, Outcome.FAILED.value
    return blob, outcome, error, why


def _no_nul(text: str | None) -> str | None:
    return text.replace("\x00", "\\x00") if text and "\x00" in text else text


def set_gpus(conn: Connection, log: Log, job_id: int, lease: int, gpus: str) -> bool:
    """Record the devices a running job was given, on the job and in its log; False if not owned."""
    mine = sa.and_(t_job.c.id == job_id, t_job.c.lease == lease, t_job.c.status == _RUNNING)
    if not conn.execute(sa.update(t_job).where(mine).values(gpus=gpus)).rowcount:
        return False
    log(
        conn,
        [
            {
                "job_id": job_id,
                "from_status": None,
                "to_status": None,
                "why": f"on GPU {gpus}",
                "data": json.dumps({"gpus": gpus}),
            }
        ],
    )
    return True


def log_metrics(conn: Connection, job_id: int, lease: int, rows: list[dict[str, Any]]) -> bool:
    """Append learning-curve points of a job the caller owns; False if not owned."""
    for row in rows:
        if "\x00" in str(row["name"]):
            raise UsageError(
                f"metric {row['name']!r} cannot be stored: its name contains a NUL character "
                "(\\x00), which jobman does not store on any database"
            )
    if conn.execute(sa.select(t_job.c.id).where(owned()), {"id": job_id, "lease": lease}).first() is None:
        return False
    if rows:
        # NULL is NaN on both engines (SQLite would turn a NaN into NULL anyway); infinities are stored as such.
        conn.execute(
            sa.insert(t_metric), [{**r, "value": None if math.isnan(r["value"]) else r["value"]} for r in rows]
        )
    return True


# -- the end of a run ------------------------------------------------------------------------


def finish(
    conn: Connection,
    log: Log,
    hot: HotStatements,
    job_id: int,
    lease: int,
    outcome: str,
    blob: str | None,
    error: str | None,
    exit_code: int | None,
    why: str | None,
    relaunch: bool,
    pending: list[dict[str, Any]] | None = None,
    *,
    clock: Clock = _local_time,
    after_end: Ended | None = None,
    code: str | None = None,
) -> Status | None:
    """Record how the run at ``lease`` ended; None if the caller no longer owns the job.

    With ``pending``, a DONE job that makes no dependent ready leaves its event there, for the caller to
    write with the next claim's (one statement for both). ``clock`` stamps the end (the store's:
    the database server's time); ``after_end`` is told of every job that ended (DONE, or ended
    badly for good), in the same transaction (a search moves on); a DONE job only if the finishing
    statement found it in a search."""
    if outcome == Outcome.DONE:  # the hot path: one statement
        return finish_done(
            conn, log, hot, job_id, lease, blob, exit_code, why, pending, clock=clock, after_end=after_end, code=code
        )
    try:
        outcome = Outcome(outcome)
    except ValueError:
        raise ValueError(f"unknown outcome {outcome!r}") from None
    row = conn.execute(
        sa.select(t_job.c.attempt, t_job.c.max_attempts, t_job.c.stop_requested).where(owned()).with_for_update(),
        {"id": job_id, "lease": lease},
    ).first()  # vs. a crash
    if row is None:
        return None
    now = clock(conn)
    values: dict[str, Any] = {"heartbeat_at": now}
    if blob is not None:
        values["results"] = blob
    if code is not None:
        values["code"] = code
    if row.stop_requested:  # whatever else the run did, it was asked to stop
        new, reason = Status.CANCELED, why or "cancelled while running"
    elif outcome is Outcome.FAILED:
        new, reason = Status.FAILED, why or "failed"
    elif outcome is Outcome.CRASHED:
        new, reason = Status.CRASHED, why or "crashed"
    else:  # INCOMPLETE or REQUEUE: queued again, first in line, to resume
        new, reason = (
            Status.QUEUED,
            why or ("returned INCOMPLETE" if outcome is Outcome.INCOMPLETE else "put back by its stopping worker"),
        )
        values.update(resume=True, queue_order=-1, queued_at=now)
    values["status"] = new.value
    if new is not Status.QUEUED:
        values["finished_at"] = now
    if error is not None or new is Status.QUEUED:
        values["error"] = error
    if exit_code is not None:
        values["exit_code"] = exit_code
    conn.execute(sa.update(t_job).where(t_job.c.id == job_id).values(**values))
    log(
        conn,
        [{"job_id": job_id, "from_status": _RUNNING, "to_status": new.value, "attempt": row.attempt, "why": reason}],
    )
    if new is Status.CRASHED and relaunch and row.attempt < row.max_attempts:
        return relaunch_crashed(conn, log, [(job_id, row.attempt, row.max_attempts, reason)])[job_id]
    if new is Status.QUEUED:  # put back while it ran, a parent may have been reset meanwhile
        graph.refresh(conn, log, [job_id], why=_RECHECK)
        return _status(conn, job_id)
    ended_downstream(conn, log, {job_id: new})
    if after_end is not None:
        after_end(conn, job_id)
    return new


def finish_done(
    conn: Connection,
    log: Log,
    hot: HotStatements,
    job_id: int,
    lease: int,
    blob: str | None,
    exit_code: int | None,
    why: str | None,
    pending: list[dict[str, Any]] | None = None,
    *,
    clock: Clock = _local_time,
    after_end: Ended | None = None,
    code: str | None = None,
) -> Status | None:
    """The common end: mark DONE, log it (or leave its event in ``pending``), queue ready dependents."""
    rows = hot.finish_done.rows(
        conn, id=job_id, lease=lease, now=clock(conn), results=blob, exit_code=exit_code, code=code
    )
    if not rows:
        return None
    attempt, has_children, in_search = rows[0]
    event = {
        "job_id": job_id,
        "from_status": _RUNNING,
        "to_status": _DONE,
        "attempt": attempt,
        "why": why or "finished",
    }
    ready = [r[0] for r in hot.ready_children.rows(conn, id=job_id)] if has_children else []
    if pending is not None and not ready:
        pending.append(event)
    else:  # written before the promotions it causes, so that the log reads in order
        log(conn, [event])
    if ready:
        graph.refresh(conn, log, ready, why=f"job {job_id} is DONE")
    if after_end is not None and in_search:  # only a search moves on at a job's end
        after_end(conn, job_id)
    return Status.DONE


def crash_found(
    conn: Connection,
    log: Log,
    exp: int,
    found: dict[int, dict[int, str]],
    *,
    relaunch: bool,
    max_attempts: int | None,
    now: float | None = None,
    after_end: Ended | None = None,
) -> dict[int, Status]:
    """RUNNING jobs found dead (``found``: job id -> {lease: reason}) end CRASHED, or CANCELED when
    their stop was asked; those with attempts left (``max_attempts``, or each job's own) are
    relaunched. A job no longer RUNNING at that lease is left alone and absent from the answer.
    ``after_end`` is told of each job that ended for good (a search moves on: the monitor's verdict
    is what a learning sampler sees of a dead job)."""
    rows: list[Any] = []
    for chunk in chunks(sorted(found)):
        rows.extend(
            conn.execute(
                sa.select(t_job.c.id, t_job.c.lease, t_job.c.attempt, t_job.c.max_attempts, t_job.c.stop_requested)
                .where(t_job.c.experiment_id == exp, t_job.c.id.in_(chunk), t_job.c.status == _RUNNING)
                .with_for_update()
            ).all()
        )
    ended: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    again: list[tuple[int, int, int, str]] = []
    out: dict[int, Status] = {}
    for r in rows:
        reason = found[r.id].get(r.lease)
        if reason is None:
            continue
        new = Status.CANCELED if r.stop_requested else Status.CRASHED
        events.append(
            {
                "job_id": r.id,
                "from_status": _RUNNING,
                "to_status": new.value,
                "attempt": r.attempt,
                "why": reason if new is Status.CRASHED else f"cancelled while running ({reason})",
            }
        )
        ended.append({"_id": r.id, "_status": new.value, "_error": reason})
        out[r.id] = new
        limit = r.max_attempts if max_attempts is None else max_attempts
        if new is Status.CRASHED and relaunch and r.attempt < limit:
            again.append((r.id, r.attempt, limit, reason))
    if ended:
        conn.execute(
            sa.update(t_job)
            .where(t_job.c.id == sa.bindparam("_id"))
            .values(status=sa.bindparam("_status"), error=sa.bindparam("_error"), finished_at=now or time.time()),
            ended,
        )
    log(conn, events)
    dead = {i: s for i, s in out.items() if i not in {a[0] for a in again}}
    out.update(relaunch_crashed(conn, log, again, now=now))
    ended_downstream(conn, log, dead)
    if after_end is not None:
        for job_id in sorted(dead):
            after_end(conn, job_id)
    return out


def relaunch_crashed(
    conn: Connection, log: Log, crashed: Sequence[tuple[int, int, int, str]], now: float | None = None
) -> dict[int, Status]:
    """CRASHED jobs (id, attempt, attempt limit, reason) queued again, keeping their checkpoint; a parent
    reset while one ran leaves it WAITING instead. Returns each one's new status."""
    if not crashed:
        return {}
    now = now or time.time()
    ids = [c[0] for c in crashed]
    for chunk in chunks(ids):
        conn.execute(
            sa.update(t_job)
            .where(t_job.c.id.in_(chunk))
            .values(
                status=Status.QUEUED.value,
                queued_at=now,
                queue_order=0,
                resume=False,
                stop_requested=False,
                finished_at=None,
            )
        )
    log(
        conn,
        [
            {
                "job_id": i,
                "from_status": Status.CRASHED.value,
                "to_status": Status.QUEUED.value,
                "attempt": a,
                "why": f"relaunch after crash ({reason}), attempt {a} of {limit}",
            }
            for i, a, limit, reason in crashed
        ],
    )
    graph.refresh(conn, log, ids, why=_RECHECK)
    out: dict[int, Status] = {}
    for chunk in chunks(ids):
        out.update(
            (i, Status(s)) for i, s in conn.execute(sa.select(t_job.c.id, t_job.c.status).where(t_job.c.id.in_(chunk)))
        )
    return out


def ended_downstream(conn: Connection, log: Log, dead: dict[int, Status]) -> None:
    """Jobs that ended badly (id -> status) block everything downstream of them, in one query."""
    ids = sorted(dead)
    if len(ids) == 1:
        graph.block_many(conn, log, ids, f"job {ids[0]} is {dead[ids[0]].value}")
    elif ids:
        ended = " or ".join(sorted({s.value for s in dead.values()}))
        graph.block_many(conn, log, ids, f"{named(ids)} ended {ended}")


def release(conn: Connection, log: Log, exp: int, job_id: int, backend_id: str, reason: str) -> Status | None:
    """Allocation ``backend_id`` ended without claiming its QUEUED job: an attempt spent; QUEUED for
    another allocation, or CRASHED once max_attempts are spent. None if the job no longer waits for it."""
    row = conn.execute(
        sa.select(t_job.c.attempt, t_job.c.max_attempts)
        .where(
            t_job.c.id == job_id,
            t_job.c.experiment_id == exp,
            t_job.c.status == Status.QUEUED.value,
            t_job.c.backend_id == backend_id,
            t_job.c.pid.is_(None),
        )
        .with_for_update()
    ).first()
    if row is None:
        return None
    attempt = row.attempt + 1
    if attempt < row.max_attempts:
        conn.execute(
            sa.update(t_job).where(t_job.c.id == job_id).values(attempt=attempt, backend=None, backend_id=None)
        )
        new, why = Status.QUEUED, f"{reason} (attempt {attempt} of {row.max_attempts}; to be submitted again)"
    else:
        conn.execute(
            sa.update(t_job)
            .where(t_job.c.id == job_id)
            .values(attempt=attempt, status=Status.CRASHED.value, error=reason, finished_at=time.time())
        )
        new, why = Status.CRASHED, f"{reason} (attempt {attempt} of {row.max_attempts})"
    log(
        conn,
        [
            {
                "job_id": job_id,
                "from_status": Status.QUEUED.value,
                "to_status": new.value,
                "attempt": attempt,
                "why": why,
            }
        ],
    )
    if new is Status.CRASHED:
        ended_downstream(conn, log, {job_id: new})
    return new


# -- repairs -------------------------------------------------------------------------------


def check_ids(conn: Connection, exp: int, experiment: str, job_ids: Sequence[int]) -> None:
    """Refuse an empty selection, or one naming a job not in experiment ``exp`` (``experiment``)."""
    if not job_ids:
        raise UsageError("no job was selected")
    found: set[int] = set()
    for chunk in chunks(list(job_ids)):
        found.update(
            conn.execute(sa.select(t_job.c.id).where(t_job.c.experiment_id == exp, t_job.c.id.in_(chunk))).scalars()
        )
    missing = sorted(set(job_ids) - found)
    if missing:
        raise NoSuchJob(f"no job {missing[0]} in experiment {experiment!r}")


def check_not_running(conn: Connection, job_ids: Sequence[int]) -> None:
    """The rule of a reset by hand: a RUNNING job is cancelled first (or the reset forced)."""
    for chunk in chunks(list(job_ids)):  # every chunk, not the first
        busy = conn.execute(sa.select(t_job.c.id).where(t_job.c.id.in_(chunk), t_job.c.status == _RUNNING)).first()
        if busy is not None:
            raise UsageError(f"job {busy.id} is RUNNING: cancel it with --running first, or reset with --force")


def set_priority(conn: Connection, log: Log, job_ids: Sequence[int], priority: float, why: str) -> int:
    """Higher runs first among QUEUED jobs; each change is in the event log (status unchanged)."""
    events = []
    for chunk in chunks(list(job_ids)):
        events += [
            {
                "job_id": r.id,
                "from_status": r.status,
                "to_status": r.status,
                "attempt": r.attempt,
                "why": f"priority set to {priority} {why}",
            }
            for r in conn.execute(
                sa.update(t_job)
                .where(t_job.c.id.in_(chunk))
                .values(priority=priority)
                .returning(t_job.c.id, t_job.c.status, t_job.c.attempt)
            )
        ]
    log(conn, events)
    return len(events)


def delete(conn: Connection, log: Log, job_ids: Sequence[int]) -> int:
    """Remove jobs with their events and metrics; their dependents lose that dependency (re-derived)."""
    affected: set[int] = set()
    n = 0
    for chunk in chunks(list(job_ids)):
        affected.update(conn.execute(sa.select(t_dep.c.job_id).where(t_dep.c.depends_on.in_(chunk))).scalars())
        for table, col in (
            (t_metric, t_metric.c.job_id),
            (t_event, t_event.c.job_id),
            (t_dep, t_dep.c.job_id),
            (t_dep, t_dep.c.depends_on),
        ):
            conn.execute(sa.delete(table).where(col.in_(chunk)))
        n += conn.execute(sa.delete(t_job).where(t_job.c.id.in_(chunk))).rowcount
    graph.refresh(conn, log, sorted(affected - set(job_ids)), why="a dependency was deleted")
    return n


def relaunchable(
    conn: Connection,
    exp: int,
    *,
    include_failed: bool,
    ids: Sequence[int] | None = None,
    max_attempts: int | None = None,
    ignore_limit: bool = False,
) -> list[int]:
    """CRASHED (and, if asked, FAILED) jobs with attempts left (``max_attempts`` overrides each job's
    own limit; ``ignore_limit``: any), of ``ids`` or of the whole experiment, their rows locked."""
    statuses = [Status.CRASHED.value] + ([Status.FAILED.value] if include_failed else [])
    q = sa.select(t_job.c.id).where(t_job.c.experiment_id == exp, t_job.c.status.in_(statuses))
    if not ignore_limit:
        q = q.where(t_job.c.attempt < (t_job.c.max_attempts if max_attempts is None else sa.literal(max_attempts)))
    if ids is None:
        return sorted(conn.execute(q.with_for_update()).scalars())
    found: list[int] = []
    for chunk in chunks(list(ids)):
        found.extend(conn.execute(q.where(t_job.c.id.in_(chunk)).with_for_update()).scalars())
    return sorted(found)


def retry(conn: Connection, log: Log, exp: int, job_ids: Sequence[int], *, why: str, fresh: bool) -> list[int]:
    """The retry rule, for the CLI, the web page and ``retry=True`` calls alike: the FAILED and CRASHED jobs
    of ``job_ids``, whatever their attempt limit, queued again with everything downstream back to
    WAITING; resuming from their checkpoint with their attempt count, or (``fresh``) started over as a
    reset starts them. The other jobs are left as they are. Returns the jobs retried."""
    chosen = relaunchable(conn, exp, include_failed=True, ids=job_ids, ignore_limit=True)
    reset(conn, log, chosen, cascade=True, why=why, fresh=fresh)
    return chosen


def reset(conn: Connection, log: Log, job_ids: Sequence[int], *, cascade: bool, why: str, fresh: bool) -> list[int]:
    """Jobs back to WAITING (then re-derived), with everything downstream of them (``cascade``; else
    only BLOCKED dependents). ``fresh``: a new attempt budget and no checkpoint (a reset by hand); else
    a relaunch, resuming. Results cleared go into the event log. Returns every job changed."""
    if not job_ids:
        return []
    roots = sorted(set(job_ids))
    root_set = set(roots)
    down = [d for d in graph.descendants(conn, roots) if d not in root_set]
    size = in_list_size(conn)
    events = []
    cleared: list[int] = []
    for group, is_root in ((roots, True), (down, False)):
        for chunk in chunks(group, size):
            rows = conn.execute(
                sa.select(t_job.c.id, t_job.c.status, t_job.c.attempt, t_job.c.results)
                .where(t_job.c.id.in_(chunk))
                .order_by(t_job.c.id)
            ).all()
            for r in rows:
                if not is_root and not cascade and r.status != Status.BLOCKED.value:
                    continue
                if not is_root and r.status == Status.WAITING.value and not r.results:
                    continue
                # The stored results, as they are (JSON already): a cascade may clear a hundred thousand.
                data = f'{{"results": {r.results}}}' if r.results and (fresh or not is_root) else None
                events.append(
                    {
                        "job_id": r.id,
                        "from_status": r.status,
                        "to_status": Status.WAITING.value,
                        "attempt": r.attempt,
                        "data": data,
                        "why": why if is_root else f"{why}: upstream job reset",
                    }
                )
                cleared.append(r.id)
    values: dict[str, Any] = dict(
        status=Status.WAITING.value,
        results=None,
        error=None,
        exit_code=None,
        finished_at=None,
        stop_requested=False,
        resume=False,
        queue_order=0,
        queued_at=None,
    )
    # A relaunch keeps the job's last checkpoint so it resumes; a reset by hand starts afresh.
    root_values = {**values, "attempt": 0} if fresh else {k: v for k, v in values.items() if k != "results"}
    for chunk in chunks([i for i in cleared if i in root_set], size):
        conn.execute(sa.update(t_job).where(t_job.c.id.in_(chunk)).values(**root_values))
    for chunk in chunks([i for i in cleared if i not in root_set], size):
        conn.execute(sa.update(t_job).where(t_job.c.id.in_(chunk)).values(**values, attempt=0))
    log(conn, events)
    if cascade:
        # Every job of the reset is WAITING now, so one whose parents are all in it stays WAITING:
        # only the roots and the jobs with a parent outside it can move.
        moving = roots + graph.with_parent_outside(conn, down, root_set | set(down))
    else:
        # Every job downstream is re-derived, not only those cleared: a QUEUED one left alone by
        # --no-cascade has a parent that is no longer DONE.
        moving = sorted(set(cleared) | set(down))
    graph.refresh(conn, log, sorted(set(moving)), why="dependencies re-checked after reset")
    return cleared


def cancel(conn: Connection, log: Log, job_ids: Sequence[int], *, running: bool, why: str) -> list[int]:
    """Jobs not started become CANCELED (their dependents BLOCKED); RUNNING ones, with ``running``, are
    asked to stop (their run ends CANCELED). Finished jobs are left alone. Returns the jobs changed.
    Every job of the set moves from the status it had, in one statement (a chunk of ids at a time)."""
    rows = current(conn, job_ids)
    busy = [r.id for r in rows if r.status == _RUNNING]
    if busy and not running:
        raise UsageError(f"job {busy[0]} is RUNNING: add --running to ask it to stop")
    stopped = [r.id for r in rows if r.status in names_of(PENDING)]
    now = time.time()
    for chunk in chunks(busy):
        conn.execute(sa.update(t_job).where(t_job.c.id.in_(chunk)).values(stop_requested=True))
    for chunk in chunks(stopped):
        conn.execute(
            sa.update(t_job).where(t_job.c.id.in_(chunk)).values(status=Status.CANCELED.value, finished_at=now)
        )
    events = []
    for r in rows:  # by id, as a job at a time would log them
        if r.status == _RUNNING:
            events.append(
                {
                    "job_id": r.id,
                    "from_status": r.status,
                    "to_status": r.status,
                    "attempt": r.attempt,
                    "why": f"{why}: stop requested",
                }
            )
        elif r.status in names_of(PENDING):
            events.append(
                {
                    "job_id": r.id,
                    "from_status": r.status,
                    "to_status": Status.CANCELED.value,
                    "attempt": r.attempt,
                    "why": why,
                }
            )
    log(conn, events)
    ended_downstream(conn, log, dict.fromkeys(stopped, Status.CANCELED))
    return sorted(busy + stopped)


def set_status(conn: Connection, log: Log, job_ids: Sequence[int], status: Status, why: str) -> list[int]:
    """Force a status, keeping the graph consistent around it (see :func:`check_settable`): the jobs
    move in one statement (a chunk of ids at a time), then what depends on them follows, as after
    the other moves. Jobs already at ``status`` are left alone. Returns the jobs changed."""
    check_settable(status)
    rows = [r for r in current(conn, job_ids) if r.status != status.value]
    ids = [r.id for r in rows]
    values: dict[str, Any] = {"status": status.value}
    if status is Status.QUEUED:
        values.update(queued_at=time.time(), resume=False)
    for chunk in chunks(ids):
        conn.execute(sa.update(t_job).where(t_job.c.id.in_(chunk)).values(**values))
    log(
        conn,
        [
            {"job_id": r.id, "from_status": r.status, "to_status": status.value, "attempt": r.attempt, "why": why}
            for r in rows
        ],
    )
    if not ids:
        return []
    if status in BLOCKING:  # everything downstream is BLOCKED
        ended_downstream(conn, log, dict.fromkeys(ids, status))
        return ids
    if status in REQUEUED:  # QUEUED exactly when every dependency is DONE
        graph.refresh(conn, log, ids, why=_RECHECK)
    # Downstream, re-derived: the dependents of a DONE job may run; those of a job that was DONE, or
    # that blocked them, lose that parent.
    lost = [r.id for r in rows if r.status in names_of(BLOCKING if status is Status.DONE else (*BLOCKING, Status.DONE))]
    down = set(graph.descendants(conn, lost))
    if status is Status.DONE:
        down.update(graph.dependents(conn, ids))
    graph.refresh(conn, log, sorted(down), why=f"{named(ids)} {'is' if len(ids) == 1 else 'are'} {status.value}")
    return ids


def _status(conn: Connection, job_id: int) -> Status:
    return Status(conn.execute(sa.select(t_job.c.status).where(t_job.c.id == job_id)).scalar_one())

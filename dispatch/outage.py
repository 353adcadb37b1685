"""Riding out a database outage: a server restart or failover is waited for, not reported as a failure.

A call that meets :class:`DatabaseUnavailable` (connection refused, the server
terminated the connection, it is starting up, every connection slot it has is
taken) is tried again with jittered backoff for up
to ``patience`` seconds, with one line when the outage begins and one when it
ends. Any other database error (a read-only file, a full disk, a refused
password) is not an outage and goes up at once.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from jobman.jobdb.errors import DatabaseError, DatabaseUnavailable, ServerFull

if TYPE_CHECKING:
    from jobman.jobdb.store import Store

T = TypeVar("T")

# Long enough for a server restart or a failover; JOBMAN_OUTAGE_WAIT or --outage-wait change it.
DEFAULT_OUTAGE_WAIT = 600.0
FIRST_DELAY, MAX_DELAY = 0.5, 10.0
# A full server frees a slot whenever one of jobman's own workers ends: looked at more often than a
# server that is away, so that a worker still waiting for a slot when the work is done learns it soon
# (a 10 s cap kept such workers up to 15 s past the last job).
FULL_MAX_DELAY = 3.0
# Each look at a full server is a connection of its own, counted by the server beside those the others
# hold: a refusal that found it ``over`` connections past jobman's share (other waiting workers looking
# at once) stretches the next wait ``over`` times, up to this, so that the more workers wait, the
# seldomer each looks. Jittered by half either way, it keeps a waiting worker's exit within 6 s of the
# slot it waited for (with 6 s, 9 s, 150 workers outlived the work by 12.8 s).
FULL_LONGEST_DELAY = 4.0


def default_patience() -> float:
    try:
        return float(os.environ.get("JOBMAN_OUTAGE_WAIT", DEFAULT_OUTAGE_WAIT))
    except ValueError:
        return DEFAULT_OUTAGE_WAIT


class Outage:
    """Calls that wait out a database outage of up to ``patience`` seconds."""

    def __init__(
        self, log: Callable[[str], None], patience: float | None = None, stopping: Callable[[], bool] = lambda: False
    ) -> None:
        self.log = log
        self.patience = default_patience() if patience is None else patience
        self.stopping = stopping  # asked to stop: an outage is not waited out any longer

    def call(
        self, fn: Callable[[], T], doing: str, waits: Callable[[DatabaseUnavailable], bool] = lambda _exc: True
    ) -> T:
        """``fn()``, tried again while the database is unreachable in a way ``waits`` accepts (any, by
        default); ``doing`` names it in the log."""
        began: float | None = None
        delay = FIRST_DELAY
        while True:
            try:
                result = fn()
            except DatabaseUnavailable as exc:
                if not waits(exc):
                    raise
                now = time.monotonic()
                if began is None:
                    began = now
                    self.log(f"{exc}; {doing}: trying again for up to {self.patience:g} s")
                if now - began >= self.patience or self.stopping():
                    raise DatabaseUnavailable(f"{exc}; gave up {doing} after {now - began:.0f} s") from None
                # Jittered: the workers a full server refused together do not all come back at once.
                time.sleep(min(_wait_after(exc, delay) * random.uniform(0.5, 1.5), began + self.patience - now))
                delay = min(delay * 2, FULL_MAX_DELAY if isinstance(exc, ServerFull) else MAX_DELAY)
                continue
            if began is not None:
                self.log(f"the database is back after {time.monotonic() - began:.0f} s; {doing} again")
            return result


def _wait_after(exc: DatabaseUnavailable, delay: float) -> float:
    """The wait (before jitter) after ``exc``: the backoff's ``delay``, stretched for a full server by how
    far past jobman's share the refused look found it."""
    if isinstance(exc, ServerFull) and exc.over > 1:
        return min(delay * exc.over, FULL_LONGEST_DELAY)
    return delay


def no_connection_to_spare(store: Store) -> str | None:
    """One sentence when the PostgreSQL server has no connection to spare for jobman's workers (how
    many jobman holds, and what to do), else None; a server that cannot be asked is the outage's business."""
    try:
        use = store.connection_use()
        if use is None or not use.full:  # SQLite, or room left
            return None
    except ServerFull:
        use = None
    except DatabaseError:
        return None
    held = (
        f"{use.total} of the {use.limit - use.reserved} it allows ordinary roles are taken, {use.jobman} "
        f"by jobman, which leaves {use.spare} free for others"
        if use is not None
        else "it refused one"
    )
    return (
        f"the PostgreSQL server has no connection to spare ({held}): run fewer workers, put a PgBouncer "
        "in front of it (README: 'Many workers on one PostgreSQL'), or raise its max_connections"
    )

"""Job statuses, their jobman numeric codes, and the groups the status machine uses."""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from .errors import UsageError


class Status(str, Enum):
    WAITING = "WAITING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"
    CRASHED = "CRASHED"
    CANCELED = "CANCELED"
    BLOCKED = "BLOCKED"

    def __str__(self) -> str:
        return self.value


# The original jobman's codes stay readable; the statuses it never had get new ones.
CODES: dict[Status, int] = {
    Status.QUEUED: 0,
    Status.RUNNING: 1,
    Status.DONE: 2,
    Status.FAILED: 5,
    Status.CANCELED: -1,
    Status.WAITING: 6,
    Status.CRASHED: 7,
    Status.BLOCKED: 8,
}
# ERR_START (a job that could not start) is FAILED here, with the reason in its error.
ALIASES: dict[str, Status] = {
    "START": Status.QUEUED,
    "ERR_RUN": Status.FAILED,
    "ERR_START": Status.FAILED,
    "CANCELLED": Status.CANCELED,
}

# The groups the status machine, the CLI and dispatch speak of, defined here only.
#: Ended: nothing more happens to these jobs without a repair (reset, retry, set-status). What progress
#: counts as "finished", in dispatch and on the dashboard alike: BLOCKED jobs never ran, but no longer wait.
ENDED = (Status.DONE, Status.FAILED, Status.CRASHED, Status.CANCELED, Status.BLOCKED)
#: Ended badly: what makes a dispatch exit 1.
BAD = (Status.FAILED, Status.CRASHED, Status.BLOCKED)
#: How one run of a job ends badly (a job that ran cannot become BLOCKED); what ``retry`` puts back.
RAN_BADLY = (Status.FAILED, Status.CRASHED)
#: A dependency in one of these makes its dependents BLOCKED.
BLOCKING = (Status.FAILED, Status.CRASHED, Status.CANCELED, Status.BLOCKED)
#: Not started, and derived from the parents' statuses alone: QUEUED exactly when every parent is DONE.
PENDING = (Status.WAITING, Status.QUEUED, Status.BLOCKED)
#: Where a job put back in the queue lands: QUEUED, or WAITING when a parent is no longer DONE.
REQUEUED = (Status.QUEUED, Status.WAITING)
#: Still to run or running: a worker waits while any is left.
OUTSTANDING = (Status.QUEUED, Status.RUNNING, Status.WAITING)


#: The order statuses are shown in wherever several are (counts, bars, live views): the status machine's.
DISPLAY_ORDER = (
    Status.WAITING,
    Status.QUEUED,
    Status.RUNNING,
    Status.DONE,
    Status.FAILED,
    Status.CRASHED,
    Status.BLOCKED,
    Status.CANCELED,
)


def names_of(statuses: tuple[Status, ...]) -> list[str]:
    """The names of a group, as stored."""
    return [s.value for s in statuses]


def in_display_order(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """(status, count) of ``counts`` (keyed by name) that are not zero, in ``DISPLAY_ORDER``."""
    return [(s.value, counts[s.value]) for s in DISPLAY_ORDER if counts.get(s.value)]


class Outcome(str, Enum):
    """How a run ended, as its worker reports it to ``Store.finish`` (a plain string is accepted too)."""

    DONE = "DONE"
    FAILED = "FAILED"
    CRASHED = "CRASHED"  # killed by the world: relaunched within max_attempts
    INCOMPLETE = "INCOMPLETE"  # the job asked to be queued again and resumed
    REQUEUE = "REQUEUE"  # its worker is stopping: put back without counting an attempt

    def __str__(self) -> str:
        return self.value


#: What the worker loop reports of a job it no longer owns (reset, cancelled or declared crashed meanwhile).
LOST = "LOST"


def parse_status(text: str | int) -> Status:
    """A status from its name, a jobman alias (START, ERR_RUN) or its numeric code."""
    word = str(text).strip().upper()
    if word in Status.__members__:
        return Status[word]
    if word in ALIASES:
        return ALIASES[word]
    try:
        code = int(word)
    except ValueError:
        code = None
    for status, value in CODES.items():
        if value == code:
            return status
    names = ", ".join(s.value for s in Status)
    raise UsageError(f"unknown status {text!r}: use one of {names}, START, ERR_RUN or a jobman code")

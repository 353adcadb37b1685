"""Job statuses, their jobman numeric codes, and the groups the status machine uses."""

from __future__ import annotations

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
ALIASES: dict[str, Status] = {"START": Status.QUEUED, "ERR_RUN": Status.FAILED, "ERR_START": Status.FAILED,
                              "CANCELLED": Status.CANCELED}

FINISHED = (Status.DONE, Status.FAILED, Status.CRASHED, Status.CANCELED)
# A dependency in one of these makes its dependents BLOCKED.
BLOCKING = (Status.FAILED, Status.CRASHED, Status.CANCELED, Status.BLOCKED)
NOT_FINISHED = (Status.WAITING, Status.QUEUED, Status.RUNNING, Status.BLOCKED)


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

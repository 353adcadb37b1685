"""Errors a user can meet: each is one clear sentence, its docstring the default message."""

from __future__ import annotations


class JobmanError(Exception):
    """Something went wrong in jobman."""

    exit_code = 1

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class UsageError(JobmanError):
    """The command was given something it cannot use."""

    exit_code = 2


class SweepError(UsageError):
    """The sweep expression is malformed."""


class DatabaseError(JobmanError):
    """The database cannot be used."""


class DatabaseUnavailable(DatabaseError):
    """The database server cannot be reached right now (down, restarting, or the network is)."""


class ServerFull(DatabaseUnavailable):
    """The database server refused a connection: every connection slot it has is taken."""

    def __init__(self, message: str | None = None, over: int = 1) -> None:
        super().__init__(message)
        self.over = over  # how many connections past what jobman's workers may take the server was


class SchemaError(DatabaseError):
    """The database schema is not the one this jobman expects."""


class NoSchema(SchemaError):
    """The database has no jobman tables yet."""


class NoSuchJob(UsageError):
    """No job has that id in this experiment."""


class NoSuchExperiment(UsageError):
    """No experiment of that name is in the database."""


class TargetUnimportable(JobmanError):
    """A job's target cannot be imported where it runs: its other jobs are left QUEUED."""

    exit_code = 4  # a worker's exit code its dispatch reads: stop, do not start another


class LeaseLost(JobmanError):
    """This worker no longer owns the job: it was reset, cancelled or declared crashed."""


class StateTooLarge(JobmanError):
    """The job's state is larger than the database accepts."""


class JobFailed(JobmanError):
    """The job ended FAILED (or CRASHED past its attempts): its stored error says why.

    ``job_id``, ``status`` and ``error`` (the job's traceback or reason, as stored) are attributes.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        job_id: int | None = None,
        status: str | None = None,
        error: str | None = None,
    ) -> None:
        super().__init__(message)
        self.job_id, self.status, self.error = job_id, status, error


class JobNotRun(JobFailed):
    """The job will not run: it was CANCELED, or is BLOCKED by a dependency that did not finish."""


class CallTimeout(JobmanError, TimeoutError):
    """The job did not finish in the time given."""

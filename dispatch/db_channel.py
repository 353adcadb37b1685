"""The channel of a job claimed from the database: checkpoints and metrics go to the store."""

from __future__ import annotations

from typing import Any

from jobman.jobdb.store import Store

from .channel import Channel


class DbChannel(Channel):
    """A :class:`Channel` whose ``save`` and ``log`` write to the job's row, under its lease.

    In a job forked from its worker, the store's pooled connections are the worker's: they are
    replaced by the job's own (``Store.after_fork``) the first time the job writes, so a job that
    never checkpoints pays nothing for them.
    """

    def __init__(self, *args: Any, store: Store, lease: int, forked: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store = store
        self.lease = lease
        self._forked = forked

    def _own_store(self) -> Store:
        if self._forked:
            self._store.after_fork()
            self._forked = False
        return self._store

    def _save(self, results: dict[str, Any]) -> None:
        self._own_store().save(self.job_id, self.lease, results)

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        self._own_store().log_metrics(self.job_id, self.lease, [(step, k, v) for k, v in metrics.items()])

"""The channel of a job claimed from the database: checkpoints and metrics go to the store."""

from __future__ import annotations

from typing import Any

from jobman.jobdb.store import Store

from .channel import Channel


class DbChannel(Channel):
    """A :class:`Channel` whose ``save`` and ``log`` write to the job's row, under its lease."""

    def __init__(self, *args: Any, store: Store, lease: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store = store
        self.lease = lease

    def _save(self, results: dict[str, Any]) -> None:
        self._store.save(self.job_id, self.lease, results)

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        self._store.log_metrics(self.job_id, self.lease, [(step, k, v) for k, v in metrics.items()])

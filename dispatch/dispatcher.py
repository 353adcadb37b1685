"""``jobman dispatch``: keep enough workers running on a backend until the experiment is finished."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store

from .backends.base import Backend, WorkerSpec


@dataclass
class Tally:
    """Jobs of the experiment per status, summed over phases."""

    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, store: Store) -> "Tally":
        counts: dict[str, int] = {}
        for (_phase, status), n in store.counts().items():
            counts[status] = counts.get(status, 0) + n
        return cls(counts)

    def __getitem__(self, status: Status | str) -> int:
        return self.counts.get(str(status), 0)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def finished(self) -> int:
        return sum(self[s] for s in ("DONE", "FAILED", "CRASHED", "CANCELED", "BLOCKED"))

    @property
    def active(self) -> bool:
        """Work is left that can still happen."""
        return self["QUEUED"] > 0 or self["RUNNING"] > 0

    @property
    def bad(self) -> int:
        return sum(self[s] for s in ("FAILED", "CRASHED", "BLOCKED"))

    def line(self) -> str:
        order = ("DONE", "FAILED", "CRASHED", "BLOCKED", "CANCELED", "RUNNING", "QUEUED", "WAITING")
        return ", ".join(f"{self[s]} {s}" for s in order if self[s])


class Watcher(Protocol):
    def scan(self) -> object: ...


@dataclass
class DispatchOptions:
    workers: int
    worker_args: tuple[str, ...] = ()
    poll_interval: float = 0.5
    scan_interval: float = 5.0
    stop_on_interrupt: bool = True  # Ctrl-C stops the workers (False: they go on, e.g. on Slurm)


class Dispatcher:
    """Starts workers as jobs become ready, tops them up as phases unlock, returns when all is done."""

    def __init__(self, store: Store, backend: Backend, options: DispatchOptions,
                 watcher: Watcher | None = None, on_tick: Callable[[Tally, int], None] | None = None) -> None:
        self.store = store
        self.backend = backend
        self.options = options
        self.watcher = watcher
        self.on_tick = on_tick or (lambda _t, _w: None)
        self.spec = WorkerSpec(store.target.with_table(), tuple(options.worker_args))

    def run(self) -> Tally:
        last_scan = 0.0
        try:
            while True:
                tally = Tally.of(self.store)
                alive = self.backend.running_workers()
                self.on_tick(tally, alive)
                if not tally.active and alive == 0:
                    return tally
                wanted = min(self.options.workers, tally["QUEUED"] + tally["RUNNING"])
                if tally["QUEUED"] and alive < wanted:
                    self.backend.start_workers(self.spec, wanted - alive)
                if self.watcher is not None and time.time() - last_scan >= self.options.scan_interval:
                    self.watcher.scan()
                    last_scan = time.time()
                self.backend.wait(self.options.poll_interval)
        except KeyboardInterrupt:
            if self.options.stop_on_interrupt:
                self.backend.stop_workers()
            raise

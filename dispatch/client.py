"""The Python API's first home, kept so that ``from jobman.dispatch.client import Experiment`` still works:
its futures and caching are in :mod:`.futures`, what a call is in :mod:`.calls`."""

from __future__ import annotations

from .calls import grid, json_params, sample, source_version, target_of
from .futures import Experiment, JobFuture, as_completed, cached, call, default_experiment, map, wait

__all__ = [
    "Experiment",
    "JobFuture",
    "as_completed",
    "cached",
    "call",
    "default_experiment",
    "grid",
    "json_params",
    "map",
    "sample",
    "source_version",
    "target_of",
    "wait",
]

"""jobman: a job database and experiment scheduler for machine-learning research.

From Python (imported on first use, so ``import jobman`` stays cheap for the CLI and workers)::

    exp = jobman.Experiment("sqlite:///runs.db?table=mlp", backend="local", workers=4)
    futures = exp.map(train, jobman.grid(lr=[0.1, 0.01], nhid=[64, 256]))
    for f in jobman.as_completed(futures):
        print(f.result())
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> the module that holds it.
_LAZY = {
    "Experiment": "jobman.dispatch.futures",
    "JobFuture": "jobman.dispatch.futures",
    "call": "jobman.dispatch.futures",
    "map": "jobman.dispatch.futures",
    "pipeline": "jobman.dispatch.futures",
    "grid": "jobman.dispatch.calls",
    "as_completed": "jobman.dispatch.futures",
    "wait": "jobman.dispatch.futures",
    "cached": "jobman.dispatch.futures",
    "DD": "jobman.tools",
    "flatten": "jobman.tools",
    "expand": "jobman.tools",
    "make": "jobman.tools",
    "make2": "jobman.tools",
    "reval": "jobman.tools",
    "resolve": "jobman.tools",
    "defaults_merge": "jobman.tools",
    "sample": "jobman.dispatch.calls",
    **{
        name: "jobman.jobdb.distributions"
        for name in ("uniform", "loguniform", "quniform", "qloguniform", "randint", "normal", "qnormal", "choice")
    },
}
_MODULES = {
    "errors": "jobman.jobdb.errors",
    "sql": "jobman.sql",
    "tools": "jobman.tools",
    "experiments": "jobman.experiments",
    "ps": "jobman.ps",
}

__all__ = [*_LAZY, *_MODULES, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    else:
        raise AttributeError(f"module 'jobman' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

"""jobman: a job database and experiment scheduler for machine-learning research."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public names, imported on first use: `import jobman` stays cheap for a worker and a job.
_LAZY: dict[str, tuple[str, str | None]] = {
    "DD": ("jobman.tools", "DD"),
    "flatten": ("jobman.tools", "flatten"),
    "expand": ("jobman.tools", "expand"),
    "sql": ("jobman.sql", None),
    "tools": ("jobman.tools", None),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'jobman' has no attribute {name!r}") from None
    value = importlib.import_module(module)
    return value if attr is None else getattr(value, attr)


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])

"""Limits on the shape of what is stored as JSON (parameters, results, checkpoints): how deep it
nests and how long a key is. Every reader (the report, the dashboard, a job's state) walks stored
JSON, so what would make them recurse without end is refused before anything is written."""

from __future__ import annotations

from typing import Any

from .errors import UsageError

MAX_DEPTH = 32  # lists and objects inside one another
MAX_KEY_CHARS = 1000  # a name, dotted path included


def shape_problem(value: Any) -> str | None:
    """What is wrong with the shape of ``value`` (too deep, a key too long), or None. Walked without
    recursion, so a value nested any depth is measured, never followed into a RecursionError."""
    if not isinstance(value, (dict, list, tuple)):
        return None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested more than {MAX_DEPTH} levels deep"
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict):
            for key in node:
                if isinstance(key, str) and len(key) > MAX_KEY_CHARS:
                    return f"a name of {len(key)} characters, over the limit of {MAX_KEY_CHARS}"
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return None


def check_shape(value: Any, what: str) -> None:
    """Refuse ``value`` (``what`` names it: "the parameters of job 3") if its shape is over the limits."""
    problem = shape_problem(value)
    if problem is not None:
        raise UsageError(f"{what} cannot be stored: {problem}")


def json_within_limits(text: str) -> bool:
    """True when the JSON ``text`` cannot be over the limits, seen from its length and brackets alone:
    the cheap test that spares a sweep's small jobs the walk."""
    return len(text) <= MAX_KEY_CHARS and text.count("[") + text.count("{") <= MAX_DEPTH

"""How values read on a page: times, durations, results and parameters (Jinja filters)."""

from __future__ import annotations

import json
import time
from typing import Any

from jobman.jobdb.selection import format_number, format_param


def when(epoch: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else ""


def duration(seconds: float | None) -> str:
    """``42s``, ``3m 12s``, ``2h 05m``, ``3d 4h``."""
    if seconds is None:
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def rate(per_second: float | None) -> str:
    if not per_second:
        return ""
    return f"{per_second * 60:.3g}/min" if per_second < 1 else f"{per_second:.3g}/s"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def number(value: Any) -> str:
    if isinstance(value, float):
        return format_number(value)
    return format_param(value) if value is not None else ""


FILTERS = {"when": when, "duration": duration, "rate": rate, "pretty": pretty, "num": number, "param": format_param}

"""What every benchmark shares: figures beside their baselines, the machine, RESULTS.md."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PG_URL = os.environ.get("JOBMAN_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def compile_package() -> None:
    """Byte-compile jobman, as installing its wheel does: the processes a benchmark starts then
    load bytecode, as a user's would, even from a source checkout with PYTHONDONTWRITEBYTECODE."""
    import compileall
    import importlib.util
    import re

    spec = importlib.util.find_spec("jobman")
    for location in spec.submodule_search_locations or []:
        compileall.compile_dir(location, quiet=1, rx=re.compile(r"[/\\](\.venv|tests|bench)[/\\]"))


compile_package()


@dataclass
class Figure:
    """One measured figure: jobman's, the baseline's (if any) and the target it answers to."""

    name: str
    jobman: float
    unit: str
    baseline: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        return self.jobman / self.baseline

    def line(self) -> str:
        base = f" | baseline {self.baseline:,.2f} {self.unit} | ratio {self.ratio:.2f}" if self.baseline else ""
        met = "" if self.met is None else (" | target met" if self.met else " | TARGET MISSED")
        return f"{self.name}: {self.jobman:,.2f} {self.unit}{base}{met} ({self.target}) {self.note}".rstrip()


def say(figure: Figure) -> Figure:
    print(figure.line(), flush=True)
    return figure


def machine() -> dict[str, str]:
    import numpy
    import sqlalchemy

    try:
        import psycopg

        pg_driver = psycopg.__version__
    except Exception:  # noqa: BLE001
        pg_driver = "-"
    try:
        server = (
            subprocess.run(
                ["psql", "-tA", PG_URL, "-c", "show server_version"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "-"
        )
    except (OSError, subprocess.SubprocessError):
        server = "-"
    import sqlite3

    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
        "memory": _memory(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "postgresql": server,
        "sqlalchemy": sqlalchemy.__version__,
        "psycopg": pg_driver,
        "numpy": numpy.__version__,
    }


def _memory() -> str:
    try:
        import psutil

        return f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except Exception:  # noqa: BLE001
        return "-"


def fresh_pg_database() -> tuple[str, callable]:
    """A throwaway PostgreSQL database: its URL and a function that drops it."""
    import psycopg

    name = f"jobman_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = PG_URL.rsplit("/", 1)[0] + "/" + name

    def drop() -> None:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url, drop


def grid(n: int) -> str:
    return "{{" + ",".join(str(i) for i in range(n)) + "}}"


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.start


def claim_and_finish(store: Any, pending: int, evaluate: Callable[[dict], float]) -> list[float]:
    """A learning search's jobs worked through the store as a worker would, ``pending`` of them claimed
    at once: the oldest claimed is finished DONE with ``evaluate(params)`` as its ``loss`` (each end
    proposes the next point in the finishing transaction). The values, in the order the jobs ended."""
    from jobman.jobdb.records import WorkerInfo

    worker = WorkerInfo.here()
    held: list[Any] = []
    out: list[float] = []
    while True:
        while len(held) < pending and (claimed := store.claim(worker)) is not None:
            held.append(claimed)
        if not held:
            return out
        claimed = held.pop(0)
        value = evaluate(claimed.job.params)
        store.finish(claimed.job.id, claimed.lease, "DONE", results={"loss": value})
        out.append(value)


def ask_and_tell(study: Any, dists: dict, evals: int, pending: int, evaluate: Callable[[dict], float]) -> list[float]:
    """Optuna's own loop in memory, ``pending`` trials asked before each tell, ``evals`` in all: the
    values, in the order they were told."""
    asked = [study.ask(dists) for _ in range(min(pending, evals))]
    out: list[float] = []
    while asked:
        trial = asked.pop(0)
        value = evaluate(trial.params)
        study.tell(trial, value)
        out.append(value)
        if len(out) + len(asked) < evals:
            asked.append(study.ask(dists))
    return out

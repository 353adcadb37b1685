"""What the search tests share: an experiment module written to disk for the workers to import."""

from __future__ import annotations

import os
from pathlib import Path


def experiment_module(tmp_path: Path, name: str, source: str):
    """Write ``source`` as module ``name``; the environment a worker needs to import it, and a runs folder."""
    moddir = tmp_path / "mods"
    moddir.mkdir()
    (moddir / f"{name}.py").write_text(source)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(moddir), os.environ.get("PYTHONPATH")) if p)}
    return type("Exp", (), {"env": env, "runs": tmp_path / "runs"})


def by_phase(store) -> dict[int, list]:
    """The experiment's jobs by phase: a search's jobs by rung."""
    out: dict[int, list] = {}
    for job in store.jobs():
        out.setdefault(job.phase, []).append(job)
    return out

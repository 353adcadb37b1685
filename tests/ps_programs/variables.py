"""Run under mpiexec by tests/test_models_parallel.py: every rank makes the same variable in the parameter
server, pushes gradients of its own, updates, saves with and without slots, loads, and writes what it saw
as JSON to OUT/rank-N.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from jobman import ps
from jobman.models.optim import make_optimizer
from jobman.models.variables import PSVariable, Tally

SHAPES = {"W": (5, 3), "b": (3,)}
STEPS = 4


def gradient(rank: int, step: int) -> np.ndarray:
    """What rank ``rank`` pushes at ``step``: the test computes the same."""
    return np.random.default_rng([rank, step]).standard_normal(18).astype(np.float32)


def initial() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def listed(arrays: dict[str, np.ndarray]) -> dict[str, list]:
    return {k: np.asarray(v).tolist() for k, v in arrays.items()}


def main(out: Path, optimizer: str) -> None:
    ps.init()
    rank = ps.worker_id()
    updater = make_optimizer(optimizer, {}, lr=0.1, momentum=0.9, weight_decay=0.01)
    var = PSVariable(ps, SHAPES, type(updater).slot_names)
    var.init(initial())
    seen: dict = {"rank": rank, "size": ps.num_workers(), "initial": var.pull().tolist(), "pulled": []}
    for step in range(STEPS):
        var.push(gradient(rank, step))
        updater.begin_step()
        var.update(updater)
        seen["pulled"].append(var.pull().tolist())
    seen["with_slots"] = listed(var.save(slots=True))
    seen["without_slots"] = listed(var.save(slots=False))
    saved = var.save(slots=True)
    var.load(var.save(slots=False))  # slots back to zero, values kept
    seen["loaded_without"] = listed(var.save(slots=True))
    var.load(saved)
    seen["loaded_with"] = listed(var.save(slots=True))
    seen["tally"] = Tally(ps, 2).reduce([rank + 0.5, 1.0]).tolist()
    var.release()
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])

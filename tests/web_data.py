"""A small experiment in every state, made through the store's verbs, for the dashboard's tests."""

from __future__ import annotations

import math
import random
from typing import Any

from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec

HOSTILE = "<script>alert(1)</script>"
WORKER = WorkerInfo(host="node-1", pid=4242)


def valid_error(lr: float, nhid: int, fold: int) -> float:
    """A made-up result with a clear winner: lr=0.01, nhid=64."""
    return round(0.1 + abs(math.log10(lr) + 2) * 0.05 + (64 - nhid) / 1000 + fold * 0.001, 6)


def fill(store: Store, *, running: int = 1, failed: int = 1) -> dict[str, Any]:
    """Schedule 12 phase-0 jobs (lr x nhid x 2 folds) each with a phase-1 child, and one job whose
    parameter, result and error are hostile markup; finish most of phase 0, fail some, leave some running.
    Returns the ids by role."""
    specs = []
    for lr in (0.1, 0.01, 0.001):
        for nhid in (32, 64):
            for fold in (0, 1):
                specs.append(JobSpec(0, "fn", "pkg.train:fit", {"lr": lr, "nhid": nhid, "id_cross_fold": fold}, None))
                specs.append(
                    JobSpec(1, "fn", "pkg.train:tune", {"lr": lr, "nhid": nhid, "id_cross_fold": fold}, len(specs) - 1)
                )
    specs.append(JobSpec(0, "fn", "pkg.train:fit", {"lr": 0.5, "nhid": 8, "id_cross_fold": 0, "note": HOSTILE}, None))
    ids = store.schedule(specs).job_ids
    first = ids[0:-1:2]  # the phase-0 jobs, in sweep order
    roles: dict[str, Any] = {
        "all": ids,
        "done": [],
        "failed": [],
        "running": [],
        "hostile": ids[-1],
        "phase0": first,
        "phase1": ids[1:-1:2],
    }
    for n, job_id in enumerate(first + [ids[-1]]):
        claimed = store.claim_job(job_id, WORKER)
        assert claimed is not None, job_id
        p = claimed.job.params
        if job_id == roles["hostile"]:
            store.finish(job_id, claimed.lease, "FAILED", error=f"RuntimeError: {HOSTILE}")
            roles["failed"].append(job_id)
        elif n >= len(first) - running - failed and len(roles["running"]) < running:
            store.log_metrics(job_id, claimed.lease, [(s, "train_loss", 1.0 / (s + 1)) for s in range(4)])
            roles["running"].append(job_id)
        elif n >= len(first) - failed:
            store.finish(job_id, claimed.lease, "FAILED", error="ValueError: loss is nan\n  at step 17")
            roles["failed"].append(job_id)
        else:
            err = valid_error(p["lr"], p["nhid"], p["id_cross_fold"])
            store.log_metrics(job_id, claimed.lease, [(s, "train_loss", err + 1.0 / (s + 1)) for s in range(5)])
            store.finish(job_id, claimed.lease, "DONE", results={"valid_error": err, "train_error": err / 2})
            roles["done"].append(job_id)
    return roles


def fill_wide(store: Store, jobs: int = 40) -> list[int]:
    """An experiment as wide as they come: ten parameters (a long path and a long choice among them),
    five results, a long host name; every job DONE with a learning curve."""
    rng = random.Random(0)
    specs = []
    for i in range(jobs):
        params = {
            "learning_rate": 10 ** rng.uniform(-4, -1),
            "hidden_units": rng.choice([64, 128, 256, 512]),
            "dropout_rate": rng.uniform(0, 0.5),
            "weight_decay": 10 ** rng.uniform(-6, -2),
            "batch_size": rng.choice([32, 64, 128]),
            "optimizer": rng.choice(["adam", "sgd_with_nesterov_momentum"]),
            "dataset_path": "/very/long/path/to/some/dataset/folder/fashion-mnist-train-images.npz",
            "seed": i,
            "momentum": rng.uniform(0.5, 0.99),
            "warmup_steps": rng.choice([0, 100, 1000]),
        }
        specs.append(JobSpec(0, "fn", "pkg.train:fit", params, None))
    ids = store.schedule(specs).job_ids
    worker = WorkerInfo(host="node-with-a-long-hostname-01.cluster.example.org", pid=4242)
    for job_id in ids:
        claimed = store.claim_job(job_id, worker)
        assert claimed is not None, job_id
        store.log_metrics(job_id, claimed.lease, [(s, "train_loss", 1.0 / (s + 1)) for s in range(5)])
        results = {"valid_error": rng.random(), "train_error": rng.random(), "test_accuracy_top5": rng.random()}
        store.finish(job_id, claimed.lease, "DONE", results={**results, "n_parameters": 123456789})
    return ids


def schedule_calls(store: Store, width: int) -> dict[str, Any]:
    """A graph of calls made job by job, all not started: one ``load``, ``width`` ``train`` calls taking it
    (a fan-out), each with a phase-1 ``score`` taking it, and one ``summary`` taking every score (a
    fan-in). Returns the ids by role."""
    (load,) = store.schedule([JobSpec(0, "fn", "lab.steps:load", {"name": "fashion-mnist"}, None)]).job_ids
    specs = []
    for i in range(width):
        params = {"lr": 10.0 ** -(1 + i % 4), "seed": i}
        specs.append(JobSpec(0, "fn", "lab.steps:train", params, None))
        specs.append(JobSpec(1, "fn", "lab.steps:score", params, len(specs) - 1))
    ids = store.schedule(specs, after=[load]).job_ids
    trains, scores = list(ids[0::2]), list(ids[1::2])
    (summary,) = store.schedule([JobSpec(0, "fn", "lab.steps:summary", {"n": width}, None)], after=scores).job_ids
    return {"load": load, "trains": trains, "scores": scores, "summary": summary}


def fill_calls(store: Store, width: int) -> dict[str, Any]:
    """:func:`schedule_calls`' graph with the load and the first half of the trains DONE, the last train
    FAILED (its score and the summary BLOCKED), the one before it RUNNING. Returns the ids by role."""
    roles = schedule_calls(store, width)
    load, trains = roles["load"], roles["trains"]
    done = [load] + trains[: width // 2]
    for job_id in done:
        claimed = store.claim_job(job_id, WORKER)
        assert claimed is not None, job_id
        store.finish(job_id, claimed.lease, "DONE", results={"err": 0.1})
    claimed = store.claim_job(trains[-1], WORKER)
    assert claimed is not None
    store.finish(trains[-1], claimed.lease, "FAILED", error="ValueError: loss is nan")
    assert store.claim_job(trains[-2], WORKER) is not None
    return {**roles, "done": done}

"""Cross-validation's last step: ``jobman.models.cv:retrain``, a fan-in job after a CV sweep.

Its parents are the cross-validation jobs of a sweep (every configuration x every
fold, scheduled with ``--after``). It groups them by configuration, picks the
best by the mean of a metric over folds (``channel.best``: the report's selection), retrains
that configuration once on the whole training set and tests it once.

- Plain CV parents (``nb_cross_fold``/``id_cross_fold``): the retrain uses every
  fold (a seeded ``valid_fraction`` held out for early stopping) and tests on the
  data set's own test set; a data set without one (digits) gets no ``test_error``,
  and the winning group's mean ``test_error`` over folds is reported as ``cv_test_error``.
- Double-CV parents (``nb_outer_fold``/``id_outer_fold`` + inner folds): for each
  outer fold the best configuration is chosen on that fold's inner folds only,
  retrained on the outer training set and tested on the outer fold;
  ``test_error`` is the mean over outer folds (``id_outer_fold`` in the retrain's
  own parameters restricts it to one outer fold).

Parameters: ``metric`` ("valid_error"), ``mode`` ("min"), ``group_over`` (None:
the report's default fold and seed keys). Results: the retrained job's standard
results, plus ``best_params``, ``best_target``, ``cv_mean``, ``cv_std``, ``cv_n``,
``cv_job_ids`` (and ``outer`` with one entry per outer fold for double CV).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jobman.dispatch.channel import COMPLETE, DD, INCOMPLETE, Channel, Parent

from .params import job_params, settings

RETRAIN_DEFAULTS: dict[str, Any] = {"metric": "valid_error", "mode": "min", "group_over": None}
FOLD_KEYS = ("nb_cross_fold", "id_cross_fold", "nb_outer_fold", "id_outer_fold")
STANDARD_RESULTS = ("train_error", "valid_error", "test_error", "epochs", "best_epoch", "seconds")


class SubChannel(Channel):
    """The channel of a run nested in a job: its own workdir, the job's stop flag, log and checkpoint."""

    def __init__(self, outer: Channel, workdir: Path, params: Mapping[str, Any], log_prefix: str = "") -> None:
        super().__init__(
            job_id=outer.job_id,
            phase=outer.phase,
            attempt=outer.attempt,
            workdir=Path(workdir),
            params=dict(params),
            parents=[],
            deadline=outer.deadline,
        )
        self._outer, self._prefix = outer, log_prefix

    def request_stop(self, reason: str) -> None:
        self._outer.request_stop(reason)

    def should_stop(self) -> bool:
        return self._outer.should_stop()

    @property
    def stop_reason(self) -> str | None:
        return self._outer.stop_reason

    def _save(self, results: dict[str, Any]) -> None:
        self._outer.save()

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        self._outer.log(step, **{self._prefix + k: v for k, v in metrics.items()})


def _trainer_for(target: str) -> Callable[[dict, Channel], str]:
    """The function that retrains a winner of ``target``: DBN fine-tuning reruns both phases."""
    module_name, _, name = target.partition(":") if ":" in target else target.rpartition(".")
    if module_name == "jobman.models.dbn" and name in ("finetune", "train"):
        from . import dbn

        return dbn.train
    fn = getattr(importlib.import_module(module_name), name)
    return fn


def _with_metric(parents: list[Parent], metric: str) -> list[Parent]:
    """The parents that have a number for ``metric``: those the selection ranks."""
    out = []
    for par in parents:
        value = (par.results or {}).get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value):
            out.append(par)
    return out


def _retrain_one(
    parents: list[Parent],
    p: Mapping[str, Any],
    channel: Channel,
    workdir: Path,
    overrides: Mapping[str, Any],
    log_prefix: str,
) -> dict[str, Any] | None:
    """Select among ``parents``, retrain the winner in ``workdir``; its results, or None if stopped."""
    ranked = _with_metric(parents, p["metric"])
    if not ranked:
        raise ValueError(f"no parent job has a numeric {p['metric']!r} result to select on")
    winner = channel.best(p["metric"], mode=p["mode"], group_over=p["group_over"], parents=ranked)
    job_ids = [int(j) for j in winner.job_ids]
    first = next(par for par in ranked if par.job_id in job_ids)
    params = {**dict(first.params), **dict(winner.params)}
    for key in FOLD_KEYS:
        params.pop(key, None)
    params.update(overrides)
    sub_state = DD(params)
    sub_channel = SubChannel(channel, workdir, params, log_prefix)
    sub_channel.bind(sub_state)
    status = _trainer_for(first.target)(sub_state, sub_channel)
    if status == INCOMPLETE:
        return None
    found = [par.results.get("test_error") for par in ranked if par.job_id in job_ids]
    tests = [t for t in found if isinstance(t, (int, float))]
    out = {k: sub_state[k] for k in STANDARD_RESULTS if k in sub_state}
    out.update(
        best_params={k: v for k, v in dict(winner.params).items()},
        best_target=first.target,
        cv_mean=float(winner.mean),
        cv_std=None if winner.std is None else float(winner.std),
        cv_n=int(winner.n),
        cv_job_ids=job_ids,
    )
    if tests:
        out["cv_test_error"] = float(np.mean(tests))
    return out


def retrain(state: dict, channel: Channel) -> str:
    """Pick the best configuration among the parent CV jobs, retrain it on the full training set, test once."""
    params = job_params(state, channel)
    p = settings(params, RETRAIN_DEFAULTS)
    channel.bind(state)
    parents = list(channel.parents)
    if not parents:
        raise ValueError("cv:retrain needs the cross-validation jobs as parents (schedule it with --after)")
    outer_ids = sorted(
        {int(par.params.get("id_outer_fold", 0)) for par in parents if int(par.params.get("nb_outer_fold", 0) or 0)}
    )
    if not outer_ids:
        out = _retrain_one(parents, p, channel, channel.workdir / "retrain", {"test_fraction": 0.0}, "retrain_")
        if out is None:
            return INCOMPLETE
        state.update(out)
        return COMPLETE
    if "id_outer_fold" in params:
        outer_ids = [int(params["id_outer_fold"])]
    done = {int(o["id_outer_fold"]): o for o in state.get("outer", [])}
    for o in outer_ids:
        if o in done:
            continue
        group = [
            par
            for par in parents
            if int(par.params.get("id_outer_fold", 0)) == o and int(par.params.get("nb_outer_fold", 0) or 0)
        ]
        nb_outer = int(group[0].params["nb_outer_fold"])
        # The outer fold is the test set and the other outer folds the training set: plain CV over outer folds.
        overrides = {"nb_cross_fold": nb_outer, "id_cross_fold": o, "nb_outer_fold": 0}
        out = _retrain_one(group, p, channel, channel.workdir / f"retrain-outer{o}", overrides, f"outer{o}_")
        if out is None:
            return INCOMPLETE
        done[o] = {"id_outer_fold": o, **out}
        state["outer"] = [done[k] for k in sorted(done)]
        channel.save()
    folds = [done[o] for o in outer_ids]
    for key in ("train_error", "valid_error", "test_error"):
        values = [f[key] for f in folds if isinstance(f.get(key), (int, float))]
        if values:
            state[key] = float(np.mean(values))
    state["seconds"] = float(sum(float(f.get("seconds", 0.0) or 0.0) for f in folds))
    tests = [f["test_error"] for f in folds if isinstance(f.get("test_error"), (int, float))]
    if tests:
        state["test_error_std"] = float(np.std(tests))
    state["epochs"] = int(sum(int(f.get("epochs", 0) or 0) for f in folds))
    return COMPLETE

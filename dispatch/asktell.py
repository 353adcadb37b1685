"""Ask/tell from Python: a learning search whose evaluations are made elsewhere, recorded as jobs.

``search = exp.search({"lr": jobman.loguniform(1e-4, 1e-1)}, sampler="tpe", metric="loss")``;
``point = search.ask()`` proposes the next point as a job of the search, claimed by this process;
``search.tell(point, loss=0.3)`` records its results (the job DONE), ``search.tell(point, failed=
"why")`` its failure. ``report``, the dashboard and the next proposals see them as any other job.
A point asked and never told ends CRASHED once the monitor finds this process gone: a failure to the
sampler, never run by a worker (the job's kind is ``asked``, its attempt limit 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jobman.jobdb.distributions import Distribution
from jobman.jobdb.errors import UsageError
from jobman.jobdb.halving import Halving, sampled
from jobman.jobdb.learn import ASKED, Plan, check_plan, parse_objectives
from jobman.jobdb.records import WorkerInfo
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store

UNBOUNDED = 2**31 - 1  # the budget of a search asked without one


class Point(dict):
    """A proposed point: its parameters, and the job that records it (``job_id``)."""

    job_id: int
    lease: int


def learning_plan(
    space: Mapping[str, Any],
    sampler: str,
    metric: str | Sequence[str],
    *,
    samples: int,
    parallel: int,
    seed: int,
    kind: str,
    target: str,
    maximize: bool = False,
    constraints: Sequence[str] = (),
    max_attempts: int = 3,
    halving: str | None = None,
    eta: int = 3,
    asynchronous: bool = False,
) -> tuple[Halving, Plan]:
    """The rules and plan of a learning search over ``space`` (distributions, and fixed values);
    with ``halving`` (``"epochs=1:27"``), a multi-fidelity one whose configurations start at the first
    rung and are promoted as ``sqlschedule --halving`` does."""
    from jobman.jobdb.halving import parse_halving
    from jobman.jobdb.learn import check_halving, parse_constraints

    if not isinstance(space, Mapping):
        raise UsageError("the space is a dict of parameter names to distributions (jobman.uniform(0, 1), ...)")
    drawn = {k: v for k, v in space.items() if isinstance(v, Distribution)}
    fixed = {k: v for k, v in space.items() if not isinstance(v, Distribution)}
    metrics = [metric] if isinstance(metric, str) else list(metric)
    objectives = parse_objectives(metrics, maximize)
    rules = Halving("", (), 0, objectives[0][0], objectives[0][1]) if objectives else None
    if halving is not None:
        rules = parse_halving(halving, eta, objectives[0][0] if objectives else None, False, asynchronous)
        rules = dataclasses.replace(rules, mode=objectives[0][1])
        if rules.resource in fixed:
            raise UsageError(f"halving sets {rules.resource}; leave it out of the space")
        fixed = {**fixed, rules.resource: rules.rungs[0]}
    elif asynchronous:
        raise UsageError("asynchronous goes with halving='RESOURCE=MIN:MAX'")
    plan = Plan(
        sampler,
        samples,
        parallel,
        seed,
        objectives,
        kind,
        target,
        (fixed,),
        constraints=parse_constraints(constraints),
        max_attempts=1 if kind == ASKED else max_attempts,
    )
    check_plan(plan, drawn)
    assert rules is not None  # check_plan refused a plan without a metric
    check_halving(plan, rules, drawn)
    out = sampled(drawn, rules)
    assert out is not None  # check_plan refused an empty space
    return out, plan


class Search:
    """An ask/tell search of an experiment (see the module's docstring)."""

    def __init__(self, store: Store, rules: Halving, plan: Plan) -> None:
        self.store, self.plan = store, plan
        self.id, _, _ = store.start_search(rules, plan)
        self._worker = WorkerInfo.here()

    def ask(self) -> Point:
        """The next point: a dict of its parameters, with its ``job_id``."""
        claimed = self.store.ask(self.id, self._worker)
        if claimed is None:
            raise UsageError(f"search {self.id} has spent its budget of {self.plan.samples} points")
        point = Point({k: v for k, v in claimed.job.params.items() if k not in self.plan.runs[0]})
        point.job_id, point.lease = claimed.job.id, claimed.lease
        return point

    def tell(
        self, point: Point, results: Mapping[str, Any] | None = None, *, failed: str | None = None, **kw: Any
    ) -> Status:
        """Record what the evaluation of ``point`` gave (``loss=0.3``, or a dict), or that it failed."""
        if not isinstance(point, Point):
            raise UsageError("tell() takes a point that ask() gave")
        values = {**(results or {}), **kw}
        if failed is not None:
            return self.store.finish(point.job_id, point.lease, "FAILED", results=values or None, error=failed)
        missing = [m for m, _ in self.plan.objectives if m not in values]
        if missing:
            raise UsageError(f"tell() needs {missing[0]}=..., the metric this search optimises")
        return self.store.finish(point.job_id, point.lease, "DONE", results=values)

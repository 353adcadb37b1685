"""Successive halving through phases: a rung is a phase, a promotion is a dependency.

``--halving epochs=3:27 --eta 3`` runs every configuration at epochs=3 (rung 0, the sweep's
phase), the best third of them on to epochs=9 (rung 1, the next phase), the best third of those
to 27. A promoted job is a new job, the child of its rung's job, and continues from its parent's
workdir (see :func:`continues_from`). Promotions are decided in the transaction that finishes a
rung's job (:func:`after_finish`), so a crash anywhere leaves the search as it was before or after
that job's end, never between: synchronously once every configuration of the rung is finished,
or (``--async``, ASHA) as soon as a configuration ranks in the top 1/eta of the finished ones.
Promotions made stand: a reset or a relaunch re-runs jobs, it never takes a promotion back.
A learning search (``.learn``) starts each configuration at its Hyperband bracket's rung, and each
bracket (the configurations that started at one rung) is halved on its own; with ``--async`` each of
its configurations is judged once, as its runs at a rung end, by Optuna's successive-halving rule
(:func:`goes_on`), not by ASHA's share.

The rules (:func:`choose`) are pure; the rest reads and writes the ``search`` tables.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .canonical import dump_json, load_json, load_results
from .distributions import Distribution
from .errors import UsageError
from .schema import job as t_job
from .schema import job_dep as t_dep
from .schema import job_event as t_event
from .schema import job_metric as t_metric
from .schema import search as t_search
from .schema import search_job as t_sjob
from .status import Status

# Statuses after which a job of a rung will not change by itself (CRASHED may be relaunched).
_ENDED = {Status.DONE.value, Status.FAILED.value, Status.CANCELED.value, Status.BLOCKED.value}


@dataclass(frozen=True)
class Halving:
    """The rules of one search."""

    resource: str
    rungs: tuple[Any, ...]  # the resource at each rung, smallest first
    eta: int
    metric: str
    mode: str = "min"  # or "max"
    asynchronous: bool = False
    prune: str | None = None  # "median": stop running jobs whose curve is worse than the finished jobs'
    # The distributions the sweep drew its parameters from: (key, name, arguments), by key.
    space: tuple[tuple[str, str, tuple[Any, ...]], ...] = ()

    def to_json(self) -> str:
        data = {**asdict(self), "rungs": list(self.rungs), "space": {k: [n, *a] for k, n, a in self.space}}
        if not self.space:  # a search without draws is written as it was before draws were recorded
            del data["space"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Halving:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Halving:
        """The rules of a search's spec, read already (``data`` is not changed)."""
        data = dict(data)
        data.pop("learn", None)  # a learning search's sampler and state (see .learn)
        data.pop("state", None)
        space = tuple((k, v[0], tuple(v[1:])) for k, v in sorted(data.pop("space", {}).items()))
        return cls(**{**data, "rungs": tuple(data["rungs"]), "space": space})

    def distributions(self) -> dict[str, Distribution]:
        """The sampled parameters and their distributions."""
        return {key: Distribution(name, args) for key, name, args in self.space}


def sampled(space: Mapping[str, Distribution], rules: Halving | None = None) -> Halving | None:
    """``rules`` with the distributions a sweep drew from recorded beside them (a search of its own
    when there are no rules: it only remembers the draws, for plots); None when nothing is drawn."""
    if not space:
        return rules
    recorded = tuple((key, d.name, tuple(d.args)) for key, d in sorted(space.items()))
    return dataclasses.replace(rules or Halving("", (), 0, ""), space=recorded)


def sweep_space(sweep: Any) -> dict[str, Distribution]:
    """The parameters a parsed sweep draws, and their distributions (the last phase's, if several)."""
    return {a.key: a.distribution for phase in sweep.phases for a in phase.assignments if a.distribution is not None}


def rung_values(low: float, high: float, eta: int) -> list[Any]:
    """``low``, ``low*eta``, ... below ``high``, then ``high``: the resource at each rung."""
    count = int(math.floor(math.log(high / low) / math.log(eta) + 1e-9))
    values = [low * eta**k for k in range(max(1, count))] + [high]
    if isinstance(low, int) and isinstance(high, int):
        values = [int(round(v)) for v in values]
    return list(dict.fromkeys(values))


def parse_halving(text: str, eta: int, metric: str | None, maximize: bool, asynchronous: bool) -> Halving:
    """``RESOURCE=MIN:MAX`` and the options beside it, or a UsageError saying what is wrong."""
    from .sweep import parse_value

    key, sep, bounds = text.partition("=")
    low_text, colon, high_text = bounds.partition(":")
    if not sep or not colon or not key:
        raise UsageError(f"--halving {text!r}: write RESOURCE=MIN:MAX, such as epochs=3:27")
    try:
        low, high = parse_value(low_text), parse_value(high_text)
    except ValueError:
        low = high = None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high)):
        raise UsageError(f"--halving {text!r}: MIN and MAX are numbers, such as epochs=3:27")
    if not 0 < low < high:
        raise UsageError(f"--halving {text!r}: MIN must be above 0 and below MAX")
    if eta < 2:
        raise UsageError(f"--eta {eta}: keep the best 1/eta of each rung, so eta is 2 or more")
    if not metric:
        raise UsageError("--halving needs --metric M: the result that ranks configurations (such as valid_error)")
    return Halving(key, tuple(rung_values(low, high, eta)), eta, metric, "max" if maximize else "min", asynchronous)


def parse_prune(rule: str, metric: str | None, maximize: bool) -> Halving:
    """The rules of a search that only prunes (no rungs)."""
    if rule != "median":
        raise UsageError(f"--prune {rule!r}: the rule is 'median'")
    if not metric:
        raise UsageError("--prune needs --metric M: the logged curve to compare (such as valid_error)")
    return Halving("", (), 0, metric, "max" if maximize else "min", False, rule)


def median_says_stop(value: float, others: Sequence[float], mode: str) -> float | None:
    """The median of ``others`` when ``value`` is worse than it (and there are enough others), else None."""
    if len(others) < PRUNE_MIN_FINISHED:
        return None
    worst = -math.inf if mode == "max" else math.inf  # a NaN (a diverged run) counts as the worst value
    ordered = sorted(worst if math.isnan(v) else v for v in others)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    if math.isnan(value):
        return median
    worse = value < median if mode == "max" else value > median
    return median if worse else None


# The median of fewer finished curves says too little to stop a job on.
PRUNE_MIN_FINISHED = 3


def rung_sizes(configs: int, eta: int, rungs: int) -> list[int]:
    """How many configurations reach each rung when every rung finishes (synchronous halving)."""
    sizes = [configs]
    for _ in range(rungs - 1):
        sizes.append(max(1, sizes[-1] // eta) if sizes[-1] else 0)
    return sizes


def bracket_shares(rungs: int, eta: int) -> list[int]:
    """Hyperband's brackets as Optuna's HyperbandPruner weighs them: bracket ``i`` starts its
    configurations at rung ``i`` (the last one trains them to the full budget at once), and takes
    ``ceil(n * eta**s / (s + 1))`` of every ``sum`` configurations, ``n`` the rungs, ``s = n - 1 - i``."""
    return [math.ceil(rungs * eta ** (rungs - 1 - i) / (rungs - i)) for i in range(rungs)]


def bracket_of(shares: Sequence[int], draw: int) -> int:
    """The bracket a configuration drawn as ``draw`` (any integer) goes to, in proportion to ``shares``."""
    left = draw % sum(shares)
    for bracket, share in enumerate(shares):
        left -= share
        if left < 0:
            return bracket
    return len(shares) - 1


def allowed(finished: int, total: int, eta: int, closed: bool = True) -> int:
    """How many configurations of a rung may be promoted once ``finished`` of its ``total`` are.

    ``closed``: no configuration can join the rung any more (the rung below it is all finished).
    """
    return max(1, total // eta) if closed and finished >= total and total else finished // eta


def choose(
    scores: Mapping[str, float | None],
    total: int,
    promoted: Sequence[str],
    eta: int,
    mode: str,
    asynchronous: bool,
    closed: bool = True,
) -> list[str]:
    """The configurations to promote now. ``scores``: the finished ones (None: failed, never promoted).

    Synchronous: nothing until all ``total`` are finished, then the best ``max(1, total // eta)``.
    Asynchronous: the best of the top ``finished // eta`` not yet promoted, so that no more than
    that many ever are (and, once the rung is closed and finished, as many as synchronously).
    """
    if not asynchronous and (len(scores) < total or not closed):
        return []
    sign = -1.0 if mode == "max" else 1.0
    valued = {c: s for c, s in scores.items() if s is not None}
    ranked = sorted(valued, key=lambda c: (sign * valued[c], c))
    limit = allowed(len(scores), total, eta, closed)
    room = limit - len(promoted)
    if room <= 0:
        return []
    done = set(promoted)
    return [c for c in ranked[:limit] if c not in done][:room]


def goes_on(value: float, ended: Sequence[float], eta: int, mode: str) -> bool:
    """Whether a configuration of a learning search whose runs at a rung just ended with ``value`` goes
    on to the next rung: the rule of Optuna's ``SuccessiveHalvingPruner``, which its ``HyperbandPruner``
    applies within each bracket.

    ``ended``: the results of every configuration of its bracket that ended at this rung, its own
    included. It goes on when it is within the best ``len(ended) // eta`` of them (the best of them
    when fewer than ``eta`` ended), ties included, and it is judged once, then. Unlike
    :func:`choose`'s asynchronous rule (ASHA's, which promotes at most a ``1/eta`` share of the rung
    and lets an earlier configuration take a place later), every new configuration that beats the
    rung's history goes on at once: a model's later proposals, better than its first, reach the full
    budget instead of waiting behind the places their predecessors took.
    """
    sign = -1.0 if mode == "max" else 1.0
    ranked = sorted(sign * v for v in ended)
    return bool(ranked) and sign * value <= ranked[max(0, len(ranked) // eta - 1)]


def config_of(params: Mapping[str, Any], resource: str) -> str:
    """What identifies a configuration across folds, seeds and rungs: a hash of the other parameters."""
    from .selection import default_group_keys

    drop = {resource, *default_group_keys(params)}
    return hashlib.sha256(
        dump_json({k: v for k, v in params.items() if k not in drop}, "parameters").encode()
    ).hexdigest()[:32]


# -- the database side ----------------------------------------------------------------------------


def register(
    conn: Connection, exp: int, rules: Halving, job_ids: Sequence[int], params: Sequence[Mapping[str, Any]]
) -> int:
    """Record a search over the rung-0 jobs ``job_ids``; the same search twice is one row.

    A search scheduled again with more samples is the same search grown: the jobs it already holds
    stay where they are, and the new ones join its first rung, to be ranked with the others.
    """
    spec = rules.to_json()
    only_draws = not rules.rungs and not rules.prune  # it remembers the distributions; no job needs it
    members = "" if only_draws else "|" + ",".join(map(str, sorted(job_ids)))
    key = hashlib.sha256((spec + members).encode()).hexdigest()
    found = conn.execute(
        sa.select(t_search.c.id).where(t_search.c.experiment_id == exp, t_search.c.key == key)
    ).scalar()
    if found is None and not only_draws and job_ids:
        found = _grown(conn, exp, spec, job_ids, params, rules.resource)
    if found is not None:
        return found
    search_id = conn.execute(
        sa.insert(t_search).values(experiment_id=exp, key=key, spec=spec, created_at=time.time())
    ).inserted_primary_key[0]  # type: ignore[index]
    if only_draws or not job_ids:
        return search_id
    conn.execute(
        sa.insert(t_sjob),
        [
            {"job_id": j, "search_id": search_id, "rung": 0, "config": config_of(p, rules.resource)}
            for j, p in zip(job_ids, params)
        ],
    )
    return search_id


def _grown(
    conn: Connection, exp: int, spec: str, job_ids: Sequence[int], params: Sequence[Mapping[str, Any]], resource: str
) -> int | None:
    """The search of these rules that already holds some of ``job_ids`` at its first rung, given the
    others as new first-rung members; None when no search holds any of them."""

    def first_rung(*where: Any) -> sa.Select:
        return (
            sa.select(t_sjob.c.search_id, t_sjob.c.job_id)
            .join(t_search, t_search.c.id == t_sjob.c.search_id)
            .where(t_search.c.experiment_id == exp, t_search.c.spec == spec, t_sjob.c.rung == 0, *where)
        )

    chunks = [job_ids[i : i + 900] for i in range(0, len(job_ids), 900)]
    holders = {row.search_id for chunk in chunks for row in conn.execute(first_rung(t_sjob.c.job_id.in_(chunk)))}
    if not holders:
        return None
    found = min(holders)
    held = {row.job_id for row in conn.execute(first_rung(t_sjob.c.search_id == found))}
    new = [
        {"job_id": j, "search_id": found, "rung": 0, "config": config_of(p, resource)}
        for j, p in zip(job_ids, params)
        if j not in held
    ]
    if new:
        conn.execute(sa.insert(t_sjob), new)
    return found


def after_finish(
    conn: Connection,
    job_id: int,
    refresh: Callable[[Connection, list[int], str], None],
    hash_of: Callable[[int, str, str, dict], str],
    now: Callable[[], float] = time.time,
) -> list[int]:
    """Promote what the end of ``job_id`` allows, in the caller's transaction; the new jobs' ids.

    ``refresh`` re-derives the status of new jobs from their parents (the store's), ``hash_of``
    gives a job's identity, ``now`` the time the store stamps rows with.
    """
    memberships = conn.execute(sa.select(t_sjob.c.search_id, t_sjob.c.rung).where(t_sjob.c.job_id == job_id)).all()
    new: list[int] = []
    for search_id, rung in memberships:
        # The search's row is locked (PostgreSQL; SQLite's writer holds the database) so that two jobs of
        # a rung ending at once decide one after the other, the second seeing the first's end and promotions.
        exp, spec = conn.execute(
            sa.select(t_search.c.experiment_id, t_search.c.spec).where(t_search.c.id == search_id).with_for_update()
        ).one()
        data = json.loads(spec)
        rules = Halving.from_dict(data)
        budget = data.get("learn", {}).get("samples")  # a learning search's configurations in all
        if rules.asynchronous and "learn" in data:
            # A learning search's configuration is judged once, when its runs at a rung have ended
            # (:func:`goes_on`): nothing above its rung is decided by this end.
            if rung < len(rules.rungs) - 1:
                new += _promote(conn, search_id, exp, None, rules, rung, refresh, hash_of, now, judged=job_id)
            continue
        # The rungs above may close with this end (a rung is closed once every job below it ended):
        # their promotions are decided again, each within its bracket.
        for above in range(rung, len(rules.rungs) - 1):
            new += _promote(conn, search_id, exp, budget, rules, above, refresh, hash_of, now)
    return new


def _promote(
    conn: Connection,
    search_id: int,
    exp: int,
    budget: int | None,
    rules: Halving,
    rung: int,
    refresh: Callable[[Connection, list[int], str], None],
    hash_of: Callable[[int, str, str, dict], str],
    now: Callable[[], float],
    judged: int | None = None,
) -> list[int]:
    """Promote from ``rung`` of the search (its row locked by the caller) what halving allows; the new jobs.
    ``budget``: the configurations a learning search proposes in all (None: not one). ``judged``: the
    job whose configuration alone is judged (a learning search's, see :func:`goes_on`), whether the
    rung is closed or not."""
    rows = conn.execute(
        sa.select(t_job.c.id, t_job.c.status, t_job.c.results, t_sjob.c.config, t_sjob.c.rung)
        .join(t_sjob, t_sjob.c.job_id == t_job.c.id)
        .where(t_sjob.c.search_id == search_id, t_sjob.c.rung <= rung + 1)
        .order_by(t_job.c.id)
    ).all()
    # The rung is closed when every job below it has ended and, in a learning search, every
    # configuration of its budget was proposed: no configuration can join it any more.
    closed = judged is None and all(r.status in _ENDED for r in rows if r.rung < rung)
    if closed and budget is not None:
        proposed = conn.execute(
            sa.select(sa.func.count(sa.distinct(t_sjob.c.config))).where(t_sjob.c.search_id == search_id)
        ).scalar_one()
        closed = proposed >= budget
    # A configuration's bracket is the rung it started at (Hyperband's: a learning search starts some
    # above the first rung); each bracket is halved on its own, as Hyperband's brackets are.
    bracket: dict[str, int] = {}
    for r in rows:
        bracket[r.config] = min(bracket.get(r.config, r.rung), r.rung)
    new: list[int] = []
    for start in sorted({bracket[r.config] for r in rows if r.rung == rung}):
        jobs: dict[str, list[Any]] = {}
        promoted: set[str] = set()
        for r in rows:
            if bracket[r.config] != start:
                continue
            if r.rung == rung:
                jobs.setdefault(r.config, []).append(r)
            elif r.rung == rung + 1:
                promoted.add(r.config)
        new += _promote_bracket(conn, exp, search_id, rung, rules, jobs, promoted, closed, hash_of, now, judged)
    if new:
        refresh(conn, new, "promoted")
    return new


def _promote_bracket(
    conn: Connection,
    exp: int,
    search_id: int,
    rung: int,
    rules: Halving,
    jobs: Mapping[str, list[Any]],
    promoted: set[str],
    closed: bool,
    hash_of: Callable[[int, str, str, dict], str],
    now: Callable[[], float],
    judged: int | None = None,
) -> list[int]:
    """Promote from ``rung`` what halving allows among one bracket's configurations (``jobs``: their
    runs at that rung; ``promoted``: those of them already at the next); the new jobs. With ``judged``
    (a job's id), only that job's configuration is judged, by :func:`goes_on`."""
    scores: dict[str, float | None] = {}
    for config, members in jobs.items():
        if all(m.status in _ENDED for m in members):
            values: list[Any] = [
                (load_json(m.results) if m.results else {}).get(rules.metric) if m.status == Status.DONE.value else None
                for m in members
            ]
            ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
            scores[config] = sum(values) / len(values) if ok else None
    if judged is None:
        chosen = choose(scores, len(jobs), sorted(promoted), rules.eta, rules.mode, rules.asynchronous, closed)
    else:
        mine = [c for c, members in jobs.items() if any(m.id == judged for m in members)]
        ended = [v for v in scores.values() if v is not None]
        chosen = [
            c
            for c in mine
            if c not in promoted
            and (value := scores.get(c)) is not None
            and goes_on(value, ended, rules.eta, rules.mode)
        ]
    valued = {c: s for c, s in scores.items() if s is not None}
    ranked = sorted(valued, key=lambda c: ((-1 if rules.mode == "max" else 1) * valued[c], c))
    new: list[int] = []
    for config in chosen:
        why = (
            f"promoted to rung {rung + 1} ({rules.resource}={rules.rungs[rung + 1]}): ranked "
            f"{ranked.index(config) + 1} of {len(scores)} finished at rung {rung}, "
            f"{rules.metric} {scores[config]:.6g}"
        )
        for member in jobs[config]:
            new += _child(conn, exp, search_id, member.id, rung + 1, config, rules, why, hash_of, now())
    return new


def _child(
    conn: Connection,
    exp: int,
    search_id: int,
    parent: int,
    rung: int,
    config: str,
    rules: Halving,
    why: str,
    hash_of: Callable[[int, str, str, dict], str],
    now: float,
) -> list[int]:
    """The job that continues ``parent`` at ``rung``; made unless it exists, linked unless it is.

    Runs of one configuration with equal parameters (``sqlschedule -r`` copies) are promoted together,
    each to a child of its own: the first keeps the parameters' identity, the others take one derived
    from their parent's id, so that deciding the promotion again finds the same children.
    """
    child: Any = conn.execute(
        sa.select(t_dep.c.job_id)
        .join(t_sjob, t_sjob.c.job_id == t_dep.c.job_id)
        .where(t_dep.c.depends_on == parent, t_sjob.c.rung == rung)
        .limit(1)
    ).scalar()
    p = conn.execute(
        sa.select(
            t_job.c.phase, t_job.c.kind, t_job.c.target, t_job.c.params, t_job.c.priority, t_job.c.max_attempts
        ).where(t_job.c.id == parent)
    ).one()
    params = {**load_json(p.params), rules.resource: rules.rungs[rung]}
    digest = hash_of(p.phase + 1, p.kind, p.target, params)
    if child is None:
        child = conn.execute(
            sa.select(t_job.c.id).where(t_job.c.experiment_id == exp, t_job.c.params_hash == digest)
        ).scalar()
        if (
            child is not None
            and conn.execute(
                sa.select(t_sjob.c.job_id).where(
                    t_sjob.c.job_id == child, t_sjob.c.search_id == search_id, t_sjob.c.rung == rung
                )
            ).first()
        ):
            # Another run of this configuration was promoted to that job: this run is a copy.
            digest = hashlib.sha256(f"{digest}\x1fcontinues\x1f{parent}".encode()).hexdigest()
            child = conn.execute(
                sa.select(t_job.c.id).where(t_job.c.experiment_id == exp, t_job.c.params_hash == digest)
            ).scalar()
    made = child is None
    if made:
        child = conn.execute(
            sa.insert(t_job).values(
                experiment_id=exp,
                phase=p.phase + 1,
                kind=p.kind,
                target=p.target,
                params=dump_json(params, "parameters"),
                params_hash=digest,
                status=Status.WAITING.value,
                priority=p.priority,
                max_attempts=p.max_attempts,
                created_at=now,
            )
        ).inserted_primary_key[0]  # type: ignore[index]
        conn.execute(sa.insert(t_dep).values(job_id=child, depends_on=parent))
        conn.execute(
            sa.insert(t_event).values(
                job_id=child,
                at=now,
                from_status=None,
                to_status=Status.WAITING.value,
                attempt=0,
                why=why,
                source=None,
                data=None,
            )
        )
    if (
        conn.execute(
            sa.select(t_sjob.c.job_id).where(t_sjob.c.job_id == child, t_sjob.c.search_id == search_id)
        ).first()
        is None
    ):
        conn.execute(sa.insert(t_sjob).values(job_id=child, search_id=search_id, rung=rung, config=config))
    return [child] if made else []


def continues_from(conn: Connection, job_id: int) -> str | None:
    """The workdir a promoted job starts from: its parent's, the job it continues at a higher rung."""
    found = continuation(conn, job_id)
    return found[0] if found else None


def continuation(conn: Connection, job_id: int) -> tuple[str | None, dict[str, Any]] | None:
    """Where a promoted job starts: its parent's workdir and the state its parent saved (its results),
    less what the job's own parameters say (the resource above all), which take precedence. None for
    a job that continues no other."""
    parent = t_job.alias("parent")
    row = conn.execute(
        sa.select(parent.c.workdir, parent.c.results, t_job.c.params)
        .select_from(t_sjob)
        .join(t_dep, t_dep.c.job_id == t_sjob.c.job_id)
        .join(parent, parent.c.id == t_dep.c.depends_on)
        .join(t_job, t_job.c.id == t_sjob.c.job_id)
        .where(t_sjob.c.job_id == job_id, t_sjob.c.rung > 0)
        .limit(1)
    ).first()
    if row is None:
        return None
    own = load_json(row.params)
    saved = load_results(row.results) if row.results else {}
    if not isinstance(saved, dict):
        saved = {}
    return row.workdir, {k: v for k, v in saved.items() if k not in own and k != "pruned"}


def prune_verdict(conn: Connection, job_id: int, step: int, metrics: Mapping[str, float]) -> str | None:
    """Why the job that logged ``metrics`` at ``step`` should stop, or None: its search prunes by the
    median, and its value is worse than the median of the search's finished (DONE, unpruned) jobs at
    that step."""
    for search_id, spec in conn.execute(
        sa.select(t_sjob.c.search_id, t_search.c.spec)
        .join(t_search, t_search.c.id == t_sjob.c.search_id)
        .where(t_sjob.c.job_id == job_id)
    ):
        rules = Halving.from_json(spec)
        if rules.prune != "median" or rules.metric not in metrics:
            continue
        last: dict[int, float] = {}
        rows = conn.execute(
            sa.select(t_metric.c.job_id, t_metric.c.value, t_job.c.results)
            .join(t_sjob, t_sjob.c.job_id == t_metric.c.job_id)
            .join(t_job, t_job.c.id == t_metric.c.job_id)
            .where(
                t_sjob.c.search_id == search_id,
                t_metric.c.name == rules.metric,
                t_metric.c.step == step,
                t_job.c.status == Status.DONE.value,
                t_metric.c.job_id != job_id,
            )
            .order_by(t_metric.c.id)
        )
        for other, value, results in rows:
            if not (load_json(results) if results else {}).get("pruned"):
                last[other] = math.nan if value is None else value  # NULL is a logged NaN
        value = float(metrics[rules.metric])
        median = median_says_stop(value, list(last.values()), rules.mode)
        if median is not None:
            return (
                f"pruned at step {step}: {rules.metric} {value:.4g} is worse than {median:.4g}, the median "
                f"of {len(last)} finished jobs at that step"
            )
    return None


def summaries(conn: Connection, exp: int) -> list[str]:
    """One line per search of the experiment: how many configurations reached each rung, and were pruned."""
    lines = []
    for search_id, spec in conn.execute(
        sa.select(t_search.c.id, t_search.c.spec).where(t_search.c.experiment_id == exp).order_by(t_search.c.id)
    ):
        rules = Halving.from_json(spec)
        reached: dict[int, set[str]] = {}
        pruned = 0
        for rung, config, results in conn.execute(
            sa.select(t_sjob.c.rung, t_sjob.c.config, t_job.c.results)
            .join(t_job, t_job.c.id == t_sjob.c.job_id)
            .where(t_sjob.c.search_id == search_id)
        ):
            reached.setdefault(rung, set()).add(config)
            pruned += bool(results and load_json(results).get("pruned"))
        parts = []
        if not rules.rungs and not rules.prune:  # it only records the draws
            continue
        if rules.rungs:
            steps = [f"{len(reached.get(k, ()))} at {rules.resource}={v}" for k, v in enumerate(rules.rungs)]
            parts.append(
                f"successive halving by {rules.metric}: configurations reaching each rung: " + ", ".join(steps)
            )
        if rules.prune:
            parts.append(f"{pruned} job{'s' if pruned != 1 else ''} pruned by the median of {rules.metric}")
        lines.append(f"search {search_id}: " + "; ".join(parts))
    return lines


def rungs_of(conn: Connection, exp: int, job_ids: Sequence[int] | None = None) -> dict[int, tuple[int, int, str]]:
    """Each job of the experiment's searches (or of ``job_ids`` only): (rung, number of rungs, resource name)."""
    out: dict[int, tuple[int, int, str]] = {}
    q = (
        sa.select(t_sjob.c.job_id, t_sjob.c.rung, t_search.c.spec)
        .join(t_search, t_search.c.id == t_sjob.c.search_id)
        .where(t_search.c.experiment_id == exp)
    )
    if job_ids is not None:
        q = q.where(t_sjob.c.job_id.in_(list(job_ids)))
    for job_id, rung, spec in conn.execute(q):
        rules = Halving.from_json(spec)
        if not rules.rungs:  # a search that only prunes has no rungs to show
            continue
        if job_id not in out or out[job_id][0] < rung:
            out[job_id] = (rung, len(rules.rungs), rules.resource)
    return out


def space_of(conn: Connection, exp: int) -> dict[str, Distribution]:
    """Every parameter the experiment's searches drew, and its distribution (the latest search's)."""
    out: dict[str, Distribution] = {}
    for (spec,) in conn.execute(
        sa.select(t_search.c.spec).where(t_search.c.experiment_id == exp).order_by(t_search.c.id)
    ):
        out.update(Halving.from_json(spec).distributions())
    return out


@dataclass
class Rungs:
    """One successive-halving search as it stands: each configuration's mean metric at each rung it reached."""

    search_id: int
    rules: Halving
    means: dict[str, dict[int, float | None]]  # config: rung: mean over its DONE runs (None: none yet)
    params: dict[str, dict[str, Any]]  # config: the parameters of its first run, the resource left out


def rungs_detail(conn: Connection, exp: int) -> list[Rungs]:
    """The experiment's successive-halving searches, for plots of the metric against the resource."""
    out = []
    for search_id, spec in conn.execute(
        sa.select(t_search.c.id, t_search.c.spec).where(t_search.c.experiment_id == exp).order_by(t_search.c.id)
    ):
        rules = Halving.from_json(spec)
        if not rules.rungs:
            continue
        values: dict[str, dict[int, list[float]]] = {}
        params: dict[str, dict[str, Any]] = {}
        for rung, config, status, job_params, results in conn.execute(
            sa.select(t_sjob.c.rung, t_sjob.c.config, t_job.c.status, t_job.c.params, t_job.c.results)
            .join(t_job, t_job.c.id == t_sjob.c.job_id)
            .where(t_sjob.c.search_id == search_id)
            .order_by(t_job.c.id)
        ):
            params.setdefault(config, {k: v for k, v in load_json(job_params).items() if k != rules.resource})
            runs = values.setdefault(config, {}).setdefault(rung, [])
            value = (load_json(results) if results else {}).get(rules.metric) if status == Status.DONE.value else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                runs.append(float(value))
        means = {
            c: {r: (sum(v) / len(v) if v else None) for r, v in sorted(by_rung.items())}
            for c, by_rung in values.items()
        }
        out.append(Rungs(search_id, rules, means, params))
    return out

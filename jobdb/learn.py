"""Search that learns: Optuna's samplers (TPE, GP, CMA-ES, NSGA-II, QMC) over the job table.

A learning search is a ``search`` row whose spec carries, beside the distributions, the sampler,
the budget (``samples``: configurations in all), how many may be pending at once (``parallel``), the
objectives and the jobs a configuration is made of (one per fold or seed). Each proposal rebuilds an
in-memory Optuna study from the search's jobs (:func:`trials`): a configuration whose runs all ended
DONE is a COMPLETE trial by their mean, pruned ones PRUNED with their logged curve, any run FAILED,
CRASHED, CANCELED or BLOCKED makes it a FAIL, and one still waiting or running is a RUNNING trial, so
that TPE's constant liar and the GP see what is pending. Then it asks for the next point with a seed
derived from the search's seed and the proposal's number.

With ``--halving`` each configuration goes to one of Hyperband's brackets
(:func:`.halving.bracket_shares`) and starts at that bracket's rung; the model is fit on every
configuration that ended, ranked by how far it got (:func:`build_study` with ``reach``: Optuna's TPE
on the pruned trials of a study under its HyperbandPruner), once BOHB's d + 3 have
(:func:`model_minimum`), at random before. BOHB's own rules (Falkner et al. 2018: the highest rung
with enough results, a third of the proposals at random) spent about twice the epochs of Optuna's
pair on ``bench/search.py --learn`` (``bench/RESULTS-search.md`` has the ablation of each difference).

Proposals are made in the transaction that records a job's end (:func:`after_end`) and in the one that
schedules the search, under a lock on the search's row: whatever process is killed, the budget is
never exceeded and no point is proposed twice. Stateful samplers' attributes (CMA-ES, NSGA-II, QMC)
are kept in the spec's ``state`` and given back to the next study.

Optuna is imported only here, and only when a learning search needs a proposal.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .canonical import dump_json, load_json
from .distributions import Distribution
from .errors import UsageError
from .halving import Halving, bracket_of, bracket_shares, config_of
from .schema import job as t_job
from .schema import job_event as t_event
from .schema import job_metric as t_metric
from .schema import search as t_search
from .schema import search_job as t_sjob
from .status import Status

_log = logging.getLogger(__name__)
SAMPLERS = ("tpe", "gp", "cmaes", "nsga2", "qmc", "auto")
# The kind of the jobs of an ask/tell search: evaluated elsewhere, recorded here, never run by a worker.
ASKED = "asked"
INSTALL = "pip install 'jobman-sql[search]'"
# Statuses after which a run of a configuration will not change by itself (CRASHED: the monitor has
# relaunched it already when it had attempts left).
_ENDED = {s.value for s in (Status.DONE, Status.FAILED, Status.CRASHED, Status.CANCELED, Status.BLOCKED)}
_BAD = {s.value for s in (Status.FAILED, Status.CRASHED, Status.CANCELED, Status.BLOCKED)}
# Optuna's automatic choice (OptunaHub's AutoSampler): a GP for small numeric budgets, TPE when a
# parameter is categorical or the study has several objectives, CMA-ES for large numeric budgets.
GP_BUDGET = 250
GP_LIMIT = 1000  # the GP's cost grows as the cube of the trials: past this, a proposal takes seconds
MISSING = 1e9  # the violation of a constraint whose result is missing: large, and finite for the GP's model
STARTUP = 10  # Optuna's default: the finished trials TPE and the GP draw at random before they model
# SMAC3's cap on its initial design: at most a quarter of the budget is drawn at random, so that a
# small budget (32 evaluations) still leaves most of its proposals to the model.
STARTUP_SHARE = 0.25
_RETRIES = 20  # asks before a space whose points are all taken is declared exhausted


@dataclass(frozen=True)
class Plan:
    """What a learning search proposes, and from which jobs a configuration is made."""

    sampler: str
    samples: int
    parallel: int
    seed: int
    objectives: tuple[tuple[str, str], ...]  # (metric, "min" or "max")
    kind: str
    target: str
    runs: tuple[dict[str, Any], ...]  # the fixed parameters of each run of a configuration (folds, seeds)
    priority: float = 0.0
    max_attempts: int = 3
    constraints: tuple[tuple[str, str, float], ...] = ()  # (result, "<=" or ">=", bound)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sampler": self.sampler,
            "samples": self.samples,
            "parallel": self.parallel,
            "seed": self.seed,
            "objectives": [list(o) for o in self.objectives],
            "kind": self.kind,
            "target": self.target,
            "runs": list(self.runs),
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            **({"constraints": [list(c) for c in self.constraints]} if self.constraints else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            data["sampler"],
            int(data["samples"]),
            int(data["parallel"]),
            int(data["seed"]),
            tuple((m, d) for m, d in data["objectives"]),
            data["kind"],
            data["target"],
            tuple(data["runs"]),
            float(data.get("priority", 0.0)),
            int(data.get("max_attempts", 3)),
            tuple((n, op, float(b)) for n, op, b in data.get("constraints", ())),
        )

    def identity(self, rules: Halving) -> str:
        """The search's key: the same command twice is one search, and a larger budget (or another
        ``parallel``) continues it."""
        data = {**self.to_dict(), "samples": None, "parallel": None, "rules": json.loads(rules.to_json())}
        return hashlib.sha256(("learn\x00" + json.dumps(data, sort_keys=True)).encode()).hexdigest()


def parse_objectives(metrics: Sequence[str], maximize: bool) -> tuple[tuple[str, str], ...]:
    """``--metric M`` (``M:max``, ``M:min``) repeated, and ``--max``; a UsageError when they conflict."""
    out: dict[str, str] = {}
    for text in metrics:
        name, colon, way = text.rpartition(":") if text.endswith((":max", ":min")) else (text, "", "")
        if not name:
            raise UsageError(f"--metric {text!r}: name a result, such as valid_error or accuracy:max")
        direction = way if colon else ("max" if maximize else "min")
        if colon and maximize and way == "min":
            raise UsageError(f"--metric {text!r} says lowest is best, and --max says highest: keep one")
        if out.get(name, direction) != direction:
            raise UsageError(f"--metric {name} is given both lowest best and highest best: keep one")
        out[name] = direction
    if maximize and len(out) > 1 and not all(m.endswith((":max", ":min")) for m in metrics):
        raise UsageError("--max with several metrics is ambiguous: write --metric NAME:max for each one to maximise")
    return tuple(out.items())


def parse_constraints(texts: Sequence[str]) -> tuple[tuple[str, str, float], ...]:
    """``--constraint 'memory_mb<=4000'`` (or ``>=``), repeated; a UsageError naming the bad one."""
    out = []
    for text in texts:
        op = "<=" if "<=" in text else ">=" if ">=" in text else None
        name, _, bound = text.partition(op) if op else ("", "", "")
        try:
            value = float(bound)
        except ValueError:
            value = math.nan
        if op is None or not name.strip() or not math.isfinite(value):
            raise UsageError(f"--constraint {text!r}: write RESULT<=NUMBER or RESULT>=NUMBER, such as memory_mb<=4000")
        out.append((name.strip(), op, value))
    return tuple(out)


def constraint_values(
    results: Sequence[Mapping[str, Any]], constraints: Sequence[tuple[str, str, float]]
) -> list[float]:
    """Optuna's constraint values of a configuration (feasible when every one is <= 0), by the mean of
    each result over its runs; a result missing or not a number is a violation."""
    out = []
    for name, op, bound in constraints:
        got = [r.get(name) for r in results]
        if not got or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in got
        ):
            out.append(MISSING)
            continue
        mean = sum(float(v) for v in got if v is not None) / len(got)
        out.append(mean - bound if op == "<=" else bound - mean)
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_plan(plan: Plan, space: Mapping[str, Distribution]) -> None:
    """Refuse, in one sentence, a plan whose sampler cannot handle its space or budget."""
    if plan.sampler not in SAMPLERS:
        raise UsageError(f"--sampler {plan.sampler!r}: choose one of random, halton, {', '.join(SAMPLERS)}")
    if not plan.objectives:
        raise UsageError(f"--sampler {plan.sampler} needs --metric M: the result it minimises (M:max to maximise)")
    if not space:
        raise UsageError(f"--sampler {plan.sampler} needs distributions to draw from, such as lr=loguniform(1e-4,1e-1)")
    if plan.parallel < 1 and plan.kind != ASKED:
        raise UsageError(f"--parallel must be at least 1, not {plan.parallel}")
    for key, dist in space.items():
        optuna_distribution(key, dist)  # refuses what Optuna cannot sample
    categorical = any(d.name == "choice" for d in space.values())
    if plan.sampler == "cmaes" and categorical:
        raise UsageError("--sampler cmaes cannot sample choice(...): use --sampler tpe, or give the parameter a range")
    if plan.sampler == "cmaes" and len(plan.objectives) > 1:
        raise UsageError("--sampler cmaes optimises one metric: use --sampler nsga2 or tpe for several")
    chosen = resolve_auto(plan.sampler, space, plan.samples, len(plan.objectives))
    if plan.constraints and chosen in ("cmaes", "qmc"):
        raise UsageError(f"--sampler {plan.sampler} cannot steer away from --constraint: use tpe, gp or nsga2")
    if plan.sampler == "gp" and plan.samples > GP_LIMIT:
        raise UsageError(
            f"--sampler gp slows as the cube of the evaluations: past {GP_LIMIT} use --sampler tpe or cmaes"
        )
    available(resolve_auto(plan.sampler, space, plan.samples, len(plan.objectives)))


def check_halving(plan: Plan, rules: Halving, space: Mapping[str, Distribution]) -> None:
    """Refuse, in one sentence, a multi-fidelity search (a learning sampler with ``--halving``) that
    cannot work: its model is TPE's or the GP's, of one metric, over one rung's results."""
    if not rules.rungs:
        return
    chosen = resolve_auto(plan.sampler, space, plan.samples, len(plan.objectives))
    if chosen not in ("tpe", "gp"):
        raise UsageError(
            f"--sampler {plan.sampler} with --halving: the model of a rung's results is TPE's or the GP's, "
            "use --sampler tpe or gp"
        )
    if len(plan.objectives) > 1:
        raise UsageError("--halving ranks configurations by one --metric: give one, or leave --halving out")
    if plan.constraints:
        raise UsageError("--halving promotes by --metric alone and cannot honour --constraint: leave one out")
    if rules.resource in space:
        raise UsageError(f"--halving sets {rules.resource}; leave it out of the distributions")


def optuna_distribution(key: str, dist: Distribution) -> tuple[str, dict[str, Any]]:
    """The Optuna distribution of a jobman one, as (class name, arguments); a UsageError for those a
    learning sampler cannot take."""
    a = dist.args
    if dist.name == "uniform":
        return "FloatDistribution", {"low": float(a[0]), "high": float(a[1])}
    if dist.name == "loguniform":
        return "FloatDistribution", {"low": float(a[0]), "high": float(a[1]), "log": True}
    if dist.name == "randint":
        return "IntDistribution", {"low": int(a[0]), "high": int(a[1])}
    if dist.name == "quniform":
        low, high = math.ceil(a[0] / a[2] - 1e-9) * a[2], math.floor(a[1] / a[2] + 1e-9) * a[2]
        if all(isinstance(x, int) for x in a):
            return "IntDistribution", {"low": int(low), "high": int(high), "step": int(a[2])}
        return "FloatDistribution", {"low": float(low), "high": float(high), "step": float(a[2])}
    if dist.name == "choice":
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in a):
            raise UsageError(f"{key}=choice(...): a learning sampler chooses among numbers, strings and booleans")
        return "CategoricalDistribution", {"choices": tuple(a)}
    raise UsageError(
        f"{key}={dist.name}(...) has no bounds a learning sampler can search: use uniform, loguniform, "
        "randint, quniform or choice"
    )


def resolve_auto(sampler: str, space: Mapping[str, Distribution], samples: int, objectives: int) -> str:
    """The sampler ``auto`` stands for, by Optuna's rule; any other as it is."""
    if sampler != "auto":
        return sampler
    if objectives > 1:
        return "nsga2" if samples > GP_BUDGET else "tpe"
    if any(d.name == "choice" for d in space.values()):
        return "tpe"
    if samples <= GP_BUDGET:
        return "gp" if _importable("torch") else "tpe"
    return "cmaes" if _importable("cmaes") else "tpe"


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def available(sampler: str) -> None:
    """Refuse, in one sentence naming what to install, a sampler whose library is missing."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise UsageError(f"--sampler {sampler} needs Optuna: {INSTALL}") from None
    needs = {"cmaes": "cmaes", "gp": "torch"}.get(sampler)
    if needs is not None and not _importable(needs):
        extra = INSTALL if needs == "cmaes" else "pip install torch"
        raise UsageError(f"--sampler {sampler} needs {needs}: {extra} (or use --sampler tpe)")


def startup_trials(samples: int) -> int:
    """The random proposals TPE and the GP make before they model: Optuna's default, capped at
    SMAC3's quarter of the budget (at least one)."""
    return max(1, min(STARTUP, int(samples * STARTUP_SHARE)))


def proposal_seed(seed: int, number: int) -> int:
    """The seed of proposal ``number``: two proposals from the same history still differ, and a
    sequential run with one seed is the same run again."""
    digest = hashlib.blake2b(f"{seed}\x00{number}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


# -- the database side ----------------------------------------------------------------------------


def spec_of(rules: Halving, plan: Plan, state: Mapping[str, Any] | None = None) -> str:
    return json.dumps({**json.loads(rules.to_json()), "learn": plan.to_dict(), "state": state or {}}, sort_keys=True)


def start(
    conn: Connection,
    exp: int,
    rules: Halving,
    plan: Plan,
    hash_of: Callable[[int, str, str, dict], str],
    now: float,
) -> tuple[int, list[int], int]:
    """Record a learning search (or grow the one the same command made) and make its first proposals,
    in the caller's transaction (the experiment locked); (search id, new job ids, configurations before)."""
    key = plan.identity(rules)
    found = conn.execute(
        sa.select(t_search.c.id, t_search.c.spec)
        .where(t_search.c.experiment_id == exp, t_search.c.key == key)
        .with_for_update()
    ).first()
    if found is None:
        search_id = conn.execute(
            sa.insert(t_search).values(experiment_id=exp, key=key, spec=spec_of(rules, plan), created_at=now)
        ).inserted_primary_key[0]  # type: ignore[index]
    else:
        search_id, old = found
        data = json.loads(old)
        stored = Plan.from_dict(data["learn"])
        grown = Plan(**{**stored.__dict__, "samples": max(stored.samples, plan.samples), "parallel": plan.parallel})
        conn.execute(
            sa.update(t_search).where(t_search.c.id == search_id).values(spec=spec_of(rules, grown, data.get("state")))
        )
    before = len(_configs(conn, search_id))
    return search_id, propose(conn, search_id, hash_of, now), before


def after_end(
    conn: Connection, job_id: int, hash_of: Callable[[int, str, str, dict], str], now: Callable[[], float]
) -> list[int]:
    """Propose what the end of ``job_id`` allows in each learning search it belongs to; the new jobs."""
    new: list[int] = []
    for search_id, spec in conn.execute(
        sa.select(t_search.c.id, t_search.c.spec)
        .join(t_sjob, t_sjob.c.search_id == t_search.c.id)
        .where(t_sjob.c.job_id == job_id)
    ).all():
        if "learn" not in json.loads(spec):
            continue
        try:
            new += propose(conn, search_id, hash_of, now())
        except sa.exc.SQLAlchemyError:
            raise  # the transaction is lost with it: the caller's retry records the end again
        except Exception:  # noqa: BLE001 - the sampler's failure (Optuna missing here, a bug) must not
            # lose the end being recorded: the next end asks again, as does scheduling the search again.
            _log.exception(
                "search %s: no point proposed after job %s ended (schedule the search again to go on)",
                search_id,
                job_id,
            )
    return new


@dataclass
class Config:
    """One configuration of a search: its runs, in job order."""

    key: str
    jobs: list[Any]

    @property
    def pending(self) -> bool:
        return any(j.status not in _ENDED for j in self.jobs)


def _configs(conn: Connection, search_id: int) -> dict[str, Config]:
    out: dict[str, Config] = {}
    for row in conn.execute(
        sa.select(t_job.c.id, t_job.c.status, t_job.c.params, t_job.c.results, t_sjob.c.config, t_sjob.c.rung)
        .join(t_sjob, t_sjob.c.job_id == t_job.c.id)
        .where(t_sjob.c.search_id == search_id)
        .order_by(t_job.c.id)
    ):
        out.setdefault(row.config, Config(row.config, [])).jobs.append(row)
    return out


def model_minimum(space: Mapping[str, Distribution]) -> int:
    """The ended configurations a multi-fidelity search needs before it proposes from its model:
    BOHB's N_min + 2 (Falkner et al. 2018, Algorithm 2), N_min = d + 1 and d the parameters drawn."""
    return len(space) + 3


def model_rung(configs: Mapping[str, Config], rules: Halving, minimum: int) -> tuple[int | None, int]:
    """BOHB's rule: the highest rung with at least ``minimum`` finished results, and how many it has;
    (None, the largest count of a rung) when no rung has that many yet."""
    done = Status.DONE.value
    counts = [0] * max(1, len(rules.rungs))
    for config in configs.values():
        for rung in range(len(counts)):
            runs = [j for j in config.jobs if j.rung == rung]
            if runs and all(j.status == done and _finite(_result(j, rules.metric)) for j in runs):
                counts[rung] += 1
    for rung in reversed(range(len(counts))):
        if counts[rung] >= minimum:
            return rung, counts[rung]
    return None, max(counts)


def _means(config: Config, rules: Halving) -> dict[int, float]:
    """A configuration's mean result at each rung all its runs finished with one."""
    out: dict[int, float] = {}
    for rung in sorted({j.rung for j in config.jobs}):
        runs = [j for j in config.jobs if j.rung == rung]
        got = [_result(j, rules.metric) if j.status == Status.DONE.value else None for j in runs]
        if all(_finite(v) for v in got):
            out[rung] = sum(float(v) for v in got if v is not None) / len(got)
    return out


def _result(job: Any, metric: str) -> Any:
    return (load_json(job.results) if job.results else {}).get(metric)


def _model(
    conn: Connection, plan: Plan, rules: Halving, configs: Mapping[str, Config], state: Mapping[str, Any], startup: int
) -> tuple[Any, Any, str]:
    """The study a multi-fidelity proposal asks (every configuration that ended, ranked by how far it
    got) and what the proposal says of it: from the model once ``startup`` configurations ended, at
    random before (the sampler's own start-up, which counts the same trials)."""
    import optuna

    study, dists = build_study(conn, plan, rules, configs, state, reach=True)
    State = optuna.trial.TrialState
    count = len(study.get_trials(deepcopy=False, states=(State.COMPLETE, State.PRUNED)))
    ended = f"{count} configuration{'s' if count != 1 else ''}"
    text = (
        f", from a model of the {ended} that ended, ranked by how far they got"
        if count >= startup
        else f", at random: {ended} ended, the model needs {startup}"
    )
    return study, dists, text


def propose(
    conn: Connection,
    search_id: int,
    hash_of: Callable[[int, str, str, dict], str],
    now: float,
    wanted: int | None = None,
) -> list[int]:
    """Fill the search up to its budget and its ``parallel`` pending configurations; the new job ids.
    With ``wanted``, that many configurations whatever is pending (an ``ask``), within the budget.

    The search's row is locked first (PostgreSQL; SQLite's writer holds the database), so that two
    workers ending jobs of one search at once propose one after the other, the second seeing the
    first's points as pending."""
    exp, spec = conn.execute(
        sa.select(t_search.c.experiment_id, t_search.c.spec).where(t_search.c.id == search_id).with_for_update()
    ).one()
    data = json.loads(spec)
    plan, rules, state = Plan.from_dict(data["learn"]), Halving.from_dict(data), data.get("state") or {}
    configs = _configs(conn, search_id)
    pending = sum(c.pending for c in configs.values())
    room = min(plan.parallel - pending if wanted is None else wanted, plan.samples - len(configs))
    if room <= 0:
        return []
    space = rules.distributions()
    sampler_name = resolve_auto(plan.sampler, space, plan.samples, len(plan.objectives))
    startup, source, shares = None, "", [1]
    if rules.rungs:  # multi-fidelity: the model of the ended configurations, Hyperband's brackets
        startup = model_minimum(space)
        shares = bracket_shares(len(rules.rungs), rules.eta)
        study, dists, source = _model(conn, plan, rules, configs, state, startup)
    else:
        study, dists = build_study(conn, plan, rules, configs, state)
    if not rules.rungs and sampler_name in ("tpe", "gp"):
        # TPE and the GP model once this many trials ended (Optuna counts COMPLETE and PRUNED ones).
        import optuna

        startup = startup_trials(plan.samples)
        ended = len(
            study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
        )
        results = f"{ended} result{'s' if ended != 1 else ''}"
        source = (
            f", from a model of {results}" if ended >= startup else f", at random: {results}, the model needs {startup}"
        )
    new: list[int] = []
    number = len(configs)
    tries = 0
    while room > 0 and tries < _RETRIES * max(1, room):
        tries += 1
        seed = proposal_seed(plan.seed, number + tries * 1_000_003)
        # Configuration ``number``'s bracket: drawn from the search's seed and the number alone, so that
        # a sequential run is the same run again. The first draw is not used (it once chose BOHB's
        # random share of the proposals); it is kept so that a configuration keeps its bracket.
        draw = random.Random(f"{plan.seed}\x00{number}")
        draw.random()
        bracket = bracket_of(shares, draw.randrange(sum(shares)))
        study.sampler = make_sampler(sampler_name, seed, plan, startup)
        trial = study.ask(fixed_distributions=dists)
        point = {k: _jobman_value(v) for k, v in trial.params.items()}
        start_at = {rules.resource: rules.rungs[bracket]} if rules.rungs else {}
        runs = [{**run, **point, **start_at} for run in plan.runs]
        config = config_of(runs[0], rules.resource)
        if config in configs:  # the same point again (a small discrete space): ask with another seed
            continue
        configs[config] = Config(config, [])
        why = f"proposed by {sampler_name}: configuration {number + 1} of {plan.samples}{source}"
        if rules.rungs:
            why += f"; Hyperband bracket {bracket + 1} of {len(shares)}, from {rules.resource}={rules.rungs[bracket]}"
        for params in runs:
            job_id, made = _insert(conn, exp, plan, params, hash_of, why, now)
            conn.execute(sa.insert(t_sjob).values(job_id=job_id, search_id=search_id, rung=bracket, config=config))
            if made:
                new.append(job_id)
        attrs = study._storage.get_trial_system_attrs(trial._trial_id)
        if attrs:
            state.setdefault("trials", {})[config] = attrs
        number += 1
        room -= 1
        tries = 0
    study_attrs = study._storage.get_study_system_attrs(study._study_id)
    if study_attrs or state.get("trials"):
        state["study"] = study_attrs
        conn.execute(sa.update(t_search).where(t_search.c.id == search_id).values(spec=spec_of(rules, plan, state)))
    return new


def _insert(
    conn: Connection,
    exp: int,
    plan: Plan,
    params: dict[str, Any],
    hash_of: Callable[[int, str, str, dict], str],
    why: str,
    now: float,
) -> tuple[int, bool]:
    """The job of ``params``: (its id, whether it was made now). One that exists already (made by hand
    or by another search) is the same job: it joins this search as it is, and is run once."""
    digest = hash_of(0, plan.kind, plan.target, params)
    found = conn.execute(
        sa.select(t_job.c.id).where(t_job.c.experiment_id == exp, t_job.c.params_hash == digest)
    ).scalar()
    if found is not None:
        return found, False
    job_id = conn.execute(
        sa.insert(t_job).values(
            experiment_id=exp,
            phase=0,
            kind=plan.kind,
            target=plan.target,
            params=dump_json(params, "parameters"),
            params_hash=digest,
            status=Status.QUEUED.value,
            priority=plan.priority,
            max_attempts=plan.max_attempts,
            created_at=now,
            queued_at=now,
        )
    ).inserted_primary_key[0]  # type: ignore[index]
    conn.execute(
        sa.insert(t_event).values(
            job_id=job_id,
            at=now,
            from_status=None,
            to_status=Status.QUEUED.value,
            attempt=0,
            why=why,
            source=None,
            data=None,
        )
    )
    return job_id, True


def _jobman_value(v: Any) -> Any:
    if isinstance(v, float):
        return float(round(v, 12))
    return v


def make_sampler(name: str, seed: int, plan: Plan, startup: int | None = None) -> Any:
    """Optuna's sampler of that name, seeded; ``startup``: the finished trials before TPE or the GP
    proposes from its model (:func:`startup_trials` of the budget when None)."""
    import optuna

    samplers = optuna.samplers
    if startup is None:
        startup = startup_trials(plan.samples)
    # Constraints need nothing here: their values are in each trial's system attributes (build_study),
    # where Optuna's samplers read them.
    if name == "tpe":
        return samplers.TPESampler(
            seed=seed,
            multivariate=len(plan.objectives) == 1,
            constant_liar=True,
            n_startup_trials=startup,
        )
    if name == "gp":
        return samplers.GPSampler(seed=seed, n_startup_trials=startup)
    if name == "cmaes":
        return samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "nsga2":
        return samplers.NSGAIISampler(seed=seed)
    if name == "qmc":
        return samplers.QMCSampler(seed=plan.seed, scramble=True, warn_independent_sampling=False)
    raise UsageError(f"unknown sampler {name!r}")


def build_study(
    conn: Connection,
    plan: Plan,
    rules: Halving,
    configs: Mapping[str, Config],
    state: Mapping[str, Any],
    rung: int = 0,
    reach: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """An in-memory study holding one trial per configuration, in the order they were proposed.

    A multi-fidelity search's trials are its configurations' runs at ``rung``: one that has none
    there is a RUNNING trial while any of its runs is pending (so that new points keep away from
    those in flight), and is left out once it stopped below that rung. With ``reach`` (what a
    proposal asks) they are every configuration instead: COMPLETE by its mean at the highest rung,
    PRUNED with its mean at each rung it reached when it stopped below, RUNNING while a run is
    pending; Optuna's TPE ranks PRUNED trials after COMPLETE ones, by the last step they reached and
    then their value there, so a configuration ranks by how far it got."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {
        key: getattr(optuna.distributions, cls)(**kwargs)
        for key, (cls, kwargs) in ((k, optuna_distribution(k, d)) for k, d in sorted(rules.distributions().items()))
    }
    study = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(),
        directions=["maximize" if d == "max" else "minimize" for _, d in plan.objectives],
    )
    for key, value in (state.get("study") or {}).items():
        study._storage.set_study_system_attr(study._study_id, key, value)
    trial_attrs = state.get("trials") or {}
    curves = _curves(conn, [j.id for c in configs.values() for j in c.jobs if _pruned(j)], plan.objectives[0][0])
    for config in configs.values():
        if not config.jobs:
            continue
        params = load_json(config.jobs[0].params)
        if not all(k in params for k in dists):
            continue
        runs = [j for j in config.jobs if j.rung == rung] if rules.rungs else config.jobs
        outcome: dict[str, Any]
        if reach and rules.rungs:
            means = {} if config.pending else _means(config, rules)
            top = len(rules.rungs) - 1
            if config.pending:
                outcome = {"state": optuna.trial.TrialState.RUNNING}
            elif not means:
                continue
            elif top in means:
                outcome = {"state": optuna.trial.TrialState.COMPLETE, "values": [means[top]]}
            else:
                outcome = {"state": optuna.trial.TrialState.PRUNED, "intermediate_values": means}
        elif runs:
            outcome = trial_outcome(runs, plan.objectives, curves, optuna.trial.TrialState)
        elif config.pending:
            outcome = {"state": optuna.trial.TrialState.RUNNING}
        else:
            continue
        point = {k: params[k] for k in dists}
        study.add_trial(
            optuna.trial.create_trial(
                params=point,
                distributions=dists,
                system_attrs={**trial_attrs.get(config.key, {}), **_constraint_attrs(config, plan)},
                user_attrs={"config": config.key},
                **outcome,
            )
        )
    return study, dists


def _constraint_attrs(config: Config, plan: Plan) -> dict[str, Any]:
    if not plan.constraints or any(j.status != Status.DONE.value for j in config.jobs):
        return {}
    results = [load_json(j.results) if j.results else {} for j in config.jobs]
    values = constraint_values(results, plan.constraints)
    return {f"constraints:{n}{op}{b:g}": v for (n, op, b), v in zip(plan.constraints, values)}


def _pruned(job: Any) -> bool:
    return job.status == Status.DONE.value and bool(job.results and load_json(job.results).get("pruned"))


def _curves(conn: Connection, job_ids: list[int], metric: str) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    if job_ids:
        for job_id, step, value in conn.execute(
            sa.select(t_metric.c.job_id, t_metric.c.step, t_metric.c.value)
            .where(t_metric.c.job_id.in_(job_ids), t_metric.c.name == metric)
            .order_by(t_metric.c.id)
        ):
            if value is not None and math.isfinite(value):
                out.setdefault(job_id, {})[int(step)] = float(value)
    return out


def trial_outcome(
    jobs: Sequence[Any], objectives: Sequence[tuple[str, str]], curves: Mapping[int, Mapping[int, float]], states: Any
) -> dict[str, Any]:
    """A configuration's trial as Optuna sees it: its state, and its values or its curve.

    Any run still waiting or running: RUNNING. Any run failed, crashed, cancelled or blocked: FAIL.
    Pruned: PRUNED with the mean of its runs' curves. All DONE: COMPLETE by the mean of each metric
    over the runs (FAIL when a run did not report one as a finite number)."""
    if any(j.status not in _ENDED for j in jobs):
        return {"state": states.RUNNING}
    if any(j.status in _BAD for j in jobs):
        return {"state": states.FAIL}
    if any(_pruned(j) for j in jobs):
        steps: dict[int, list[float]] = {}
        for j in jobs:
            for step, value in curves.get(j.id, {}).items():
                steps.setdefault(step, []).append(value)
        return {"state": states.PRUNED, "intermediate_values": {s: sum(v) / len(v) for s, v in sorted(steps.items())}}
    values = []
    for metric, _ in objectives:
        got = [(load_json(j.results) if j.results else {}).get(metric) for j in jobs]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in got):
            return {"state": states.FAIL}
        values.append(sum(float(v) for v in got if v is not None) / len(got))
    return {"state": states.COMPLETE, "values": values}


def summaries(conn: Connection, exp: int) -> list[str]:
    """One line per learning search of the experiment: its sampler, budget and best so far."""
    lines = []
    for search_id, spec in conn.execute(
        sa.select(t_search.c.id, t_search.c.spec).where(t_search.c.experiment_id == exp).order_by(t_search.c.id)
    ):
        data = json.loads(spec)
        if "learn" not in data:
            continue
        plan = Plan.from_dict(data["learn"])
        configs = _configs(conn, search_id)
        ended = sum(not c.pending for c in configs.values())
        goal = ", ".join(f"{m} ({'highest' if d == 'max' else 'lowest'} best)" for m, d in plan.objectives)
        line = (
            f"search {search_id}: {plan.sampler} on {goal}: {len(configs)} of {plan.samples} configurations "
            f"proposed, {ended} ended"
        )
        # DONE without the metric: a failure to the sampler, most likely a misnamed --metric.
        unreported = {
            m
            for c in configs.values()
            for j in c.jobs
            if j.status == Status.DONE.value and not _pruned(j)
            for m, _ in plan.objectives
            if not _finite((load_json(j.results) if j.results else {}).get(m))
        }
        if unreported:
            line += f"; some DONE jobs report no {', '.join(sorted(unreported))} (failures to the sampler)"
        lines.append(line)
    return lines


@dataclass(frozen=True)
class FrontPoint:
    """One configuration on a multi-objective search's Pareto front."""

    params: dict[str, Any]  # the proposed parameters
    values: dict[str, float]  # each metric's mean over the configuration's runs
    job_ids: tuple[int, ...]


@dataclass(frozen=True)
class Front:
    """The feasible configurations of a learning search that no other beats on every metric."""

    search_id: int
    objectives: tuple[tuple[str, str], ...]
    points: tuple[FrontPoint, ...]
    constraints: tuple[tuple[str, str, float], ...] = ()
    evaluated: tuple[FrontPoint, ...] = ()  # every finished configuration, in the order proposed
    importances: tuple[tuple[str, float], ...] = ()  # each parameter's, for the first metric, largest first


def fronts(conn: Connection, exp: int, every: bool = False) -> list[Front]:
    """The Pareto front of each multi-objective, constrained or multi-fidelity learning search of the
    experiment (Optuna's ``best_trials`` over the same trials a proposal sees: feasible ones only,
    under constraints; at the highest rung with a result, with halving; with one metric, the best);
    empty when Optuna is not installed."""
    try:
        import optuna
    except ImportError:
        return []
    out = []
    for search_id, spec in conn.execute(
        sa.select(t_search.c.id, t_search.c.spec).where(t_search.c.experiment_id == exp).order_by(t_search.c.id)
    ).all():
        data = json.loads(spec)
        if "learn" not in data:
            continue
        plan, rules = Plan.from_dict(data["learn"]), Halving.from_json(spec)
        if not every and len(plan.objectives) < 2 and not plan.constraints and not rules.rungs:
            continue
        configs = _configs(conn, search_id)
        top, _ = model_rung(configs, rules, 1)  # a multi-fidelity search is judged at its highest rung
        study, _ = build_study(conn, plan, rules, configs, {}, rung=top or 0)
        points = []
        for trial in sorted(study.best_trials, key=lambda t: t.values):
            config = configs[trial.user_attrs["config"]]
            points.append(
                FrontPoint(
                    dict(trial.params),
                    {m: float(v) for (m, _), v in zip(plan.objectives, trial.values)},
                    tuple(j.id for j in config.jobs),
                )
            )
        evaluated = tuple(
            FrontPoint(
                dict(t.params),
                {m: float(v) for (m, _), v in zip(plan.objectives, t.values)},
                tuple(j.id for j in configs[t.user_attrs["config"]].jobs),
            )
            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        )
        importances = _importances(optuna, study) if every and len(evaluated) >= 2 else {}
        out.append(
            Front(search_id, plan.objectives, tuple(points), plan.constraints, evaluated, tuple(importances.items()))
        )
    return out


def _importances(optuna: Any, study: Any) -> dict[str, float]:
    """Optuna's importance of each parameter for the first metric, over the finished trials; empty
    when they are too few or too alike to tell. The evaluator asks what reaches low values of a
    target: a metric to maximise is negated."""
    sign = -1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else 1.0
    try:
        with (
            warnings.catch_warnings()
        ):  # "computes the importances of params to achieve low target values": negated above
            warnings.filterwarnings("ignore", message=".*achieve low `target` values.*")
            return dict(optuna.importance.get_param_importances(study, target=lambda t: sign * t.values[0]))
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}


def objectives_of(conn: Connection, exp: int) -> list[tuple[str, str]]:
    """The (metric, direction) pairs of the experiment's latest learning search; empty when none."""
    for (spec,) in conn.execute(
        sa.select(t_search.c.spec).where(t_search.c.experiment_id == exp).order_by(t_search.c.id.desc())
    ):
        data = json.loads(spec)
        if "learn" in data:
            return [(m, d) for m, d in data["learn"]["objectives"]]
    return []


def members(conn: Connection, search_id: int) -> tuple[int, list[tuple[int, str]]]:
    """A learning search's budget, and its jobs as (id, status), in id order."""
    data = json.loads(conn.execute(sa.select(t_search.c.spec).where(t_search.c.id == search_id)).scalar_one())
    rows = conn.execute(
        sa.select(t_job.c.id, t_job.c.status)
        .join(t_sjob, t_sjob.c.job_id == t_job.c.id)
        .where(t_sjob.c.search_id == search_id)
        .order_by(t_job.c.id)
    ).all()
    return int(data["learn"]["samples"]) * len(data["learn"]["runs"]), [(r.id, r.status) for r in rows]

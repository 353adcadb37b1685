"""``jobman sqlschedule``: a sweep on one command line becomes jobs in the database."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, NoReturn

import click

from jobman.jobdb.command_paths import anchored_command
from jobman.jobdb.errors import NoSchema, UsageError
from jobman.jobdb.halving import (
    PRUNE_MIN_FINISHED,
    Halving,
    config_of,
    parse_halving,
    parse_prune,
    rung_sizes,
    sampled,
    sweep_space,
)
from jobman.jobdb.learn import SAMPLERS as LEARNING
from jobman.jobdb.priority import check_ranks
from jobman.jobdb.records import SchedulePreview
from jobman.jobdb.status import parse_status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import (
    PHASE_SEPARATOR,
    Assignment,
    Expansion,
    Phase,
    Sweep,
    check_samples,
    count_jobs,
    parse_sweep,
    repeated_values,
)

from .common import Database, err, fmt_params, parse_ids, with_database

_SEP = "\x00phase\x00"
MAX_JOBS = 100_000_000


class SweepCommand(click.Command):
    """Keeps every ``--`` as a phase separator (click would swallow the first one)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, [_SEP if a == PHASE_SEPARATOR else a for a in args])


def original_forms(tokens: list[str], *, later_wins: bool = False) -> list[str]:
    """The original's parameter forms (``file.conf``, ``key <- file.conf``, ``key::builder``,
    ``key:=expression``) as ``key=value`` tokens; the tokens as they are when there are none."""
    from jobman.jobdb.conf import expand_tokens, is_conf_token

    if not later_wins and not any(t != PHASE_SEPARATOR and is_conf_token(t) for t in tokens):
        return tokens  # the common case: a sweep's errors keep naming the user's own arguments
    from jobman.dispatch.builders import evaluate

    return expand_tokens(tokens, evaluate=evaluate, later_wins=later_wins)


def check_targets(targets: list[tuple[str, list[str]]]) -> dict[str, tuple[str | None, str | None]]:
    """Refuse a sweep whose function targets cannot be imported here, or cannot take a parameter
    the sweep gives them (``--no-check`` skips this). Returns, per target, the directory it was
    found from and the digest of its source."""
    from jobman.dispatch.experiment import TargetError, resolve, unaccepted
    from jobman.dispatch.provenance import found_at, source_digest

    found = {}
    for target, names in targets:
        try:
            fn = resolve(target)
        except TargetError as exc:
            raise UsageError(f"{exc} (use --no-check if it only exists where the jobs run)") from None
        refused = unaccepted(fn, names)
        if refused is not None:
            raise UsageError(refused)
        found[target] = (found_at(fn), source_digest(fn))
    return found


def changed_code(store: Any, found: dict[str, tuple[str | None, str | None]], ids: list[int]) -> dict[str, list[int]]:
    """Per target, the DONE jobs among ``ids`` that ran another version of it than the one here."""
    stale = {}
    for target, (_where, source) in found.items():
        if source is not None and ids:
            ran_other = store.ran_other_source(ids, source)
            if ran_other:
                stale[target] = ran_other
    return stale


def parse_after(selectors: tuple[str, ...]) -> dict:
    """``--after phase=0 --after status=DONE --after lr=0.1 --after ids=1-9`` into filters (ANDed)."""
    from jobman.jobdb.sweep import parse_value

    out: dict = {"params": {}}
    for sel in selectors:
        if sel == "all":
            continue
        if "=" not in sel:
            raise UsageError(
                f"--after {sel!r}: write key=value (phase=0, status=DONE, ids=1-9, target=..., or a parameter) or 'all'"
            )
        key, _, value = sel.partition("=")
        if key == "phase":
            out["phase"] = int(value) if value.lstrip("-").isdigit() else _bad_after(sel)
        elif key == "status":
            out["status"] = [parse_status(v) for v in value.split(",")]
        elif key in ("id", "ids"):
            out["ids"] = parse_ids([value])
        elif key == "target":
            out["target"] = value
        else:
            try:
                out["params"][key] = parse_value(value)
                if not isinstance(out["params"][key], (int, float, str, bool, list, type(None))):
                    at = len(value) - len(value.lstrip())
                    raise ValueError(f"a selector matches one value, not a distribution@{at}")
            except ValueError as exc:  # 'message@position' in the value
                message, _, pos = str(exc).rpartition("@")
                raise UsageError(f"--after {sel!r}: {message} at character {len(key) + 2 + int(pos)}") from None
    return out


def _bad_after(sel: str) -> NoReturn:
    raise UsageError(f"--after {sel!r}: the phase is a whole number")


@click.command("sqlschedule", cls=SweepCommand, context_settings={"ignore_unknown_options": False})
@click.argument("sweep", nargs=-1, required=True, metavar="[DB] TARGET [k=v | k={{a,b}}]... [-- [TARGET] k=v...]")
@with_database("sweep", create=True)
@click.option(
    "--cmd",
    "command",
    metavar="COMMAND",
    help="Run a command instead of a function: 'python train.py' (parameters become --key value "
    "arguments, or fill {key} placeholders).",
)
@click.option(
    "--after",
    multiple=True,
    metavar="SELECTOR",
    help="Fan-in: the first phase depends on every existing job matching SELECTOR "
    "(phase=0, status=DONE, ids=1-9, target=..., key=value; repeat to AND; 'all').",
)
@click.option("--priority", type=float, default=0, show_default=True, help="Higher runs first (1.5 is fine).")
@click.option(
    "-f", "--force", is_flag=True, help="Add the jobs even if the same jobs are already there (as new copies)."
)
@click.option(
    "-r",
    "--repeat",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    metavar="N",
    help="Schedule each job N times (copies after the first; with -f, N new copies).",
)
@click.option(
    "-p",
    "--parser",
    "parser",
    default=None,
    metavar="NAME",
    help="Accepted for old scripts: the k=v and k={{a,b}} syntax is always jobman's own.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Runs allowed per job before a crash is final.",
)
@click.option(
    "--ranks",
    type=int,
    default=1,
    show_default=True,
    metavar="N",
    help="Run each job as N processes started together (a gang): each gets RANK, WORLD_SIZE, "
    "MASTER_ADDR, MASTER_PORT, ...; rank 0's results are the job's.",
)
@click.option(
    "--samples",
    type=int,
    default=None,
    metavar="N",
    help="Draw N points from the distributions (lr=loguniform(1e-4,1e-1), nhid=choice(64,128), ...); "
    "each grid point gets the same N. Point i depends only on --seed and i.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="The seed of the --samples draws.")
@click.option(
    "--sampler",
    type=click.Choice(["random", "halton", *LEARNING]),
    default="random",
    show_default=True,
    help="random: independent draws; halton: a low-discrepancy sequence, randomly shifted by --seed; "
    "tpe, gp, cmaes, nsga2, qmc, auto: Optuna's samplers, each point proposed as jobs end from those "
    "that ended (needs --metric; pip install 'jobman-sql[search]').",
)
@click.option(
    "--parallel",
    type=int,
    default=None,
    metavar="P",
    help="With a learning --sampler: configurations pending at once (default: the CPUs of this host).",
)
@click.option(
    "--halving",
    metavar="RESOURCE=MIN:MAX",
    help="Successive halving: run every configuration with RESOURCE=MIN, the best 1/eta of them "
    "on to MIN*eta, ... up to MAX; each rung is a phase, and a promoted job continues from "
    "its parent's checkpoint (e.g. epochs=3:27).",
)
@click.option("--eta", type=int, default=3, show_default=True, help="With --halving: keep the best 1/eta of a rung.")
@click.option(
    "--metric",
    "metrics",
    metavar="M",
    multiple=True,
    help="With --halving, --prune or a learning --sampler: the result that ranks configurations (lowest "
    "best; M:max for highest). A learning sampler takes several: --metric valid_error --metric seconds.",
)
@click.option("--max", "maximize", is_flag=True, help="The highest --metric is best.")
@click.option(
    "--constraint",
    "constraints",
    multiple=True,
    metavar="RESULT<=X",
    help="With a learning --sampler: a configuration is feasible when its RESULT (mean over its runs) is "
    "<= X (or >= X); infeasible ones are steered away from and never reported best. Repeatable.",
)
@click.option(
    "--async",
    "asynchronous",
    is_flag=True,
    help="With --halving: promote a configuration as soon as it ranks in the top 1/eta of the "
    "finished ones of its rung (ASHA), rather than once the whole rung is finished.",
)
@click.option(
    "--prune",
    type=click.Choice(["median"]),
    help="Stop a running job whose logged --metric at a step is worse than the median of the finished "
    "jobs of this sweep at that step; it ends DONE with pruned=True.",
)
@click.option("--no-check", is_flag=True, help="Do not import the targets here to check them.")
@click.option(
    "--rerun-changed",
    is_flag=True,
    help="Queue again the DONE jobs of this sweep that ran an older version of their target "
    "(their results are kept in the event log).",
)
@click.option("--dry-run", is_flag=True, help="Print how many jobs the sweep makes; write nothing.")
def sqlschedule(  # noqa: C901
    sweep: tuple[str, ...],
    database: Database,
    command: str | None,
    after: tuple[str, ...],
    priority: float,
    force: bool,
    repeat: int,
    parser: str | None,
    max_attempts: int,
    ranks: int,
    samples: int | None,
    seed: int,
    sampler: str,
    parallel: int | None,
    halving: str | None,
    eta: int,
    metrics: tuple[str, ...],
    maximize: bool,
    constraints: tuple[str, ...],
    asynchronous: bool,
    prune: str | None,
    no_check: bool,
    dry_run: bool,
    rerun_changed: bool,
) -> None:
    """Schedule a sweep: one job per point of the grid, phases joined by '--'.

    \b
    Example:
      jobman sqlschedule 'sqlite:///sweeps.db?table=mlp' mypkg.train:main \\
          lr={{0.1,0.01,0.001}} nhid={{64,256}} -- epochs={{10,50}}
    Each '--' starts a phase: its jobs are made once per job of the phase
    before, inherit its parameters, and start when it is DONE. A phase may
    name its own target first: ... -- jobman.models.dbn:finetune lr={{0.1,0.03}}.
    Values may be distributions, drawn --samples times from --seed:
      uniform(a,b) loguniform(a,b) randint(a,b) normal(mu,sigma) choice(x,y,...)
      quniform(a,b,q) qloguniform(a,b,q) qnormal(mu,sigma,q)
    Scheduling the same sweep twice adds nothing; a larger --samples adds only
    the new points.

    \b
    The original jobman's forms are read too:
      defaults.conf          key=value lines (# comments, other files), overridden by later keys
      'key <- file.conf'     that file's keys under key. (key.a, key.b, ...)
      obj::pkg.mod.Class     obj.__builder__, for make(state.obj) in the job
      'x:=@random.random()'  the value of the expression, computed once here and stored
    """
    if parser is not None and parser != "filemerge":
        click.echo(
            f"note: --parser {parser} is not used: jobman reads k=v, k={{{{a,b}}}} and dotted names itself", err=True
        )
    check_ranks(ranks)
    tokens = original_forms([PHASE_SEPARATOR if t == _SEP else t for t in sweep])
    if command is not None:
        command = anchored_command(command, os.getcwd())  # the job runs in its workdir, not here
    parsed = parse_sweep(tokens, command=command)
    if command is not None and not command.strip():
        raise UsageError("--cmd needs a command line, such as 'python train.py'")
    check_samples(parsed, samples)
    total = count_jobs(parsed, samples)
    if total > MAX_JOBS:  # a runaway product of grids, most likely; memory is not the limit
        raise UsageError(f"the sweep makes {total:,} jobs; split it (at most {MAX_JOBS:,} at once)")
    if sampler in LEARNING:
        _schedule_learning(
            database, parsed, samples, seed, sampler, parallel, metrics, maximize, priority, max_attempts,
            no_check=no_check, dry_run=dry_run, constraints=constraints, halving=halving, eta=eta,
            asynchronous=asynchronous,
            refused=[("--prune", prune), ("--after", after), ("-f", force), ("-r", repeat > 1)],
        )  # fmt: skip
        return
    if constraints:
        raise UsageError("--constraint goes with a learning --sampler (tpe, gp, nsga2, auto)")
    if parallel is not None:
        raise UsageError("--parallel goes with a learning --sampler (tpe, gp, cmaes, nsga2, qmc, auto)")
    if len(metrics) > 1:
        raise UsageError("several --metric go with a learning --sampler; --halving and --prune rank by one")
    metric = metrics[0] if metrics else None
    if metric is not None and metric.endswith((":max", ":min")):
        metric, _, way = metric.rpartition(":")
        maximize = maximize or way == "max"
    rules = None
    if halving is not None:
        rules, parsed = _halving_rules(parsed, halving, eta, metric, maximize, asynchronous)
        if prune is not None:
            rules = dataclasses.replace(rules, prune=parse_prune(prune, metric, maximize).prune)
    elif prune is not None:
        if asynchronous:
            raise UsageError("--async goes with --halving RESOURCE=MIN:MAX")
        if len(parsed.phases) > 1:
            raise UsageError("--prune compares the jobs of one phase: give a sweep without '--'")
        rules = parse_prune(prune, metric, maximize)
    elif metric is not None or maximize or asynchronous:
        raise UsageError("--metric, --max and --async go with --halving RESOURCE=MIN:MAX or --prune median")
    rules = sampled(sweep_space(parsed), rules)  # the distributions drawn, kept for report --plot
    # Made as the store reads it: a million-job grid is never held whole.
    specs = Expansion(parsed, samples=samples, seed=seed, sampler=sampler)
    found = {} if no_check else check_targets(specs.function_parameters())
    if rerun_changed and no_check:
        raise UsageError("--rerun-changed compares the targets as imported here: it cannot go with --no-check")
    for note in repeated_values(parsed):
        click.echo(f"note: {note}", err=True)
    store = _preview_store(database) if dry_run else database.open()
    after_ids: list[int] = []
    if after:
        sel = parse_after(after)
        after_ids = store.select_ids(
            status=sel.get("status", ()), phase=sel.get("phase"), params=sel["params"] or None, target=sel.get("target")
        )
        if "ids" in sel:
            after_ids = sorted(set(after_ids) & set(sel["ids"]))
        if not after_ids:
            raise UsageError(f"--after {' '.join(after)} matches no job in experiment {store.experiment!r}")
        # A fan-in sweep's phases come after the deepest job it waits for.
        wanted = set(after_ids)
        specs = specs.shifted(1 + max(j.phase for j in store.jobs(with_deps=False) if j.id in wanted))
    keep: dict[str, Any] = dict(
        after=after_ids,
        priority=priority,
        max_attempts=max_attempts,
        ranks=ranks,
        halving=rules,
        duplicate=force,
        repeat=repeat,
        # The sweep's ids, to compare the code its DONE jobs ran, only where some ran already.
        keep_ids=store.ran_before([t for t, (_where, source) in found.items() if source]),
        where={target: where for target, (where, _source) in found.items() if where}
        | ({command: os.getcwd()} if command is not None else {}),
    )
    if dry_run:
        keep.pop("keep_ids")
        keep.pop("where")
        _print_preview(store, store.preview_schedule(specs, first=DRY_RUN_SHOWN, **keep), len(parsed.phases))
        if rules is not None and rules.rungs:
            click.echo(_rungs_line(rules, list(specs), repeat))
        return
    if len(specs) >= 20_000 and err.is_terminal:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("scheduling"),
            BarColumn(),
            TextColumn("{task.completed:,}/{task.total:,}"),
            TimeRemainingColumn(),
            console=err.console,
            transient=True,
        ) as bar:
            task = bar.add_task("schedule", total=len(specs) * repeat)
            result = store.schedule(specs, progress=lambda n: bar.update(task, completed=n), **keep)
    else:
        result = store.schedule(specs, **keep)
    if repeat > 1 and not result.repeated:
        click.echo("the jobs were already there, so they are not repeated (use -f to add copies anyway)", err=True)
    where = f"experiment {store.experiment!r} of {store.target.display}"
    if result.added == 0:
        click.echo(f"all {result.existing} jobs of this sweep are already in {where}; nothing added")
    else:
        extra = f" ({result.existing} already present)" if result.existing else ""
        click.echo(f"added {result.added} jobs to {where}{extra}")
    _changed_code(store, found, result.job_ids, rerun_changed)
    if rules is not None and rules.rungs:
        click.echo(_rungs_line(rules, list(specs), repeat if result.repeated else 1))
    if rules is not None and rules.prune:
        click.echo(
            f"pruning by {rules.metric}: a running job worse than the median of the finished ones at "
            f"the same step is stopped (once {PRUNE_MIN_FINISHED} have finished)"
        )


DRY_RUN_SHOWN = 10  # jobs a --dry-run lists


def _preview_store(database: Database) -> Store:
    """Where a --dry-run rehearses its schedule: the database, or an empty one in memory when there is
    none yet (so that nothing is created, not even the file)."""
    path = database.target.sqlite_path
    if not (path and path != ":memory:" and not os.path.exists(path)):
        try:
            return Store(database.target, create=False)
        except NoSchema:
            pass
    return Store.open("sqlite:///:memory:", database.target.experiment)


def _print_preview(store: Store, preview: SchedulePreview, phases: int) -> None:
    """How many jobs the sweep would add, what it would not, and the first of them."""
    notes = []
    if preview.existing:
        notes.append(f"{preview.existing} already present")
    if preview.merged:
        notes.append(f"{preview.merged} named twice by the sweep, merged")
    extra = f" ({'; '.join(notes)})" if notes else ""
    click.echo(
        f"{preview.added} jobs in {phases} phase(s) would be added to experiment {store.experiment!r}"
        f"{extra}; nothing written (--dry-run)"
    )
    for job in preview.first:
        click.echo(f"  phase {job.phase}  {job.target}  {fmt_params(job.params) or '-'}")
    if preview.added > len(preview.first):
        click.echo(f"  ... and {preview.added - len(preview.first)} more")


def _changed_code(store: Any, found: dict[str, tuple[str | None, str | None]], ids: list[int], rerun: bool) -> None:
    """Say which DONE jobs of the sweep ran an older version of their target; with ``rerun``,
    queue them again (a reset: their results go to the event log)."""
    for target, stale in changed_code(store, found, ids).items():
        name = target.replace(":", ".")
        if rerun:
            store.reset(stale, why=f"ran an older version of {name}; scheduled again with --rerun-changed")
            click.echo(f"{len(stale)} of these jobs ran an older {name}: queued again (old results in their events)")
        else:
            click.echo(f"{len(stale)} of these jobs ran an older {name}; --rerun-changed runs them again")


def _schedule_learning(
    database: Database,
    parsed: Sweep,
    samples: int | None,
    seed: int,
    sampler: str,
    parallel: int | None,
    metrics: tuple[str, ...],
    maximize: bool,
    priority: float,
    max_attempts: int,
    *,
    no_check: bool,
    dry_run: bool,
    refused: list[tuple[str, Any]],
    constraints: tuple[str, ...] = (),
    halving: str | None = None,
    eta: int = 3,
    asynchronous: bool = False,
) -> None:
    """A learning search: its first configurations now, the others proposed as jobs end. With
    ``--halving``, a multi-fidelity one: each new configuration starts at its Hyperband bracket's rung,
    proposed from a model of every configuration that ended, ranked by how far it got (at random
    until enough have), and is promoted within its bracket (``--async``: judged once, as its runs at
    a rung end, by Optuna's successive-halving rule)."""
    from jobman.jobdb.learn import Plan, check_halving, check_plan, parse_constraints, parse_objectives, resolve_auto
    from jobman.jobdb.selection import default_group_keys

    for option, given in refused:
        if given:
            raise UsageError(f"--sampler {sampler} does not combine with {option}: use --sampler random or halton")
    if asynchronous and halving is None:
        raise UsageError("--async goes with --halving RESOURCE=MIN:MAX")
    if len(parsed.phases) > 1:
        raise UsageError(f"--sampler {sampler} proposes the jobs of one phase: give a sweep without '--'")
    if samples is None:
        raise UsageError(f"--sampler {sampler} needs --samples N, the number of configurations to evaluate")
    space = sweep_space(parsed)
    rules: Halving | None = None
    if halving is not None:
        objectives = parse_objectives(metrics, maximize)
        if len(objectives) > 1:
            raise UsageError("--halving ranks configurations by one --metric: give one, or leave --halving out")
        if not objectives:
            raise UsageError(f"--sampler {sampler} needs --metric M: the result it minimises (M:max to maximise)")
        ((metric, direction),) = objectives
        rules, parsed = _halving_rules(parsed, halving, eta, metric, direction == "max", asynchronous)
    phase = parsed.phases[0]
    fixed = [a for a in phase.assignments if a.key not in space]
    runs = [a.key for a in fixed if a.grid and len(a.values) > 1]
    others = sorted(set(runs) - set(default_group_keys(runs)))
    if others:
        raise UsageError(
            f"--sampler {sampler} proposes every parameter but folds and seeds: write {others[0]} as choice(...)"
        )
    template = list(Expansion(Sweep([Phase(phase.target, fixed)], parsed.kind)))
    plan = Plan(
        sampler,
        samples,
        parallel if parallel is not None else max(1, os.cpu_count() or 1),
        seed,
        parse_objectives(metrics, maximize),
        template[0].kind,
        template[0].target,
        tuple(s.params for s in template),
        priority,
        max_attempts,
        parse_constraints(constraints),
    )
    check_plan(plan, space)
    rules = rules or _learning_rules(plan)
    check_halving(plan, rules, space)
    if not no_check:
        check_targets(Expansion(parsed, samples=1, seed=seed).function_parameters())
    chosen = resolve_auto(sampler, space, samples, len(plan.objectives))
    how = f"{chosen} (chosen by auto)" if chosen != sampler else chosen
    per = len(plan.runs)
    fidelity = ""
    if rules.rungs:
        fidelity = (
            f"; each from a model of the configurations that ended (once {len(space) + 3} have, random before), "
            f"promoted by halving {rules.resource} {rules.rungs[0]} to {rules.rungs[-1]}, eta {rules.eta}"
            + (", async" if rules.asynchronous else "")
        )
    if dry_run:
        click.echo(
            f"{samples} configurations of {per} job(s), proposed by {how} as jobs end, {plan.parallel} "
            f"pending at most{fidelity}; nothing written (--dry-run)"
        )
        return
    store = database.open()
    search_id, new, before = store.start_search(sampled(space, rules), plan)  # type: ignore[arg-type]
    where = f"experiment {store.experiment!r} of {store.target.display}"
    if not new:
        rest = "" if before >= samples else f"; the rest of the {samples} are proposed as jobs end"
        click.echo(f"search {search_id} holds {before} configurations in {where}; nothing added{rest}")
        return
    configs = len(new) // max(1, per)
    click.echo(
        f"search {search_id}: {how} proposed {configs} configuration{'s' if configs != 1 else ''} ({len(new)} "
        f"job{'s' if len(new) != 1 else ''}) to {where}; the rest of the {samples} are proposed as jobs end, "
        f"{plan.parallel} pending at most{fidelity}"
    )


def _learning_rules(plan: Any) -> Halving:
    """What the rest of jobman reads of a learning search: its first metric, and no rungs."""
    metric, direction = plan.objectives[0]
    return Halving("", (), 0, metric, direction)


def _halving_rules(
    parsed: Sweep, text: str, eta: int, metric: str | None, maximize: bool, asynchronous: bool
) -> tuple[Halving, Sweep]:
    """The rules of ``--halving``, and the sweep with the resource at its first rung."""
    rules = parse_halving(text, eta, metric, maximize, asynchronous)
    if len(parsed.phases) > 1:
        raise UsageError("--halving makes the phases itself (one per rung): give a sweep without '--'")
    if any(a.key == rules.resource for a in parsed.phases[0].assignments):
        raise UsageError(f"--halving sets {rules.resource}; leave it out of the sweep")
    first = Assignment(rules.resource, (rules.rungs[0],), False)
    return rules, Sweep([Phase(parsed.phases[0].target, [*parsed.phases[0].assignments, first])], parsed.kind)


def _rungs_line(rules: Halving, specs: list, repeat: int = 1) -> str:
    configs = len({config_of(s.params, rules.resource) for s in specs})
    runs = repeat * len(specs) // max(1, configs)  # folds, seeds or copies of each configuration
    sizes = rung_sizes(configs, rules.eta, len(rules.rungs))
    steps = ", ".join(f"{n * runs} at {rules.resource}={r}" for n, r in zip(sizes, rules.rungs))
    how = "as each job finishes (async)" if rules.asynchronous else "once each rung is finished"
    return (
        f"successive halving by {rules.metric} ({'highest' if rules.mode == 'max' else 'lowest'} best), "
        f"promoting {how}: {steps} (jobs per rung, when every rung finishes)"
    )


def _alias(name: str) -> SweepCommand:
    return SweepCommand(
        name,
        callback=sqlschedule.callback,
        params=sqlschedule.params,
        help=sqlschedule.help,
        short_help="Same as sqlschedule (the name jobman users know).",
    )


COMMANDS = [sqlschedule, _alias("sqlschedules"), _alias("schedule")]

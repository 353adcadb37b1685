"""``jobman cmdline``: run one experiment here, without a database, as the original jobman did."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from jobman.dispatch.runner import EXIT_INCOMPLETE
from jobman.jobdb.errors import UsageError

from .schedule import original_forms

CMDLINE_RECORD = "cmdline.json"  # the target and parameters of the run a directory holds
ORIG_CONF, CURRENT_CONF = "orig.conf", "current.conf"  # the original's record of a run, key = value lines
_CODES = {"DONE": 2, "INCOMPLETE": 1, "FAILED": 5}

# Options of the original's cmdline that have no meaning here: what to use instead.
_EXPLAINED = {
    "workdir_gen": "-g/--workdir-gen is not used: a run's directory is jobman_DATE_TIME_XXXX, or name it with -w",
    "sigint": "-2/--sigint is not needed: Ctrl-C always interrupts a cmdline run",
    "parser": "-p/--parser is not used: jobman reads key=value, key::builder, key:=expression and .conf files itself",
}


@click.command("cmdline", context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, required=True, metavar="TARGET [k=v | k::builder | k:=expr | file.conf]...")
@click.option(
    "-w",
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the run keeps its files and checkpoint (state.json). Default: a new directory "
    "jobman_DATE_TIME_XXXX here.",
)
@click.option(
    "--workdir-dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Make the new run directory inside DIR instead of here.",
)
@click.option("--resume", is_flag=True, help="Continue the run saved in --workdir (same target and parameters).")
@click.option(
    "-f",
    "--force",
    is_flag=True,
    help="Run even if --workdir holds an earlier run, finished or not (it continues from its state).",
)
@click.option("-n", "--dry-run", is_flag=True, help="Run in a temporary directory, removed afterwards.")
@click.option("-r", "--redirect", is_flag=True, help="Send the run's stdout and stderr to files in its directory.")
@click.option("--redirect-stdout", is_flag=True, help="Send the run's stdout to WORKDIR/stdout.txt.")
@click.option("--redirect-stderr", is_flag=True, help="Send the run's stderr to WORKDIR/stderr.txt.")
@click.option(
    "--finish-up-after",
    type=click.FloatRange(0.01),
    default=None,
    metavar="SECONDS",
    help="After SECONDS, channel.switch() answers 'finish-up' and should_stop() turns true.",
)
@click.option(
    "--save-every",
    type=click.FloatRange(0),
    default=None,
    metavar="SECONDS",
    help="channel.switch() answers 'save' every SECONDS, to ask for a checkpoint.",
)
@click.option("-g", "--workdir-gen", "workdir_gen", default=None, metavar="FN", help="Accepted for old scripts.")
@click.option("-2", "--sigint", is_flag=True, default=None, help="Accepted for old scripts.")
@click.option("-p", "--parser", default=None, metavar="NAME", help="Accepted for old scripts.")
def cmdline(
    args: tuple[str, ...],
    workdir: str | None,
    workdir_dir: str | None,
    resume: bool,
    force: bool,
    dry_run: bool,
    redirect: bool,
    redirect_stdout: bool,
    redirect_stderr: bool,
    finish_up_after: float | None,
    save_every: float | None,
    **explained: Any,
) -> int:
    """Run one experiment here, without a database (jobman's cmdline).

    Parameters are key=value (dotted keys nest: state.c.d), key::builder
    (state.key.__builder__, for make(state.key)), key:=expression (its value,
    with @pkg.fn imports: "x:=@random.uniform(0, 100)"), configuration files of
    such lines, and 'key <- file.conf' (that file's keys under key). A key
    given twice keeps its last value, so defaults in a file come first.

    Each run gets a new directory unless -w names one; a directory holding an
    earlier run's state is continued only with --resume or -f, and only by the
    same target and parameters. The directory keeps orig.conf (the parameters)
    and current.conf (parameters and results), as the original wrote them.

    Exits 0 when the run is DONE, 75 when it returned INCOMPLETE (run it again
    with --resume to continue), 1 when it FAILED.

    \b
    Example:
      jobman cmdline jobman.examples.def_addition.addition_example first=2 second=5
      jobman cmdline jobman.models.mlp:train dataset=digits nhid=64 epochs=5 -w /tmp/run1
      jobman cmdline jobman.models.mlp:train dataset=digits nhid=64 epochs=5 -w /tmp/run1 --resume
    """
    from jobman.dispatch.experiment import TargetError, resolve
    from jobman.dispatch.runner import run_direct
    from jobman.jobdb.sweep import canonical_target, parse_sweep

    for name, given in explained.items():
        if given is not None:
            click.echo(_EXPLAINED[name], err=True)
    parsed = parse_sweep(original_forms(list(args), later_wins=True))
    if len(parsed.phases) > 1 or any(a.grid or a.distribution for a in parsed.phases[0].assignments):
        raise UsageError("cmdline runs one job: no grids, distributions or '--' phases (schedule a sweep for that)")
    params = {a.key: a.values[0] for a in parsed.phases[0].assignments}
    first = parsed.phases[0].target
    assert first is not None  # parse_sweep refuses a sweep whose first phase names no target
    target = canonical_target(first)
    resume = resume or (force and workdir is not None)
    if resume and workdir is None:
        raise UsageError("--resume continues the run saved in a directory: name it with -w/--workdir")
    if sum(x is not None and x is not False for x in (workdir, workdir_dir, dry_run or None)) > 1:
        raise UsageError("give only one of -w/--workdir, --workdir-dir and -n/--dry-run")
    try:
        fn = resolve(target)
    except TargetError as exc:
        raise UsageError(str(exc)) from None
    if workdir is not None:
        run_dir = Path(workdir)
    elif dry_run:
        run_dir = Path(tempfile.mkdtemp(prefix="jobman_dry_run_"))
    else:
        run_dir = _fresh_run_directory(Path(workdir_dir) if workdir_dir else Path("."))
    _check_saved_run(run_dir, target, params, resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    shown, run_dir = run_dir, run_dir.resolve()  # the run works inside it: its paths must not be relative
    (run_dir / CMDLINE_RECORD).write_text(json.dumps({"target": target, "params": params}, sort_keys=True))
    experiment = target.replace(":", ".")
    started = time.ctime()
    _write_conf(run_dir / ORIG_CONF, params, {"experiment": experiment, "time": started})
    deadline = time.time() + finish_up_after if finish_up_after else None
    try:
        with _inside(run_dir), _redirected(run_dir, redirect or redirect_stdout, redirect or redirect_stderr):
            ending = run_direct(fn, params, run_dir, resume=resume, save_every=save_every, deadline=deadline)
        _write_conf(
            run_dir / CURRENT_CONF,
            {**params, **ending.results},
            {"experiment": experiment, "time": started, "status": _CODES.get(ending.status, 5)},
        )
        click.echo(
            json.dumps(
                {
                    "status": ending.status,
                    "results": ending.results,
                    "workdir": "(removed: --dry-run)" if dry_run else str(shown),
                },
                indent=2,
            )
        )
    finally:
        if dry_run:
            shutil.rmtree(run_dir, ignore_errors=True)
    if ending.error:
        click.echo(ending.error, err=True)
    # As a command job would say it: 75 asks to be run again and resumed (a cmdline wrapped in one does).
    return {"DONE": 0, "INCOMPLETE": EXIT_INCOMPLETE}.get(ending.status, 1)


def _write_conf(path: Path, values: dict[str, Any], own: dict[str, Any]) -> None:
    """``key = value`` lines that ``jobman cmdline`` reads back as a configuration file."""
    from jobman.jobdb.nested import flatten
    from jobman.jobdb.sweep import format_value

    flat = {**flatten(values), **{f"jobman.{k}": v for k, v in own.items()}}
    lines = []
    for key in sorted(flat):
        try:
            lines.append(f"{key} = {format_value(flat[key])}")
        except (TypeError, ValueError):
            continue  # a value the line form cannot hold is in state.json
    path.write_text("".join(line + "\n" for line in lines))


@contextlib.contextmanager
def _inside(run_dir: Path) -> Iterator[None]:
    """The run's own directory as the current one while it runs, as the original set it."""
    before = os.getcwd()
    os.chdir(run_dir)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _redirected(run_dir: Path, stdout: bool, stderr: bool) -> Iterator[None]:
    """The run's printing into stdout.txt and stderr.txt of its directory, when asked."""
    with contextlib.ExitStack() as stack:
        if stdout:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(run_dir / "stdout.txt", "a"))))
        if stderr:
            stack.enter_context(contextlib.redirect_stderr(stack.enter_context(open(run_dir / "stderr.txt", "a"))))
        yield


def _fresh_run_directory(parent: Path) -> Path:
    """A new directory for one run, as the original jobman made: jobman_DATE_TIME_XXXX in ``parent``."""
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=time.strftime("jobman_%Y%m%d_%H%M%S_"), dir=str(parent)))


def _check_saved_run(run_dir: Path, target: str, params: dict, resume: bool) -> None:
    """Refuse to run over another run's saved state: resumed only when asked, and only the same run."""
    from jobman.dispatch.channel import DirectChannel

    state_file = run_dir / DirectChannel.STATE_FILE
    if not state_file.exists():
        return
    if not resume:
        raise UsageError(
            f"{run_dir} holds the saved state of an earlier run: add --resume to continue it, or give another --workdir"
        )
    try:
        record = json.loads((run_dir / CMDLINE_RECORD).read_text())
        saved_target, saved = record["target"], record["params"]
    except (OSError, ValueError, KeyError, TypeError):  # a state saved some other way: its values are the record
        saved_target, saved = target, {k: v for k, v in json.loads(state_file.read_text()).items() if k in params}
    if saved_target != target:
        raise UsageError(f"{run_dir} holds a run of {saved_target}, not {target}: give another --workdir")
    differ = sorted(k for k in set(saved) | set(params) if saved.get(k, _UNSET) != params.get(k, _UNSET))
    if differ:
        key = differ[0]
        was = json.dumps(saved[key]) if key in saved else "unset"
        now = json.dumps(params[key]) if key in params else "unset"
        raise UsageError(
            f"{run_dir} holds a run with other parameters ({key} was {was}, now {now}): "
            "give another --workdir to start a new run"
        )


_UNSET = object()


COMMANDS = [cmdline]

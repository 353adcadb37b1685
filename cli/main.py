"""The ``jobman`` command: a click group whose commands live in the modules beside this one."""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
import traceback
from typing import Any

import click

from jobman import __version__
from jobman.jobdb import sqlite_memory
from jobman.jobdb.errors import JobmanError
from jobman.jobdb.url import mask_password

# Which module holds each command, in the order `jobman --help` lists them. A command's
# module is imported only when that command runs (or help is shown), so `jobman worker`
# does not pay for the report's NumPy or the migrations' alembic before forking jobs.
COMMAND_MODULES: dict[str, str] = {
    "sqlschedule": "schedule",
    "sqlschedules": "schedule",
    "schedule": "schedule",
    "list": "jobs",
    "show": "jobs",
    "sqlstatus": "jobs",
    "db": "db",
    "worker": "run",
    "sql": "run",
    "dispatch": "run",
    "run-job": "run",
    "cmdline": "cmdline",
    "reset": "repair",
    "retry": "repair",
    "cancel": "repair",
    "set-status": "repair",
    "set-priority": "repair",
    "rm": "repair",
    "artifact": "artifacts",
    "gc": "artifacts",
    "monitor": "monitor",
    "condor_check": "monitor",
    "report": "report",
    "sqlview": "view",
    "serve": "serve",
    "demo": "demo",
    "help": "view",
}


class JobmanGroup(click.Group):
    """Loads each command's module on first use; lists commands in the order of a typical session."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module_name = COMMAND_MODULES.get(name)
        if module_name is None:
            return None
        if name == "dispatch" and _local_dispatch_ahead():
            from jobman.dispatch.backends import zygote

            zygote.prestart()  # its imports overlap this process's own (the command's module, the database)
        module = importlib.import_module(f"jobman.cli.{module_name}")
        return next((c for c in module.COMMANDS if c.name == name), None)


def _local_dispatch_ahead() -> bool:
    """Whether the command line being run is a local ``jobman dispatch`` that will start workers, as
    far as can be told before its options are parsed (a wrong guess costs a process that exits)."""
    args = _switches.get("argv") or []
    if any(a in ("-h", "--help") for a in args):
        return False
    for i, arg in enumerate(args):
        if arg == "--backend" and i + 1 < len(args):
            return args[i + 1] == "local"
        if arg.startswith("--backend="):
            return arg == "--backend=local"
    return True


@click.group(cls=JobmanGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="jobman")
@click.option("--debug", is_flag=True, envvar="JOBMAN_DEBUG", help="Show tracebacks instead of one-line errors.")
@click.option(
    "--artifacts",
    metavar="DIR|URL",
    help="The artifact store (a shared folder, or an fsspec URL): $JOBMAN_ARTIFACTS for this command "
    "and the workers it starts. Default: ?artifacts= in the URL, else beside a SQLite file, else "
    "EXPROOT/_artifacts.",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool, artifacts: str | None) -> None:
    """jobman: a job database and experiment scheduler for machine-learning research.

    \b
    Schedule a sweep, run it on local cores or Slurm, watch it, report the winner:
      jobman sqlschedule 'sqlite:///sweeps.db?table=mlp' jobman.models.mlp:train lr={{0.1,0.01}}
      jobman dispatch 'sqlite:///sweeps.db?table=mlp' -j 2
      jobman report 'sqlite:///sweeps.db?table=mlp' --metric valid_error
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    _switches["debug"] = debug
    if artifacts:
        # An environment variable, so that the workers this command starts find the same store.
        os.environ["JOBMAN_ARTIFACTS"] = artifacts if "://" in artifacts else os.path.abspath(artifacts)


# The group's switches as click parsed them, for ``main`` to read once a command has raised
# (``--debug`` given as another option's value is that value, not the switch); and the arguments.
_switches: dict[str, Any] = {}


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning every error a user can meet into one sentence."""
    args = sys.argv[1:] if argv is None else argv
    _switches.clear()
    _switches["argv"] = list(args)
    try:
        return _main(args)
    finally:
        if "jobman.dispatch.backends.zygote" in sys.modules:  # one started ahead and not taken: stopped
            sys.modules["jobman.dispatch.backends.zygote"].discard_prestarted()


def _main(args: list[str]) -> int:
    try:
        rv = cli.main(args=args, prog_name="jobman", standalone_mode=False)
        if isinstance(rv, int):
            return rv
    except click.exceptions.Abort:
        click.echo("jobman: interrupted", err=True)
        return 130
    except click.ClickException as exc:
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            click.echo(exc.ctx.get_usage(), err=True)
        click.echo(f"jobman: {mask_password(exc.format_message())}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except JobmanError as exc:
        if _switches.get("debug"):
            traceback.print_exc()
        click.echo(f"jobman: {mask_password(str(exc))}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("jobman: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - a bug: still one sentence unless --debug
        if _switches.get("debug"):
            traceback.print_exc()
        message = mask_password(f"{type(exc).__name__}: {exc}".splitlines()[0])
        click.echo(f"jobman: internal error ({message}); rerun with --debug for the traceback", err=True)
        return 3
    return 0


def run() -> None:
    """The ``jobman`` command as a process: :func:`main`, then an exit that skips tearing down every
    module (a tenth to a third of a second once SQLAlchemy and rich are loaded, at the end of every
    dispatch). Exit handlers still run and the standard streams are flushed; with other threads
    still alive it exits as usual, waiting for them."""
    sqlite_memory.allow()  # nothing has opened a database yet
    code = main()
    if threading.active_count() > 1:
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


if __name__ == "__main__":
    run()

"""``jobman sqlview``: the original jobman's SQL view of an experiment, and ``jobman help``."""

from __future__ import annotations

import click

from jobman.jobdb.views import FIXED_COLUMNS, create_view, drop_view

from jobman.jobdb.errors import UsageError

from .common import Database, with_database


@click.command("sqlview")
@click.argument("args", nargs=-1, required=True, metavar="[DB] VIEWNAME")
@with_database("args")
@click.option("-d", "--drop", is_flag=True, help="Drop the view instead of creating it.")
def sqlview(args: tuple[str, ...], database: Database, drop: bool) -> None:
    """Create (or recreate) a SQL view of an experiment: one column per parameter and result.

    \b
    Example:
      jobman sqlview postgres://me@dbhost/lab/mlp mlp_view
      psql -c 'SELECT id, lr, validerror FROM mlp_view WHERE jobman_status = 2'
    Column names drop underscores and turn dots into underscores (rbm.n_hid: rbm_nhid);
    id, jobman_status (the numeric code), jobman_sql_priority, jobman_hash,
    jobman_experiment, jobman_sql_hostname and jobman_sql_hostworkdir come first.
    Recreate the view to pick up result keys that appeared since.
    """
    if len(args) != 1:
        raise UsageError("jobman sqlview takes a database URL (or --db) and one view name")
    viewname = args[0]
    store = database.open()
    if drop:
        drop_view(store.engine, viewname)
        click.echo(f"dropped view {viewname}")
        return
    columns = create_view(store.engine, store.experiment, viewname)
    names = ", ".join([*FIXED_COLUMNS, *(c.name for c in columns)])
    click.echo(f"view {viewname} of experiment {store.experiment!r}: {names}")


@click.command("help")
@click.argument("command", nargs=-1, metavar="[COMMAND]")
@click.pass_context
def help_command(ctx: click.Context, command: tuple[str, ...]) -> None:
    """Show help for jobman or for one of its commands, as ``COMMAND --help`` does.

    \b
    Example:
      jobman help sqlschedule
    """
    group = ctx.parent.command if ctx.parent else None
    if not command:
        click.echo(group.get_help(ctx.parent))
        return
    name = command[0]
    cmd = group.get_command(ctx.parent, name)
    if cmd is None:
        raise UsageError(f"no command named {name!r}; 'jobman help' lists them")
    with click.Context(cmd, info_name=name, parent=ctx.parent) as sub:
        click.echo(cmd.get_help(sub))


COMMANDS = [sqlview, help_command]

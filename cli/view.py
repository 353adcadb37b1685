"""``jobman sqlview``: the original jobman's SQL view of an experiment, and ``jobman help``."""

from __future__ import annotations

import click

from jobman.jobdb.errors import UsageError
from jobman.jobdb.views import FIXED_COLUMNS, create_view, drop_view

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


# The original's help topics, beside its commands.
TOPICS = {
    "experiment": """\
An experiment is a function of a module Python can import:

    def my_experiment(state, channel):
        state.result = state.first + state.second   # what it adds to state is its result
        return channel.COMPLETE                     # or None; channel.INCOMPLETE to be resumed

Name it as mypkg.mymodule.my_experiment (or mypkg.mymodule:my_experiment). state holds the
parameters, nested by their dots (state.hyper.lr), and state.jobman what jobman knows of the
run (id, experiment, sql.host_name, sql.host_workdir, ...). The function runs in its own
working directory; channel.save() checkpoints state, and a job run again is handed back what
it saved. channel.switch() (or channel()) answers 'stop' or 'finish-up' when it should save
and return INCOMPLETE, 'save' when it should checkpoint, else None.""",
    "parameters": """\
Parameters, after the experiment, on cmdline, sqlschedule and sqlschedules:

    key=value             state.key; typed as int, float, bool, None, text or [list]; a dotted
                          key nests (c.d=hello gives state.c.d)
    key={{a,b,c}}         sqlschedule(s): one job per value, several give their product
    key::pkg.mod.Builder  state.key.__builder__; make(state.key) builds the object
    key:=expression       the expression's value, computed once and stored (@a.b.c imports
                          a.b.c): "x:=@random.uniform(0, 100)"
    path/to/file.conf     one such form per line (# comments), or another file's path
    'key <- file.conf'    that file's keys under key.

A file's values are defaults: a key given after it wins.""",
    "example": """\
    jobman cmdline jobman.examples.def_addition.addition_example first=2 second=5
    jobman sqlschedule 'sqlite:///add.db/test_add_' jobman.examples.def_addition.addition_example \\
        'first={{0,2,4}}' 'second={{1,3}}'
    jobman sql -n0 'sqlite:///add.db/test_add_' .
    jobman sqlview 'sqlite:///add.db/test_add_' test_add_view""",
}


@click.command("help")
@click.argument("command", nargs=-1, metavar="[COMMAND | TOPIC]")
@click.pass_context
def help_command(ctx: click.Context, command: tuple[str, ...]) -> None:
    """Show help for jobman or for one of its commands, as ``COMMAND --help`` does, or a topic:
    experiment (how to write one), parameters (how to give them), example.

    \b
    Example:
      jobman help sqlschedule
      jobman help parameters
    """
    parent = ctx.parent
    assert parent is not None and isinstance(parent.command, click.Group)  # a command of the jobman group
    group = parent.command
    if not command:
        click.echo(group.get_help(parent))
        click.echo("\nTopics (jobman help TOPIC): " + ", ".join(TOPICS))
        return
    name = command[0]
    if name in TOPICS:
        click.echo(TOPICS[name])
        return
    cmd = group.get_command(parent, name)
    if cmd is None:
        raise UsageError(f"no command or topic named {name!r}; 'jobman help' lists them")
    with click.Context(cmd, info_name=name, parent=ctx.parent) as sub:
        click.echo(cmd.get_help(sub))


COMMANDS = [sqlview, help_command]

"""``jobman db``: the schema (alembic migrations) and the experiments a database holds."""

from __future__ import annotations

import click

from jobman.jobdb import engine as db_engine

from .common import Database, print_json, with_database


@click.group("db")
def db_group() -> None:
    """The database itself: upgrade its schema, list its experiments.

    \b
    Example:
      jobman db upgrade --db postgresql://me@dbhost/lab
    """


@db_group.command("upgrade")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
def upgrade(database: Database) -> None:
    """Bring the database schema to this jobman's version (alembic).

    \b
    Example:
      jobman db upgrade 'sqlite:///sweeps.db'
    A fresh database is upgraded by itself the first time a sweep is scheduled.
    """
    target = database.target
    engine = db_engine.make_engine(target)
    with db_engine.translated_errors(target):
        before, after = db_engine.upgrade(engine)
    if before == after:
        click.echo(f"{target.display} is already at schema revision {after}")
    else:
        click.echo(f"{target.display}: schema upgraded from {before or 'nothing'} to {after}")


@db_group.command("experiments")
@click.argument("url", required=False, metavar="[DB]")
@with_database()
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def experiments(database: Database, fmt: str) -> None:
    """List the experiments (jobman's tables) in a database.

    \b
    Example:
      jobman db experiments 'sqlite:///sweeps.db'
    """
    store = database.open()
    names = store.experiments()
    if fmt == "json":
        print_json(names)
    else:
        for name in names:
            click.echo(name)


COMMANDS = [db_group]

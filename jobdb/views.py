"""SQL views of an experiment, the original jobman's ``sqlview``: one row per job, one column per
parameter and result key, so plain SQL can filter and sort a sweep.

Columns are named as jobman named them: underscores dropped, dots made underscores
(``n_hidden`` → ``nhidden``, ``rbm.nhid`` → ``rbm_nhid``), lower case, next to ``id``,
``jobman_status`` (the numeric code), ``jobman_sql_priority``, ``jobman_hash``,
``jobman_experiment``, ``jobman_sql_hostname`` and ``jobman_sql_hostworkdir``. The keys are
those present when the view is made: recreate it to pick up new result keys.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .errors import UsageError
from .schema import metadata
from .status import CODES
from .txn import find_experiment

_VIEW_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# Keys a view can name safely inside a JSON path literal.
_SAFE_KEY = re.compile(r"^[A-Za-z0-9_.\- ]{1,200}$")

FIXED_COLUMNS = (
    "id",
    "jobman_status",
    "jobman_sql_priority",
    "jobman_hash",
    "jobman_experiment",
    "jobman_sql_hostname",
    "jobman_sql_hostworkdir",
)


@dataclass(frozen=True)
class ViewColumn:
    """One key's column: its name in the view, its stored key, where it is found and its JSON kinds."""

    name: str
    key: str
    in_params: bool
    in_results: bool
    kinds: frozenset[str]  # 'number', 'string', 'boolean', 'other'


def column_name(key: str) -> str:
    """jobman's rule: underscores dropped, dots made underscores, lower case."""
    return key.replace("_", "").replace(".", "_").lower()


def check_view_name(name: str) -> str:
    if not _VIEW_NAME.match(name or ""):
        raise UsageError(f"view name {name!r} must be a plain SQL name: a letter or '_', then letters, digits, '_'")
    if name.lower() in {t.lower() for t in metadata.tables} or name.lower().startswith("jobman_alembic"):
        raise UsageError(f"{name!r} is one of jobman's own tables; choose another view name")
    return name


def _kinds_sql(conn: Connection, column: str, experiment_id: int) -> sa.TextClause:
    if conn.dialect.name == "sqlite":
        return sa.text(
            f"SELECT DISTINCT e.key, e.type FROM job, json_each(job.{column}) AS e "
            f"WHERE job.experiment_id = :exp AND job.{column} IS NOT NULL"
        )
    return sa.text(
        f"SELECT DISTINCT e.key, jsonb_typeof(e.value) FROM job, jsonb_each(job.{column}::jsonb) AS e "
        f"WHERE job.experiment_id = :exp AND job.{column} IS NOT NULL"
    )


_KIND = {
    "integer": "number",
    "real": "number",
    "number": "number",
    "text": "string",
    "string": "string",
    "true": "boolean",
    "false": "boolean",
    "boolean": "boolean",
    "null": "null",
}


def view_columns(conn: Connection, experiment_id: int) -> list[ViewColumn]:
    """The key columns of an experiment's view, in key order, each name unique."""
    found: dict[str, dict[str, set[str]]] = {}
    for column in ("params", "results"):
        for key, kind in conn.execute(_kinds_sql(conn, column, experiment_id), {"exp": experiment_id}):
            found.setdefault(key, {"params": set(), "results": set(), "kinds": set()})
            found[key][column].add(kind)
            found[key]["kinds"].add(_KIND.get(kind, "other"))
    taken = set(FIXED_COLUMNS)
    out = []
    for key in sorted(found):
        if not _SAFE_KEY.match(key):
            continue  # a name SQL cannot spell safely; `jobman show` still has it
        base = column_name(key) or "key"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        info = found[key]
        out.append(
            ViewColumn(name, key, bool(info["params"]), bool(info["results"]), frozenset(info["kinds"] - {"null"}))
        )
    return out


def _value_sql(dialect: str, source: str, col: ViewColumn) -> str:
    if dialect == "sqlite":
        return f"json_extract(job.{source}, '$.\"{col.key}\"')"
    ref = f"(job.{source}::jsonb)"
    if col.kinds == {"number"}:
        return f"CASE WHEN jsonb_typeof({ref} -> '{col.key}') = 'number' THEN ({ref} ->> '{col.key}')::numeric END"
    if col.kinds == {"boolean"}:
        return f"CASE WHEN jsonb_typeof({ref} -> '{col.key}') = 'boolean' THEN ({ref} ->> '{col.key}')::boolean END"
    return f"{ref} ->> '{col.key}'"


def view_sql(dialect: str, name: str, experiment_id: int, columns: list[ViewColumn]) -> str:
    """The CREATE VIEW statement of an experiment's view."""
    status = " ".join(f"WHEN '{s.value}' THEN {code}" for s, code in CODES.items())
    parts = [
        "job.id AS id",
        f"CASE job.status {status} END AS jobman_status",
        "job.priority AS jobman_sql_priority",
        "job.params_hash AS jobman_hash",
        # the original named a function module.function
        "CASE job.kind WHEN 'fn' THEN replace(job.target, ':', '.') ELSE job.target END AS jobman_experiment",
        "job.host AS jobman_sql_hostname",
        "job.workdir AS jobman_sql_hostworkdir",
    ]
    for col in columns:
        sources = [
            _value_sql(dialect, s, col)
            for s, present in (("results", col.in_results), ("params", col.in_params))
            if present
        ]
        value = sources[0] if len(sources) == 1 else f"COALESCE({', '.join(sources)})"
        parts.append(f'{value} AS "{col.name}"')
    return (
        f"CREATE VIEW {name} AS SELECT "
        + ", ".join(parts)
        + f" FROM job WHERE job.experiment_id = {int(experiment_id)}"
    )


def _is_table(conn: Connection, name: str) -> bool:
    return name.lower() in {t.lower() for t in sa.inspect(conn).get_table_names()}


def _has_view(conn: Connection, name: str) -> bool:
    return name.lower() in {v.lower() for v in sa.inspect(conn).get_view_names()}


def create_view(engine: Engine, experiment: str, name: str) -> list[ViewColumn]:
    """(Re)create view ``name`` of one experiment, in one transaction; returns its key columns."""
    check_view_name(name)
    with engine.begin() as conn:
        experiment_id = find_experiment(conn, experiment, "this database")
        if _is_table(conn, name):
            raise UsageError(f"{name!r} is a table of this database, not a view; choose another view name")
        columns = view_columns(conn, experiment_id)
        conn.exec_driver_sql(f"DROP VIEW IF EXISTS {name}")
        conn.exec_driver_sql(view_sql(conn.dialect.name, name, experiment_id, columns))
    return columns


def drop_view(engine: Engine, name: str) -> None:
    """Drop view ``name``; a name that is not a view is refused."""
    check_view_name(name)
    with engine.begin() as conn:
        if not _has_view(conn, name):
            raise UsageError(f"no view named {name!r} in this database")
        conn.exec_driver_sql(f"DROP VIEW {name}")

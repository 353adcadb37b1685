"""The report's SQL, all of it: configurations grouped, counted and averaged by the database, streamed
best first.

:mod:`.inpython` groups a list of records in Python; the statements here do the same for a store's
experiment inside the database, so that a report of a million jobs never holds them (the steps
between them are :mod:`.indatabase`'s). One read transaction: the parameter and result keys are read
from a job or two found by index, the jobs are grouped into a temporary table of configurations
(count, sum, sum of squares, min and max of each numeric result) while the grouping checks those keys
on every job (when the check fails, the keys of every job are read with ``json_each`` /
``jsonb_each`` and the jobs grouped again), and the configurations are read back ranked, a section
(outer fold) at a time. Python keeps the rules: it computes each mean and std from those sums, and
puts configurations whose means agree to 12 significant digits in the order the in-Python engine
gives. What SQL cannot say the same way (a ``--where`` on a list, a key JSON paths cannot name) is
left to the Python path: :func:`sql_able` says which.

SQLite holds parameters and results as JSON text, PostgreSQL as jsonb: the expressions below
differ by dialect, the plan is the same.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..canonical import found_by_json_path
from ..selection import frozen, sort_key
from ..status import Status
from ..txn import experiment_id

if TYPE_CHECKING:
    from ..selection import Condition
    from ..store import Store

TEMP = "jobman_report"
_NUMERIC = {"sqlite": ("integer", "real"), "postgresql": ("number",)}  # JSON types of a number

# The status a job's results count from, spelled in SQL from the one constant that names it.
DONE_SQL = f"'{Status.DONE.value}'"


@contextlib.contextmanager
def reading(store: Store) -> Iterator[tuple[Connection, int]]:
    """One read transaction on the store's experiment: (connection, experiment id). SQLite's connection is
    set for the report's sorts meanwhile, and its temporary table let go after."""
    with store.transactions.connected() as conn, _sorting(conn):
        try:
            with conn.begin():
                yield conn, experiment_id(conn, store.target)
        finally:
            if conn.dialect.name == "sqlite":
                _let_go(conn)


def count_jobs(conn: Connection, where: str, binds: dict[str, Any]) -> int:
    """How many jobs ``where`` selects."""
    return conn.execute(sa.text(f"SELECT count(*) FROM job WHERE {where}"), binds).scalar() or 0


# A temporary table of more configurations than this is let go with its connection rather than dropped:
# SQLite frees a dropped table's pages one by one (a million: 0.18 s), a closed connection's at once
# (0.04 s). The pool opens another connection when one is next wanted.
CLOSE_ABOVE = 100_000


def _let_go(conn: Connection) -> None:
    """SQLite: the report's temporary table dropped, or, when large, closed with its connection."""
    raw = conn.connection.dbapi_connection  # after the transaction: each statement its own
    assert raw is not None  # None only once the connection is closed
    found = f"SELECT count(*) FROM sqlite_temp_master WHERE type = 'table' AND name = '{TEMP}'"
    if not raw.execute(found).fetchone()[0]:
        return
    if (raw.execute(f"SELECT max(rowid) FROM temp.{TEMP}").fetchone()[0] or 0) > CLOSE_ABOVE:
        conn.invalidate()
    else:
        raw.execute(f"DROP TABLE temp.{TEMP}")


# SQLite's sorts of a report (the grouping, the ranking) with a page cache this small (KiB) and worker
# threads: a sort larger than the cache is cut into runs sorted by the threads while the next is read,
# then merged. A million configurations: the report 10.8 s -> 9.3 s, its peak 212 -> 98 MiB (a
# sort held in the 64 MiB cache of the store's connections is sorted by one thread, and held twice).
SORT_CACHE_KIB = 4 * 1024


@contextlib.contextmanager
def _sorting(conn: Connection) -> Iterator[None]:
    """SQLite's connection set for the report's sorts while it is read, then as it was."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw = conn.connection.dbapi_connection
    assert raw is not None  # None only once the connection is closed
    cache = raw.execute("PRAGMA cache_size").fetchone()[0]
    raw.execute(f"PRAGMA cache_size = -{SORT_CACHE_KIB}")
    raw.execute(f"PRAGMA threads = {min(4, os.cpu_count() or 1)}")
    try:
        yield
    finally:
        if not conn.invalidated:
            raw.execute("PRAGMA threads = 0")
            raw.execute(f"PRAGMA cache_size = {int(cache)}")


def sql_able(conditions: Sequence[Condition], keys: Iterable[str], dialect: str) -> bool:
    """Whether every filter and key can be said in SQL the way the Python path tests it."""
    plain = (int, float, str, bool, type(None))
    return all(isinstance(c.value, plain) for c in conditions) and all(found_by_json_path(k, dialect) for k in keys)


class Sql:
    """The JSON expressions of one dialect over the ``job`` table, with their bound values."""

    def __init__(self, dialect: str) -> None:
        self.pg = dialect == "postgresql"
        self.numeric = _NUMERIC["postgresql" if self.pg else "sqlite"]
        self.binds: dict[str, Any] = {}

    def experiment_jobs(self, exp: int, phase: int | None) -> str:
        """The jobs of experiment ``exp`` (of one phase)."""
        where = f"job.experiment_id = {self.bind(exp)}"
        return where if phase is None else f"{where} AND job.phase = {self.bind(phase)}"

    def in_scopes(self, scopes: Sequence[tuple[Any, Any]]) -> str:
        """The jobs of these (phase, target) scopes."""
        return (
            "(" + " OR ".join(f"(job.phase = {self.bind(p)} AND job.target = {self.bind(t)})" for p, t in scopes) + ")"
        )

    def bind(self, value: Any) -> str:
        name = f"b{len(self.binds)}"
        self.binds[name] = value
        return ":" + name

    def path(self, key: str) -> str:
        return self.bind(key if self.pg else f'$."{key}"')

    def type_of(self, column: str, key: str) -> str:
        """The JSON type of ``column``'s ``key`` (NULL when absent)."""
        p = self.path(key)
        return f"jsonb_typeof({column} -> {p})" if self.pg else f"json_type({column}, {p})"

    def number(self, column: str, key: str, guard: bool = True) -> str:
        """``column``'s ``key`` as a double when it is a JSON number, else NULL."""
        p = self.path(key)
        if self.pg:
            return f"CASE WHEN jsonb_typeof({column} -> {p}) = 'number' THEN ({column} ->> {p})::float8 END"
        value = f"CAST(json_extract({column}, {p}) AS REAL)"
        if not guard:
            return value
        return f"CASE WHEN json_type({column}, {p}) IN ('integer', 'real') THEN {value} END"

    def text(self, column: str, key: str) -> str:
        p = self.path(key)
        if self.pg:
            return f"CASE WHEN jsonb_typeof({column} -> {p}) = 'string' THEN ({column} ->> {p}) COLLATE \"C\" END"
        return f"CASE WHEN json_type({column}, {p}) = 'text' THEN json_extract({column}, {p}) END"

    def condition(self, cond: Condition) -> str:
        """A ``--where`` condition as SQL: true exactly when ``cond.test(params)`` is."""
        key, op, value = cond.key, cond.op, cond.value
        kind = self.type_of("job.params", key)
        if op in ("==", "!="):
            if value is None:
                same = f"{kind} = 'null'"
            elif isinstance(value, bool):
                same = f"{kind} = '{'boolean' if self.pg else str(value).lower()}'"
                if self.pg:
                    same += f" AND job.params -> {self.path(key)} = '{str(value).lower()}'::jsonb"
            elif isinstance(value, (int, float)):
                same = f"{self.number('job.params', key)} = {self.bind(float(value))}"
            else:
                same = f"{self.text('job.params', key)} = {self.bind(value)}"
            same = f"coalesce({same}, false)" if self.pg else f"coalesce({same}, 0)"
            return same if op == "==" else f"({kind} IS NOT NULL AND NOT {same})"
        sql_op = op
        if isinstance(value, bool) or value is None:
            return "1 = 0"
        if isinstance(value, (int, float)):
            return f"{self.number('job.params', key)} {sql_op} {self.bind(float(value))}"
        return f"{self.text('job.params', key)} {sql_op} {self.bind(value)}"

    def without(self, keys: Sequence[str]) -> str:
        """The parameters without the group keys: equal for the jobs of one configuration."""
        if not keys:
            return "job.params"
        if self.pg:
            return f"job.params - CAST({self.bind(list(keys))} AS text[])"
        return "json_remove(job.params, " + ", ".join(self.path(k) for k in keys) + ")"


@dataclass
class KeyStats:
    """A parameter over the jobs: how many have it, and whether they all hold one value."""

    jobs: int
    one_value: bool


def param_keys(conn: Connection, where: str, binds: dict[str, Any]) -> dict[str, KeyStats]:
    if conn.dialect.name == "postgresql":
        sql = (
            "SELECT e.key, count(*), min(jsonb_typeof(e.value)) = max(jsonb_typeof(e.value)) "
            "AND min(e.value::text) = max(e.value::text) FROM job, jsonb_each(job.params) AS e "
            f"WHERE {where} GROUP BY e.key"
        )
    else:
        sql = (
            "SELECT e.key, count(*), min(e.type) = max(e.type) AND min(e.value) IS max(e.value) "
            f"FROM job, json_each(job.params) AS e WHERE {where} GROUP BY e.key"
        )
    return {k: KeyStats(n, bool(same)) for k, n, same in conn.execute(sa.text(sql), binds)}


def sampled_keys(conn: Connection, where: str, binds: dict[str, Any]) -> dict[str, KeyStats]:
    """The parameters of one job of the selection (found by index): what the grouping starts from,
    checked afterwards on every configuration by :func:`keys_hold`, far cheaper than
    :func:`param_keys` reading every pair."""
    cast = "::text" if conn.dialect.name == "postgresql" else ""
    found = conn.execute(sa.text(f"SELECT job.params{cast} FROM job WHERE {where} LIMIT 1"), binds).scalar()
    return {k: KeyStats(-1, False) for k in (json.loads(found) if found else {})}


def _first_and_last(conn: Connection, column: str, where: str, binds: dict[str, Any]) -> list[Any]:
    """``column`` of the first and of the last job of ``where`` (None without one). Their ids are found
    by min() and max(), which read an index of the experiment's jobs alone: with ORDER BY id LIMIT 1,
    PostgreSQL's planner may walk the primary key from its far end, through every job of the
    experiments after this one (a million: 0.3 s)."""
    return [
        conn.execute(
            sa.text(f"SELECT {column} FROM job WHERE job.id = (SELECT {way}(job.id) FROM job WHERE {where})"), binds
        ).scalar()
        for way in ("min", "max")
    ]


def constant_candidates(
    conn: Connection, sql: Sql, where: str, groups: Sequence[str]
) -> tuple[list[str], dict[str, Any]]:
    """The parameters of the configurations of the first and the last job of the selection (found by
    index), and those that hold one value in both: the candidates for constant, with their values,
    checked on every configuration by :func:`survey`."""
    texts = _first_and_last(conn, sql.without(groups) + ("::text" if sql.pg else ""), where, sql.binds)
    if texts[0] is None:
        return [], {}
    first, last = json.loads(texts[0]), json.loads(texts[1])
    same = {k: first[k] for k in sorted(first) if k in last and _json_equal(first[k], last[k])}
    return list(dict.fromkeys([*first, *last])), same


def _json_equal(a: Any, b: Any) -> bool:
    return (
        type(a) is type(b)
        and frozen(a) == frozen(b)
        or (
            not isinstance(a, bool)
            and not isinstance(b, bool)
            and isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and a == b
        )
    )


def keys_differ(sql: Sql, keys: Sequence[str], constant: dict[str, Any]) -> str:
    """SQL true for a configuration with a parameter but ``keys``, or without ``constant``'s values."""
    rest = [k for k in keys if k not in constant]
    want = json.dumps(dict(sorted(constant.items())), separators=(",", ":"))
    if sql.pg:
        return f"(cfg - CAST({sql.bind(rest)} AS text[])) IS DISTINCT FROM CAST({sql.bind(want)} AS jsonb)"
    rest_of = ("json_remove(cfg, " + ", ".join(sql.path(k) for k in rest) + ")") if rest else "json(cfg)"
    return f"{rest_of} IS NOT {sql.bind(want)}"


def result_keys(conn: Connection, where: str, binds: dict[str, Any]) -> list[tuple[int, str, str, str]]:
    """(phase, target, key, JSON type) of the results of DONE jobs."""
    postgres = conn.dialect.name == "postgresql"
    each, kind = ("jsonb_each", "jsonb_typeof(e.value)") if postgres else ("json_each", "e.type")
    sql = (
        f"SELECT job.phase, job.target, e.key, {kind} FROM job, {each}(job.results) AS e "
        f"WHERE {where} AND job.status = {DONE_SQL} GROUP BY 1, 2, 3, 4"
    )
    return [tuple(r) for r in conn.execute(sa.text(sql), binds)]


def sampled_results(conn: Connection, where: str, binds: dict[str, Any]) -> dict[str, bool] | None:
    """The result keys of the first and the last DONE job of the selection (found by index), each with
    whether one of them holds a number there: what the grouping starts from in place of
    :func:`result_keys` reading every pair, checked on every job by :func:`unseen_results` while
    grouping. None when no DONE job has results that are an object."""
    cast = "::text" if conn.dialect.name == "postgresql" else ""
    found: dict[str, bool] = {}
    for text in _first_and_last(conn, f"job.results{cast}", f"{where} AND job.status = {DONE_SQL}", binds):
        results = json.loads(text) if text else None
        if not isinstance(results, dict):
            return None
        for key, value in results.items():
            number = type(value) in (int, float) and math.isfinite(value)
            found[key] = found.get(key, False) or number
    return found


def unseen_results(sql: Sql, sample: dict[str, bool]) -> str:
    """SQL true for a job whose results have a key ``sample`` lacks, or a number under a key the
    sample held none in (a result the report would then list): the grouping read from the sample
    would then not be the report's."""
    if sql.pg:
        rest = (
            f"CASE WHEN jsonb_typeof(job.results) = 'object' THEN "
            f"(job.results - CAST({sql.bind(list(sample))} AS text[])) <> '{{}}'::jsonb ELSE true END"
        )
    else:
        rest = "json_remove(job.results" + "".join(", " + sql.path(k) for k in sample) + ") <> '{}'"
    tests = [rest] + [
        f"{sql.type_of('job.results', k)} IN ({', '.join(repr(t) for t in sql.numeric)})"
        for k, number in sample.items()
        if not number and not k.startswith("_")
    ]
    return "job.results IS NOT NULL AND (" + " OR ".join(tests) + ")"


def scope_counts(conn: Connection, where: str, binds: dict[str, Any]) -> list[tuple[int, str, int, int]]:
    """(phase, target, jobs, DONE jobs) of the selection."""
    sql = (
        f"SELECT job.phase, job.target, count(*), sum(CASE WHEN job.status = {DONE_SQL} THEN 1 ELSE 0 END) "
        f"FROM job WHERE {where} GROUP BY job.phase, job.target"
    )
    return [tuple(r) for r in conn.execute(sa.text(sql), binds)]


def group(
    conn: Connection,
    sql: Sql,
    where: str,
    groups: Sequence[str],
    columns: Sequence[str],
    guarded: set[str],
    unseen: str | None = None,
    *,
    parallel: bool = False,
    scope: str | None = None,
) -> None:
    """The configurations of the selection into the temporary table: per (phase, target, parameters but
    the group keys), the jobs' count, first id, ids, the statuses that are not DONE, and for each
    result its count, sum, sum of squares, min and max over the DONE jobs that report it as a number.
    With ``unseen`` (SQL), whether it held for one of a configuration's DONE jobs (column ``unseen``).
    PostgreSQL may share the reading of the jobs among parallel workers, each configuration's jobs summed
    in the order of their ids all the same. With ``parallel``, SQLite groups the two halves of the jobs
    side by side (:func:`_group_in_halves`; ``scope``, a condition that holds for every job of ``where``,
    is what counts them cheaply). See :func:`jobman.jobdb.report.open_report`."""
    values = []
    for i, name in enumerate(columns):
        number = sql.number("job.results", name, guard=sql.pg or name in guarded)
        values.append(f"CASE WHEN job.status = {DONE_SQL} THEN {number} END AS v{i}")
    if unseen is not None:
        values.append(f"CASE WHEN job.status = {DONE_SQL} AND ({unseen}) THEN 1 ELSE 0 END AS u")
    stats = [
        f"count(v{i}) AS n{i}, sum(v{i}) AS s{i}, sum(v{i} * v{i}) AS q{i}, min(v{i}) AS lo{i}, max(v{i}) AS hi{i}"
        for i in range(len(columns))
    ]
    ids = "string_agg(id::text, ',')" if sql.pg else "group_concat(id)"
    metric_ids = (
        "string_agg(CASE WHEN v0 IS NOT NULL THEN id::text END, ',')"
        if sql.pg
        else "group_concat(CASE WHEN v0 IS NOT NULL THEN id END)"
    )
    others = (
        f"string_agg(CASE WHEN status <> {DONE_SQL} THEN status END, ',')"
        if sql.pg
        else f"group_concat(CASE WHEN status <> {DONE_SQL} THEN status END)"
    )

    def body(where: str) -> str:
        cfg = sql.without(groups)
        if sql.pg:
            # Sorted to be grouped, jobs are compared by what tells configurations apart first: a hash of
            # the configuration (equal for equal jsonb; comparing the jsonb values themselves took most of
            # the grouping's time), and last by id, so that each configuration's sums add its jobs in one
            # order whoever reads them: parallel workers may read and sort the jobs (their sorted runs are
            # merged), and the report is the same bit for bit.
            inner = (
                f"SELECT job.id, job.phase, job.target, job.status, {cfg} AS cfg, "
                f"jsonb_hash_extended({cfg}, 0) AS h"
                + "".join(", " + v for v in values)
                + f" FROM job WHERE {where} ORDER BY h, job.phase, job.target, cfg, job.id"
            )
            keys = "h, phase, target, cfg"
        else:
            # LIMIT keeps the subquery from being folded in (as the ORDER BY does on PostgreSQL): each
            # value is then read out of the JSON once, not once per aggregate. Grouped by the text of the
            # configuration before phase and target.
            inner = (
                f"SELECT job.id, job.phase, job.target, job.status, {cfg} AS cfg"
                + "".join(", " + v for v in values)
                + f" FROM job WHERE {where} LIMIT -1"
            )
            keys = "cfg, phase, target"
        return (
            f"SELECT phase, target, cfg, count(*) AS jobs, min(id) AS first_id, {others} AS others, {ids} AS ids, "
            f"{metric_ids} AS metric_ids"
            + "".join(", " + s for s in stats)
            + (", max(u) AS unseen" if unseen is not None else "")
            + f" FROM ({inner}) AS j GROUP BY {keys}"
        )

    if sql.pg:
        # Grouping a million jobs hashes them in memory rather than in a score of batches on disk.
        conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")
        # The JSON of every job is read by parallel workers as well as this backend when the planner
        # finds that cheaper: at the default costs it never does for 100,000 jobs (408 ms in one backend
        # against 250 ms in three, measured on two cores). Later statements of the report read the
        # temporary table, which is never scanned in parallel.
        conn.exec_driver_sql("SET LOCAL parallel_setup_cost = 100")
        conn.exec_driver_sql("SET LOCAL parallel_tuple_cost = 0.01")
        conn.execute(sa.text(f"CREATE TEMP TABLE {TEMP} ON COMMIT DROP AS {body(where)}"), sql.binds)
        return
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS temp.{TEMP}")
    middle = _middle_id(conn, scope or where, sql.binds) if parallel else None
    if middle is None:
        conn.execute(sa.text(f"CREATE TEMP TABLE {TEMP} AS {body(where)}"), sql.binds)
    else:
        at = sql.bind(middle)
        _group_in_halves(conn, body(f"{where} AND job.id < {at}"), body(f"{where} AND job.id >= {at}"), sql.binds)


# SQLite groups the jobs of a selection in two halves side by side (see _group_in_halves) when this
# many ids lie between its first and its last: fewer are grouped too fast to gain, and of more, the
# second half's configurations would be held in memory.
HALVES_FROM, HALVES_UP_TO = 10_000, 200_000


def _middle_id(conn: Connection, scope: str, binds: dict[str, Any]) -> int | None:
    """The job id that parts the jobs of ``scope`` in two halves, when they are worth grouping apart.
    Their first and last ids are found by index; how many lie between bounds how many there are."""
    lo, hi = conn.execute(
        sa.text(f"SELECT (SELECT min(job.id) FROM job WHERE {scope}), (SELECT max(job.id) FROM job WHERE {scope})"),
        binds,
    ).one()
    if lo is None or not HALVES_FROM <= hi - lo + 1 <= HALVES_UP_TO:
        return None
    return (lo + hi + 1) // 2


def _group_in_halves(conn: Connection, lower: str, upper: str, binds: dict[str, Any]) -> None:
    """The grouping of SQLite on two cores: this connection groups the lower half of the jobs into the
    temporary table while a thread of its own, on another connection, groups the upper half and
    reads its configurations; they are then added to the table, and a configuration with jobs in
    both halves is made one row (its counts and sums added, its ids joined). About two thirds of
    the time of one grouping (100,000 jobs: 210 against 320 ms) where SQLite counts no memory
    (:mod:`jobman.jobdb.sqlite_memory`); where it does, its mutex lets the two run no faster than
    one, and the result is the same.

    The other connection reads the database as it is a moment later than this one's transaction:
    a job that changed meanwhile is counted once, in the half its id falls in, as it was then. Its
    sums are added in another order than one grouping's, so a mean can differ in its last bit."""
    found: list[Any] = []

    def read_upper() -> None:
        try:
            with conn.engine.connect().execution_options(jobman_readonly=True) as other, other.begin():
                result = other.execute(sa.text(upper), binds)
                found.extend([list(result.keys()), [tuple(r) for r in result]])
        except BaseException as exc:  # noqa: BLE001 - raised again by the connection that waits for it
            found[:] = [exc]

    helper = threading.Thread(target=read_upper, name="jobman-report-half", daemon=True)
    helper.start()
    try:
        conn.execute(sa.text(f"CREATE TEMP TABLE {TEMP} AS {lower}"), binds)
    finally:
        helper.join()
    if len(found) == 1:
        raise found[0]
    names, rows = found
    ours = {
        (phase, target, cfg): rowid
        for rowid, phase, target, cfg in conn.exec_driver_sql(f"SELECT rowid, phase, target, cfg FROM temp.{TEMP}")
    }
    both = {ours[r[:3]]: r for r in rows if r[:3] in ours}
    fresh = [r for r in rows if r[:3] not in ours]
    marks = ", ".join("?" * len(names))
    if fresh:
        conn.exec_driver_sql(f"INSERT INTO temp.{TEMP} VALUES ({marks})", fresh)
    if both:
        merged = []
        for rowid, *mine in conn.exec_driver_sql(
            f"SELECT rowid, * FROM temp.{TEMP} WHERE rowid IN ({', '.join(map(str, both))})"
        ):
            merged.append((*(_joined(n, a, b) for n, a, b in zip(names, mine, both[rowid])), rowid))
        assignments = ", ".join(f"{n} = ?" for n in names)
        conn.exec_driver_sql(f"UPDATE temp.{TEMP} SET {assignments} WHERE rowid = ?", merged)


def _joined(name: str, a: Any, b: Any) -> Any:
    """One column of a configuration grouped in two halves, from the column of each half."""
    if a is None or b is None:
        return b if a is None else a
    kind = name.rstrip("0123456789")  # each result's columns end in its number
    if kind in ("phase", "target", "cfg"):
        return a
    if kind in ("others", "ids", "metric_ids"):
        return f"{a},{b}"
    if kind in ("first_id", "lo"):
        return min(a, b)
    if kind in ("unseen", "hi"):
        return max(a, b)
    return a + b  # jobs, and each result's n, s (sum) and q (sum of squares)


def outer_expr(sql: Sql, outer: str | None) -> str:
    if outer is None:
        return "NULL"
    return f"(cfg -> {sql.path(outer)})" if sql.pg else f"json_extract(cfg, {sql.path(outer)})"


@dataclass
class Section:
    """One outer fold's configurations (all of them when not nested)."""

    value: Any  # the outer value, None when not nested
    match: str  # SQL: the section's configurations
    configurations: int
    with_metric: int
    expected: dict[tuple[int, str], int]  # (phase, target) -> jobs of its largest configuration
    # Configurations with the metric that might be incomplete (class 1 of :func:`ranked`): 0 when every
    # scope's configurations have as many jobs as each other and all of them are DONE with the metric.
    maybe_incomplete: int = 0

    def classes(self, allow_incomplete: bool) -> list[int]:
        """The classes of :func:`ranked` the section may hold: 0 eligible, 1 not, 2 without the metric."""
        found = [0] if self.with_metric else []
        if self.maybe_incomplete and not allow_incomplete:
            found.append(1)
        if self.configurations > self.with_metric:
            found.append(2)
        return found


@dataclass
class Survey:
    """What one reading of the grouped configurations says of them all (:func:`survey`)."""

    sections: list[Section]  # in the order of the Python path
    configurations: int
    jobs: int
    constant_results: dict[str, float]  # results with one value in every run of every configuration
    # The (phase, target) scopes when every one of them has a configuration with the metric and no job
    # was marked by :func:`unseen_results`; None otherwise (or when not asked).
    scopes: set[tuple[Any, Any]] | None
    keys_hold: bool  # no configuration matched the ``differ`` test (true when none was given)


def survey(
    conn: Connection,
    sql: Sql,
    outer: str | None,
    columns: Sequence[str],
    *,
    unseen: bool = False,
    differ: str | None = None,
) -> Survey:
    """The outer folds with their counts, the totals, whether the results the grouping assumed hold
    (``unseen``: the table has that column) and whether no configuration is ``differ`` (SQL, from
    :func:`keys_differ`): one scan of the temporary table, grouped by outer value, phase and target."""
    expr = outer_expr(sql, outer)
    if outer is None:
        shown = ["NULL"]
    elif sql.pg:
        shown = [f"({expr})::text"]
    else:
        shown = [f"json_type(cfg, {sql.path(outer)})", expr]
    parts = [
        "count(*)",
        "sum(CASE WHEN n0 > 0 THEN 1 ELSE 0 END)",
        "max(jobs)",
        "min(jobs)",
        "sum(CASE WHEN n0 > 0 AND n0 = jobs THEN 1 ELSE 0 END)",
        "sum(jobs)",
        "max(n0)",
        "max(unseen)" if unseen else "0",
        f"max(CASE WHEN {differ} THEN 1 ELSE 0 END)" if differ else "0",
    ]
    for i in range(1, len(columns)):
        parts += [f"sum(CASE WHEN n{i} > 0 THEN 1 ELSE 0 END)", f"min(lo{i})", f"max(hi{i})"]
    keys = [*shown, "phase", "target"]
    grouped = f"GROUP BY {', '.join(str(i + 1) for i in range(len(keys)))}"
    if not sql.pg:
        # SQLite sorts every row to group them, even into one group; the groups alone it finds with a
        # table of the distinct ones (a million configurations: 0.1 s, where the sort took 0.4 s).
        # With one group, its keys are read as bare columns of an aggregate without GROUP BY.
        if len(conn.execute(sa.text(f"SELECT DISTINCT {', '.join(keys)} FROM {TEMP} LIMIT 2"), sql.binds).all()) == 1:
            grouped = ""
    rows = conn.execute(sa.text(f"SELECT {', '.join(keys)}, {', '.join(parts)} FROM {TEMP} {grouped}"), sql.binds).all()
    found: dict[tuple, Section] = {}
    with_metric_in: dict[tuple[Any, Any], bool] = {}  # per scope: whether a configuration has the metric
    configs = jobs = 0
    marked = differs = False
    # per result: configurations with it, min, max (the database's values, of the result's JSON type)
    results: list[list[Any]] = [[0, None, None] for _ in columns[1:]]
    for r in rows:
        key, (phase, target, count, with_metric, largest, smallest, all_done, total, most, unseen_here, odd) = (
            tuple(r[: len(shown)]),
            r[len(shown) : len(shown) + 11],
        )
        if key not in found:
            if outer is None:
                value, match = None, "1 = 1"
            elif sql.pg:
                value = None if key[0] is None else json.loads(key[0])
                match = f"({expr})::text IS NOT DISTINCT FROM {sql.bind(key[0])}"
            else:
                kind, raw = key
                value = (kind == "true") if kind in ("true", "false") else (None if kind in (None, "null") else raw)
                if kind in ("array", "object"):
                    value = json.loads(raw)
                match = f"json_type(cfg, {sql.path(outer)}) IS {sql.bind(kind)} AND {expr} IS {sql.bind(raw)}"
            found[key] = Section(value, match, 0, 0, {})
        section = found[key]
        section.configurations += count
        section.with_metric += with_metric or 0
        section.expected[(phase, target)] = largest
        # Of one size, a configuration DONE with the metric in all its jobs is complete.
        section.maybe_incomplete += (with_metric or 0) - ((all_done or 0) if smallest == largest else 0)
        configs += count
        jobs += int(total)
        with_metric_in[(phase, target)] = with_metric_in.get((phase, target), False) or bool(most)
        marked = marked or bool(unseen_here)
        differs = differs or bool(odd)
        rest = r[len(shown) + 11 :]  # per result after the metric: configurations with it, min, max
        for res, having, lo, hi in zip(results, rest[0::3], rest[1::3], rest[2::3]):
            res[0] += having or 0
            res[1] = min((v for v in (res[1], lo) if v is not None), default=None)
            res[2] = max((v for v in (res[2], hi) if v is not None), default=None)
    constant = {
        name: float(lo)
        for name, (having, lo, hi) in zip(columns[1:], results)
        if configs and having == configs and lo == hi
    }
    held = set(with_metric_in) if unseen and not marked and all(with_metric_in.values()) else None
    return Survey(sorted(found.values(), key=lambda s: sort_key(s.value)), configs, jobs, constant, held, not differs)


def ranked_query(
    sql: Sql,
    section: Section,
    columns: Sequence[str],
    mode: str,
    allow_incomplete: bool,
    limit: int | None = None,
    every: int = 0,
    ids: bool = True,
    cls: int | None = None,
) -> str:
    """The SQL of :func:`ranked`; with ``cls``, of the configurations of that class alone, the mean its
    first key (see :func:`ranked`). ``ids`` False: the rows as the json writes them, without the column
    of every job's id (NULL), nor the sum and sum of squares of a result with one value (NULL)."""
    if ids:
        stats = "".join(f", n{i}, s{i}, q{i}, lo{i}, hi{i}" for i in range(len(columns)))
    else:
        stats = "".join(
            f", n{i}, CASE WHEN lo{i} = hi{i} THEN NULL ELSE s{i} END AS s{i}, "
            f"CASE WHEN lo{i} = hi{i} THEN NULL ELSE q{i} END AS q{i}, lo{i}, hi{i}"
            for i in range(len(columns))
        )
    cfg = "cfg::text" if sql.pg else "cfg"
    allow = ("true" if sql.pg else "1") if allow_incomplete else ("false" if sql.pg else "0")
    scopes = list(section.expected.items())
    if len(scopes) == 1:
        expected = str(int(scopes[0][1]))
    else:  # a complete configuration has as many jobs as the largest of its phase and target
        expected = (
            "CASE"
            + "".join(f" WHEN phase = {sql.bind(p)} AND target = {sql.bind(t)} THEN {int(n)}" for (p, t), n in scopes)
            + " END"
        )
    rank = (
        f"CASE WHEN n0 = 0 THEN 2 WHEN {allow} OR (n0 = jobs AND jobs = {expected}) "
        "THEN 0 ELSE 1 END AS cls, CASE WHEN lo0 = hi0 THEN lo0 ELSE s0 / n0 END AS m, "
        "CASE WHEN n0 < 2 THEN NULL WHEN lo0 = hi0 THEN 0.0 ELSE (q0 - s0 * s0 / n0) / (n0 - 1) END AS var"
    )
    select = (
        f"SELECT phase, target, {cfg} AS cfg, jobs, first_id, others, {'ids' if ids else 'NULL'} AS ids, "
        f"metric_ids{stats}, {expected} AS expected, {rank} FROM {TEMP} WHERE {section.match}"
    )
    order = f"cls, m {'ASC' if mode == 'min' else 'DESC'}, n0 DESC, var ASC NULLS LAST, first_id"
    if cls is not None:
        level = (
            f"CASE WHEN n0 = 0 THEN 2 WHEN {allow} OR (n0 = jobs AND jobs = {expected}) THEN 0 ELSE 1 END = {int(cls)}"
        )
        select += f" AND {level}"
        order = "first_id" if cls == 2 else order.removeprefix("cls, ")
    if every:  # one configuration with the metric in ``every``, by the database's order
        # Numbered on what orders them alone; only the rows picked are read whole.
        picked = (
            f"SELECT first_id FROM (SELECT first_id, row_number() OVER (ORDER BY {order}) AS rn FROM "
            f"(SELECT first_id, n0, {rank} FROM {TEMP} WHERE {section.match} AND n0 > 0) AS r) AS s "
            f"WHERE (rn - 1) % {int(every)} = 0"
        )
        return f"{select} AND first_id IN ({picked}) ORDER BY {order}"
    if sql.pg and (limit is not None) == ids:  # the rows of a page, or every row the json writes
        # jsonb made text after the sort: for the rows kept only, or, when every row is read, as they
        # are sent, beside the client's work rather than before the first row (a million: 0.4 s sooner).
        # The outer ORDER BY is the inner one's, which PostgreSQL knows it need not sort again.
        top = select.replace("cfg::text AS cfg", "cfg", 1)
        cols = (
            "phase, target, cfg::text AS cfg, jobs, first_id, others, ids, metric_ids"
            + "".join(f", n{i}, s{i}, q{i}, lo{i}, hi{i}" for i in range(len(columns)))
            + ", expected, cls, m, var"
        )
        cut = f" LIMIT {int(limit)}" if limit is not None else ""
        return f"SELECT {cols} FROM ({top} ORDER BY {order}{cut}) AS top ORDER BY {order}"
    return f"{select} ORDER BY {order}" + ("" if limit is None else f" LIMIT {int(limit)}")


def ranked(
    conn: Connection,
    sql: Sql,
    section: Section,
    columns: Sequence[str],
    mode: str,
    allow_incomplete: bool,
    limit: int | None = None,
    every: int = 0,
) -> Iterator[tuple]:
    """A section's configurations in the database's order: eligible ones by mean (then more runs, the
    lower spread, the first scheduled), then ineligible ones, then those without the metric. The
    rows are (phase, target, cfg, jobs, first_id, others, ids, metric_ids, (n, s, q, lo, hi) per
    result, expected, class, mean, variance)."""
    if every:
        yield from _rows(conn, sql, ranked_query(sql, section, columns, mode, allow_incomplete, every=every))
        return
    # A class at a time: sorted on the mean first, the database compares two rows by a number it
    # holds beside each, rather than by a class they nearly all share (on PostgreSQL, a sort of a
    # million configurations in a third of the time). A LIMIT goes on into the next class.
    for cls in section.classes(allow_incomplete):
        count = 0
        for row in _rows(conn, sql, ranked_query(sql, section, columns, mode, allow_incomplete, limit, cls=cls)):
            count += 1
            yield row
        if limit is not None:
            limit -= count
            if limit <= 0:
                return


def _rows(conn: Connection, sql: Sql, query: str) -> Iterator[tuple]:
    # A server-side cursor on PostgreSQL (``yield_per`` alone would fetch every row first); SQLite's
    # cursor reads as it goes.
    result = conn.execution_options(stream_results=True, max_row_buffer=5000).execute(sa.text(query), sql.binds)
    try:
        for part in result.partitions(5000):
            yield from part
    finally:
        result.close()


BATCH = 5000  # rows fetched at a time by :func:`ranked_batches`


def ranked_batches(
    conn: Connection, sql: Sql, section: Section, columns: Sequence[str], mode: str, allow_incomplete: bool
) -> Iterator[list[tuple]]:
    """The rows of :func:`ranked` as the json writes them (``ranked_query(ids=False)``), in lists of plain
    tuples read straight from the driver's cursor: a million rows without a million result-row objects.
    On PostgreSQL the rows come in binary (no number written as text by the server and parsed back), in
    chunks the server sends while the last ones are being written (libpq's chunked mode): never all
    held, and the server's work beside the client's rather than between its requests."""
    raw = conn.connection.dbapi_connection
    assert raw is not None  # None only once the connection is closed
    for cls in section.classes(allow_incomplete):
        query = sa.text(ranked_query(sql, section, columns, mode, allow_incomplete, ids=False, cls=cls))
        compiled = query.compile(dialect=conn.dialect)
        params = compiled.construct_params(sql.binds)
        args = tuple(params[k] for k in compiled.positiontup) if compiled.positiontup else params
        chunked = sql.pg and _chunked_mode()
        cursor = (
            raw.cursor(binary=True)
            if chunked
            else raw.cursor(name=f"{TEMP}_rows", binary=True)
            if sql.pg
            else raw.cursor()
        )
        rows = None
        fetch: Callable[[], list[tuple]]
        try:
            if chunked:
                rows = cursor.stream(compiled.string, args, binary=True, size=BATCH)
                fetch = functools.partial(lambda it: list(itertools.islice(it, BATCH)), rows)
            else:  # SQLite, or an older libpq: a named (server-side) cursor
                cursor.execute(compiled.string, args)
                # both drivers' fetchmany returns a list; the DB-API's type says only a Sequence
                fetch = functools.partial(cursor.fetchmany, BATCH)  # type: ignore[assignment]
            while True:
                part = fetch()
                if not part:
                    break
                yield part
        finally:
            if rows is not None:
                rows.close()  # read to its end, or the query cancelled
            cursor.close()


def first_ranked(
    conn: Connection, sql: Sql, section: Section, columns: Sequence[str], mode: str, allow_incomplete: bool, count: int
) -> list[tuple]:
    """The first ``count`` configurations of a section in the Python path's order, read with a LIMIT
    (the database keeps the best rows instead of sorting them all); more are read while the last run
    of equal means might go on past it."""
    limit = count + 64
    while True:
        rows = list(ranked(conn, sql, section, columns, mode, allow_incomplete, limit))
        last = _run_key(rows[-1], len(columns)) if len(rows) == limit else None
        if last is None:
            return list(in_python_order(iter(rows), len(columns)))[:count]
        cut = next(i for i, r in enumerate(rows) if _run_key(r, len(columns)) == last)
        if cut >= count:
            return list(in_python_order(iter(rows[:cut]), len(columns)))[:count]
        limit *= 4


def _run_key(row: tuple, width: int) -> tuple | None:
    mean = row[8 + 5 * width + 2]
    return None if mean is None else (row[8 + 5 * width + 1], f"{mean:.12g}")


def in_python_order(rows: Iterator[tuple], width: int) -> Iterator[tuple]:
    """``rows`` (from :func:`ranked`) in the order of the in-Python engine's ranking: the database sorted the raw means;
    the configurations whose means agree to 12 significant digits are put in order here, by more runs,
    then the lower std, then the first scheduled. Only such a run of equal means is held at a time."""
    cls_at, mean_at = 8 + 5 * width + 1, 8 + 5 * width + 2
    run: list[tuple] = []
    last_cls: Any = None  # the database's values, as the row holds them
    last_mean: Any = None
    for row in rows:
        mean, cls = row[mean_at], row[cls_at]
        if mean is None:  # no metric: the database's order (first scheduled) is the rule's
            if run:
                yield from _sorted_run(run, width)
                run = []
            last_mean = None
            yield row
            continue
        if run and (cls != last_cls or not _same_12(last_mean, mean)):
            yield from _sorted_run(run, width)
            run = []
        if not run:
            last_cls, last_mean = cls, mean
        run.append(row)
    yield from _sorted_run(run, width)


def _chunked_mode() -> bool:
    """Whether the libpq psycopg uses reads a result in chunks of many rows (version 17 on)."""
    import psycopg

    return psycopg.pq.version() >= 170000


def in_python_order_batches(batches: Iterable[list[tuple]], width: int) -> Iterator[list[tuple]]:
    """:func:`in_python_order` over lists of rows, a list at a time. A list whose rows all have the
    metric in one class, with no two next to each other within 1e-11 of each other (relatively), is
    already in order and passes as it is; a run of equal means is put in order by
    :func:`in_python_order`. The last row of each list is held for the next: its run may go on there."""
    cls_at, mean_at = 8 + 5 * width + 1, 8 + 5 * width + 2
    held: list[tuple] = []
    for batch in batches:
        rows = held + batch if held else batch
        if _apart(rows, cls_at, mean_at):
            held = rows[-1:]
            if len(rows) > 1:
                yield rows[:-1]
            continue
        run_start = _last_run(rows, cls_at, mean_at)
        held = rows[run_start:]
        if run_start:
            yield list(in_python_order(iter(rows[:run_start]), width))
    if held:
        yield list(in_python_order(iter(held), width))


def _apart(rows: list[tuple], cls_at: int, mean_at: int) -> bool:
    """Whether ``rows`` all have a mean, all in one class, and no two next to each other agree to
    12 significant digits (nor could: they differ by more than 1e-11 of the larger)."""
    first, last = rows[0], rows[-1]
    if first[cls_at] != last[cls_at] or first[mean_at] is None or last[mean_at] is None:
        return False  # the classes are sorted, and means without the metric come last in a section
    import numpy as np  # here: only a streamed json needs it

    means = np.fromiter((r[mean_at] for r in rows), dtype=np.float64, count=len(rows))
    gaps = np.abs(np.diff(means))
    return bool((gaps > 1e-11 * np.maximum(np.abs(means[:-1]), np.abs(means[1:]))).all())


def _last_run(rows: list[tuple], cls_at: int, mean_at: int) -> int:
    """Where the last run of equal means (by :func:`in_python_order`'s rule) of ``rows`` starts."""
    start = 0
    last_cls, last_mean = None, None
    for i, row in enumerate(rows):
        mean, cls = row[mean_at], row[cls_at]
        if mean is None:
            start, last_mean = i, None
            continue
        if last_mean is None or cls != last_cls or not _same_12(last_mean, mean):
            start, last_cls, last_mean = i, cls, mean
    return start


def _same_12(a: float, b: float) -> bool:
    """Whether two means agree to 12 significant digits (the rule's equal means); cheap when far apart."""
    if a == b:
        return True
    if abs(b - a) > 1e-11 * max(abs(a), abs(b)):
        return False
    return f"{a:.12g}" == f"{b:.12g}"


def _sorted_run(run: list[tuple], width: int) -> list[tuple]:
    if len(run) < 2:
        return run
    var_at = 8 + 5 * width + 3
    return sorted(run, key=lambda r: (-r[8], std_of(r[var_at], r[11], r[12]), r[4]))


def std_of(var: float | None, lo: float | None, hi: float | None) -> float:
    """The metric's std as the rule compares it (unknown: last)."""
    if var is None:
        return math.inf
    return 0.0 if lo == hi else math.sqrt(max(var, 0.0))


def stat_of(n: int, s: float, q: float, lo: float, hi: float) -> tuple[float, float | None]:
    """(mean, sample std) from a result's count, sum and sum of squares, as the Python path gives them."""
    if lo == hi:
        return lo, (0.0 if n > 1 else None)
    mean = s / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(max((q - s * s / n) / (n - 1), 0.0))


def drop(conn: Connection) -> None:
    """Drop the configurations' temporary table (to group again)."""
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {'' if conn.dialect.name == 'postgresql' else 'temp.'}{TEMP}")

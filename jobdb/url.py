"""Database URLs the jobman way: ``sqlite:///x.db?table=mlp``, ``postgres://u@h/db?table=mlp``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

from .errors import UsageError

DEFAULT_DB = "sqlite:///jobman.db"
DEFAULT_TABLE = "default"
_SCHEMES = {
    "sqlite": "sqlite",
    "postgres": "postgresql+psycopg",
    "postgresql": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


@dataclass(frozen=True)
class DbTarget:
    """A parsed database location: the SQLAlchemy URL, the experiment, and a printable form."""

    sqlalchemy_url: str
    experiment: str
    dialect: str  # "sqlite" or "postgresql"
    schema: str | None = None
    artifacts: str | None = None  # where its artifact store is (``?artifacts=``), if the URL says

    def __post_init__(self) -> None:
        check_experiment_name(self.experiment)

    @property
    def display(self) -> str:
        """The URL with any password masked, safe for logs and errors."""
        return mask_password(self.sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://"))

    @property
    def sqlite_path(self) -> str | None:
        if self.dialect != "sqlite":
            return None
        path = self.sqlalchemy_url[len("sqlite:///") :].split("?", 1)[0]
        return path or None

    def with_table(self) -> str:
        """A URL that names this experiment, to hand to another process."""
        base, _, query_text = self.sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://").partition("?")
        query = dict(parse_qsl(query_text))
        query["table"] = self.experiment
        if self.schema:
            query["schema"] = self.schema
        if self.artifacts:
            query["artifacts"] = self.artifacts
        return f"{base}?{urlencode(query)}"


def check_experiment_name(name: str) -> None:
    """Refuse, in one sentence, a name that could not be a folder of the run folder: a job's workdir is
    RUNS/EXPERIMENT/ID, so "." or ".." would put it beside or above the others."""
    if not _NAME.match(name):
        raise UsageError(f"experiment name {name!r} may only hold letters, digits, '_', '-' and '.'")
    if not name.strip("."):
        raise UsageError(f"experiment name {name!r} names a folder, not an experiment: use a letter or digit in it")


# A URL's password: what follows "user:" up to the last "@" that a host and then the end of the
# authority follow, so that a raw "@", "#", "?" or space in the password is masked with the rest of it.
_USERINFO_PASSWORD = re.compile(
    r"(\b[a-z][a-z0-9+.\-]*://[^:/@\s]*:)([^/\n]*)(@[^\s@/?#]*(?=[/?#\s'\"]|$))", re.I | re.M
)
# A password given as a query parameter (libpq and psycopg take ?password=), plain or percent-encoded.
_QUERY_PASSWORD = re.compile(r"((?:[?&;]|%26|%3F)(?:password|pass|pwd)(?:=|%3D))([^&\s'\"]*)", re.I)


def mask_password(text: str) -> str:
    """Replace every database password in ``text`` by ``***``: the password of a URL (all of it up to
    the host, even with a raw ``@``, ``#`` or space in it) and a ``password=`` query parameter."""
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1***\3", text))


def without_password(text: str) -> str:
    """``text`` with every database password taken out of it (``user:pw@host`` becomes ``user@host``,
    ``password=pw`` becomes ``password=``): a URL that still names the database, for a process that
    gets the password some other way, or not at all."""
    text = _USERINFO_PASSWORD.sub(lambda m: m.group(1)[:-1] + m.group(3), text)
    return _QUERY_PASSWORD.sub(r"\1", text)


_DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")


def split_path_table(path: str, dialect: str) -> tuple[str, str | None]:
    """The original jobman's form, the table after the database: ``host/dbname/tablename``, and for
    SQLite ``/path/file.db/tablename`` (the file has a database suffix or exists)."""
    head, sep, last = path.rstrip("/").rpartition("/")
    if not sep or not last:
        return path, None
    if dialect == "sqlite":
        if (
            head.startswith("/")
            and len(head) > 1
            and not last.endswith(_DB_SUFFIXES)
            and (head.endswith(_DB_SUFFIXES) or os.path.isfile(head[1:]))
        ):
            return head, last
        return path, None
    # postgresql: netloc/dbname/table (a bare netloc/dbname has no second slash)
    if "/" in head:
        return head, last
    return path, None


def parse_db(url: str | None = None, table: str | None = None) -> DbTarget:
    """Resolve ``--db``/``--table``/``JOBMAN_DB`` into a :class:`DbTarget`.

    The experiment name comes from ``--table``, else the URL's ``?table=``, else ``default``.
    """
    raw = url or os.environ.get("JOBMAN_DB") or DEFAULT_DB
    if "://" not in raw:
        if raw.endswith((".db", ".sqlite", ".sqlite3")) or os.sep in raw:
            raw = "sqlite:///" + raw
        else:
            raise UsageError(
                f"{mask_password(raw)!r} is not a database URL (try sqlite:///file.db or postgresql://user@host/db)"
            )
    scheme, _, rest = raw.partition("://")
    dialect = _SCHEMES.get(scheme.lower())
    if dialect is None:
        raise UsageError(f"unknown database scheme {scheme!r}: use sqlite:///path.db or postgresql://user@host/db")
    path, _, query_text = rest.partition("?")
    query = dict(parse_qsl(query_text, keep_blank_values=True))
    path, path_table = split_path_table(path, dialect)
    experiment = table or query.pop("table", None) or path_table or DEFAULT_TABLE
    query.pop("table", None)
    schema = query.pop("schema", None)
    artifacts = query.pop("artifacts", None) or None
    check_experiment_name(experiment)
    if schema is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$", schema):
        raise UsageError(f"schema name {schema!r} is not a plain SQL identifier")
    clean = f"{dialect}://{path}" + (f"?{urlencode(query)}" if query else "")
    if dialect == "sqlite":
        if not path.startswith("/") or len(path) < 2:
            raise UsageError(
                "a SQLite URL has three slashes and a file: sqlite:///relative.db or sqlite:////abs/path.db"
            )
        return DbTarget(clean, experiment, "sqlite", artifacts=artifacts)
    return DbTarget(clean, experiment, "postgresql", schema, artifacts)

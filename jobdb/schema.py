"""The tables every part of jobman shares. Migrations in ``migrations/`` must produce exactly these.

Times are seconds since the epoch (floats), so that both engines compare them the
same way and tests can move them back instead of sleeping.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    DDL,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    event,
    text,
)
from sqlalchemy.types import TypeDecorator, TypeEngine

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect

metadata = MetaData()


class JsonText(TypeDecorator):
    """A JSON object: text on SQLite; jsonb on PostgreSQL, so SQL can reach into it (params->>'lr').
    Passed as text both ways: jobman encodes its canonical JSON itself, and the engine reads jsonb
    back as text (see ``engine.make_engine``). PostgreSQL's types are loaded only by an engine that
    talks to PostgreSQL: a SQLite command or worker starts without them."""

    impl = Text
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        return _raw_jsonb() if dialect.name == "postgresql" else self.impl_instance


@functools.cache
def _raw_jsonb() -> TypeEngine:
    from sqlalchemy.dialects.postgresql import JSONB

    class RawJsonb(JSONB):
        """jsonb that neither encodes nor decodes: not the driver's own jsonb type either, which
        would encode jobman's JSON text a second time."""

        cache_ok = True

        def adapt(self, cls: Any, **kw: Any) -> RawJsonb:  # type: ignore[override]
            return RawJsonb()  # whatever the driver's jsonb type is

        def bind_processor(self, dialect: Dialect) -> None:
            return None

        def result_processor(self, dialect: Dialect, coltype: object) -> None:
            return None

    return RawJsonb()


JSON_TEXT = JsonText()
# Priorities may be fractional (the original jobman's 1.0); SQLite stores a REAL in an INTEGER column as is.
PRIORITY = Integer().with_variant(Float(), "postgresql")

experiment = Table(
    "experiment",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("created_at", Float, nullable=False),
)

job = Table(
    "job",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("experiment_id", Integer, ForeignKey("experiment.id", ondelete="CASCADE"), nullable=False),
    Column("phase", Integer, nullable=False, server_default=text("0")),
    Column("kind", String(8), nullable=False, server_default=text("'fn'")),  # 'fn' or 'cmd'
    Column("target", Text, nullable=False),
    Column("params", JSON_TEXT, nullable=False),  # JSON object
    Column("params_hash", String(64), nullable=False),
    Column("status", String(16), nullable=False),
    Column("priority", PRIORITY, nullable=False, server_default=text("0")),
    Column("queue_order", Integer, nullable=False, server_default=text("0")),  # < 0: first in line
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("3")),
    Column("lease", Integer, nullable=False, server_default=text("0")),  # fencing token, +1 per claim
    Column("resume", Boolean, nullable=False, server_default=text("false")),  # next claim continues this attempt
    Column("stop_requested", Boolean, nullable=False, server_default=text("false")),
    Column("results", JSON_TEXT),  # JSON object
    Column("host", String(255)),
    Column("pid", Integer),
    Column("pid_started_at", Float),
    Column("backend", String(16)),
    Column("backend_id", String(64)),
    Column("log_path", Text),
    Column("workdir", Text),
    Column("created_at", Float, nullable=False),
    Column("queued_at", Float),
    Column("started_at", Float),
    Column("heartbeat_at", Float),
    Column("finished_at", Float),
    Column("error", Text),
    Column("exit_code", Integer),
    Column("gpus", String(255)),  # the devices given to its last run (CUDA_VISIBLE_DEVICES)
    Column("ranks", Integer, nullable=False, server_default=text("1")),  # processes that run it together
    # What ran (JSON): where the target was found when scheduled, then, from its worker, the target's
    # source digest, the git state of its tree and the environment (texts shared by jobs: ``code_text``).
    Column("code", JSON_TEXT),
    UniqueConstraint("experiment_id", "params_hash", name="uq_job_experiment_hash"),
)
# The claim: the first QUEUED job of an experiment by priority and order.
Index("ix_job_claim", job.c.experiment_id, job.c.status, job.c.priority.desc(), job.c.queue_order, job.c.id)
# Pages of ``jobman list`` in id order: all jobs, one status, one phase (a range per status); the
# counts per phase and status are read from ix_job_phase alone.
Index("ix_job_list", job.c.experiment_id, job.c.id)
Index("ix_job_status", job.c.experiment_id, job.c.status, job.c.id)
Index("ix_job_phase", job.c.experiment_id, job.c.phase, job.c.status, job.c.id)
# PostgreSQL only: a parameter filter (params @> '{"lr": 0.1}'). Not an ``Index`` of the metadata,
# which would build a plain index over SQLite's JSON text.
PARAMS_INDEX = "ix_job_params"
event.listen(
    job,
    "after_create",
    DDL(f"CREATE INDEX {PARAMS_INDEX} ON job USING gin (params jsonb_path_ops)").execute_if(dialect="postgresql"),
)

job_dep = Table(
    "job_dep",
    metadata,
    Column("job_id", Integer, ForeignKey("job.id", ondelete="CASCADE"), primary_key=True),
    Column("depends_on", Integer, ForeignKey("job.id", ondelete="CASCADE"), primary_key=True),
)
Index("ix_job_dep_parent", job_dep.c.depends_on)

job_event = Table(
    "job_event",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("job_id", Integer, ForeignKey("job.id", ondelete="CASCADE"), nullable=False),
    Column("at", Float, nullable=False),
    Column("from_status", String(16)),
    Column("to_status", String(16)),
    Column("attempt", Integer),
    Column("why", Text, nullable=False),
    Column("source", String(255)),  # host:pid of whoever made the change
    Column("data", Text),  # JSON: results cleared by a reset, and the like
)
Index("ix_job_event_job", job_event.c.job_id, job_event.c.id)
Index("ix_job_event_crash", job_event.c.to_status, job_event.c.id)  # the monitor's latest crashes

job_metric = Table(
    "job_metric",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("job_id", Integer, ForeignKey("job.id", ondelete="CASCADE"), nullable=False),
    Column("step", Integer, nullable=False),
    Column("name", String(100), nullable=False),
    Column("value", Float),  # NULL is NaN (SQLite stores a NaN as NULL); infinities are stored as such
    Column("at", Float, nullable=False),
)
Index("ix_job_metric_job", job_metric.c.job_id, job_metric.c.name, job_metric.c.step)

# Functions stored by value (``cloudpickle``): one defined in a script's or a notebook's
# ``__main__`` cannot be imported by a worker, so its code is kept here under its target,
# ``name#digest`` (the digest of its code: one row per distinct code, never shared by two functions).
# A row stored before digests, under a plain ``name``, keeps its newest definition.
function_code = Table(
    "function_code",
    metadata,
    Column("experiment_id", Integer, ForeignKey("experiment.id", ondelete="CASCADE"), primary_key=True),
    Column("target", Text, primary_key=True),
    Column("digest", String(64), nullable=False),  # sha256 of ``code``: a worker reloads only what changed
    Column("code", LargeBinary, nullable=False),
    Column("stored_at", Float, nullable=False),
)

# A successive-halving search: its rules (resource, rungs, eta, metric, mode, async) as JSON,
# one row per distinct search of an experiment (``key`` hashes the rules and the first rung's jobs).
search = Table(
    "search",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("experiment_id", Integer, ForeignKey("experiment.id", ondelete="CASCADE"), nullable=False),
    Column("key", String(64), nullable=False),
    Column("spec", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("experiment_id", "key", name="uq_search_experiment_key"),
)

# The rung each job of a search is at, and its configuration (a hash of its parameters without
# the resource, folds and seeds): the folds of one configuration are promoted together.
search_job = Table(
    "search_job",
    metadata,
    Column("job_id", Integer, ForeignKey("job.id", ondelete="CASCADE"), primary_key=True),
    Column("search_id", Integer, ForeignKey("search.id", ondelete="CASCADE"), primary_key=True),
    Column("rung", Integer, nullable=False),
    Column("config", String(64), nullable=False),
)
Index("ix_search_job_rung", search_job.c.search_id, search_job.c.rung)

# Texts many jobs share, kept once each by the digest of their content: a working tree's
# uncommitted diff (``kind`` 'diff'), an environment's installed packages ('packages').
code_text = Table(
    "code_text",
    metadata,
    Column("digest", String(64), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("body", Text, nullable=False),
    Column("stored_at", Float, nullable=False),
)

VERSION_TABLE = "jobman_alembic_version"
# The newest migration in migrations/versions; a test keeps the two equal.
HEAD_REVISION = "0009"

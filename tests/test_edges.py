"""Corners a new user meets in the first minutes: each answered by one sentence or by the one
right behaviour, with the database left as it was when something is refused."""

from __future__ import annotations

import contextlib
import hashlib
import io

import pytest
import sqlalchemy as sa
from test_cli_basics import dump_db

from jobman.cli.main import main
from jobman.jobdb.errors import UsageError
from jobman.jobdb.schema import job as t_job
from jobman.jobdb.status import Status
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec, SweepError, expand, parse_sweep

DOTTED = "jobman.jobdb.status.parse_status"  # importable: the target check passes
COLON = "jobman.jobdb.status:parse_status"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def refused(argv: list[str], *words: str) -> str:
    code, out, err = run(*argv)
    lines = [line for line in err.splitlines() if line.startswith("jobman: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, out, err)
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.fixture
def three(store: Store) -> list[int]:
    """Three jobs of one experiment: DONE, FAILED and QUEUED."""
    ids = store.schedule(expand(parse_sweep([COLON, "x={{1,2,3}}"]))).job_ids
    for outcome in ("DONE", "FAILED"):
        claimed = store.claim(WorkerInfo(host="edgehost", pid=1))
        store.finish(claimed.job.id, claimed.lease, outcome, results={"v": 1})
    return ids


def statuses(store: Store) -> list[Status]:
    return [j.status for j in store.jobs()]


def test_no_status_command_makes_a_running_job_without_a_worker(db_url, store, three):
    before = dump_db(db_url)
    refused(["sqlstatus", db_url, str(three[2]), "--set_status", "RUNNING"], "claims")
    refused(["set-status", db_url, str(three[2]), "RUNNING"], "claims")
    refused(["sqlstatus", db_url, str(three[2]), "--set_status", "1"], "claims")  # jobman's code of RUNNING
    with pytest.raises(UsageError, match="only when a worker claims it"):
        store.set_status([three[2]], Status.RUNNING)
    assert dump_db(db_url) == before


def test_set_status_with_no_job_named_changes_nothing(db_url, store, three):
    before = dump_db(db_url)
    refused(["sqlstatus", db_url, "--set_status", "START"], "name the jobs", "--all")
    refused(["sqlstatus", db_url, "--all", "--set_status", "START"], "refusing without a terminal", "--yes")
    assert dump_db(db_url) == before

    code, out, err = run("sqlstatus", db_url, "--status", "FAILED", "--set_status", "START")
    assert code == 0 and "1 job(s) set to QUEUED" in out, err
    assert statuses(store) == [Status.DONE, Status.QUEUED, Status.QUEUED]
    code, out, err = run("sqlstatus", db_url, "--all", "--yes", "--set_status", "CANCELED")
    assert code == 0 and "3 job(s) set to CANCELED" in out, err
    assert statuses(store) == [Status.CANCELED] * 3


def test_both_spellings_of_a_function_are_one_job(store):
    first = store.schedule([JobSpec(0, "fn", DOTTED, {"x": 1}, None)])
    again = store.schedule(expand(parse_sweep([COLON, "x=1"])))
    assert (first.added, again.added, again.existing) == (1, 0, 1)
    assert again.job_ids == first.job_ids
    assert store.job(first.job_ids[0]).target == COLON
    assert store.select_ids(target=DOTTED) == store.select_ids(target=COLON) == first.job_ids


def test_a_job_stored_under_the_dotted_spelling_is_found_again(store):
    """Rows stored before the spellings were one keep their target and hash, and are not added twice."""
    [old] = store.schedule([JobSpec(0, "fn", COLON, {"x": 1}, None)]).job_ids
    with store.engine.begin() as conn:  # as an older jobman stored it: hashed with the spelling given
        params = conn.execute(sa.select(t_job.c.params).where(t_job.c.id == old)).scalar_one()
        legacy_hash = hashlib.sha256(f"0\x1ffn\x1f{DOTTED}\x1f{params}".encode()).hexdigest()
        conn.execute(sa.update(t_job).where(t_job.c.id == old).values(target=DOTTED, params_hash=legacy_hash))
    for target in (DOTTED, COLON):
        result = store.schedule([JobSpec(0, "fn", target, {"x": 1}, None), JobSpec(0, "fn", target, {"x": 2}, None)])
        assert result.job_ids[0] == old and result.existing >= 1
    assert len(store.jobs()) == 2
    assert store.job(old).target == DOTTED


def test_two_grids_on_one_key_say_what_is_wrong(db_url):
    with pytest.raises(SweepError, match="closes here and more follows"):
        parse_sweep([COLON, "x={{1,2}}{{3,4}}"])
    with pytest.raises(SweepError, match="nested"):
        parse_sweep([COLON, "x={{1,{{2,3}}}}"])
    refused(["sqlschedule", db_url, COLON, "x={{1,2}}{{3,4}}"], "one key one grid")

"""What a sweep would add is counted exactly before it is written, a Hydra-style comma list is refused
with the grid it means, and the terminal tables never cut a number in two nor cut anything unmarked.

Real databases (both engines) and the real ``jobman`` command; the targets are modules under ``tmp_path``.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from jobman.jobdb.errors import NoSuchExperiment
from jobman.jobdb.store import Store

TRAIN = """
    def kw(lr, width=4, epochs=3):
        return {"score": lr * width * epochs}

    def train(learning_rate, hidden_units=64, weight_decay=0.0, dropout_probability=0.5):
        return {"train_error": 0.000618, "valid_error": 0.0193123, "test_error": 0.0211, "seconds": 12.5}

    def big(lr):
        return {"curve": [round(0.1 * i, 3) for i in range(200)], "loss": 0.5}
"""


@pytest.fixture
def mod(tmp_path: Path) -> Path:
    (tmp_path / "tablemod.py").write_text(textwrap.dedent(TRAIN))
    return tmp_path


def ids_of(url: str) -> list[int]:
    store = Store.open(url)
    try:
        return [j.id for j in store.jobs()]
    finally:
        store.dispose()


def test_dry_run_counts_exactly_what_would_be_added_and_lists_the_first_jobs(db_url, mod, jobman):
    sweep = ["tablemod:kw", "lr={{0.1,0.2,0.1}}", "width={{1,2,3}}"]
    # On a database or experiment that is not there yet: counted, and nothing made.
    dry = jobman("sqlschedule", db_url, *sweep, "--dry-run", cwd=mod)
    assert dry.code == 0, dry.err
    assert "6 jobs in 1 phase(s) would be added" in dry.out and "3 named twice by the sweep, merged" in dry.out
    assert "lr={{0.1,0.2,0.1}} gives 0.1 more than once" in dry.err  # the duplicate value is named
    assert len(re.findall(r"^  phase 0  tablemod:kw  lr=0\.[12] width=[123]$", dry.out, re.M)) == 6, dry.out
    with pytest.raises(NoSuchExperiment):
        ids_of(db_url)
    # Two of them are there already: not counted again.
    assert jobman("sqlschedule", db_url, "tablemod:kw", "lr=0.1", "width={{1,2}}", cwd=mod).code == 0
    before = ids_of(db_url)
    dry = jobman("sqlschedule", db_url, *sweep, "--dry-run", cwd=mod)
    assert dry.code == 0, dry.err
    assert "4 jobs in 1 phase(s) would be added" in dry.out, dry.out
    assert "2 already present" in dry.out and "3 named twice by the sweep, merged" in dry.out
    listed = re.findall(r"^  phase 0  tablemod:kw  (.*)$", dry.out, re.M)
    assert listed == ["lr=0.1 width=3", "lr=0.2 width=1", "lr=0.2 width=2", "lr=0.2 width=3"]
    assert ids_of(db_url) == before  # nothing written
    done = jobman("sqlschedule", db_url, *sweep, cwd=mod)
    assert "added 4 jobs" in done.out and "(2 already present)" in done.out, done.out
    # A long sweep lists its first jobs and says how many more.
    dry = jobman("sqlschedule", db_url, "tablemod:kw", "lr={{1,2,3,4}}", "width={{5,6,7,8}}", "--dry-run", cwd=mod)
    assert "16 jobs" in dry.out and dry.out.count("  phase 0  ") == 10 and "... and 6 more" in dry.out


def test_a_missing_database_file_is_not_created_by_a_dry_run(tmp_path, mod, jobman):
    url = f"sqlite:///{tmp_path / 'new.db'}?table=t"
    dry = jobman("sqlschedule", url, "tablemod:kw", "lr={{0.1,0.2}}", "--dry-run", cwd=mod)
    assert dry.code == 0 and "2 jobs in 1 phase(s) would be added" in dry.out, dry.out + dry.err
    assert not (tmp_path / "new.db").exists()


def test_a_top_level_comma_list_is_refused_with_the_grid_it_means(db_url, mod, jobman):
    out = jobman("sqlschedule", db_url, "tablemod:kw", "lr=0.1,0.2", cwd=mod)
    assert out.code != 0 and "Traceback" not in out.err
    assert out.err.strip().count("\n") == 0, out.err  # one sentence
    assert "lr=0.1,0.2" in out.err and "write lr={{0.1,0.2}} for one job per value" in out.err, out.err
    with pytest.raises(NoSuchExperiment):  # nothing written
        ids_of(db_url)
    # Quoted, it is the one string the user meant.
    out = jobman("sqlschedule", db_url, "tablemod:big", 'lr="0.1,0.2"', "--no-check", cwd=mod)
    assert out.code == 0, out.err
    [job] = Store.open(db_url).jobs()
    assert job.params == {"lr": "0.1,0.2"}


NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


@pytest.mark.parametrize("columns", [80, 60])
def test_list_never_splits_a_number_at_80_columns(db_url, mod, jobman, columns):
    sweep = ["tablemod:train", "learning_rate={{0.1,0.001}}", "weight_decay={{0.0001,0.00001}}"]
    assert jobman("sqlschedule", db_url, *sweep, "dropout_probability={{0.25,0.5}}", cwd=mod).code == 0
    # The README's fan-in: a job after others, whose 'after' column takes room too.
    assert jobman("sqlschedule", db_url, "tablemod:train", "learning_rate=0.3", "--after", "phase=0", cwd=mod).code == 0
    run = jobman("worker", db_url, "--exproot", str(mod / "runs"), cwd=mod)
    assert run.code == 0, run.err
    listed = jobman("list", db_url, cwd=mod, env={"COLUMNS": str(columns)})
    assert listed.code == 0, listed.err
    assert max(len(line.rstrip()) for line in listed.out.splitlines()[1:-1]) <= columns, listed.out
    numbers = set(NUMBER.findall(listed.out))
    for whole in ("0.000618", "0.01931", "0.0211", "0.25", "0.0001", "1e-05"):
        assert whole in numbers, (whole, listed.out)
    for part in ("0.00061", "0.0193", "0.000", "0.02"):  # what a number cut in two leaves
        assert part not in numbers, (part, listed.out)


def test_show_marks_what_it_cut(db_url, mod, jobman):
    assert jobman("sqlschedule", db_url, "tablemod:big", "lr=0.1", cwd=mod).code == 0
    assert jobman("worker", db_url, "--exproot", str(mod / "runs"), cwd=mod).code == 0
    [job_id] = ids_of(db_url)
    shown = jobman("show", db_url, str(job_id), cwd=mod, env={"COLUMNS": "80"})
    assert shown.code == 0, shown.err
    [results] = [line for line in shown.out.splitlines() if "results" in line and "curve" in line]
    assert results.rstrip(" │").endswith("…"), results
    assert f"`jobman show {job_id} --format json` shows it whole" in shown.out
    wide = jobman("show", db_url, str(job_id), cwd=mod, env={"COLUMNS": "2000"})
    assert "…" not in wide.out and "19.9]" in wide.out

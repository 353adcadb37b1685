"""What a sweep would add is counted exactly before it is written, and a Hydra-style comma list is
refused with the grid it means.

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

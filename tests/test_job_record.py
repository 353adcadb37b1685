"""What a job records is what ran: parameters a target cannot take are refused, never dropped.

Real databases, real workers and the real ``jobman`` command; the targets are modules written
under ``tmp_path``, imported as a user's own would be.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import jobman
from jobman.jobdb.errors import NoSuchExperiment, UsageError
from jobman.jobdb.store import Store

KWMOD = '''
    import os

    def kw(lr, width=4, epochs=3):
        """Leaves a line per run: a job run with its defaults would show here."""
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ran.txt"), "a") as fh:
            fh.write(f"{lr} {width} {epochs}\\n")
        return {"score": lr * width * epochs}

    def anything(lr, **rest):
        return {"rest": sorted(rest)}

    def classic(state, channel):
        state.seen = sorted(k for k in state if k != "jobman")
'''


@pytest.fixture
def kwmod(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "kwmod.py").write_text(textwrap.dedent(KWMOD))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


# -- 1. parameters checked ------------------------------------------------------------------------

def test_sqlschedule_refuses_a_parameter_the_target_cannot_take_and_writes_nothing(db_url, kwmod, jobman):
    out = jobman("sqlschedule", db_url, "kwmod:kw", "lr=0.1", "nosuch=3", cwd=kwmod)
    assert out.code != 0
    assert out.err.strip() == "jobman: nosuch: kw() takes lr, width, epochs", out.err
    out = jobman("sqlschedule", db_url, "kwmod:kw", "lr={{0.1,0.2}}", "--", "widht=64", cwd=kwmod)
    assert out.code != 0 and "widht: kw() takes lr, width, epochs; did you mean width?" in out.err, out.err
    assert "Traceback" not in out.err
    with pytest.raises(NoSuchExperiment):  # not even the experiment was made
        Store.open(db_url).jobs()
    # What the target can take is scheduled: its own names, anything for **kwargs or (state, channel).
    for target in ("kwmod:kw", "kwmod:anything", "kwmod:classic"):
        out = jobman("sqlschedule", db_url, target, "lr=0.1", *(["other=1"] if target != "kwmod:kw" else []),
                     cwd=kwmod)
        assert out.code == 0, out.err


def test_a_parameter_met_at_run_time_fails_the_job_with_the_same_sentence_and_never_runs_defaults(
        db_url, kwmod, jobman):
    out = jobman("sqlschedule", db_url, "kwmod:kw", "lr=0.1", "widht={{8,64}}", "--no-check", cwd=kwmod)
    assert out.code == 0, out.err
    out = jobman("sqlschedule", db_url, "kwmod:classic", "lr=0.1", "whatever=2", cwd=kwmod)
    assert out.code == 0, out.err
    out = jobman("worker", db_url, "--exproot", str(kwmod / "runs"), cwd=kwmod)
    jobs = {(j.target, j.params.get("widht")): j for j in Store.open(db_url).jobs()}
    for width in (8, 64):
        job = jobs[("kwmod:kw", width)]
        assert job.status == "FAILED"
        assert "widht: kw() takes lr, width, epochs; did you mean width?" in (job.error or "")
    assert ran(kwmod) == []  # kw never ran with its default width
    classic = jobs[("kwmod:classic", None)]
    assert classic.status == "DONE" and classic.results["seen"] == ["lr", "whatever"]


def test_call_and_map_refuse_a_parameter_the_function_cannot_take(db_url, kwmod):
    import kwmod as module

    exp = jobman.Experiment(db_url, backend="inline", exproot=kwmod / "runs")
    with pytest.raises(UsageError, match=r"^widht: kw\(\) takes lr, width, epochs; did you mean width\?$"):
        exp.call(module.kw, lr=0.1, widht=64)
    with pytest.raises(UsageError, match=r"^nosuch: kw\(\) takes lr, width, epochs$"):
        exp.map("kwmod:kw", [{"lr": 0.1}, {"lr": 0.2, "nosuch": 1}])
    with pytest.raises(UsageError, match="nosuch: kw"):
        exp.schedule("kwmod:kw lr={{0.1,0.2}} nosuch=1")
    with pytest.raises(NoSuchExperiment):
        exp.results(as_frame=False)
    assert ran(kwmod) == []

    def local(a, *, b=1):
        return {"sum": a + b}

    with pytest.raises(UsageError, match=r"^c: local\(\) takes a, b$"):
        exp.call(local, a=1, c=2)
    assert exp.call(local, a=1, b=2).result(timeout=60) == {"sum": 3}
    assert exp.call(module.kw, lr=0.5, width=2).result(timeout=60) == {"score": 3.0}
    assert exp.call(module.anything, lr=0.5, extra=2).result(timeout=60) == {"rest": ["extra"]}
    exp.close()



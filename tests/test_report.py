"""``jobman report`` and ``report.best``: grouping over folds, exact statistics, eligibility, ties,
filters, every output format, nested cross-validation, plots, and a real fan-in job choosing its config."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import struct
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from jobman.cli.main import main as jobman_main
from jobman.jobdb import report
from jobman.jobdb.errors import JobmanError, UsageError
from jobman.jobdb.report import NothingEligible, UnknownMetric
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import JobSpec

TARGET = "tests.fake:train"


def add_jobs(
    store: Store, jobs: list[tuple[dict, str, dict | None]], *, phase: int = 0, target: str = TARGET
) -> list[int]:
    """Schedule ``(params, status, results)`` jobs in order, then claim and finish each as told.

    QUEUED jobs must come last: they are left unclaimed.
    """
    ids = store.schedule([JobSpec(phase, "fn", target, p, None) for p, _, _ in jobs]).job_ids
    worker = WorkerInfo.here()
    for job_id, (_params, status, results) in zip(ids, jobs):
        if status == "QUEUED":
            continue
        claimed = store.claim(worker, None)
        assert claimed is not None and claimed.job.id == job_id
        if status != "RUNNING":
            store.finish(job_id, claimed.lease, status, results=results, relaunch=False)
    return ids


def cli(*args: str, capsys) -> tuple[int, str, str]:
    """The jobman command, in this process (fast); the fan-in test runs the real one."""
    capsys.readouterr()
    code = jobman_main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def record(params: dict, value: float | None, status: str = "DONE", job_id: int | None = None, **more) -> dict:
    results = None if value is None else {"valid_error": value, **more}
    rec = {"params": params, "results": results, "status": status}
    if job_id is not None:
        rec["job_id"] = job_id
    return rec


# -- exact statistics on a hand-made results set --------------------------------------------

SWEEP = [  # two configurations × three folds; the first is better
    ({"lr": 0.01, "nhid": 256, "nb_cross_fold": 3, "id_cross_fold": 0}, 0.05, 0.5),
    ({"lr": 0.01, "nhid": 256, "nb_cross_fold": 3, "id_cross_fold": 1}, 0.07, 0.25),
    ({"lr": 0.01, "nhid": 256, "nb_cross_fold": 3, "id_cross_fold": 2}, 0.09, 0.75),
    ({"lr": 0.1, "nhid": 64, "nb_cross_fold": 3, "id_cross_fold": 0}, 0.1, 0.9),
    ({"lr": 0.1, "nhid": 64, "nb_cross_fold": 3, "id_cross_fold": 1}, 0.2, 0.8),
    ({"lr": 0.1, "nhid": 64, "nb_cross_fold": 3, "id_cross_fold": 2}, 0.3, 0.7),
]


def test_means_and_sample_stds_are_exact_and_the_best_is_said_in_words(store, db_url, capsys):
    ids = add_jobs(
        store, [(p, "DONE", {"valid_error": v, "accuracy": a, "_internal": 1.0, "note": "text"}) for p, v, a in SWEEP]
    )
    rep = report.from_store(store, "valid_error")
    assert rep.group_over == ["id_cross_fold"]
    assert rep.constant == {"nb_cross_fold": 3}
    assert rep.varying == ["lr", "nhid"]
    assert rep.columns == ["valid_error", "accuracy"]  # numbers only, no _private results
    first, second = rep.rows
    assert first.best and not second.best and (first.rank, second.rank) == (1, 2)
    assert first.params == {"lr": 0.01, "nhid": 256, "nb_cross_fold": 3}
    assert first.job_ids == ids[:3] and second.job_ids == ids[3:]
    assert first.n == 3 and first.mean == pytest.approx(0.07) and first.std == pytest.approx(0.02)
    assert second.mean == pytest.approx(0.2) and second.std == pytest.approx(0.1)
    acc = first.stats["accuracy"]
    assert (acc.n, acc.mean, acc.std, acc.min, acc.max) == (3, pytest.approx(0.5), pytest.approx(0.25), 0.25, 0.75)
    assert rep.summary_lines() == ["best: lr=0.01 nhid=256 — valid_error 0.07 ± 0.020 over 3 folds"]

    code, out, _ = cli("report", db_url, capsys=capsys)
    assert code == 0
    assert "all configurations: nb_cross_fold=3" in out
    header = next(line for line in out.splitlines() if "valid_error" in line and "#" in line)
    assert "nb_cross_fold" not in header and "id_cross_fold" not in header  # shown once above, not per row
    assert "0.07 ± 0.020" in out and "0.2 ± 0.10" in out
    assert out.strip().splitlines()[-1] == "best: lr=0.01 nhid=256 — valid_error 0.07 ± 0.020 over 3 folds"


def test_max_mode_picks_the_highest(store, db_url, capsys):
    add_jobs(store, [(p, "DONE", {"valid_error": v, "accuracy": a}) for p, v, a in SWEEP])
    rep = report.from_store(store, "accuracy", "max")
    assert rep.best.params["lr"] == 0.1 and rep.best.mean == pytest.approx(0.8)
    code, out, _ = cli("report", db_url, "--metric", "accuracy", "--max", "--format", "json", capsys=capsys)
    data = json.loads(out)
    assert code == 0 and data["mode"] == "max" and data["best"]["params"]["lr"] == 0.1
    assert [r["rank"] for r in data["rows"]] == [1, 2]


def test_missing_and_failed_folds_are_counted_never_averaged_and_not_eligible_by_default(store, db_url, capsys):
    jobs = [  # lr=0.001 is the best on paper but has one fold FAILED (with a junk value) and one running
        ({"lr": 0.001, "id_cross_fold": 0}, "DONE", {"valid_error": 0.01}),
        ({"lr": 0.001, "id_cross_fold": 1}, "FAILED", {"valid_error": 999.0}),
        ({"lr": 0.001, "id_cross_fold": 2}, "DONE", {"valid_error": 0.03}),
        ({"lr": 0.01, "id_cross_fold": 0}, "DONE", {"valid_error": 0.1}),
        ({"lr": 0.01, "id_cross_fold": 1}, "DONE", {"valid_error": 0.1}),
        ({"lr": 0.01, "id_cross_fold": 2}, "DONE", {"valid_error": 0.1}),
        ({"lr": 0.1, "id_cross_fold": 0}, "DONE", {"valid_error": 0.05}),  # its fold 2 was never scheduled
        ({"lr": 0.1, "id_cross_fold": 1}, "DONE", {"valid_error": 0.05}),
        ({"lr": 0.001, "id_cross_fold": 3}, "RUNNING", None),
    ]
    add_jobs(store, jobs)
    rep = report.from_store(store, "valid_error")
    rows = {r.params["lr"]: r for r in rep.rows}
    bad = rows[0.001]
    assert bad.status == {"DONE": 2, "FAILED": 1, "RUNNING": 1} and bad.not_done() == {"failed": 1, "running": 1}
    assert bad.n == 2 and bad.mean == pytest.approx(0.02) and bad.std == pytest.approx(math.sqrt(2) * 0.01)
    assert bad.expected == 4 and not bad.complete and not bad.eligible
    assert rows[0.1].n == 2 and not rows[0.1].eligible
    # Every complete configuration must have as many jobs as the largest: with lr=0.001's four, none is.
    assert rep.best is None and "--allow-incomplete" in rep.why_none()

    records = [{"params": p, "results": r, "status": s} for p, s, r in jobs[:-1]]
    chosen = report.best(records)
    assert chosen.params == {"lr": 0.01} and chosen.n == 3 and chosen.std == 0.0
    assert report.best(records, allow_incomplete=True).params == {"lr": 0.001}

    code, out, _ = cli("report", db_url, "--top", "0", capsys=capsys)
    assert code == 0 and "2/4 (+1 failed, +1 running)" in out and "2/4" in out
    assert "no configuration is eligible" in out
    code, out, _ = cli("report", db_url, "--allow-incomplete", "--format", "json", capsys=capsys)
    data = json.loads(out)
    assert data["best"]["params"] == {"lr": 0.001} and data["best"]["complete"] is False
    assert data["best"]["results"]["valid_error"]["max"] == 0.03  # the FAILED job's 999 is not in it


def test_nothing_eligible_and_unknown_metric_are_clear_errors():
    records = [record({"lr": 0.1, "fold": 0}, 0.1), record({"lr": 0.1, "fold": 1}, None, "FAILED")]
    with pytest.raises(NothingEligible, match="allow_incomplete=True"):
        report.best(records)
    assert issubclass(NothingEligible, JobmanError)
    with pytest.raises(UnknownMetric, match=r"no finished job reports 'accuracy' \(numeric results: valid_error\)"):
        report.best(records, metric="accuracy")
    with pytest.raises(NothingEligible, match="no configuration"):
        report.best([])
    with pytest.raises(UsageError, match="mode"):
        report.best(records, mode="lowest")


def test_ties_go_to_more_runs_then_lower_std_then_first_scheduled():
    cfg = lambda name, **k: {"name": name, **k}  # noqa: E731
    # Same mean (in a different summation order), same n, same std: the one scheduled first wins.
    recs = [record(cfg("b", seed=s), v, job_id=10 + s) for s, v in enumerate([0.1, 0.2, 0.3])]
    recs += [record(cfg("a", seed=s), v, job_id=20 + s) for s, v in enumerate([0.3, 0.2, 0.1])]
    assert report.best(recs).params == {"name": "b"}
    assert report.best(list(reversed(recs))).params == {"name": "b"}  # by job id, not by position
    # Same mean: the lower std wins.
    recs = [record(cfg("wide", seed=s), v, job_id=s) for s, v in enumerate([0.0, 0.2, 0.4])]
    recs += [record(cfg("narrow", seed=s), v, job_id=10 + s) for s, v in enumerate([0.19, 0.2, 0.21])]
    assert report.best(recs).params == {"name": "narrow"}
    # Same mean with missing runs allowed: more runs win.
    recs = [record(cfg("few", seed=s), 0.2, job_id=s) for s in range(2)]
    recs += [record(cfg("many", seed=s), 0.2, job_id=10 + s) for s in range(3)]
    assert report.best(recs, allow_incomplete=True).params == {"name": "many"}
    rows = report.summarize(recs, "valid_error", allow_incomplete=True)
    assert [r.params["name"] for r in rows] == ["many", "few"] and rows[0].std == 0.0
    # Positions without ids: first in the records wins.
    recs = [record(cfg("x"), 0.5), record(cfg("y"), 0.5)]
    assert report.best(recs, group_over=[]).params == {"name": "x"}
    assert report.summarize(recs, "valid_error", group_over=[])[0].std is None  # n = 1: no spread


def test_default_group_and_outer_keys():
    keys = [
        "id_cross_fold",
        "nb_cross_fold",
        "seed",
        "init_seed",
        "fold",
        "fold_id",
        "id_outer_fold",
        "nb_outer_fold",
        "lr",
        "seeds_per_x",
        "n_seed",
    ]
    assert report.default_group_keys(keys) == ["fold", "fold_id", "id_cross_fold", "init_seed", "seed"]
    assert report.default_outer_key(keys) == "id_outer_fold"
    assert report.default_outer_key(["outer_fold", "lr"]) == "outer_fold"
    assert report.default_outer_key(["lr", "id_cross_fold"]) is None


def test_parent_like_objects_and_status_enums_are_records():
    from jobman.dispatch.channel import Parent
    from jobman.jobdb.status import Status

    parents = [
        Parent(i, 0, TARGET, Path("."), {"lr": lr, "id_cross_fold": f}, {"valid_error": lr + f / 100})
        for i, (lr, f) in enumerate([(0.1, 0), (0.1, 1), (0.2, 0), (0.2, 1)])
    ]
    chosen = report.best(parents)
    assert chosen.params == {"lr": 0.1} and chosen.job_ids == [0, 1] and chosen.n == 2
    assert chosen.mean == pytest.approx(0.105) and chosen.std == pytest.approx(math.sqrt(0.5) * 0.01)
    recs = [{"params": p.params, "results": p.results, "status": Status.DONE, "job_id": p.job_id} for p in parents]
    assert report.best(recs).job_ids == [0, 1]


# -- filters and formats -----------------------------------------------------------------------

GRID = [
    (
        {"nhid": h, "act": a, "id_cross_fold": f},
        "DONE",
        {"valid_error": 1 / h + (a == "relu") * 0.1 + f / 1000, "train_error": 0.5 / h},
    )
    for h in (32, 128, 512)
    for a in ("tanh", "relu")
    for f in range(2)
]


def test_where_filters_on_parameters(store, db_url, capsys):
    add_jobs(store, GRID)
    rep = report.from_store(store, "valid_error", where=["nhid>=128"])
    assert {r.params["nhid"] for r in rep.rows} == {128, 512} and rep.jobs == 8
    rep = report.from_store(store, "valid_error", where=["nhid>=128", "act==relu"])
    assert [r.params for r in rep.rows] == [{"act": "relu", "nhid": 512}, {"act": "relu", "nhid": 128}]
    assert rep.constant == {"act": "relu"}
    assert report.parse_where("act!=tanh").test({"act": "relu"})
    assert not report.parse_where("act<3").test({"act": "relu"})  # text and number never compare
    assert not report.parse_where("lr==0.1").test({"nhid": 3})  # a job without the key never matches
    assert report.parse_where("flag=true").test({"flag": True})
    assert not report.parse_where("flag=1").test({"flag": True})  # True is not 1 here

    code, out, _ = cli("report", db_url, "--where", "nhid<100", "--format", "json", capsys=capsys)
    assert code == 0 and {r["params"]["nhid"] for r in json.loads(out)["rows"]} == {32}
    for bad, words in [("nhid=>128", "not an operator"), ("nhid", "KEY OP VALUE"), ("depth>2", "no job has")]:
        code, _, err = cli("report", db_url, "--where", bad, capsys=capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("report", db_url, "--where", "nhid>9999", capsys=capsys)
    assert code == 2 and "no job matches --where nhid>9999" in err


def test_json_csv_and_markdown_outputs_parse(store, db_url, capsys):
    add_jobs(store, GRID)
    code, out, _ = cli("report", db_url, "--format", "json", capsys=capsys)
    data = json.loads(out)
    assert code == 0 and len(data["rows"]) == 6 and data["best"]["params"] == {"act": "tanh", "nhid": 512}
    assert data["best"]["results"]["valid_error"] == {
        "n": 2,
        "mean": pytest.approx(1 / 512 + 0.0005),
        "std": pytest.approx(math.sqrt(0.5) * 0.001),
        "min": pytest.approx(1 / 512),
        "max": pytest.approx(1 / 512 + 0.001),
    }
    assert data["group_over"] == ["id_cross_fold"] and "ddof=1" in data["std"]

    code, out, _ = cli("report", db_url, "--format", "csv", capsys=capsys)
    table = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(table) == 6
    assert table[0]["best"] == "1" and table[0]["nhid"] == "512" and table[0]["act"] == "tanh"
    assert float(table[0]["valid_error_mean"]) == pytest.approx(1 / 512 + 0.0005)
    assert table[0]["valid_error_n"] == "2" and "train_error_std" in table[0]

    code, out, _ = cli("report", db_url, "--format", "markdown", "--top", "3", capsys=capsys)
    lines = [line for line in out.splitlines() if line.startswith("|")]
    head, rule, body = lines[0], lines[1], lines[2:]
    cells = lambda line: [c.strip() for c in line.strip("|").split("|")]  # noqa: E731
    assert code == 0 and cells(head)[:4] == ["best", "#", "act", "nhid"] and len(body) == 3
    assert set(rule.replace("|", "").replace("-", "").replace(":", "")) == set()
    assert all(len(cells(line)) == len(cells(head)) for line in body)
    assert cells(body[0])[0] == "**★**" and "**best: act=tanh nhid=512" in out


def test_phase_option_and_scopes_without_the_metric_are_left_out(store, db_url, capsys):
    add_jobs(store, GRID[:4])
    add_jobs(store, [({"stage": "retrain"}, "DONE", {"test_error": 0.3})], target="tests.fake:retrain")
    rep = report.from_store(store, "valid_error")
    assert rep.dropped == [(0, "tests.fake:retrain", 1)] and len(rep.rows) == 2
    add_jobs(store, [({"nhid": 32, "seed": s}, "DONE", {"valid_error": 0.5}) for s in range(2)], phase=1)
    assert len(report.from_store(store, "valid_error", phase=1).rows) == 1
    code, out, _ = cli("report", db_url, capsys=capsys)
    assert code == 0 and "left out: phase 0 tests.fake:retrain (1 job), which reports no valid_error" in out
    code, out, err = cli("report", db_url, "--metric", "nope", capsys=capsys)
    assert code == 2 and "no finished job reports 'nope'" in err


# -- nested cross-validation ---------------------------------------------------------------


def test_nested_cross_validation_is_reported_per_outer_fold_and_overall(store, db_url, capsys):
    # Outer folds 0 and 1 prefer lr=0.01; outer fold 2 prefers lr=0.1.
    valid = {(0, 0.01): 0.1, (0, 0.1): 0.2, (1, 0.01): 0.3, (1, 0.1): 0.4, (2, 0.01): 0.6, (2, 0.1): 0.5}
    jobs = [
        (
            {"lr": lr, "id_outer_fold": o, "id_cross_fold": f},
            "DONE",
            {"valid_error": valid[o, lr] + (f - 1) * 0.01, "test_error": valid[o, lr] * 2},
        )
        for o in range(3)
        for lr in (0.01, 0.1)
        for f in range(3)
    ]
    add_jobs(store, jobs)
    rep = report.from_store(store, "valid_error")
    assert rep.outer == "id_outer_fold" and rep.group_over == ["id_cross_fold"]
    assert {o: r.params["lr"] for o, r in rep.best_by_outer.items()} == {0: 0.01, 1: 0.01, 2: 0.1}
    assert all(r.std == pytest.approx(0.01) for r in rep.best_by_outer.values())
    overall = rep.overall["valid_error"]
    assert overall.n == 3 and overall.mean == pytest.approx(0.3) and overall.std == pytest.approx(0.2)
    assert rep.overall["test_error"].mean == pytest.approx(0.6)
    assert [r.rank for r in rep.rows] == [1, 2, 1, 2, 1, 2]

    code, out, _ = cli("report", db_url, capsys=capsys)
    assert code == 0
    assert "best for id_outer_fold=2: lr=0.1 — valid_error 0.5 ± 0.010 over 3 folds" in out
    assert "overall: valid_error 0.3 ± 0.20, test_error 0.6 ± 0.40 over 3 outer folds" in out
    code, out, _ = cli("report", db_url, "--format", "json", capsys=capsys)
    data = json.loads(out)
    assert [b["best"]["params"]["lr"] for b in data["best_by_outer"]] == [0.01, 0.01, 0.1]
    assert data["overall"]["valid_error"]["mean"] == pytest.approx(0.3)
    # Not nested: the outer fold is then a parameter like any other, as in report.best.
    rep = report.from_store(store, "valid_error", outer=None)
    assert rep.best.params == {"lr": 0.01, "id_outer_fold": 0}


# -- plots ------------------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    blob = path.read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n" and blob[12:16] == b"IHDR"
    return struct.unpack(">II", blob[16:24])


def test_plots_are_valid_pngs_of_a_sensible_size(db_url, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    store = Store.open(db_url)
    try:
        ids = add_jobs(store, [(p, "RUNNING", None) for p, _, _ in GRID])
        for job_id, (_params, _, results) in zip(ids, GRID):
            job = store.job(job_id)
            store.log_metrics(
                job_id, job.lease, [(s, "valid_error", results["valid_error"] * (5 - s)) for s in range(5)]
            )
            store.finish(job_id, job.lease, "DONE", results=results)
    finally:
        store.dispose()
    code, out, err = cli("report", db_url, "--plot", str(tmp_path / "plots"), "--curves", "3", capsys=capsys)
    assert code == 0, err
    files = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert files == ["valid_error_learning_curves.png", "valid_error_vs_act.png", "valid_error_vs_nhid.png"]
    for name in files:
        width, height = png_size(tmp_path / "plots" / name)
        assert 400 <= width <= 3000 and 300 <= height <= 2000
        assert (tmp_path / "plots" / name).stat().st_size > 10_000  # drawn, not blank
    assert "valid_error_vs_nhid.png" in err and out.strip()  # the report still went to stdout


def test_plotting_without_matplotlib_is_one_sentence(monkeypatch):
    from jobman.jobdb.report import plots

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UsageError, match=r"pip install 'jobman-sql\[plot\]'"):
        plots.require_matplotlib()


# -- a real fan-in job choosing its configuration --------------------------------------------

EXPERIMENT = '''
    """A tiny sweep: valid_error is lowest at lr=0.01; the fan-in job retrains with the best."""

    from jobman.jobdb.report import best


    def train(state, channel):
        error = abs(state.lr - 0.01) * 10 + 0.02 + 0.001 * state.id_cross_fold
        for step in range(3):
            channel.log(step, valid_error=error * (3 - step))
        state.valid_error = error
        state.train_error = error / 2


    def retrain(state, channel):
        records = [{"params": p.params, "results": p.results, "status": "DONE", "job_id": p.job_id}
                   for p in channel.parents]
        chosen = best(records, metric="valid_error", mode="min")
        state.chosen = dict(chosen.params)
        state.chosen_mean = chosen.mean
        state.chosen_n = chosen.n
        state.chosen_jobs = chosen.job_ids
'''


def test_a_fan_in_job_chooses_the_best_config_of_a_real_sweep(db_url, tmp_path, jobman, capsys):
    module = f"report_sweep_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(EXPERIMENT))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    run = lambda *args: jobman(*args, cwd=tmp_path, env=env, timeout=120)  # noqa: E731

    r = run("sqlschedule", db_url, f"{module}:train", "lr={{0.01,0.1}}", "id_cross_fold={{0,1,2}}", "nb_cross_fold=3")
    assert r.code == 0, r.err
    r = run("sqlschedule", db_url, f"{module}:retrain", "stage=final", "--after", "phase=0")
    assert r.code == 0, r.err
    r = run("worker", db_url, "--idle-timeout", "30", "--heartbeat", "1")
    assert r.code == 0, r.err

    store = Store.open(db_url)
    try:
        jobs = store.jobs()
        assert [j.status.value for j in jobs] == ["DONE"] * 7
        fan_in = next(j for j in jobs if j.target.endswith(":retrain"))
        best_ids = [j.id for j in jobs if j.params.get("lr") == 0.01]
        assert fan_in.depends_on == sorted(j.id for j in jobs if j is not fan_in)
        assert fan_in.results["chosen"] == {"lr": 0.01, "nb_cross_fold": 3}
        assert fan_in.results["chosen_n"] == 3 and fan_in.results["chosen_jobs"] == best_ids
        assert fan_in.results["chosen_mean"] == pytest.approx(0.021)
    finally:
        store.dispose()

    code, out, _ = cli("report", db_url, "--format", "json", capsys=capsys)
    data = json.loads(out)
    assert code == 0 and data["best"]["params"] == {"lr": 0.01, "nb_cross_fold": 3}
    assert data["dropped"] == [{"phase": fan_in.phase, "target": f"{module}:retrain", "jobs": 1}]
    code, out, _ = cli("report", db_url, capsys=capsys)
    assert code == 0 and "best: lr=0.01 — valid_error 0.021 ± 0.0010 over 3 folds" in out


# -- the database's grouping agrees with the Python path --------------------------------------


def put_jobs(
    store: Store, jobs: list[tuple[dict, str, dict | None]], *, phase: int = 0, target: str = TARGET
) -> list[int]:
    """Schedule ``(params, status, results)`` jobs and write their status and results as they are."""
    import sqlalchemy as sa

    from jobman.jobdb.schema import job as t_job

    ids = store.schedule([JobSpec(phase, "fn", target, p, None) for p, _, _ in jobs]).job_ids
    with store.engine.begin() as conn:
        for job_id, (_, status, results) in zip(ids, jobs):
            conn.execute(
                sa.update(t_job)
                .where(t_job.c.id == job_id)
                .values(status=status, results=None if results is None else json.dumps(results, sort_keys=True))
            )
    return ids


def same_report(store: Store, metric: str = "valid_error", mode: str = "min", **options) -> report.Report:
    """The report from the database and from every job in Python: equal row by row, and in every format."""
    in_db = report.from_store(store, metric, mode, **options)
    in_py = report.from_store_in_python(store, metric, mode, **options)
    assert in_db.summary is not None and in_py.summary is None  # the two paths did run
    for name in ("group_over", "outer", "constant", "varying", "columns", "jobs", "dropped", "configurations"):
        assert getattr(in_db, name) == getattr(in_py, name), name
    assert len(in_db.rows) == len(in_py.rows)
    for a, b in zip(in_db.rows, in_py.rows):
        assert (
            a.params,
            a.phase,
            a.target,
            a.outer,
            a.rank,
            a.best,
            a.eligible,
            a.complete,
            a.expected,
            a.status,
            a.job_ids,
            a.all_job_ids,
            a.first_id,
        ) == (
            b.params,
            b.phase,
            b.target,
            b.outer,
            b.rank,
            b.best,
            b.eligible,
            b.complete,
            b.expected,
            b.status,
            b.job_ids,
            b.all_job_ids,
            b.first_id,
        ), b.params
        assert a.stats.keys() == b.stats.keys()
        for name, s in b.stats.items():
            t = a.stats[name]
            assert (t.n, t.mean, t.min, t.max) == (s.n, pytest.approx(s.mean, rel=1e-12), s.min, s.max)
            assert t.std == (None if s.std is None else pytest.approx(s.std, rel=1e-9, abs=1e-15))
    best_in_db = {k: r.params for k, r in in_db.best_by_outer.items()}
    assert best_in_db == {k: r.params for k, r in in_py.best_by_outer.items()}
    assert in_db.summary_lines() == in_py.summary_lines()
    assert in_db.constant_results == in_py.constant_results
    assert in_db.outer_values == in_py.outer_values and in_db.scopes == in_py.scopes
    # Held a page at a time, the rest streamed from the database: the same rows.
    with report.open_report(store, metric, mode, keep=2, **options) as part:
        assert len(part.rows) <= 2 * max(len(part.outer_values), 1)
        assert [r.to_dict() for r in part.iter_rows()] == [r.to_dict() for r in in_db.rows]
        assert [json.loads(t) for t in part.iter_json()] == [r.to_dict() for r in in_db.rows]
        assert part.summary_lines() == in_py.summary_lines()
    if not part.holds_all:  # closed: what it holds stays readable, the rest says where to find it
        assert part.rows and part.best_by_outer
        with pytest.raises(UsageError, match="while it is open"):
            list(part.iter_rows())
    return in_db


def assert_close(got, want, where: str = "") -> None:
    """Equal, floats to 1e-9 (a std from sums of squares, not from deviations)."""
    if isinstance(want, float) and isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-15), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for k in want:
            assert_close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def folds_and_ties(lr: float, values: list[float | None], statuses: list[str] | None = None, **more):
    statuses = statuses or ["DONE"] * len(values)
    return [
        (
            {"lr": lr, "nb_cross_fold": 3, "id_cross_fold": i, **more},
            s,
            None if v is None else {"valid_error": v, "epochs": 20, "note": "text", "_private": 1.0},
        )
        for i, (v, s) in enumerate(zip(values, statuses))
    ]


def test_the_database_and_python_agree_on_folds_missing_metrics_and_ties(store, db_url, capsys, monkeypatch):
    jobs = (
        folds_and_ties(0.1, [0.2, 0.1, 0.3])  # mean 0.2
        + folds_and_ties(0.2, [0.1, 0.2, 0.3])  # the same values in another order: a tie, by std then id
        + folds_and_ties(0.3, [0.15, 0.15, 0.3])  # mean 0.2 again, a lower std: first of the three
        + folds_and_ties(0.35, [0.5, 0.5, 0.5], warmup=5)  # a parameter the first and last jobs lack
        + folds_and_ties(0.4, [0.01, None, 0.02], ["DONE", "DONE", "FAILED"])  # a fold without the metric
        + folds_and_ties(0.5, [0.3, 0.3, 0.3], ["DONE", "RUNNING", "QUEUED"])
        + folds_and_ties(0.6, [None, None, None], ["QUEUED"] * 3)  # nothing yet
        + folds_and_ties(0.7, [1 / 3, 1 / 3])
    )  # one fold short of the others
    put_jobs(store, jobs)
    rep = same_report(store)
    assert [r.params["lr"] for r in rep.rows][:3] == [0.3, 0.1, 0.2] and rep.best.params["lr"] == 0.3
    assert rep.constant == {"nb_cross_fold": 3} and rep.constant_results == {}  # lr=0.6 has no epochs yet
    assert same_report(store, where=["lr<=0.3"]).constant_results == {"epochs": 20.0}
    same_report(store, allow_incomplete=True)
    same_report(store, "valid_error", "max")
    same_report(store, where=["lr>=0.3"])
    same_report(store, group_over=[])
    # json and csv stream every configuration past the first ones held: the same document.
    import jobman.cli.report as cli_report

    monkeypatch.setattr(cli_report, "STREAMED_AFTER", 2)
    expected = report.from_store_in_python(store, "valid_error").to_dict()
    code, out, _ = cli("report", db_url, "--format", "json", capsys=capsys)
    data = json.loads(out)
    assert code == 0 and len(data["rows"]) == 8
    assert_close(data, {"experiment": store.experiment, "where": [], **json.loads(json.dumps(expected))})
    code, out, _ = cli("report", db_url, "--format", "csv", capsys=capsys)
    assert code == 0 and len(list(csv.reader(io.StringIO(out)))) == 9


def test_names_beyond_ascii_are_grouped_and_averaged_as_in_python(store):
    # SQLite's JSON paths miss a key stored escaped (a Greek letter, a control character): such a
    # report is made as the Python path makes it, never with the key silently left out.
    jobs = [
        (
            {"α": a, "note\x01": "x", "id_cross_fold": i, "nb_cross_fold": 2},
            "DONE",
            {"valid_error": a + i / 10, "λ": 2 * a + i},
        )
        for a in (0.3, 0.1, 0.2)
        for i in range(2)
    ]
    put_jobs(store, jobs)
    for metric in ("valid_error", "λ"):
        got = report.from_store(store, metric)
        want = report.from_store_in_python(store, metric)
        assert [(r.params, r.job_ids, {k: (s.n, s.mean) for k, s in r.stats.items()}) for r in got.rows] == [
            (r.params, r.job_ids, {k: (s.n, s.mean) for k, s in r.stats.items()}) for r in want.rows
        ]
        assert [r.params["α"] for r in got.rows] == [0.1, 0.2, 0.3] and got.best.stats[metric].n == 2
    assert store.select_ids(params={"α": 0.2}) == store.select_ids(params={"α": 0.2, "note\x01": "x"})
    assert len(store.select_ids(params={"α": 0.2})) == 2


def test_the_database_and_python_agree_on_seeds_rounding_ties_phases_and_outer_folds(store):
    # Means equal to 12 significant digits but not to the last bit: ranked as equal, then by std.
    seeds = [
        ({"act": a, "seed": s}, "DONE", {"valid_error": v, "accuracy": 1 - v})
        for a, vals in (("relu", [0.1, 0.2]), ("tanh", [0.15, 0.15]), ("elu", [0.3, 0.0]))
        for s, v in enumerate(vals)
    ]
    put_jobs(store, seeds)
    put_jobs(store, [({"act": "relu", "seed": 0, "finetune": True}, "DONE", {"loss": 1.0})], phase=1)
    rep = same_report(store)
    assert rep.dropped == [(1, TARGET, 1)] and [r.params["act"] for r in rep.rows] == ["tanh", "relu", "elu"]
    same_report(store, "accuracy", "max", phase=0)
    with pytest.raises(UnknownMetric, match="numeric results: accuracy, loss, valid_error"):
        report.from_store(store, "nope")

    # A run of 150 means equal to 12 digits (not to the last bit) goes on past the first rows read.
    put_jobs(
        store, [({"x": i}, "DONE", {"valid_error": 0.15 if i % 2 else (0.1 + 0.2) / 2}) for i in range(150)], phase=3
    )
    rep = same_report(store, phase=3)
    assert [r.params["x"] for r in rep.rows[:3]] == [0, 1, 2]

    nested = [
        ({"lr": lr, "id_outer_fold": o, "id_cross_fold": i}, "DONE", {"valid_error": lr * (o + 1) + i / 100})
        for o in range(3)
        for lr in (0.1, 0.2)
        for i in range(2)
    ]
    put_jobs(store, nested, phase=2, target="tests.fake:nested")
    rep = same_report(store, phase=2)
    assert rep.outer == "id_outer_fold" and set(rep.best_by_outer) == {0, 1, 2} and rep.overall


def report_reads(store: Store, build) -> tuple[bool, int]:
    """Whether ``build()`` reads the result keys of every job (rather than of the two sampled), and how
    many times it groups the jobs."""
    import sqlalchemy as sa

    ran: list[str] = []
    listener = lambda *sent: ran.append(sent[2])  # noqa: E731 (conn, cursor, statement, ...)
    sa.event.listen(store.engine, "before_cursor_execute", listener)
    try:
        build()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", listener)
    return (
        any("json_each(job.results)" in s or "jsonb_each(job.results)" in s for s in ran),
        sum("CREATE TEMP TABLE" in s for s in ran),
    )


def test_result_keys_read_from_two_jobs_miss_no_rare_result(store):
    # The first and the last DONE job tell the report's result keys; a key only jobs between them
    # report (as a number, or as a number where those two hold text) is still listed, as in Python.
    import dataclasses

    def sweep(more: dict[int, dict]) -> list[tuple[dict, str, dict]]:
        return [
            (
                {"lr": lr, "id_cross_fold": i, "nb_cross_fold": 2},
                "DONE",
                {"valid_error": lr + i / 10, "note": "text", "_private": 1.0, **more.get(2 * c + i, {})},
            )
            for c, lr in enumerate((0.3, 0.1, 0.2, 0.4))
            for i in range(2)
        ]

    put_jobs(store, sweep({}))
    assert report_reads(store, lambda: report.from_store(store, "valid_error")) == (False, 1)  # the two told it all
    same_report(store)
    assert report.from_store(store, "valid_error").columns == ["valid_error"]
    for name, rare, column, numbers, groupings in (
        ("rare", {3: {"test_error": 0.5}}, "test_error", 1, 2),  # in one job of eight: grouped again
        ("text_then_number", {4: {"note": 2.5}}, "note", 1, 2),  # a number where the sampled hold text
        ("boolean", {5: {"test_error": 1.0}, 6: {"test_error": True}}, "test_error", 1, 2),  # True is no number
        ("text_only", {3: {"status_note": "slow"}, 4: {"_seconds": 3.5}}, None, 0, 1),
    ):  # no column: grouped once
        other = Store(dataclasses.replace(store.target, experiment=f"{store.experiment}_{name}"))
        put_jobs(other, sweep(rare))
        reads = report_reads(other, lambda other=other: report.from_store(other, "valid_error"))
        assert reads == (True, groupings), name
        same_report(other)
        rep = report.from_store(other, "valid_error")
        assert rep.columns == ["valid_error", *([column] if column else [])], name
        assert sum(r.stats[column].n for r in rep.rows if column in r.stats) == numbers if column else True, name
        other.dispose()


def test_a_spread_of_configurations_picked_by_the_database_is_the_python_paths(store):
    # What the dashboard's charts draw of a report too large to hold: every k-th configuration with
    # the metric, picked by the database as the Python path picks them from its ranking.
    put_jobs(
        store,
        [
            ({"lr": lr, "id_cross_fold": i}, "DONE", {"valid_error": lr * (i + 1)} if lr != 0.5 else {})
            for lr in (0.3, 0.1, 0.7, 0.2, 0.5, 0.4, 0.6)
            for i in range(2)
        ],
    )
    in_py = report.from_store_in_python(store, "valid_error")
    for count in (1, 2, 3, 6):
        with report.open_report(store, "valid_error", keep=1, sample=count) as part:
            assert not part.holds_all
            want = report.spread(iter(in_py.rows), 6, count)
            assert_close([r.to_dict() for r in part.sample], [r.to_dict() for r in want], str(count))
            assert len(part.sample) == len(want) > 0


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_json_rows_read_a_list_at_a_time_keep_the_order_of_ties_across_lists(store, monkeypatch, size):
    # The json rows are read from the database a list at a time (thousands; here ``size``): a run of
    # equal means that goes on from one list into the next is still put in the Python path's order.
    from jobman.jobdb.report import queries

    monkeypatch.setattr(queries, "BATCH", size)
    # On PostgreSQL, libpq 17 on reads them in chunks; with size 3 as an older libpq does, by a named cursor.
    monkeypatch.setattr(queries, "_chunked_mode", lambda: size != 3)
    third = (0.1 + 0.2) / 3  # 0.1 to 12 digits, not to the last bit
    jobs = (
        folds_and_ties(0.05, [0.01, 0.02, 0.03])
        + folds_and_ties(0.1, [0.2, 0.1, 0.3])
        + folds_and_ties(0.2, [0.1, 0.2, 0.3])  # a tie: by id
        + folds_and_ties(0.3, [0.15, 0.15, 0.3])  # the same mean, a lower std: first
        + folds_and_ties(0.4, [0.2, 0.2, 0.2])  # the same mean, no spread: first of all
        + folds_and_ties(0.45, [0.3, 0.3])
        + folds_and_ties(0.46, [0.3, 0.3])  # fewer runs: not eligible
        + folds_and_ties(0.5, [third, third, third])
        + folds_and_ties(0.6, [0.1, 0.1, 0.1])
        + folds_and_ties(0.7, [0.05, 0.1, 0.15])
        + folds_and_ties(0.8, [0.1, 0.1, 0.1])
        + folds_and_ties(0.9, [0.4, None, 0.4], ["DONE", "FAILED", "DONE"])
        + folds_and_ties(0.95, [None, None, None], ["QUEUED"] * 3)
        + folds_and_ties(0.99, [None, None, None], ["QUEUED"] * 3)
    )
    put_jobs(store, jobs)
    for options in ({}, {"group_over": []}, {"allow_incomplete": True}):
        for mode in ("min", "max"):
            in_db = same_report(store, "valid_error", mode, **options)
            with report.open_report(store, "valid_error", mode, keep=2, **options) as part:
                texts = list(part.iter_json())
                lists = list(part.iter_json_lists())
            assert [json.loads(t) for t in texts] == [r.to_dict() for r in in_db.rows]
            assert [t for rows in lists for t in rows] == texts


def test_json_of_configurations_of_one_run_is_the_python_paths(store):
    # A configuration of one DONE job with every result is written by a shorter route: the best, the
    # next ones, one that is not eligible (its scope's others have two runs), one missing a result,
    # one not DONE, and one per outer fold, each as the Python path writes it.
    one = [
        ({"lr": lr, "nhid": 8}, "DONE", {"valid_error": v, "train_error": v / 2})
        for lr, v in ((0.1, 0.3), (0.2, 0.1), (0.3, 0.2), (0.4, 1e-7), (0.5, 1e22))
    ]
    one += [
        ({"lr": 0.6, "nhid": 8}, "DONE", {"valid_error": 0.25}),  # without train_error
        ({"lr": 0.7, "nhid": 8}, "RUNNING", None),
    ]
    put_jobs(store, one)
    put_jobs(
        store,
        [({"lr": 0.1, "nhid": 16, "seed": s}, "DONE", {"valid_error": 0.05, "train_error": 0.01}) for s in (1, 2)]
        + [({"lr": 0.2, "nhid": 16, "seed": 1}, "DONE", {"valid_error": 0.01, "train_error": 0.01})],
        phase=1,
    )
    put_jobs(
        store,
        [
            ({"lr": lr, "id_outer_fold": o}, "DONE", {"valid_error": lr * (o + 1), "train_error": lr})
            for o in range(2)
            for lr in (0.1, 0.2)
        ],
        phase=2,
    )
    for phase in (0, 1, 2):
        for mode in ("min", "max"):
            rep = same_report(store, phase=phase, mode=mode)
            assert any(r.n == 1 for r in rep.rows) and len(rep.rows) >= 2


def test_sqlite_lets_a_large_report_table_go_with_its_connection_and_keeps_a_small_ones(tmp_path, monkeypatch):
    # A report's temporary table is dropped, or, above a size, closed with its connection (far faster at
    # a million configurations); either way the pool's next connection holds no table and the store's
    # own cache, and the next report reads the same.
    from jobman.jobdb.engine import SQLITE_CACHE_KIB
    from jobman.jobdb.report import queries

    store = Store.open(f"sqlite:///{tmp_path / 'jobs.db'}", "exp")
    put_jobs(store, [({"lr": lr / 10}, "DONE", {"valid_error": lr / 7}) for lr in range(1, 9)])

    def pooled() -> tuple[Any, list, int]:
        with store.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            return (
                raw,
                raw.execute("SELECT name FROM sqlite_temp_master").fetchall(),
                raw.execute("PRAGMA cache_size").fetchone()[0],
            )

    first, tables, cache = pooled()
    assert not tables and cache == -SQLITE_CACHE_KIB
    want = [r.to_dict() for r in report.from_store(store, "valid_error").rows]
    assert pooled() == (first, [], -SQLITE_CACHE_KIB)  # 8 configurations: dropped, the connection kept
    monkeypatch.setattr(queries, "CLOSE_ABOVE", 5)
    assert [r.to_dict() for r in report.from_store(store, "valid_error").rows] == want
    other, tables, cache = pooled()
    assert other is not first and not tables and cache == -SQLITE_CACHE_KIB  # closed with it: a new one
    assert [r.to_dict() for r in report.from_store(store, "valid_error").rows] == want
    store.dispose()


def test_a_parallel_report_reads_the_jobs_with_workers_on_postgresql_and_ranks_the_same(engine_name, tmp_path, request):
    """On PostgreSQL the grouping's plan gathers parallel workers, asked for ``parallel`` or not (in a
    database of its own, where a table option lets the planner consider them for a test-sized table),
    and each configuration's jobs are summed in the order of their ids: the report is the same to the
    last bit. On SQLite ``parallel`` groups in two halves: the same report, means to their last bits aside."""
    import random

    from sqlalchemy import event

    url = f"sqlite:///{tmp_path / 'jobs.db'}" if engine_name == "sqlite" else request.getfixturevalue("own_pg_database")
    store = Store.open(url, "parallel")
    request.addfinalizer(store.dispose)
    rng = random.Random(3)
    put_jobs(
        store,
        [
            (
                {"lr": c / 1000, "nhid": 32 * (c % 3 + 1), "fold": f},
                "DONE",
                {"valid_error": rng.random(), "train_error": rng.random()},
            )
            for c in range(1200)
            for f in range(5)
        ],
    )
    plans: list[str] = []

    def explain(conn, cursor, statement, params, context, executemany):
        if statement.startswith("CREATE TEMP TABLE") and conn.dialect.name == "postgresql":
            select = statement.split(" AS ", 1)[1]
            with conn.connection.dbapi_connection.cursor() as cur:  # same transaction, same settings
                cur.execute("EXPLAIN " + select, params)
                plans.append("\n".join(r[0] for r in cur.fetchall()))

    pg = engine_name == "postgresql"
    if pg:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE job SET (parallel_workers = 2)")
            conn.exec_driver_sql("ANALYZE job")
    event.listen(store.engine, "after_cursor_execute", explain)
    try:
        got = {}
        for parallel in (False, True):
            with report.open_report(store, "valid_error", keep=10, sample=50, parallel=parallel) as rep:
                got[parallel] = rep
    finally:
        event.remove(store.engine, "after_cursor_execute", explain)
    if pg:
        assert len(plans) == 2 and all("Workers Planned: 2" in p and "Gather Merge" in p for p in plans), plans
    one, other = got[False], got[True]
    assert other.configurations == one.configurations == 1200 and other.jobs == one.jobs == 6000
    assert [(r.params, r.all_job_ids, r.n) for r in other.rows] == [(r.params, r.all_job_ids, r.n) for r in one.rows]
    if pg:
        assert [(r.mean, r.std) for r in other.rows] == [(r.mean, r.std) for r in one.rows]
    assert [r.mean for r in other.rows] == pytest.approx([r.mean for r in one.rows], rel=1e-12)
    assert [r.params for r in other.sample] == [r.params for r in one.sample]


@pytest.mark.parametrize("folds_outside", [False, True], ids=["configurations-outside", "folds-outside"])
def test_sqlite_groups_a_large_selection_in_two_halves_at_once_and_reports_the_same(tmp_path, folds_outside):
    """``parallel`` on SQLite: the lower and upper halves of the jobs are grouped on two connections
    at once (the upper in a thread of its own) and joined. A configuration with jobs in both halves
    (every one when the folds are the sweep's outer loop) is one row, with the same jobs, statuses,
    counts and extremes as one grouping gives, and its means to their last bits."""
    import random
    import threading

    from sqlalchemy import event

    store = Store.open(f"sqlite:///{tmp_path / 'jobs.db'}", "halves")
    rng = random.Random(5)
    pairs = (
        [(c, f) for f in range(5) for c in range(2500)]
        if folds_outside
        else [(c, f) for c in range(2500) for f in range(5)]
    )
    jobs = []
    for c, f in pairs:
        status = "DONE" if (c + f) % 11 else ("RUNNING" if c % 2 else "CRASHED")
        results = None
        if status == "DONE" and (c * 5 + f) % 13:  # a DONE job without the metric now and then
            results = {"valid_error": rng.random(), "train_error": rng.random()}
        elif status == "DONE":
            results = {"train_error": rng.random()}
        jobs.append(({"lr": c / 1000, "nhid": 32 * (c % 3 + 1), "fold": f}, status, results))
    put_jobs(store, jobs)
    halves: list[str] = []

    def seen(conn, cursor, statement, params, context, executemany):
        if "job.id >=" in statement:
            halves.append(threading.current_thread().name)

    got = {}
    for parallel in (False, True):
        event.listen(store.engine, "before_cursor_execute", seen)
        try:
            with report.open_report(store, "valid_error", parallel=parallel, allow_incomplete=True) as rep:
                got[parallel] = rep
        finally:
            event.remove(store.engine, "before_cursor_execute", seen)
        # (grouped twice: the metric missing from a DONE job is found by the first grouping)
        assert halves == (["jobman-report-half"] * 2 if parallel else []), halves
    one, other = got[False], got[True]
    assert other.configurations == one.configurations == 2500 and other.jobs == one.jobs == 12_500
    assert len(other.rows) == len(one.rows) == 2500
    for a, b in zip(one.rows, other.rows):
        assert (b.params, b.rank, b.status, b.job_ids, b.all_job_ids, b.first_id, b.complete, b.eligible) == (
            a.params,
            a.rank,
            a.status,
            a.job_ids,
            a.all_job_ids,
            a.first_id,
            a.complete,
            a.eligible,
        )
        assert b.stats.keys() == a.stats.keys()
        for name, s in a.stats.items():
            t = b.stats[name]
            assert (t.n, t.min, t.max) == (s.n, s.min, s.max)
            assert t.mean == pytest.approx(s.mean, rel=1e-12)
            assert (t.std is None) == (s.std is None) and (s.std is None or t.std == pytest.approx(s.std, rel=1e-9))


def test_opening_a_store_and_reading_it_never_imports_the_report(db_url):
    # A worker opens the store for every job it claims: the report (and NumPy) stay out of its process.
    # The --where language it shares with the dashboard is jobdb.selection, at the bottom of jobdb.
    import subprocess

    code = textwrap.dedent(f"""
        import sys
        from jobman.jobdb.store import Store
        from jobman.jobdb.sweep import JobSpec
        import jobman.dispatch.worker
        store = Store.open({db_url!r}, "imports")
        store.schedule([JobSpec(0, "fn", "tests.fake:train", {{"lr": 0.1}}, None)])
        store.jobs(limit=5), store.counts(), store.outstanding(), store.experiments()
        print(sorted(m for m in sys.modules if m.startswith("jobman.jobdb.report") or m == "numpy"))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_report_and_the_selection_module_import_each_other_in_one_direction_only():
    # The selection language sits below the report; the report's SQL sits below its engines.
    import ast

    here = Path(report.__file__).parent
    selection = ast.parse((here.parent / "selection.py").read_text())
    assert not [
        n
        for n in ast.walk(selection)
        if isinstance(n, ast.ImportFrom) and n.module and ("report" in n.module or "store" in n.module)
    ]
    queries = ast.parse((here / "queries.py").read_text())
    assert not [n for n in ast.walk(queries) if isinstance(n, ast.ImportFrom) and n.level == 1]


def test_the_cv_retrain_reads_its_parents_through_the_channel_only():
    # models may use only the experiment API: the retrain's selection is channel.best.
    import ast

    import jobman.models.cv as cv

    tree = ast.parse(Path(cv.__file__).read_text())
    modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if "jobdb" in m], modules


def test_the_json_of_one_run_rows_with_results_missing_here_and_there_is_the_reports(store):
    # The JSON writer's rows of one run (most of their text known) and its other rows, side by side:
    # a second result missing from some jobs, a metric missing from others, values equal and apart.
    jobs = [
        ({"lr": lr}, "DONE", {"valid_error": lr / 3, **({"epochs": 7} if i % 3 else {})})
        for i, lr in enumerate((0.1, 0.2, 0.3, 0.4, 0.5, 0.6))
    ]
    jobs += [({"lr": 0.7}, "DONE", {"epochs": 2}), ({"lr": 0.8}, "FAILED", None), ({"lr": 0.9}, "QUEUED", None)]
    put_jobs(store, jobs)
    for options in ({}, {"allow_incomplete": True}):
        same_report(store, "valid_error", **options)
        same_report(store, "valid_error", "max", **options)

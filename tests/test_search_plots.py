"""``report --plot`` for searches, on real jobs run by real workers: the metric against each sampled
parameter on the axis its distribution calls for (as recorded when the sweep was scheduled), and the
rungs of a successive-halving search, one line per configuration. The figures are inspected as
matplotlib objects (scales, points, lines), not as pixels."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from search_helpers import by_phase, experiment_module

from jobman.jobdb.report import from_store, plots, scales
from jobman.jobdb.store import Store

MODULE = "jm_plot_exp"
TRAINER = textwrap.dedent('''
    """Best near lr=0.01; continues from its workdir's epoch count, as a promoted job must."""
    import math


    def fit(state, channel):
        count = channel.workdir / "epochs.txt"
        start = int(count.read_text()) if count.exists() else 0
        err = 0.0
        for epoch in range(start, state.epochs):
            count.write_text(str(epoch + 1))
            err = abs(math.log10(state.lr) + 2) + 0.1 * abs(state.wd - 2) + 1.0 / (epoch + 1)
            channel.log(epoch + 1, err=err)
        state.err = err
''')
FAST = ("--heartbeat", "0.2", "--grace", "2")


@pytest.fixture
def exp(tmp_path: Path):
    return experiment_module(tmp_path, MODULE, TRAINER)


def run_search(jobman, url, exp, *extra):
    made = jobman(
        "sqlschedule",
        url,
        f"{MODULE}:fit",
        "lr=loguniform(1e-4,1)",
        "wd=loguniform(1,3)",
        "mom=uniform(0.5,0.99)",
        "nhid=choice(16,32)",
        *extra,
        env=exp.env,
    )
    assert made.code == 0, made.err
    work = jobman("worker", url, "--exproot", str(exp.runs), *FAST, env=exp.env, timeout=180)
    assert work.code == 0, work.err


def figures_of(store: Store, phase: int | None = None) -> dict:
    report = from_store(store, "err", phase=phase)
    made = plots.figures(
        report,
        store.metrics,
        curves=3,
        space=store.search_space(),
        searches=store.search_rungs(),
        finished=lambda: plots.finish_order(store, "err", phase),
    )
    return {name: fig for name, fig in made}


def points_drawn(ax) -> int:
    """Configurations shown by the errorbar series of a metric-vs-parameter plot."""
    return sum(len(c.lines[0].get_xdata()) for c in ax.containers)


def test_a_random_search_plots_each_drawn_parameter_on_its_distributions_scale(jobman, db_url, store, exp, tmp_path):
    run_search(jobman, db_url, exp, "epochs=2", "--samples", "12", "--seed", "3")
    figs = figures_of(store)
    assert set(figs) == {
        "err_vs_lr.png",
        "err_vs_wd.png",
        "err_vs_mom.png",
        "err_vs_nhid.png",
        "err_best_so_far.png",
        "err_learning_curves.png",
    }
    scale = {key: figs[f"err_vs_{key}.png"].axes[0].get_xscale() for key in ("lr", "wd", "mom", "nhid")}
    # wd spans less than a factor of 3: its values alone do not look log-spaced, its loguniform() does.
    assert scale == {"lr": "log", "wd": "log", "mom": "linear", "nhid": "linear"}
    assert scales.looks_log_spaced([j.params["wd"] for j in store.jobs()]) is False
    for key in ("lr", "wd", "mom", "nhid"):
        assert points_drawn(figs[f"err_vs_{key}.png"].axes[0]) == 12
    assert "loguniform(0.0001,1)" in figs["err_vs_lr.png"].axes[0].get_xlabel()
    # The search's best so far: every job in the order it finished, and the running minimum.
    jobs = sorted(store.jobs(), key=lambda j: j.finished_at)
    dots, best = figs["err_best_so_far.png"].axes[0].get_lines()
    assert list(dots.get_ydata()) == pytest.approx([j.results["err"] for j in jobs])
    running = [min(j.results["err"] for j in jobs[: i + 1]) for i in range(len(jobs))]
    assert list(best.get_ydata()) == pytest.approx(running)
    for fig in figs.values():
        plt.close(fig)
    out = jobman("report", db_url, "--metric", "err", "--plot", str(tmp_path / "plots"))
    assert out.code == 0, out.err
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(figs)
    assert "search" not in out.out  # the recorded draws are no search to summarise


def test_a_halving_search_plots_its_rungs_with_the_promoted_configurations_drawn_on(jobman, db_url, store, exp):
    run_search(
        jobman, db_url, exp, "--samples", "9", "--seed", "1", "--halving", "epochs=1:9", "--eta", "3", "--metric", "err"
    )
    rungs = by_phase(store)
    assert [len(rungs[k]) for k in sorted(rungs)] == [9, 3, 1]
    figs = figures_of(store)
    assert "err_rungs.png" in figs
    ax = figs["err_rungs.png"].axes[0]
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [1, 3, 9]
    lines = {line.get_gid(): line for line in ax.get_lines() if (line.get_gid() or "").startswith("config:")}
    assert len(lines) == 9  # one per configuration
    lengths = sorted(len(line.get_xdata()) for line in lines.values())
    assert lengths == [1] * 6 + [2, 2, 3]  # six stopped at 1 epoch, three promoted to 3, one of them to 9
    winner = rungs[2][0]
    [star] = [line for line in ax.get_lines() if line.get_gid() == "best"]
    assert (star.get_xdata()[0], star.get_ydata()[0]) == (9, pytest.approx(winner.results["err"]))
    longest = max(lines.values(), key=lambda line: len(line.get_xdata()))
    assert list(longest.get_xdata()) == [1, 3, 9]
    assert list(longest.get_ydata()) == pytest.approx(
        [next(j for j in rungs[k] if j.params["lr"] == winner.params["lr"]).results["err"] for k in range(3)]
    )
    # Against a drawn parameter: every (configuration, rung) row, one colour per rung, on a log axis.
    ax = figs["err_vs_lr.png"].axes[0]
    assert ax.get_xscale() == "log" and points_drawn(ax) == 13 and len(ax.containers) == 3
    assert sorted(c.get_label() for c in ax.containers) == [f"epochs={e} (mean ± std)" for e in (1, 3, 9)]
    for fig in figs.values():
        plt.close(fig)


def test_the_python_api_records_the_distributions_it_draws_from(tmp_path):
    import jobman

    exp = jobman.Experiment(f"sqlite:///{tmp_path / 'api.db'}?table=t", backend=None)
    try:
        exp.schedule(
            "jobman.models.mlp:train lr=loguniform(1e-4,1e-1) momentum=uniform(0.5,0.99)", samples=4, check=False
        )
        space = exp.store.search_space()
        assert {k: (d.name, d.log_scale) for k, d in space.items()} == {
            "lr": ("loguniform", True),
            "momentum": ("uniform", False),
        }
        assert exp.store.search_summaries() == []
    finally:
        exp.close()

"""Axes a researcher would keep, the same on the dashboard (SVG), in ``report --plot`` and in a notebook
(matplotlib): a parameter swept by factors on a log axis, one point in a range around itself.

The charts are drawn from real experiments run on both engines; the SVG is read as markup, the
figures as matplotlib objects."""

from __future__ import annotations

import re

import pytest

import jobman
from jobman.jobdb.distributions import choice, loguniform, uniform
from jobman.jobdb.report.scales import log_axis, looks_log_spaced, span
from jobman.web import charts, pages


def fit(lr, nhid=32, channel=None):
    """Best at lr=0.01; logs as many steps as it is asked for."""
    err = abs(lr - 0.01) * 10 + 1.0 / nhid
    channel.log(1, err=err)
    return {"err": err}


def test_the_rules_log_scale_what_was_swept_by_factors_and_never_what_was_not():
    assert looks_log_spaced([0.001, 0.01]) and looks_log_spaced([0.001, 0.003, 0.01, 0.03, 0.1])
    assert not looks_log_spaced([16, 32]) and not looks_log_spaced([0.1, 0.2, 0.3, 0.4])
    assert not looks_log_spaced([0.01]) and not looks_log_spaced([0, 1, 10])
    # A drawn parameter's distribution decides, whatever its values look like.
    assert log_axis([1.5, 2.5], loguniform(1, 3)) and not log_axis([0.001, 0.1], uniform(0, 1))
    assert log_axis([0.001, 0.01], choice(0.001, 0.01))  # a choice says nothing of scale: its values do
    assert not log_axis([-1.0, 10.0, 100.0])


def test_one_value_is_shown_in_a_range_around_itself():
    assert span(0.03, 0.03) == pytest.approx((0.027, 0.033))
    assert span(-5.0, -5.0) == pytest.approx((-5.5, -4.5))
    assert span(0.0, 0.0) == (-1.0, 1.0)
    assert span(0.01, 0.01, log=True) == pytest.approx((0.01 / 10**0.5, 0.01 * 10**0.5))
    assert span(1.0, 2.0) == (1.0, 2.0)


def ticks(svg: str) -> list[str]:
    return re.findall(r'class="tick"[^>]*>([^<]*)<', str(svg))


def test_a_one_point_learning_curve_on_the_dashboard_spans_its_value_not_minus_one_to_one():
    svg = charts.lines([("job 1", [(0, 0.03)])], "step", "valid_error")
    labels = ticks(svg)
    assert "0.027" in labels and "0.033" in labels, labels
    assert not any(label.startswith("-0.97") or label == "1.03" for label in labels), labels
    assert 'class="mark"' in str(svg)  # one point is drawn as a mark, not a line of no length
    assert labels[0] == "0"  # its one step, ticked alone: no step -1 or 1 that was never logged
    assert ticks(charts.lines([("job 1", [(s, 1.0 / (s + 1)) for s in range(4)])], "step", "loss"))[:4] == [
        "0",
        "1",
        "2",
        "3",
    ]


@pytest.fixture
def swept(db_url, tmp_path):
    """lr swept by factors of ten (and of three), nhid by two: real jobs run inline."""
    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")
    futures = exp.map(fit, jobman.grid(lr=[0.001, 0.003, 0.01], nhid=[16, 32]))
    jobman.wait(futures)
    assert all(f.exception() is None for f in futures)
    yield exp
    exp.close()


def test_a_parameter_swept_by_factors_is_log_scaled_on_the_dashboard_and_in_the_figures(swept):
    store = swept.store
    shown = pages.report_view(store, pages.ReportCache(), pages.choose(store), store.counts())
    svg = {key: str(chart) for key, chart in shown["charts"]["scatters"]}
    # 0.003 sits near the middle of a log axis from 0.001 to 0.01 (at 48 %), not at 22 % as on a linear one.
    xs = {
        float(t): float(x)
        for x, t in re.findall(r'<text class="tick" x="([\d.]+)" y="[\d.]+" text-anchor="middle">([^<]*)<', svg["lr"])
    }
    assert sorted(xs) == [0.001, 0.003, 0.01], xs
    assert (xs[0.003] - xs[0.001]) / (xs[0.01] - xs[0.001]) == pytest.approx(0.477, abs=0.01)
    assert "lr (log)" in svg["lr"] and "nhid (log)" not in svg["nhid"]
    figs = swept.plot("err")
    assert figs["err_vs_lr.png"].axes[0].get_xscale() == "log"
    assert figs["err_vs_nhid.png"].axes[0].get_xscale() == "linear"
    # And report --plot draws the same figures: one drawing, reached from the CLI and from Python.
    assert list(figs) == ["err_vs_lr.png", "err_vs_nhid.png", "err_learning_curves.png"]


def test_a_one_point_learning_curve_in_a_figure_spans_its_value_and_is_marked(swept):
    ax = swept.plot("err", curves=1)["err_learning_curves.png"].axes[0]
    [line] = ax.get_lines()
    assert line.get_marker() == "o" and len(line.get_xdata()) == 1
    value = float(line.get_ydata()[0])
    assert ax.get_ylim() == pytest.approx(span(value, value))
    assert ax.get_xlim() == pytest.approx(span(1.0, 1.0))

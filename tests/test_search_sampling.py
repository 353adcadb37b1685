"""Distributions in the sweep grammar and ``--samples``: parsed, printed back, drawn reproducibly,
idempotently, within their bounds and with the right shape; refused at their position when wrong."""

from __future__ import annotations

import math
import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobman.jobdb.distributions import Distribution, draws
from jobman.jobdb.errors import SweepError
from jobman.jobdb.sweep import count_jobs, expand, format_sweep, format_value, parse_sweep

TARGET = "jobman.models.mlp:train"
SWEEP = [TARGET, "dataset=digits", "lr=loguniform(1e-4,1e-1)", "nhid=choice(64,128,256)", "momentum=uniform(0.5,0.99)"]


def points(tokens, **kw):
    return [s.params for s in expand(parse_sweep(tokens), **kw)]


# -- grammar --------------------------------------------------------------------------------------


def test_distributions_parse_as_values_and_print_back():
    sweep = parse_sweep(
        [*SWEEP, "a={{1,2}}", "q=quniform(0,10,2.5)", "k=randint(1,6)", "z=normal(0,1)", 'c=choice([1,2],relu,"x,y")']
    )
    assert sweep.phases[0].assignments[1].distribution == Distribution("loguniform", (1e-4, 1e-1))
    assert sweep.phases[0].assignments[-1].distribution == Distribution("choice", ([1, 2], "relu", "x,y"))
    assert parse_sweep(format_sweep(sweep)) == sweep


numbers = st.floats(-1e6, 1e6, allow_nan=False) | st.integers(-(10**6), 10**6)


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["uniform", "loguniform", "randint", "normal", "quniform", "choice"]),
    st.lists(numbers | st.text(max_size=5) | st.booleans(), min_size=1, max_size=4),
)
def test_any_distribution_that_parses_prints_back_to_itself(name, args):
    token = f"k={name}({','.join(format_value(a) for a in args)})"
    try:
        sweep = parse_sweep(["f", token])
    except SweepError as exc:
        assert "argument 2" in str(exc) and "character" in str(exc)
        return
    assert parse_sweep(format_sweep(sweep)) == sweep


def test_a_string_that_looks_like_a_call_stays_a_string_when_quoted():
    assert points(["f", 'k="uniform(1,2)"']) == [{"k": "uniform(1,2)"}]
    assert format_value("uniform(1)") == '"uniform(1)"'


@pytest.mark.parametrize(
    "token, words, char",
    [
        ("lr=loguniform(0,1)", "must be above 0", 15),
        ("lr=loguniform(1e-1,1e-4)", "below the high bound", 15),
        ("lr=uniform(1)", "takes 2 numbers", 12),
        ("lr=uniform(a,b)", "are numbers", 12),
        ("n=randint(1.5,3)", "whole numbers", 11),
        ("s=normal(0,0)", "sigma", 10),
        ("q=quniform(0,1,0)", "step q", 12),
        ("c=choice()", "at least one value", 10),
        ("lr=logunifrom(1,2)", "not a distribution", 4),
        ("lr={{1,uniform(1,2)}}", "inside a grid", 8),
        ("lr=[uniform(1,2)]", "inside a list", 5),
        ("lr=uniform(1,[2)", "never closed", 14),
        ("lr=uniform(1,2", "uniform( is never closed", 15),
        ("lr=loguniform(1e-4,1e-1)x", "unexpected text after the call of loguniform()", 25),
    ],
)
def test_a_bad_distribution_is_refused_at_its_position(token, words, char):
    with pytest.raises(SweepError) as err:
        parse_sweep(["f", "x=1", token])
    assert "argument 3" in str(err.value) and words in str(err.value) and f"character {char}" in str(err.value)


def test_samples_and_distributions_go_together():
    with pytest.raises(SweepError, match=r"argument 3 'lr=loguniform\(1e-4,1e-1\)': .*--samples.*character 4"):
        expand(parse_sweep(SWEEP))
    with pytest.raises(SweepError, match="no parameter of this sweep is one"):
        expand(parse_sweep(["f", "lr={{1,2}}"]), samples=3)
    with pytest.raises(SweepError, match="at least 1"):
        expand(parse_sweep(SWEEP), samples=0)


# -- draws ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", ["random", "halton"])
def test_draws_are_reproducible_and_the_first_n_do_not_depend_on_n(sampler):
    first = points(SWEEP, samples=32, seed=7, sampler=sampler)
    assert first == points(SWEEP, samples=32, seed=7, sampler=sampler)
    assert points(SWEEP, samples=50, seed=7, sampler=sampler)[:32] == first
    assert points(SWEEP, samples=32, seed=8, sampler=sampler) != first
    assert len({(p["lr"], p["momentum"]) for p in first}) == 32


def test_each_grid_point_gets_the_same_draws_and_phases_draw_their_own():
    jobs = expand(parse_sweep(["f", "a={{1,2}}", "lr=uniform(0,1)", "--", "m=uniform(0,1)"]), samples=3, seed=1)
    assert count_jobs(parse_sweep(["f", "a={{1,2}}", "lr=uniform(0,1)", "--", "m=uniform(0,1)"]), 3) == len(jobs)
    roots = [j.params for j in jobs if j.phase == 0]
    assert [r["a"] for r in roots] == [1, 1, 1, 2, 2, 2]
    assert [r["lr"] for r in roots[:3]] == [r["lr"] for r in roots[3:]]
    children = [j for j in jobs if j.phase == 1]
    assert len(children) == 18 and all(jobs[c.parent].params.items() <= c.params.items() for c in children)
    assert {c.params["m"] for c in children} != {r["lr"] for r in roots}


@pytest.mark.parametrize("sampler", ["random", "halton"])
def test_draws_respect_bounds_and_types(sampler):
    dists = {
        "u": Distribution("uniform", (-2.0, 3.0)),
        "l": Distribution("loguniform", (1e-4, 1e-1)),
        "r": Distribution("randint", (1, 6)),
        "c": Distribution("choice", ("a", "b", "c")),
        "q": Distribution("quniform", (0, 10, 3)),
        "ql": Distribution("qloguniform", (1, 1000, 0.5)),
    }
    out = draws(dists, 2000, seed=3, sampler=sampler)
    assert all(-2 <= p["u"] < 3 and 1e-4 <= p["l"] <= 1e-1 for p in out)
    assert {p["r"] for p in out} == {1, 2, 3, 4, 5, 6} and all(type(p["r"]) is int for p in out)
    assert {p["c"] for p in out} == {"a", "b", "c"}
    assert {p["q"] for p in out} == {0, 3, 6, 9} and all(type(p["q"]) is int for p in out)
    assert all(1 <= p["ql"] <= 1000 and (p["ql"] * 2) == int(p["ql"] * 2) for p in out)


def ks_uniform(values: list[float]) -> float:
    """The Kolmogorov-Smirnov distance between ``values`` (in [0, 1]) and the uniform distribution."""
    xs = sorted(values)
    n = len(xs)
    return max(max((i + 1) / n - x, x - i / n) for i, x in enumerate(xs))


def test_a_log_uniform_draw_is_uniform_in_the_log_and_not_in_the_value():
    n = 4000
    out = draws({"lr": Distribution("loguniform", (1e-4, 1e-1))}, n, seed=11)
    logs = [(math.log10(p["lr"]) + 4) / 3 for p in out]
    linear = [(p["lr"] - 1e-4) / (1e-1 - 1e-4) for p in out]
    critical = 1.63 / math.sqrt(n)  # the KS test at the 1% level
    assert ks_uniform(logs) < critical
    assert ks_uniform(linear) > 10 * critical  # a uniform draw of the value would pass this
    decades = [sum(1 for p in out if 10 ** (k - 4) <= p["lr"] < 10 ** (k - 3)) for k in range(3)]
    assert all(abs(d - n / 3) < 0.05 * n for d in decades), decades


def test_a_normal_draw_has_its_mean_and_sigma():
    out = [p["z"] for p in draws({"z": Distribution("normal", (5.0, 2.0))}, 4000, seed=2)]
    mean = sum(out) / len(out)
    sd = math.sqrt(sum((x - mean) ** 2 for x in out) / len(out))
    assert abs(mean - 5) < 0.1 and abs(sd - 2) < 0.1


def test_halton_draws_spread_more_evenly_than_random_ones():
    dists = {"a": Distribution("uniform", (0.0, 1.0)), "b": Distribution("uniform", (0.0, 1.0))}

    def worst_empty_cell(out):  # over a 8x8 grid of cells: how many are empty
        cells = {(int(p["a"] * 8), int(p["b"] * 8)) for p in out}
        return 64 - len(cells)

    assert worst_empty_cell(draws(dists, 64, seed=5, sampler="halton")) < worst_empty_cell(
        draws(dists, 64, seed=5, sampler="random")
    )
    assert ks_uniform([p["a"] for p in draws(dists, 256, seed=5, sampler="halton")]) < 0.02


# -- the command ----------------------------------------------------------------------------------


def test_the_same_command_adds_nothing_and_a_larger_one_only_the_new_points(jobman, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}?table=t"
    first = jobman("sqlschedule", url, *SWEEP, "--samples", "32", "--seed", "7")
    assert first.code == 0 and "added 32 jobs" in first.out, first
    again = jobman("sqlschedule", url, *SWEEP, "--samples", "32", "--seed", "7")
    assert again.code == 0 and "nothing added" in again.out
    more = jobman("sqlschedule", url, *SWEEP, "--samples", "40", "--seed", "7")
    assert more.code == 0 and "added 8 jobs" in more.out and "32 already present" in more.out


@pytest.mark.parametrize(
    "extra, words",
    [
        (["lr=loguniform(0,1)", "--samples", "3"], "character 15"),
        (["lr=loguniform(1e-4,1)"], "--samples"),
        (["lr=0.1", "--samples", "3"], "no parameter of this sweep is one"),
        (["lr=uniform(1,2)", "--samples", "3", "--sampler", "sobol"], "sobol"),
    ],
)
def test_bad_search_commands_are_one_sentence_and_write_nothing(jobman, tmp_path, extra, words):
    db = tmp_path / "never.db"
    result = jobman("sqlschedule", f"sqlite:///{db}?table=t", TARGET, *extra)
    assert result.code != 0 and words in result.err and "Traceback" not in result.err, result
    assert (
        not db.exists() or not sqlite3.connect(db).execute("select name from sqlite_master where name='job'").fetchall()
    )


def test_cmdline_runs_one_job_and_refuses_a_distribution(jobman, tmp_path):
    result = jobman("cmdline", TARGET, "lr=loguniform(1e-4,1e-1)", "--workdir", str(tmp_path / "w"))
    assert result.code != 0 and "distributions" in result.err and "Traceback" not in result.err, result


def test_the_python_api_takes_the_same_distributions(tmp_path):
    import jobman
    from jobman.jobdb.errors import UsageError

    axes = {
        "dataset": "digits",
        "lr": jobman.loguniform(1e-4, 1e-1),
        "nhid": jobman.choice(64, 128, 256),
        "momentum": jobman.uniform(0.5, 0.99),
    }
    assert jobman.sample(32, axes, seed=7) == points(SWEEP, samples=32, seed=7)
    assert jobman.sample(4, {**axes, "fold": [0, 1]}, seed=7, sampler="halton") == points(
        [*SWEEP, "fold={{0,1}}"], samples=4, seed=7, sampler="halton"
    )
    with pytest.raises(UsageError, match="above 0"):
        jobman.loguniform(0, 1)
    with pytest.raises(UsageError, match="jobman.sample"):
        jobman.grid(lr=jobman.uniform(0, 1))
    exp = jobman.Experiment(f"sqlite:///{tmp_path / 'api.db'}?table=t", backend=None)
    try:
        first = exp.schedule(SWEEP, samples=32, seed=7, check=False)
        more = exp.schedule(
            " ".join(SWEEP[:2]) + " 'lr=loguniform(1e-4,1e-1)' 'nhid=choice(64,128,256)' 'momentum=uniform(0.5,0.99)'",
            samples=40,
            seed=7,
            check=False,
        )
        assert len(first) == 32 and len(more) == 40 and len(exp.store.jobs()) == 40
        assert [f.job_id for f in more[:32]] == [f.job_id for f in first]
        with pytest.raises(jobman.errors.SweepError, match="--samples"):
            exp.schedule(SWEEP, check=False)
    finally:
        exp.close()

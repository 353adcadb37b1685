"""The sweep grammar: typed values, grids, phases, shell-expanded grids, and every refusal."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobman.jobdb.canonical import dump_json
from jobman.jobdb.errors import SweepError
from jobman.jobdb.sweep import (
    Assignment,
    Phase,
    Sweep,
    count_jobs,
    expand,
    format_sweep,
    format_value,
    parse_sweep,
    parse_value,
)


def same(a, b) -> bool:
    """Equal and of the same type, all the way down (True is not 1, 1.0 is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def params_of(tokens, **kw):
    return [spec.params for spec in expand(parse_sweep(tokens, **kw))]


# -- typing of values ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("3", 3),
        ("-12", -12),
        ("+7", 7),
        ("0", 0),
        ("0.1", 0.1),
        ("1e-3", 0.001),
        ("-2.5E2", -250.0),
        (".5", 0.5),
        ("3.", 3.0),
        ("True", True),
        ("true", True),
        ("False", False),
        ("false", False),
        ("None", None),
        ("null", None),
        ("relu", "relu"),
        ("adam_v2", "adam_v2"),
        ("a b", "a b"),
        ("", ""),
        ('"3"', "3"),
        ('"True"', "True"),
        ("'None'", "None"),
        ('"a,b"', "a,b"),
        ('"x\\"y"', 'x"y'),
        ("[]", []),
        ("[1,2,3]", [1, 2, 3]),
        ("[0.1,relu,True,None]", [0.1, "relu", True, None]),
        ("[[1,2],[3]]", [[1, 2], [3]]),
        ('["a,b",c]', ["a,b", "c"]),
        ("[ 1 , 2 ]", [1, 2]),
    ],
)
def test_values_are_typed_as_jobman_did(text, expected):
    assert same(parse_value(text), expected)
    assert same(params_of(["pkg.mod:fn", f"k={text}"]), [{"k": expected}])


def test_grid_values_are_typed_one_by_one():
    assert same(
        params_of(["f", 'k={{1,2.5,True,None,relu,"7",[1,2]}}']),
        [{"k": 1}, {"k": 2.5}, {"k": True}, {"k": None}, {"k": "relu"}, {"k": "7"}, {"k": [1, 2]}],
    )


@pytest.mark.parametrize(
    "value",
    [
        0,
        -3,
        10**20,
        0.1,
        -1e-300,
        1e300,
        True,
        False,
        None,
        "",
        "x",
        "a b",
        "1",
        "True",
        "none",
        "{{",
        "}}",
        "a,b",
        "[x",
        'q"uote',
        "it's",
        "back\\",
        "\\",
        " pad ",
        "--",
        "é",
        [],
        [1, "two", [3.5, None]],
        ["}}", "{{", "\\"],
    ],
)
def test_format_value_parses_back(value):
    assert same(parse_value(format_value(value)), value)
    sweep = parse_sweep(["f", f"k={format_value(value)}", f"g={{{{{format_value(value)},0}}}}"])
    assert same(expand(sweep)[0].params, {"k": value, "g": value})


# -- grids, products, phases ---------------------------------------------------------------


def test_a_plain_assignment_makes_one_job():
    sweep = parse_sweep(["pkg.train:main", "lr=0.1", "nhid=64"])
    [job] = expand(sweep)
    assert (job.phase, job.kind, job.target, job.parent) == (0, "fn", "pkg.train:main", None)
    assert same(job.params, {"lr": 0.1, "nhid": 64})


def test_grids_make_their_product_in_order():
    got = params_of(["f", "a={{1,2,3}}", "fixed=x", "b={{u,v}}"])
    assert got == [{"a": a, "fixed": "x", "b": b} for a in (1, 2, 3) for b in ("u", "v")]
    assert count_jobs(parse_sweep(["f", "a={{1,2,3}}", "fixed=x", "b={{u,v}}"])) == 6


def test_phases_inherit_and_depend_on_their_parent():
    sweep = parse_sweep(["pkg.dbn:pretrain", "nhid={{64,128}}", "--", "lr={{0.1,0.01,0.001}}"])
    jobs = expand(sweep)
    assert count_jobs(sweep) == len(jobs) == 2 + 2 * 3
    roots = [i for i, j in enumerate(jobs) if j.phase == 0]
    assert roots == [0, 1]
    for j in jobs[2:]:
        assert j.phase == 1 and j.parent in roots and j.target == "pkg.dbn:pretrain"
        parent = jobs[j.parent]
        assert j.params == {**parent.params, "lr": j.params["lr"]}
    children_of_first = [j.params["lr"] for j in jobs if j.parent == 0]
    assert children_of_first == [0.1, 0.01, 0.001]


def test_a_phase_may_name_its_own_target():
    sweep = parse_sweep(["pkg.dbn:pretrain", "n={{1,2}}", "--", "pkg.dbn:finetune", "lr=0.1", "--", "e={{5,6}}"])
    assert sweep.targets() == ["pkg.dbn:pretrain", "pkg.dbn:finetune", "pkg.dbn:finetune"]
    jobs = expand(sweep)
    assert [j.target for j in jobs] == ["pkg.dbn:pretrain"] * 2 + ["pkg.dbn:finetune"] * 6
    assert [j.phase for j in jobs] == [0, 0, 1, 1, 2, 2, 2, 2]
    assert jobs[-1].params == {"n": 2, "lr": 0.1, "e": 6}
    assert jobs[jobs[-1].parent].params == {"n": 2, "lr": 0.1}


def test_a_phase_of_only_a_target_makes_one_child_per_parent():
    jobs = expand(parse_sweep(["a.b:c", "x={{1,2}}", "--", "a.b:d"]))
    assert [(j.phase, j.target, j.parent, j.params) for j in jobs[2:]] == [
        (1, "a.b:d", 0, {"x": 1}),
        (1, "a.b:d", 1, {"x": 2}),
    ]


def test_command_sweeps():
    sweep = parse_sweep(["lr={{1,2}}"], command="python train.py")
    assert sweep.kind == "cmd"
    assert [(j.kind, j.target, j.params) for j in expand(sweep)] == [
        ("cmd", "python train.py", {"lr": 1}),
        ("cmd", "python train.py", {"lr": 2}),
    ]


def test_shell_brace_expanded_grids_are_joined_back():
    # bash turns an unquoted lr={{0.1,0.01}} into lr={0.1} lr={0.01}
    expanded = ["f", "lr={0.1}", "lr={0.01}", "act={relu}", "act={tanh}", "n=3"]
    assert params_of(expanded) == params_of(["f", "lr={{0.1,0.01}}", "act={{relu,tanh}}", "n=3"])
    assert len(params_of(expanded)) == 4


def test_brace_expanded_and_written_grids_number_arguments_as_typed():
    # The user typed `f a={{1,2}} bad`; the shell made it four words: errors name what was typed.
    with pytest.raises(SweepError, match=r"argument 3 'bad'"):
        parse_sweep(["f", "a={1}", "a={2}", "bad"])


# -- refusals ------------------------------------------------------------------------------


def refused(tokens, **kw) -> str:
    with pytest.raises(SweepError) as info:
        parse_sweep(tokens, **kw)
    return str(info.value)


@pytest.mark.parametrize(
    "tokens, arg, char, words",
    [
        (["f", "lr={{0.1,0.2"], 2, 4, "never closed"),
        (["f", "lr={{0.1,0.2}"], 2, 4, "never closed"),
        (["f", "lr=0.1}}"], 2, 7, "without"),
        (["f", "lr={{}}"], 2, 4, "empty"),
        (["f", "lr={{ }}"], 2, 4, "empty"),
        (["f", "lr={{0.1,}}"], 2, 10, "empty value"),
        (["f", "lr={{,0.1}}"], 2, 6, "empty value"),
        (["f", "a=1", "lr={{1,{{2}}}}"], 3, 8, "nested"),
        (["f", "1lr=3"], 2, 1, "not a valid parameter name"),
        (["f", "l$r=3"], 2, 1, "not a valid parameter name"),
        (["f", "=3"], 2, 1, "not a valid parameter name"),
        (["f", "k=[1,2"], 2, 3, "'['"),
        (["f", "k=1]"], 2, 4, "unexpected"),
        (["f", 'k="abc'], 2, 3, "quote"),
        (["f", 'k={{"abc,d}}'], 2, 5, "never closed"),
        (["f", "k=[1,[2]"], 2, 6, "never closed"),
        (["f", 'k="\\q"'], 2, 3, "malformed quoted string"),
    ],
)
def test_malformed_assignments_name_argument_and_character(tokens, arg, char, words):
    message = refused(tokens)
    assert f"argument {arg} " in message
    assert f"at character {char}" in message
    assert words in message
    assert repr(tokens[arg - 1]) in message


@pytest.mark.parametrize(
    "tokens, arg, words",
    [
        (["f", "lr"], 2, "'=' is missing"),
        (["f", "a=1", "a=2"], 3, "already set in this phase"),
        (["f", "a={{1,2}}", "--", "b=1", "a=3"], 5, "already set in phase 0"),
        (["f", "a=1", "--"], 3, "must be followed by a phase"),
        (["f", "a=1", "--", "--", "b=1"], 4, "empty"),
        (["--", "a=1"], 1, "empty"),
        (["not a target!", "a=1"], 1, "neither key=value nor a target"),
        (["f", "a=1", "--", "9bad", "b=1"], 4, "neither key=value nor a target"),
    ],
)
def test_malformed_sweeps_name_the_argument(tokens, arg, words):
    message = refused(tokens)
    assert re.search(rf"\bargument {arg}\b", message), message
    assert words in message


def test_empty_and_targetless_sweeps_are_refused():
    assert "empty" in refused([])
    assert "no target" in refused(["a=1"])


# -- properties ----------------------------------------------------------------------------

_keys = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,6}\Z")
_targets = st.from_regex(r"\A[a-z_][a-z0-9_]{0,5}(\.[a-z_][a-z0-9_]{0,5}){0,2}:[a-z_][a-z0-9_]{0,5}\Z")
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
_scalars = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    _text,
    st.sampled_from(["}}", "{{", "a,b", "[", "]", "'", '"', "\\", "1", "None"]),
)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=6)


@st.composite
def sweeps(draw) -> Sweep:
    n_phases = draw(st.integers(1, 3))
    keys = draw(st.lists(_keys, min_size=0, max_size=6, unique=True))
    cmd = draw(st.booleans())
    phases, taken = [], 0
    for number in range(n_phases):
        n = draw(st.integers(0, len(keys) - taken))
        mine = keys[taken : taken + n]
        taken += n
        assignments = []
        for key in mine:
            grid = draw(st.booleans())
            values = draw(st.lists(_values, min_size=1, max_size=3)) if grid else [draw(_values)]
            assignments.append(Assignment(key, tuple(values), grid))
        if number == 0:
            target = "python train.py --x" if cmd else draw(_targets)
        else:
            target = draw(st.one_of(st.none(), _targets))
        if number and target is None and not assignments:
            assignments.append(Assignment(f"only.p{number}", (number,), False))
        phases.append(Phase(target, assignments))
    return Sweep(phases, "cmd" if cmd else "fn")


def _reparse(sweep: Sweep) -> Sweep:
    return parse_sweep(format_sweep(sweep), command=sweep.phases[0].target if sweep.kind == "cmd" else None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sweeps())
def test_generated_sweeps_round_trip_and_expand_to_their_product(sweep):
    back = _reparse(sweep)
    assert back.kind == sweep.kind
    assert [p.target for p in back.phases] == [p.target for p in sweep.phases]
    for mine, theirs in zip(sweep.phases, back.phases):
        assert [(a.key, a.grid) for a in theirs.assignments] == [(a.key, a.grid) for a in mine.assignments]
        for a, b in zip(mine.assignments, theirs.assignments):
            assert same(list(a.values), list(b.values)), (a, b)
    jobs = expand(back)
    expected, per_parent = 0, 1
    for phase in sweep.phases:
        size = 1
        for a in phase.assignments:
            size *= len(a.values)
        per_parent *= size
        expected += per_parent
    assert len(jobs) == count_jobs(back) == expected
    for j in jobs:
        if j.phase == 0:
            assert j.parent is None
        else:
            parent = jobs[j.parent]
            assert parent.phase == j.phase - 1
            assert all(same(j.params[k], v) for k, v in parent.params.items())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sweeps())
def test_the_json_an_expansion_makes_is_the_stores_canonical_json(sweep):
    """``expand`` encodes a grid from each value's JSON; it must be the text the store would make."""
    jobs = expand(sweep)
    for j in jobs:
        if j.params_json is not None:
            assert j.params_json == dump_json(j.params) == json.dumps(j.params, sort_keys=True)
    assert all(j.params_json is not None for j in jobs if j.phase == 0)


_noise = st.sampled_from(list("{}[],=\"'\\ -:.") + ["{{", "}}", "--", "=", "k=", "{{}}"])


@st.composite
def mutated(draw) -> list[str]:
    tokens = format_sweep(draw(sweeps()))
    if not tokens:
        tokens = ["f"]
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(tokens) - 1))
        tok = tokens[i]
        how = draw(st.integers(0, 4))
        if how == 0 and tok:
            j = draw(st.integers(0, len(tok) - 1))
            tokens[i] = tok[:j] + tok[j + 1 :]
        elif how == 1:
            j = draw(st.integers(0, len(tok)))
            tokens[i] = tok[:j] + draw(_noise) + tok[j:]
        elif how == 2:
            tokens.insert(i, draw(_noise))
        elif how == 3 and len(tokens) > 1:
            del tokens[i]
        else:
            tokens[i] = draw(st.text(max_size=6))
    return tokens


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_sweeps_parse_or_raise_sweep_error(tokens):
    try:
        sweep = parse_sweep(tokens)
    except SweepError as exc:
        assert "argument" in str(exc) or "sweep" in str(exc)
        return
    assert count_jobs(sweep) == len(expand(sweep))

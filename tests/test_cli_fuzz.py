"""Fuzzing the command line: whatever arguments a user types, jobman answers with a result or one
sentence, never an internal error (exit 3) or a traceback.

Argument lists mix the words each command knows (options, statuses, formats, ids, sweep expressions,
database URLs) with random text, and run through the in-process entry point ``jobman.cli.main.main``
against a SQLite database holding a two-phase experiment with some results. Left out: ``--debug`` (which
asks for tracebacks), ``--plot`` (slow, and tested in tests/test_report.py), and text containing NUL,
which no real argv can hold.

The draws are fixed (the same every run, CI included); JOBMAN_FUZZ_EXAMPLES=2000 runs that many fresh
random ones.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobman.cli.main import cli, main
from jobman.jobdb.store import Store, WorkerInfo
from jobman.jobdb.sweep import expand, parse_sweep

TARGET = "jobman.examples.def_addition:addition_example"  # importable, takes any state: passes the check
COMMANDS = ["sqlschedule", "list", "show", "sqlstatus", "report"]


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory):
    """A database with a two-phase sweep, some results, and this directory as the working directory."""
    root = tmp_path_factory.mktemp("fuzz")
    url = f"sqlite:///{root / 'fuzz.db'}?table=mlp"
    store = Store.open(url)
    store.schedule(expand(parse_sweep([TARGET, "lr={{0.1,0.01}}", "fold={{0,1}}", "--", "e={{1,2}}"])))
    for i in range(3):
        claimed = store.claim(WorkerInfo(host="fuzzhost", pid=100 + i))
        outcome = "FAILED" if i == 2 else "DONE"
        store.finish(claimed.job.id, claimed.lease, outcome, results={"valid_error": 0.1 * (i + 1), "acc": 0.9})
    store.dispose()
    with pytest.MonkeyPatch.context() as mp:  # no command may wander off to another database or directory
        mp.chdir(root)
        mp.setenv("JOBMAN_DB", url)
        mp.delenv("JOBMAN_DEBUG", raising=False)
        yield url


def _values(url: str) -> list[str]:
    """What users put after options and in positionals: URLs, targets, sweeps, ids, statuses, metrics."""
    return [
        url,
        url.replace("table=mlp", "table=other"),
        "sqlite:///fresh.db?table=x",
        "mysql://x/y",
        "postgresql://me:pw@127.0.0.1:1/db?table=x",
        "mlp",
        "nope",
        "bad name!",
        "DONE",
        "START",
        "ERR_RUN",
        "RUNNING,FAILED",
        "5",
        "-1",
        "99",
        "bogus",
        "json",
        "csv",
        "table",
        "markdown",
        "lr,fold",
        "valid_error",
        "acc",
        "lr",
        "none",
        "fold",
        "lr>=0.05",
        "lr==0.1",
        "fold!=x",
        "lr=>",
        "python train.py",
        "python {lr}",
        "'",
        "phase=0",
        "status=DONE",
        "ids=1-3",
        "all",
        "target=x",
        "phase=x",
        TARGET,
        "pkg.mod:f",
        "os.path:sep",
        "nosuchmodule_xyz:f",
        "lr={{0.1,0.2}}",
        "lr={{",
        "e={{}}",
        "a=1",
        "a=[1,2",
        'a="q"',
        "a=1e999",
        "b={{1,2}}",
        "--",
        "0",
        "1",
        "2",
        "1-3",
        "3-1",
        "1,2",
        "2,,",
        "999999",
        "-5",
        "1" * 30,
        "-h",
        "",
        " ",
    ]


def _not_a_module(token: str) -> bool:
    """Random text that names no importable module: the target check imports what it is given."""
    head = re.split(r"[.:]", token, maxsplit=1)[0]
    if not head.isidentifier():
        return True
    try:
        return importlib.util.find_spec(head) is None
    except (ImportError, ValueError):
        return True


_random = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12).filter(
    _not_a_module
)


def argument_lists(command: str, url: str) -> st.SearchStrategy[list[str]]:
    """A command's own options with fitting or unfitting values, positionals, and noise, in any order."""
    values = st.one_of(st.sampled_from(_values(url)), st.sampled_from(_values(url)), _random)
    pieces = [values.map(lambda v: [v])]
    for param in cli.get_command(click.Context(cli), command).params:
        if not isinstance(param, click.Option):
            continue
        names = [n for n in (*param.opts, *param.secondary_opts) if n not in ("--plot", "--debug")]
        if not names:
            continue
        if param.is_flag or param.count:
            pieces.append(st.sampled_from(names).map(lambda n: [n]))
            continue
        fitting = values
        if isinstance(param.type, click.Choice):
            fitting = st.one_of(st.sampled_from(list(param.type.choices)), values)
        elif isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType)):
            fitting = st.one_of(st.integers(-3, 300).map(str), values)
        pieces.append(st.tuples(st.sampled_from(names), fitting).map(list))
    heads = [[], [url]] + (
        [[url, TARGET], [TARGET], ["sqlite:///fresh.db?table=x", "pkg.mod:f"]] if command == "sqlschedule" else []
    )
    return st.tuples(st.sampled_from(heads), st.lists(st.one_of(*pieces), max_size=6)).map(
        lambda t: [*t[0], *(token for piece in t[1] for token in piece)]
    )


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# A fixed draw by default (CI included), so that a run cannot fail on a draw the last one did not make;
# JOBMAN_FUZZ_EXAMPLES=N asks for a longer run of fresh random draws (what finds new bugs).
RANDOM_EXAMPLES = int(os.environ.get("JOBMAN_FUZZ_EXAMPLES", "0") or 0)


@pytest.mark.parametrize("command", COMMANDS)
def test_random_arguments_never_crash_a_command(fuzz_db, command):
    @settings(
        max_examples=RANDOM_EXAMPLES or 100,
        deadline=None,
        database=None,
        derandomize=not RANDOM_EXAMPLES,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(args=argument_lists(command, fuzz_db))
    def check(args):
        code, out, err = run([command, *args])
        assert code in (0, 1, 2), f"jobman {command} {args!r} exited {code}: {err}"
        assert "Traceback" not in err and "Traceback" not in out, f"jobman {command} {args!r}: {err}"
        if code != 0:
            problem = [line for line in err.splitlines() if line.startswith("jobman: ")]
            assert len(problem) == 1, f"jobman {command} {args!r} failed without one sentence: {err!r}"

    check()
    assert os.path.exists(fuzz_db.split("?", 1)[0][len("sqlite:///") :])


@pytest.mark.parametrize(
    "argv",
    [
        ["sqlstatus", "--db", "--debug"],
        ["list", "--table", "--debug"],
        ["report", "--metric", "--debug", "--db", "nope"],
    ],
)
def test_debug_as_an_options_value_is_that_value_not_the_switch(fuzz_db, argv):
    code, out, err = run(argv)
    assert code == 2 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("jobman: ")], err


def test_the_debug_switch_shows_the_traceback(fuzz_db):
    code, _out, err = run(["--debug", "sqlstatus", "--db", "nope"])
    assert code == 2 and "Traceback" in err and "jobman: 'nope' is not a database URL" in err

"""The original jobman's example modules and command-line forms, run as its documentation writes them:
``jobman cmdline`` (doc/cmdline.txt, doc/intro.txt, doc/advanced.txt), and the same experiments
through ``sqlschedule`` + ``sql``/``dispatch`` (doc/mlp_jobman.txt), on both engines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import experiment_module
from test_migrations import fresh_url  # noqa: F401 - a fixture
from test_original_jobman import one_sentence, query

from jobman.jobdb.errors import SweepError
from jobman.jobdb.store import Store

TEST_CONF = (
    "plumber :: @jobman.examples.def_make2.Plumber(%itsa, %%me, %luigi)\n"
    'plumber.itsa = "it\'s a "\n'
    'plumber.luigi :: "luigi" + exclamation_mark\n'
    'me = "me, "\n'
)


def printed(r) -> list[str]:
    """What the experiment printed: the lines before the run's JSON summary."""
    return r.out.split("{\n", 1)[0].splitlines()


def test_the_cmdline_documentation_as_written(tmp_path, jobman):
    # key::builder and make (doc/cmdline.txt).
    r = jobman(
        "cmdline",
        "jobman.examples.def_make.experiment",
        "obj::jobman.examples.def_make.MakeExample",
        "obj.param1=2",
        "obj.param2=jobman rules",
        cwd=tmp_path,
    )
    assert r.code == 0, r.err
    assert printed(r) == ["Created MakeExample object successfully.", "self.value =  2", "jobman rules"]
    # key=value, the last of a key given twice winning; key:=expression, its value recorded.
    r = jobman("cmdline", "jobman.experiments.print_state", "param1=42", "param2=a_string", "param2=2.2", cwd=tmp_path)
    assert printed(r) == ["param1 = 42", "param2 = 2.2"], r.out + r.err
    r = jobman(
        "cmdline",
        "jobman.experiments.print_state",
        "param_uniform:=@random.uniform(0, 100)",
        "param_gaussian:=@random.random()",
        cwd=tmp_path,
    )
    values = dict(line.split(" = ") for line in printed(r))
    assert 0 <= float(values["param_uniform"]) <= 100 and 0 <= float(values["param_gaussian"]) <= 1
    # Configuration files: defaults overridden by later keys, files naming files, and key <- file.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "more.conf").write_text("depth = 2\n")
    (tmp_path / "things.conf").write_text("# defaults\na = 1\nb = 2  # two\nsub/more.conf\n")
    r = jobman("cmdline", "jobman.experiments.print_state", "things.conf", "b=3", "xyz <- things.conf", cwd=tmp_path)
    assert printed(r) == ["a = 1", "b = 3", "depth = 2", "xyz.a = 1", "xyz.b = 2", "xyz.depth = 2"], r.out + r.err
    # make2 and its test.conf (doc/advanced.txt).
    (tmp_path / "test.conf").write_text(TEST_CONF)
    r = jobman("cmdline", "jobman.examples.def_make2.experiment", "test.conf", cwd=tmp_path)
    assert r.code == 0 and printed(r) == ["it's a me, luigi!"], r.out + r.err
    # The run's directory holds orig.conf and current.conf (doc/intro.txt), which read back as files.
    (tmp_path / "intro").mkdir()
    r = jobman(
        "cmdline", "jobman.examples.def_addition.addition_example", "first=2", "second=5", cwd=tmp_path / "intro"
    )
    assert printed(r) == ["state.first = 2", "state.second = 5", "result = 7"]
    (run,) = (tmp_path / "intro").glob("jobman_*_*/current.conf")
    assert {p.name for p in run.parent.glob("*.conf")} == {"orig.conf", "current.conf"}
    lines = run.read_text().splitlines()
    assert {
        "first = 2",
        "second = 5",
        "result = 7",
        "jobman.status = 2",
        "jobman.experiment = jobman.examples.def_addition.addition_example",
    } <= set(lines)
    assert "result = 7" not in (run.parent / "orig.conf").read_text()
    r = jobman("cmdline", "jobman.experiments.print_state", str(run.parent / "orig.conf"), "-n", cwd=tmp_path)
    assert printed(r) == ["first = 2", "second = 5"], r.out + r.err
    # -f -w . (doc/examples.txt): run here, and again over the run already here.
    for _ in range(2):
        r = jobman("cmdline", "-f", "-w", ".", "jobman.experiments.print_state", "nhid=30", cwd=tmp_path / "sub")
        assert r.code == 0 and printed(r) == ["nhid = 30"], r.err
    assert (tmp_path / "sub" / "current.conf").exists()


def test_cmdline_runs_the_experiment_inside_its_directory(tmp_path, jobman):
    env = {
        "PYTHONPATH": experiment_module(
            tmp_path,
            "jm_cwd_exp",
            ("import os\ndef write(state, channel):\n    open('here.txt', 'w').write(os.getcwd())\n"),
        )
    }
    r = jobman("cmdline", "jm_cwd_exp.write", "-w", "w1", cwd=tmp_path, env=env)
    assert r.code == 0, r.err
    assert (tmp_path / "w1" / "here.txt").read_text() == str((tmp_path / "w1").resolve())
    assert not (tmp_path / "here.txt").exists()


def test_cmdline_options_of_the_original(tmp_path, jobman):
    r = jobman(
        "cmdline",
        "-r",
        "--workdir-dir",
        "runs",
        "jobman.examples.def_addition.addition_example",
        "first=1",
        "second=1",
        cwd=tmp_path,
    )
    assert r.code == 0 and printed(r) == [], r.out
    (out,) = (tmp_path / "runs").glob("jobman_*/stdout.txt")
    assert out.read_text().splitlines()[-1] == "result = 2"
    r = jobman("cmdline", "-n", "jobman.experiments.print_state", "a=1", cwd=tmp_path)
    assert r.code == 0 and '"workdir": "(removed: --dry-run)"' in r.out
    assert not list(tmp_path.glob("jobman_*"))
    for flag, says in (("-2", "Ctrl-C always interrupts"), ("-g=date", "-w"), ("-p=filemerge", "reads key=value")):
        r = jobman("cmdline", flag, "-n", "jobman.experiments.print_state", "a=1", cwd=tmp_path)
        assert r.code == 0 and says in r.err, r.err
    r = jobman(
        "cmdline",
        "--save-every",
        "0",
        "--finish-up-after",
        "0.01",
        "jobman.experiments.example_sleep",
        "sleep=30",
        "-n",
        cwd=tmp_path,
        timeout=20,
    )
    assert r.code == 75 and '"status": "INCOMPLETE"' in r.out, r.out + r.err


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["missing.conf"],
            "'missing.conf': '=' is missing: parameters are written key=value (and no such configuration",
        ),
        (["a <- missing.conf"], "no configuration file 'missing.conf'"),
        (["x:=1/0"], "ZeroDivisionError"),
        (["x:=@nowhere.at_all()"], "cannot resolve 'nowhere.at_all'"),
        (["x:=object()"], "which is not a number, text"),
        (["x::"], "'::' needs a builder"),
        (["bad.conf"], "bad.conf line 2: '1abc' is not a valid parameter name"),
        (["loop.conf"], "more than 20 deep"),
    ],
)
def test_original_forms_refused_in_one_sentence(tmp_path, jobman, argv, says):
    (tmp_path / "bad.conf").write_text("ok = 1\n1abc = 2\n")
    (tmp_path / "loop.conf").write_text("loop.conf\n")
    url = f"sqlite:///{tmp_path / 'x.db'}/t"
    assert says in one_sentence(jobman("cmdline", "jobman.experiments.print_state", *argv, cwd=tmp_path))
    assert says in one_sentence(jobman("sqlschedule", url, "jobman.experiments.print_state", *argv, cwd=tmp_path))
    assert not (tmp_path / "x.db").exists() or query(url, "SELECT count(*) FROM job") == [(0,)]


def test_reval_make_and_make2():
    from jobman import DD, make, make2, reval
    from jobman.dispatch.builders import BuildError

    x = 12  # noqa: F841 - read by the expressions below, from this scope
    state = DD(b=3)  # noqa: F841
    assert reval("@numpy.add(%a, x) * %%b", a=8) == 60  # doc/advanced.txt
    assert reval("'%d%%' % x") == "12%"  # an operator is not a variable
    with pytest.raises(BuildError, match="does not use %y"):
        reval("1 + %a", a=1, y=2)
    with pytest.raises(BuildError, match="uses %a, which is not given"):
        reval("1 + %a")
    assert make({"__builder__": "fractions.Fraction", "numerator": 3, "denominator": 6}) == 0.5
    nested = make(
        {
            "outer.__builder__": "builtins.dict",
            "outer.inner.__builder__": "fractions.Fraction",
            "outer.inner.numerator": 1,
            "outer.plain": 2,
        }
    )
    assert nested == {"outer": {"inner": 1, "plain": 2}}
    suffix = "?"  # noqa: F841 - found by make2 where it is called
    assert make2({"__builder__": "%a + suffix", "a": "why"}) == "why?"
    assert make2({"v": 1}) == {"v": 1}


@pytest.fixture
def fresh_db(fresh_url):  # noqa: F811
    return fresh_url.replace("postgresql://", "postgres://", 1)


def test_the_doc_examples_through_the_database(fresh_db, tmp_path, jobman):
    """cmdline's examples scheduled with sqlschedule and run by ``jobman sql``, on both engines."""
    url = f"{fresh_db}/doc_examples"
    (tmp_path / "test.conf").write_text(TEST_CONF)
    (tmp_path / "things.conf").write_text("a = 1\nb = 2\n")
    for argv in (
        [
            "jobman.examples.def_make.experiment",
            "obj::jobman.examples.def_make.MakeExample",
            "obj.param1=2",
            "obj.param2=jobman rules",
        ],
        ["jobman.examples.def_make2.experiment", "test.conf"],
        ["jobman.experiments.print_state", "xyz <- things.conf", "u:=@random.uniform(0, 100)"],
    ):
        r = jobman("sqlschedule", url, *argv, cwd=tmp_path)
        assert r.code == 0 and "added 1 jobs" in r.out, r.out + r.err
    r = jobman("sqlschedule", url, "jobman.examples.def_make2.experiment", "test.conf", cwd=tmp_path)
    assert "nothing added" in r.out  # the same job twice is one job
    r = jobman("sql", "-n0", url, str(tmp_path / "runs"), cwd=tmp_path)
    assert r.code == 0 and "3 DONE" in r.err, r.err
    store = Store.open(url)
    try:
        jobs = sorted(store.jobs(), key=lambda j: j.id)
        out = [(Path(j.workdir) / "stdout.txt").read_text().splitlines() for j in jobs]
        assert jobs[0].params == {
            "obj.__builder__": "jobman.examples.def_make.MakeExample",
            "obj.param1": 2,
            "obj.param2": "jobman rules",
        }
        assert jobs[1].params["plumber.luigi.__builder__"] == '"luigi" + exclamation_mark'
    finally:
        store.dispose()
    assert out[0] == ["Created MakeExample object successfully.", "self.value =  2", "jobman rules"]
    assert out[1] == ["it's a me, luigi!"]
    assert out[2][1:] == ["xyz.a = 1", "xyz.b = 2"] and out[2][0].startswith("u = ")


def test_the_mlp_tutorial_as_written(fresh_db, tmp_path, jobman):
    """doc/mlp_jobman.txt: the example's files copied here, one job from the .conf, two more with
    n_hidden={{20,30}} over it, run by dispatch, read through the view with the doc's query."""
    r = subprocess.run([sys.executable, "-m", "jobman.examples", "."], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and (tmp_path / "mlp_jobman.conf").exists(), r.stderr
    url = f"{fresh_db}/mlp_dumi"
    r = jobman("sqlschedule", url, "mlp_jobman.experiment", "mlp_jobman.conf", cwd=tmp_path)
    assert r.code == 0 and "added 1 jobs" in r.out, r.out + r.err
    r = jobman("sqlschedules", url, "mlp_jobman.experiment", "mlp_jobman.conf", "n_hidden={{20,30}}", cwd=tmp_path)
    assert r.code == 0 and "added 2 jobs" in r.out, r.out + r.err
    r = jobman("dispatch", url, "-j", "2", cwd=tmp_path, timeout=300)
    assert r.code == 0, r.err
    assert jobman("sqlview", url, "dumi_mlp_view").code == 0
    rows = query(
        fresh_db,
        "select batchsize,bestvalidationloss,learningrate,minutestrained,nhidden,niter,testscore "
        "from dumi_mlp_view where jobman_status=2 order by bestvalidationloss",
    )
    assert len(rows) == 3
    assert sorted(int(r[4]) for r in rows) == [10, 20, 30]
    assert {(int(r[0]), float(r[2]), int(r[5])) for r in rows} == {(20, 0.01, 50)}
    assert all(0 <= float(r[1]) < 0.5 and 0 <= float(r[6]) < 0.5 and float(r[3]) > 0 for r in rows)
    assert [float(r[1]) for r in rows] == sorted(float(r[1]) for r in rows)


def test_conf_files_keep_a_sweeps_errors_pointing_at_the_users_arguments():
    from jobman.jobdb.conf import expand_tokens

    tokens = ["f", "a=1", "b={{1,2}}", "--", "c=3"]
    assert expand_tokens(tokens, evaluate=eval) == tokens
    with pytest.raises(SweepError, match="argument 2 'x:=nope'"):
        expand_tokens(["f", "x:=nope"], evaluate=lambda e: (_ for _ in ()).throw(NameError(e)))
    assert expand_tokens(["f", "a=1", "a=2"], evaluate=eval, later_wins=True) == ["f", "a=2"]
    assert expand_tokens(["f", "a=1", "--", "a=2"], evaluate=eval, later_wins=True) == ["f", "a=1", "--", "a=2"]


def test_examples_copy_keeps_what_is_there(tmp_path):
    (tmp_path / "test.conf").write_text("mine = 1\n")
    r = subprocess.run(
        [sys.executable, "-m", "jobman.examples", str(tmp_path)], capture_output=True, text=True, env={**os.environ}
    )
    assert r.returncode == 0 and "kept" in r.stdout
    assert (tmp_path / "test.conf").read_text() == "mine = 1\n"
    assert "def experiment" in (tmp_path / "mlp_jobman.py").read_text()


def test_the_originals_other_commands(tmp_path, jobman):
    """`jobman sql help` (doc/addition_exp_sql.txt), `condor_check` (doc/advanced.txt) and the
    experiment the original's help suggests trying, jobman.experiments.example1."""
    url = f"sqlite:///{tmp_path / 'o.db'}/t"
    r = jobman("sql", "help")
    assert r.code == 0 and r.out.startswith("Usage: jobman sql"), r.err
    assert jobman("sqlschedule", url, "jobman.experiments.example1", "a=1").code == 0
    r = jobman("condor_check", url)
    assert r.code == 0 and "jobman monitor --once --dry-run" in r.err and "dry run: checked 0 running" in r.out
    r = jobman("sql", url, str(tmp_path / "runs"))
    assert r.code == 0, r.err
    (out,) = (tmp_path / "runs").glob("t/*/stdout.txt")
    assert out.read_text() == "example experiment\n"
    r = jobman("sqlstatus", "--restart", url, "1,")  # the doc's "JOB_ID1, JOB_ID2, ..."
    assert r.code == 0 and "1 job(s) set to QUEUED (0)" in r.out, r.out + r.err

"""Command jobs (``--cmd``) run by a real worker: argv never passes through a shell, outcomes are recorded.

The programs are small Python scripts written under ``tmp_path``; they report
through ``$JOBMAN_RESULTS`` and read their state from ``$JOBMAN_STATE``.
"""

from __future__ import annotations

import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store
from jobman.jobdb.sweep import JobSpec

FAST = ("--heartbeat", "0.2", "--grace", "2")

PROGRAMS = {
    "echo_argv.py": """
        import json, os, sys
        print("hello from the job")
        env = {k: os.environ[k] for k in ("JOBMAN_JOB_ID", "JOBMAN_ATTEMPT", "JOBMAN_WORKDIR")}
        with open(os.environ["JOBMAN_RESULTS"], "w") as fh:
            json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": env}, fh)
    """,
    "fail.py": """
        import sys
        for i in range(300):
            print(f"noise line {i}", file=sys.stderr)
        print("ValueError: the last words of the job", file=sys.stderr)
        sys.exit(4)
    """,
    "rounds.py": """
        import json, os, sys
        with open(os.environ["JOBMAN_STATE"]) as fh:
            info = json.load(fh)
        state = info["state"]
        rounds = state.get("rounds", 0) + 1
        with open(os.environ["JOBMAN_RESULTS"], "w") as fh:
            json.dump({"rounds": rounds, "attempt": info["attempt"], "params": info["params"]}, fh)
        with open(os.path.join(os.environ["JOBMAN_WORKDIR"], "model.txt"), "w") as fh:
            fh.write(f"model after {rounds} rounds")
        sys.exit(75 if rounds < 2 else 0)
    """,
    "read_parent.py": """
        import json, os
        with open(os.environ["JOBMAN_STATE"]) as fh:
            info = json.load(fh)
        [parent] = info["parents"]
        [parent_dir] = os.environ["JOBMAN_PARENT_WORKDIRS"].split(os.pathsep)
        with open(os.path.join(parent_dir, "model.txt")) as fh:
            model = fh.read()
        with open(os.environ["JOBMAN_RESULTS"], "w") as fh:
            json.dump({"model": model, "parent_rounds": parent["results"]["rounds"],
                       "parent_id": parent["id"]}, fh)
    """,
    "sigkill.py": """
        import os
        os.kill(os.getpid(), 9)
    """,
    "bad_results.py": """
        import os
        with open(os.environ["JOBMAN_RESULTS"], "w") as fh:
            fh.write("[1, 2")
    """,
}


@pytest.fixture
def progs(tmp_path: Path) -> Path:
    d = tmp_path / "progs"
    d.mkdir()
    for name, text in PROGRAMS.items():
        (d / name).write_text(textwrap.dedent(text))
    return d


def command(progs: Path, name: str, *template: str) -> str:
    return " ".join(shlex.quote(x) for x in (sys.executable, str(progs / name))) + "".join(f" {t}" for t in template)


def schedule_cmd(
    store: Store, cmd: str, params: dict, *, phase: int = 0, parent: int | None = None, max_attempts: int = 3
) -> list[int]:
    return store.schedule(
        [JobSpec(phase=phase, kind="cmd", target=cmd, params=params, parent=parent)], max_attempts=max_attempts
    ).job_ids


def run_worker(jobman, url: str, runs: Path, *extra: str):
    r = jobman("worker", url, "--exproot", str(runs), *FAST, *extra, timeout=120)
    assert r.code == 0, r.err
    return r


def hostile(tmp_path: Path) -> tuple[str, Path, Path]:
    """A parameter a shell would act on: substitutions, separators, quotes, globs and braces."""
    pwned = tmp_path / "pwned"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("still here")
    text = (
        f'it\'s a "quoted"  value $(touch {pwned}) `touch {pwned}`; rm -rf {victim} && touch {pwned} '
        f"| cat > {pwned} * ~ $HOME {{lr}} {{}} \\n end"
    )
    return text, pwned, victim


def test_a_hostile_parameter_reaches_the_program_unaltered(jobman, db_url, store, progs, tmp_path):
    text, pwned, victim = hostile(tmp_path)
    runs = tmp_path / "runs"
    # scheduled the way a user would: quoted, through sqlschedule --cmd
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    r = jobman(
        "sqlschedule", db_url, "--cmd", command(progs, "echo_argv.py"), f'msg="{quoted}"', "n={{3,4}}", "flag=true"
    )
    assert r.code == 0, r.err
    ids = [j.id for j in store.jobs()]
    assert [store.job(i).params["msg"] for i in ids] == [text, text]

    run_worker(jobman, db_url, str(runs))
    for job_id, n in zip(ids, ("3", "4")):
        job = store.job(job_id)
        assert job.status is Status.DONE, job.error
        # one argument per value, in the stored (sorted) order of the parameters
        assert job.results["argv"] == ["--flag", "--msg", text, "--n", n]
        assert job.results["cwd"] == job.workdir
        assert job.results["env"] == {
            "JOBMAN_JOB_ID": str(job_id),
            "JOBMAN_ATTEMPT": "1",
            "JOBMAN_WORKDIR": job.workdir,
        }
        assert job.exit_code == 0
        assert (Path(job.workdir) / "stdout.txt").read_text() == "hello from the job\n"
    assert not pwned.exists()
    assert (victim / "keep.txt").read_text() == "still here"


def test_template_placeholders_fill_whole_arguments(jobman, db_url, store, progs, tmp_path):
    text, pwned, victim = hostile(tmp_path)
    cmd = command(progs, "echo_argv.py", "--lr={lr}", "{msg}", "fixed", "'two words'", "--layers", "{layers}")
    [job_id] = schedule_cmd(store, cmd, {"lr": 0.1, "msg": text, "layers": [64, 32], "unused": "x"})
    run_worker(jobman, db_url, tmp_path / "runs")
    job = store.job(job_id)
    assert job.status is Status.DONE, job.error
    assert job.results["argv"] == ["--lr=0.1", text, "fixed", "two words", "--layers", "[64, 32]"]
    assert not pwned.exists() and victim.exists()


def test_a_non_zero_exit_fails_with_its_code_and_the_tail_of_stderr(jobman, db_url, store, progs, tmp_path):
    [job_id] = schedule_cmd(store, command(progs, "fail.py"), {"x": 1})
    run_worker(jobman, db_url, tmp_path / "runs")
    job = store.job(job_id)
    assert job.status is Status.FAILED
    assert job.exit_code == 4
    assert "exited with code 4" in job.error
    assert job.error.rstrip().endswith("ValueError: the last words of the job")
    assert "noise line 299" in job.error and "noise line 0\n" not in job.error  # a tail, not all of it
    assert job.attempt == 1  # FAILED is never relaunched by itself
    assert [e.to_status for e in store.events(job_id) if e.to_status] == ["RUNNING", "FAILED"]


def test_exit_75_resumes_and_children_find_their_parent(jobman, db_url, store, progs, tmp_path):
    specs = [
        JobSpec(0, "cmd", command(progs, "rounds.py"), {"lr": 0.5}, None),
        JobSpec(1, "cmd", command(progs, "read_parent.py"), {"lr": 0.5, "epochs": 2}, 0),
    ]
    parent, child = store.schedule(specs).job_ids
    assert store.schedule(specs).added == 0  # the same sweep again adds nothing
    run_worker(jobman, db_url, tmp_path / "runs")

    p = store.job(parent)
    assert p.status is Status.DONE and p.attempt == 1
    assert p.results == {"rounds": 2, "attempt": 1, "params": {"lr": 0.5}}  # the second run saw the first's results
    c = store.job(child)
    assert c.status is Status.DONE, c.error
    assert c.results == {"model": "model after 2 rounds", "parent_rounds": 2, "parent_id": parent}


def test_commands_that_cannot_start_or_die_are_recorded(jobman, db_url, store, progs, tmp_path):
    [missing] = schedule_cmd(store, str(tmp_path / "no-such-program"), {"a": 1})
    [unknown] = schedule_cmd(store, command(progs, "echo_argv.py", "{nope}"), {"a": 1})
    [killed] = schedule_cmd(store, command(progs, "sigkill.py"), {"a": 1}, max_attempts=1)
    [garbled] = schedule_cmd(store, command(progs, "bad_results.py"), {"a": 1})
    run_worker(jobman, db_url, tmp_path / "runs")

    jobs = {j.id: j for j in store.jobs()}
    assert jobs[missing].status is Status.FAILED and "no-such-program" in jobs[missing].error
    assert jobs[unknown].status is Status.FAILED and "{nope}" in jobs[unknown].error
    assert jobs[killed].status is Status.CRASHED and "SIGKILL" in jobs[killed].error
    assert jobs[garbled].status is Status.FAILED and "JOBMAN_RESULTS" in jobs[garbled].error
    assert not store.jobs(status=[Status.RUNNING])


TRAIN_CLI = """
    import argparse, json, os

    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--use-bn", action="store_true")
    parser.add_argument("--augment", action="store_true")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8])
    args = parser.parse_args()
    with open(os.environ["JOBMAN_RESULTS"], "w") as fh:
        json.dump({"lr": args.lr, "use_bn": args.use_bn, "augment": args.augment, "sizes": args.sizes,
                   "cwd": os.getcwd()}, fh)
"""


def test_a_command_runs_as_written_against_a_real_argparse_script(jobman, db_url, store, tmp_path):
    """The README's form: a script beside the user, relative; flags, lists and names with '-'."""
    here = tmp_path / "project"
    here.mkdir()
    (here / "train_cli.py").write_text(textwrap.dedent(TRAIN_CLI))
    r = jobman(
        "sqlschedule",
        db_url,
        "--cmd",
        f"{shlex.quote(sys.executable)} train_cli.py",
        "lr={{0.1,0.2}}",
        "use-bn=True",
        "augment=False",
        "sizes=[32,64]",
        cwd=here,
    )
    assert r.code == 0, r.err
    run_worker(jobman, db_url, tmp_path / "runs")
    jobs = store.jobs()
    assert len(jobs) == 2
    for job, lr in zip(jobs, (0.1, 0.2)):
        assert job.status is Status.DONE, job.error
        assert str(here / "train_cli.py") in job.target  # found from where it was scheduled
        assert job.results == {"lr": lr, "use_bn": True, "augment": False, "sizes": [32, 64], "cwd": job.workdir}

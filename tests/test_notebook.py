"""An experiment in a notebook: an Experiment, a future and a job as HTML, a wait with a progress bar,
learning curves as a DataFrame, the report's plots as figures, and a link to a dashboard that is
really serving (a real ``jobman serve`` process, really killed). Real databases on both engines, jobs
really run; the notebooks are executed by a real Jupyter kernel (nbclient)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import experiment_module
from nbclient import NotebookClient

import jobman
from jobman.jobdb.errors import UsageError

DOCS_NOTEBOOK = Path(__file__).resolve().parent.parent / "docs" / "notebook.ipynb"


def fit(lr, nhid=32, channel=None):
    """Best at lr=0.01; fails at lr=0.5; logs a curve of three steps."""
    if lr == 0.5:
        raise ValueError("diverged at lr=0.5")
    err = 1.0
    for step in range(1, 4):
        err = abs(lr - 0.01) * 10 + 1.0 / (step * nhid)
        channel.log(step, err=err)
    return {"err": err}


@pytest.fixture
def runtime(tmp_path, monkeypatch) -> Path:
    """A runtime folder of this test's own, where serving dashboards are listed."""
    folder = tmp_path / "runtime"
    monkeypatch.setenv("JOBMAN_RUNTIME_DIR", str(folder))
    monkeypatch.delenv("JOBMAN_DASHBOARD", raising=False)
    return folder


@pytest.fixture
def ran(db_url, tmp_path, runtime):
    """Five calls run inline: four DONE, one FAILED."""
    exp = jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs")
    futures = exp.map(fit, jobman.grid(lr=[0.001, 0.01, 0.1, 0.5], nhid=[32]))
    futures.append(exp.call(fit, lr=0.01, nhid=64))
    yield exp, futures
    exp.close()


def test_an_experiment_a_future_and_a_job_render_as_html(ran):
    exp, futures = ran
    html = exp._repr_html_()
    segments = dict(re.findall(r'class="jobman-seg" data-status="(\w+)" data-count="(\d+)"', html))
    assert segments == {"DONE": "4", "FAILED": "1"}
    assert "5 of 5 finished" in html
    best = min(f.result()["err"] for f in futures if f.exception() is None)
    found = re.search(r'class="jobman-best" data-metric="err" data-value="([^"]+)"', html)
    assert found and float(found.group(1)) == pytest.approx(best)
    assert "lr=0.01 nhid=64" in html and f"(job {futures[-1].job_id})" in html
    assert "no dashboard is serving it" in html and "jobman serve" in html and "jobman-dashboard" not in html

    done = futures[1]._repr_html_()
    assert f'data-id="{futures[1].job_id}" data-status="DONE"' in done
    assert "lr=0.01, nhid=32" in done and "err=" in done
    failed = futures[3]._repr_html_()
    assert 'data-status="FAILED"' in failed and "ValueError: diverged at lr=0.5" in failed
    job = exp.store.job(futures[3].job_id)
    assert job._repr_html_().startswith(f'<div class="jobman-job" data-id="{job.id}" data-status="FAILED"')


def test_markup_in_a_parameter_or_an_error_is_shown_as_text(db_url, tmp_path, runtime):
    def shout(note):
        raise RuntimeError(f"<b>{note}</b>")

    with jobman.Experiment(db_url, backend="inline", exproot=tmp_path / "runs") as exp:
        future = exp.call(shout, note="<script>alert(1)</script>")
        for html in (future._repr_html_(), exp.store.job(future.job_id)._repr_html_(), exp._repr_html_()):
            assert "<script>" not in html and "<b>&lt;" not in html
        assert "&lt;script&gt;" in future._repr_html_()


def test_the_view_links_to_a_dashboard_only_while_one_serves_the_database(ran, db_url, runtime):
    exp, futures = ran
    server = subprocess.Popen(
        [sys.executable, "-m", "jobman.cli.main", "serve", db_url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        printed = server.stdout.readline()
        assert "http://" in printed, server.stderr.read() if server.poll() is not None else printed
        html = exp._repr_html_()
        found = re.search(r'class="jobman-dashboard" href="([^"]+)"', html)
        assert found, html
        link = found.group(1).replace("&amp;", "&")
        base = re.search(r"http://[^/]+/s/[\w-]+", printed).group(0)  # the server's secret path, kept in the link
        assert link.startswith(f"{base}/e/{exp.name}?token=")
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())  # the token becomes a cookie
        with browser.open(link, timeout=30) as page:  # the link opens the experiment's page
            assert page.status == 200 and exp.name in page.read().decode()
        job_link = re.search(r'href="([^"]+)"', futures[0]._repr_html_().split("jobman-dashboard", 1)[1]).group(1)
        assert f"/e/{exp.name}/job/{futures[0].job_id}?token=" in job_link
        # A server killed outright leaves its record behind; the view sees it is gone, and drops it.
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=30)
        assert list(runtime.glob("serve-*.json"))
        html = exp._repr_html_()
        assert "jobman-dashboard" not in html and "no dashboard is serving it" in html
        assert not list(runtime.glob("serve-*.json"))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_dashboard_on_another_host_is_named_by_jobman_dashboard(ran, monkeypatch):
    exp, _ = ran
    monkeypatch.setenv("JOBMAN_DASHBOARD", "http://gpu-node-3:8787/s/Secret-path_1/?token=s3cret-token")
    html = exp._repr_html_()
    assert f'href="http://gpu-node-3:8787/s/Secret-path_1/e/{exp.name}?token=s3cret-token"' in html
    # the link of any page of it will do: its server's path is kept, the page is this experiment's
    monkeypatch.setenv("JOBMAN_DASHBOARD", "http://gpu-node-3:8787/s/Secret-path_1/e/other/job/3?token=s3cret-token")
    assert f'href="http://gpu-node-3:8787/s/Secret-path_1/e/{exp.name}?token=s3cret-token"' in exp._repr_html_()


def test_waiting_shows_progress_as_text_outside_a_notebook(tmp_path, runtime, capsys, monkeypatch):
    path = experiment_module(tmp_path, "jm_nb_fit", inspect.getsource(fit))  # importable by local workers
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.syspath_prepend(path.split(os.pathsep)[0])
    module = importlib.import_module("jm_nb_fit")
    url = f"sqlite:///{tmp_path / 'runs.db'}?table=wait"
    with jobman.Experiment(url, backend="local", workers=2, exproot=tmp_path / "runs") as exp:
        futures = exp.map(module.fit, jobman.grid(lr=[0.001, 0.01, 0.5]))
        done, not_done = jobman.wait(futures, progress=True)
    assert len(done) == 3 and not not_done
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(r"\[#{30}\] 3/3 finished, 1 failed \(\d+ s\)", last), last
    # Without progress= and outside a notebook, it is concurrent.futures.wait, silent.
    jobman.wait(futures, timeout=5)
    assert capsys.readouterr().err == ""


def test_history_is_the_logged_curves_with_each_jobs_parameters(ran):
    exp, futures = ran
    frame = exp.history("err")
    assert list(frame.columns) == ["id", "step", "metric", "value", "params_lr", "params_nhid"]
    ok = [f for f in futures if f.exception() is None]
    assert len(frame) == 3 * len(ok)
    expected = sorted((j, s, v) for j, s, name, v in exp.store.metrics([f.job_id for f in ok]) if name == "err")
    assert sorted(zip(frame["id"], frame["step"], frame["value"])) == expected
    last = frame[frame["step"] == 3].set_index("id")["value"]
    assert {f.job_id: f.result()["err"] for f in ok} == pytest.approx(last.to_dict())
    assert exp.history(as_frame=False)[0]["metric"] == "err"


def test_a_curve_nobody_logged_is_refused_in_one_sentence_and_nothing_is_written(ran):
    exp, _ = ran
    before = (exp.store.counts(), [exp.store.events(j.id) for j in exp.store.jobs()])
    with pytest.raises(UsageError) as refused:
        exp.history("valid_eror")
    assert str(refused.value) == f"no job of {exp.name!r} logged a curve named 'valid_eror'; logged: err"
    with pytest.raises(UsageError, match="is 'min' or 'max'"):
        exp.plot("err", "lowest")
    assert (exp.store.counts(), [exp.store.events(j.id) for j in exp.store.jobs()]) == before


def test_plot_returns_the_figures_report_plot_writes(ran, db_url, jobman, tmp_path):
    exp, _ = ran
    figs = exp.plot("err")
    assert list(figs) == ["err_vs_lr.png", "err_vs_nhid.png", "err_learning_curves.png"]
    assert figs["err_vs_lr.png"].axes[0].get_xscale() == "log"
    out = jobman("report", db_url, "--metric", "err", "--plot", str(tmp_path / "plots"))
    assert out.code == 0, out.err
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(figs)
    html = figs._repr_html_()
    assert html.count('<img alt="') == 3 and html.count("data:image/png;base64,") == 3


def run_notebook(cells: list[str], cwd: Path, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    return execute(nb, cwd, env)


def execute(nb: nbformat.NotebookNode, cwd: Path, env: dict[str, str] | None = None) -> nbformat.NotebookNode:
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return nb


def html_of(cell: nbformat.NotebookNode) -> list[str]:
    return [o["data"]["text/html"] for o in cell.outputs if "data" in o and "text/html" in o["data"]]


def test_a_notebook_shows_the_views_and_a_live_progress_bar(tmp_path, runtime):
    cells = [
        "import jobman\n"
        "def fit(lr, channel=None):\n"
        "    for step in range(1, 4):\n"
        "        channel.log(step, err=abs(lr - 0.01) + 1 / step)\n"
        "    return {'err': abs(lr - 0.01)}\n"
        "exp = jobman.Experiment('sqlite:///runs.db?table=nb', backend='local', workers=2, exproot='runs')\n"
        "futures = exp.map(fit, jobman.grid(lr=[0.001, 0.003, 0.01, 0.03]))",
        "done, not_done = jobman.wait(futures)",
        "exp",
        "futures[0]",
        "exp.store.job(futures[2].job_id)",
        "exp.history('err').shape",
        "exp.plot('err')",
    ]
    nb = run_notebook(cells, tmp_path, {"JOBMAN_RUNTIME_DIR": str(runtime)})
    [bar] = html_of(nb.cells[1])  # one display, updated in place as the jobs finished
    assert 'data-done="4" data-total="4" data-failed="0"' in bar and "done: 4 of 4 finished" in bar
    [view] = html_of(nb.cells[2])
    assert 'data-status="DONE" data-count="4"' in view and "4 of 4 finished" in view
    assert 'class="jobman-best" data-metric="err" data-value="0.0"' in view and "lr=0.01" in view
    [future] = html_of(nb.cells[3])
    assert future.startswith('<div class="jobman-job" data-id="1" data-status="DONE"') and "Future of job 1" in future
    [job] = html_of(nb.cells[4])
    assert job.startswith('<div class="jobman-job" data-id="3" data-status="DONE"') and "lr=0.01" in job
    assert nb.cells[5].outputs[0]["data"]["text/plain"] == "(12, 5)"
    [plots] = html_of(nb.cells[6])
    assert re.findall(r'data-name="([^"]+)"', plots) == ["err_vs_lr.png", "err_learning_curves.png"]


def test_the_docs_notebook_runs_and_shows_every_view(tmp_path, runtime):
    nb = nbformat.read(DOCS_NOTEBOOK, as_version=4)
    execute(nb, tmp_path, {"JOBMAN_RUNTIME_DIR": str(runtime)})
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o["output_type"] == "error"]
    assert not errors, errors
    shown = "\n".join(h for c in nb.cells if c.cell_type == "code" for h in html_of(c))
    for part in ("jobman-wait", "jobman-experiment", "jobman-best", "jobman-job", "jobman-plot", "<table"):
        assert part in shown, part
    assert re.search(r'data-done="(\d+)" data-total="\1"', shown)  # the wait ended with every job finished
    assert (tmp_path / "runs.db").exists()  # it ran where it was executed, not in docs/
    assert not (DOCS_NOTEBOOK.parent / "runs.db").exists()
    # Its stored outputs are real ones: the same views, saved by an execution.
    stored = nbformat.read(DOCS_NOTEBOOK, as_version=4)
    kept = "\n".join(h for c in stored.cells if c.cell_type == "code" for h in html_of(c))
    for part in ("jobman-wait", "jobman-experiment", "jobman-job", "jobman-plot"):
        assert part in kept, f"docs/notebook.ipynb is saved without its {part} output"


def test_a_future_whose_job_was_deleted_says_so_in_its_view(ran):
    exp, futures = ran
    gone = futures[3]  # the failed one: a job nothing depends on
    assert exp.store.delete([gone.job_id]) == 1
    html = gone._repr_html_()
    assert html.startswith("<pre>") and "Traceback" not in html
    assert re.search(rf"job {gone.job_id}\b.*(no|not|does not exist)", html), html


def test_a_password_in_the_url_never_reaches_the_view(pg_database, tmp_path, runtime):
    """A notebook's outputs are saved and shared: the view names the database with its password masked."""
    url = pg_database.replace("postgresql://postgres@", "postgresql://postgres:s3cret-pw@") + "?table=pw"
    assert "s3cret-pw" in url
    with jobman.Experiment(url, backend="inline", exproot=tmp_path / "runs") as exp:
        future = exp.call(fit, lr=0.01)
        for shown in (exp._repr_html_(), future._repr_html_(), repr(exp)):
            assert "s3cret-pw" not in shown
        assert "jobman serve" in exp._repr_html_()


def test_a_link_to_a_dashboard_on_the_network_leaves_its_token_out(ran, runtime):
    """Saved outputs are shared: only a server this host alone can reach gets its token in the link."""
    from jobman.jobdb import serving

    exp, _ = ran
    listed = serving.register(exp.store.target, "http://10.1.2.3:8787/s/abc", "a-token-of-the-network")
    try:
        html = exp._repr_html_()
        assert f'href="http://10.1.2.3:8787/s/abc/e/{exp.name}"' in html and "a-token-of-the-network" not in html
    finally:
        serving.unregister(listed)
    listed = serving.register(exp.store.target, "http://127.0.0.1:8787/s/abc", "a-token-of-this-host")
    try:
        assert f'href="http://127.0.0.1:8787/s/abc/e/{exp.name}?token=a-token-of-this-host"' in exp._repr_html_()
    finally:
        serving.unregister(listed)
    assert not list(runtime.glob("serve-*.json"))


def test_an_experiment_whose_jobs_wait_for_workers_shows_them_queued_and_no_best(db_url, tmp_path, runtime):
    with jobman.Experiment(db_url, backend=None, exproot=tmp_path / "runs") as exp:
        assert "no job yet" in exp._repr_html_()
        futures = exp.map(fit, jobman.grid(lr=[0.001, 0.01]))
        html = exp._repr_html_()
        assert dict(re.findall(r'class="jobman-seg" data-status="(\w+)" data-count="(\d+)"', html)) == {"QUEUED": "2"}
        assert "0 of 2 finished" in html and "jobman-best" not in html
        assert f'data-id="{futures[0].job_id}" data-status="QUEUED"' in futures[0]._repr_html_()
        for f in futures:
            f.cancel()


def test_a_notebook_names_the_calls_a_future_waits_for_and_the_one_that_blocked_it(tmp_path, runtime):
    """In a real kernel: a phase-1 call WAITING on its QUEUED parent names it; once the parent is set
    FAILED, the call, now BLOCKED, names the call that blocked it."""
    cells = [
        "import jobman\n"
        "exp = jobman.Experiment('sqlite:///runs.db?table=nb', backend=None, exproot='runs')\n"
        "futures = exp.schedule('lab.steps:prepare a={{1,2}} -- lab.steps:train b=1', check=False)\n"
        "jobs = [exp.store.job(f.job_id) for f in futures]\n"
        "child = next(f for f, j in zip(futures, jobs) if j.phase == 1)\n"
        "parent = exp.store.job(child.job_id).depends_on[0]\n"
        "print(parent)",
        "child",
        "from jobman.jobdb.status import Status\nexp.store.set_status([parent], Status.FAILED)\nchild",
    ]
    nb = run_notebook(cells, tmp_path, {"JOBMAN_RUNTIME_DIR": str(runtime)})
    parent = int(nb.cells[0].outputs[0]["text"])
    [waiting] = html_of(nb.cells[1])
    assert 'data-status="WAITING"' in waiting
    held = re.search(r"waits for</th><td[^>]*>(.*?)</td>", waiting).group(1)
    assert f"job {parent} <code>prepare</code>" in held and 'data-status="QUEUED"' in held
    [blocked] = html_of(nb.cells[2])
    assert 'data-status="BLOCKED"' in blocked
    held = re.search(r"blocked by</th><td[^>]*>(.*?)</td>", blocked).group(1)
    assert f"job {parent} <code>prepare</code>" in held and 'data-status="FAILED"' in held

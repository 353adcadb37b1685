"""``jobman serve`` over HTTP, on both engines: every page, the token, the guards on actions, escaping.

The application runs in process (Starlette's test client) against a real SQLite file or the real
PostgreSQL, filled through the store's verbs; ``jobman serve`` itself runs as a real process.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from web_data import HOSTILE, fill

from jobman.jobdb.status import Status

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from jobman.web.app import create_app

TOKEN = "test-token-0123456789"
BASE = "http://127.0.0.1:8787"


@pytest.fixture
def filled(store, db_url):
    roles = fill(store)
    return store, db_url, roles


def client(
    db_url: str, *, token: str | None = TOKEN, allow_actions: bool = False, authorized: bool = True, **kwargs
) -> TestClient:
    app = create_app(db_url, token=token, allow_actions=allow_actions, **kwargs)
    headers = {"Authorization": f"token {token}"} if token and authorized else {}
    # the whole dashboard lives under the server's secret path: the client's paths are relative to it
    return TestClient(app, base_url=BASE + app.state.base, headers=headers, follow_redirects=False)


def test_the_experiments_page_lists_each_experiment_with_its_counts_and_best(filled):
    store, db_url, roles = filled
    c = client(db_url)
    page = c.get("/")
    assert page.status_code == 200
    assert f'data-name="{store.experiment}"' in page.text
    assert '<span class="count" data-status="DONE">10</span>' in page.text
    assert "computing…" in page.text  # the first paint does not wait for the report
    part = c.get("/?part=list")
    assert "<html" not in part.text and "valid_error <b>0.1005</b>" in part.text  # lr=0.01 nhid=64: 2 folds' mean
    assert "valid_error <b>0.1005</b>" in c.get("/").text  # known now: on the page at once
    data = c.get("/api/experiments").json()
    mine = next(e for e in data if e["name"] == store.experiment)
    assert mine["counts"] == {"DONE": 10, "FAILED": 2, "RUNNING": 1, "QUEUED": 10, "WAITING": 1, "BLOCKED": 1}
    assert mine["best"]["label"] == "lr=0.01 nhid=64" and mine["rate"] > 0 and mine["eta"] > 0


def test_the_experiment_page_shows_phases_report_charts_and_curves(filled):
    store, db_url, roles = filled
    c = client(db_url)
    page = c.get(f"/e/{store.experiment}")
    assert page.status_code == 200, page.text
    assert "phase 0 (12 links)" in page.text  # phase 1 depends on phase 0, one link per job
    assert 'id="report-pending"' in page.text  # the report comes with the first live update
    curves = page.text.split('id="curves"', 1)[1].split("</div>", 1)[0]
    assert curves.count('class="curve"') == 8  # the running job and the latest finished ones
    text = c.get(f"/e/{store.experiment}?part=report").text
    assert "best: lr=0.01 nhid=64 — valid_error 0.1005" in text
    assert re.search(r'<tr class="best"><td>1 ★</td>\s*<td>lr=0.01 nhid=64</td>', text)
    # One point per configuration with a mean (5 of the 7 configurations), in each parameter's chart.
    assert 'data-points="5"' in text
    for param in ("lr", "nhid"):
        figure = text.split(f'data-param="{param}"', 1)[1].split("</figure>", 1)[0]
        assert figure.count('class="pt') == 5
        assert figure.count('class="pt best"') == 1
    assert text.count('class="pc"') == 5  # parallel coordinates: a line per configuration
    strokes = re.findall(r'class="pc" fill="none" stroke="([^"]*)"', text)
    assert len(strokes) == 5 and all(re.fullmatch("#[0-9a-f]{6}", s) for s in strokes), strokes  # each one drawn
    assert "data-search=" not in text  # no learning search: none of its charts
    by_max = c.get(f"/e/{store.experiment}?part=report&metric=train_error&mode=max").text
    assert "best: lr=0.1 nhid=32 — train_error 0.09125" in by_max


def test_the_job_table_pages_sorts_and_filters(filled):
    store, db_url, roles = filled
    c = client(db_url)
    name = store.experiment

    def ids(query: str) -> list[int]:
        page = c.get(f"/e/{name}?part=jobs&{query}")
        assert page.status_code == 200, page.text
        return [int(i) for i in re.findall(r'<tr class="job" data-id="(\d+)"', page.text)]

    assert ids("") == sorted(roles["all"])
    assert ids("sort=-id") == sorted(roles["all"], reverse=True)
    assert ids("status=DONE") == sorted(roles["done"])
    assert ids("status=FAILED,RUNNING&phase=0") == sorted(roles["failed"] + roles["running"])
    assert ids("where=lr%3D%3D0.01,nhid%3E%3D64&phase=0") == [
        j.id for j in store.jobs(phase=0) if j.params["lr"] == 0.01 and j.params["nhid"] == 64
    ]
    assert ids("sort=-finished_at&status=DONE")[0] == roles["done"][-1]
    total = c.get(f"/e/{name}?part=jobs&status=DONE").text
    assert '<span id="job-total">10</span>' in total


def test_a_big_table_is_paged(store, db_url):
    from jobman.jobdb.sweep import expand, parse_sweep

    store.schedule(expand(parse_sweep(["pkg.mod:fn", "x={{" + ",".join(map(str, range(120))) + "}}"])))
    c = client(db_url)
    first = c.get(f"/e/{store.experiment}?part=jobs&sort=-id").text
    assert first.count('class="job"') == 50 and "page 1 of 3" in first
    last = c.get(f"/e/{store.experiment}?part=jobs&sort=-id&page=2").text
    assert re.findall(r'data-id="(\d+)"', last)[-1] == str(min(j.id for j in store.jobs(with_deps=False)))
    assert last.count('class="job"') == 20


def test_the_job_page_shows_history_error_links_and_curves(filled):
    store, db_url, roles = filled
    c = client(db_url)
    failed = roles["failed"][0]
    page = c.get(f"/e/{store.experiment}/job/{failed}").text
    assert "ValueError: loss is nan" in page
    assert page.count('class="event') == len(store.events(failed))
    child = store.children(failed)[0]
    assert f'/job/{child}">{child}</a>' in page  # its BLOCKED dependent, as a link
    done = roles["done"][0]
    page = c.get(f"/e/{store.experiment}/job/{done}").text
    assert page.count('class="curve"') == 1 and "valid_error" in page
    assert 'id="actions"' not in page  # no actions without --allow-actions
    part = c.get(f"/e/{store.experiment}/job/{done}?part=head")
    assert part.status_code == 200 and "<html" not in part.text and "DONE" in part.text
    assert c.get(f"/e/{store.experiment}/job/{done}?part=nothing").status_code == 404


def test_a_hostile_value_shows_as_text_on_every_page(filled):
    store, db_url, roles = filled
    c = client(db_url)
    name = store.experiment
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    for url in (
        "/",
        "/?part=list",
        f"/e/{name}",
        f"/e/{name}?part=jobs",
        f"/e/{name}?part=report",
        f"/e/{name}/job/{roles['hostile']}",
        f"/e/{name}/job/{roles['hostile']}?part=history",
        f"/e/{name}?where=note%3D%3D{HOSTILE}",
    ):
        text = c.get(url).text
        assert HOSTILE not in text and "<script>alert" not in text, url
    assert escaped in c.get(f"/e/{name}/job/{roles['hostile']}").text
    assert f"RuntimeError: {escaped}" in c.get(f"/e/{name}/job/{roles['hostile']}").text


def test_bad_input_on_a_page_is_one_sentence(filled):
    store, db_url, roles = filled
    c = client(db_url)
    for url, code, words in (
        (f"/e/{store.experiment}?sort=size", 400, "cannot sort jobs by"),
        (f"/e/{store.experiment}?status=SLEEPING", 400, "unknown status"),
        (f"/e/{store.experiment}?where=lr", 400, "KEY OP VALUE"),
        (f"/e/{store.experiment}?page=-1", 400, "0 or more"),
        (f"/e/{store.experiment}?part=report&mode=median", 400, "min or max"),
        (f"/e/{store.experiment}?part=report&metric=speed", 400, "speed"),
        ("/e/no-such-experiment", 404, "no experiment"),
        (f"/e/{store.experiment}/job/999999", 404, "no job 999999"),
    ):
        page = c.get(url)
        assert page.status_code == code, url
        assert words in re.search(r'id="error">(.*?)</p>', page.text).group(1), url


def test_every_request_needs_the_token(filled):
    store, db_url, roles = filled
    c = client(db_url, authorized=False)
    for url in (
        "/",
        f"/e/{store.experiment}",
        "/api/experiments",
        "/static/style.css",
        f"/e/{store.experiment}/job/{roles['done'][0]}",
    ):
        assert c.get(url).status_code == 403, url
        assert c.get(url, headers={"Authorization": "token wrong-token-000"}).status_code == 403, url
    assert "wrong token" in c.get("/?token=nope").text
    # The printed link: the token moves into a same-site cookie, and the address loses it.
    first = c.get(f"/e/{store.experiment}?token={TOKEN}&status=DONE")
    base = c.base_url.path.rstrip("/")
    assert first.status_code == 303 and first.headers["location"] == f"{base}/e/{store.experiment}?status=DONE"
    cookie = first.headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert c.get(BASE + first.headers["location"]).status_code == 200  # the cookie carries it now
    assert c.get("/static/live.js").status_code == 200


def test_a_request_for_another_host_name_is_refused(filled):
    store, db_url, roles = filled
    c = client(db_url)
    assert c.get("/", headers={"Host": "attacker.example:8787"}).status_code == 403
    assert c.get("/", headers={"Host": "localhost:8787"}).status_code == 200


def test_a_name_that_is_not_this_servers_is_refused_on_every_bind_address(filled):
    store, db_url, roles = filled
    # DNS rebinding: evil.example made to resolve to the served address must not reach the dashboard,
    # also on another loopback address without a token, and on every address with one
    open_loopback = client(db_url, token=None, host="127.0.0.2")
    for name in ("evil.example", "evil.example:8787", "127.0.0.2.evil.example", "localhost.evil.example"):
        assert open_loopback.get("/", headers={"Host": name}).status_code == 403, name
    for name in ("127.0.0.2:8787", "127.0.0.1:8787", "localhost:8787", "[::1]:8787"):
        assert open_loopback.get("/", headers={"Host": name}).status_code == 200, name
    everywhere = client(db_url, host="0.0.0.0")
    assert everywhere.get("/", headers={"Host": "evil.example:8787"}).status_code == 403
    assert everywhere.get("/", headers={"Host": "192.0.2.7:8787"}).status_code == 200
    assert everywhere.get("/", headers={"Host": f"{socket.gethostname()}:8787"}).status_code == 200
    one_address = client(db_url, host="192.0.2.7")
    assert one_address.get("/", headers={"Host": "192.0.2.7:8787"}).status_code == 200
    assert one_address.get("/", headers={"Host": "192.0.2.8:8787"}).status_code == 403


def test_the_token_link_redirects_on_this_server_only(filled):
    store, db_url, roles = filled
    c = client(db_url, authorized=False)
    base = c.base_url.path.rstrip("/")
    for path in ("//evil.example/", "/\\evil.example/", "///evil.example"):
        outside = c.get(f"{BASE}{path}?token={TOKEN}")  # outside the server's path: no redirect at all
        assert outside.status_code == 404 and "location" not in outside.headers, path
        r = c.get(f"{BASE}{base}{path}?token={TOKEN}")
        assert r.status_code == 303, path
        location = r.headers["location"]
        assert location.startswith(base + "/"), (path, location)


def test_actions_are_refused_without_allow_actions_from_another_site_or_without_the_token(filled):
    store, db_url, roles = filled
    failed = roles["failed"][0]
    url = f"/e/{store.experiment}/job/{failed}/action"
    form = {"csrf": TOKEN, "action": "retry"}
    assert client(db_url).post(url, data=form).status_code == 403  # actions are off
    c = client(db_url, allow_actions=True)
    assert c.post(url, data=form, headers={"Origin": "http://attacker.example"}).status_code == 403
    assert c.post(url, data=form, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert c.post(url, data={"action": "retry"}).status_code == 403  # no token in the form
    assert c.post(url, data={"csrf": "guess", "action": "retry"}).status_code == 403
    assert client(db_url, allow_actions=True, authorized=False).post(url, data=form).status_code == 403
    assert c.get(url).status_code == 405
    assert store.job(failed).status is Status.FAILED  # nothing was changed by any of them


def _act(c: TestClient, name: str, job_id: int, **form) -> str:
    r = c.post(f"/e/{name}/job/{job_id}/action", data={"csrf": TOKEN, **form}, headers={"Origin": BASE})
    assert r.status_code == 303, r.text
    return c.get(BASE + r.headers["location"]).text


def test_actions_go_through_the_store_and_are_logged_from_the_web_page(filled):
    store, db_url, roles = filled
    c = client(db_url, allow_actions=True)
    name = store.experiment
    failed, done, running = roles["failed"][0], roles["done"][0], roles["running"][0]
    page = _act(c, name, failed, action="retry")
    assert f"job {failed} queued again" in page
    assert store.job(failed).status is Status.QUEUED
    assert "retried by hand from the web page" in [e.why for e in store.events(failed)]

    child = store.children(done)[0]
    page = _act(c, name, done, action="reset")
    assert store.job(done).status is Status.QUEUED and store.job(child).status is Status.WAITING
    assert any("from the web page" in e.why for e in store.events(child))  # the cascade, in one transaction

    page = _act(c, name, running, action="reset")
    assert f"nothing changed: job {running} is RUNNING" in page
    page = _act(c, name, running, action="cancel")
    assert store.job(running).stop_requested
    assert store.events(running)[-1].why == "cancelled by hand from the web page: stop requested"

    page = _act(c, name, child, action="priority", priority="7")
    assert store.job(child).priority == 7
    assert store.events(child)[-1].why == "priority set to 7 from the web page"
    page = _act(c, name, child, action="priority", priority="high")
    assert "a priority is a number" in page and store.job(child).priority == 7
    page = _act(c, name, child, action="explode")
    assert "there is no action" in page


def test_no_page_shows_the_database_password(pg_database):
    from jobman.jobdb.store import Store

    db_url = f"{pg_database}?table=secretive"
    store = Store.open(db_url)
    roles = fill(store)
    store.dispose()
    secret = "s3cret-pw"
    with_password = re.sub(r"://([^:@/]+)@", rf"://\1:{secret}@", db_url)
    assert secret in with_password
    c = client(with_password)
    for url in ("/", f"/e/{store.experiment}", f"/e/{store.experiment}/job/{roles['done'][0]}", "/e/nothing-here"):
        text = c.get(url).text
        assert secret not in text, url
    assert "***@" in c.get("/").text


# -- the command ------------------------------------------------------------------------


def test_serve_refuses_what_it_must_in_one_sentence(jobman, tmp_path):
    db = f"sqlite:///{tmp_path / 'none.db'}"
    for args, words in (
        (["--host", "0.0.0.0", "--no-token"], "without a token would open the database"),
        (["--token", "short"], "at least 8 characters"),
        ([], "no jobman database"),
    ):
        r = jobman("serve", db, "--port", "0", *args, timeout=60)
        assert r.code != 0 and "Traceback" not in r.err, r.err
        assert words in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not (tmp_path / "none.db").exists()


def test_serve_says_how_to_install_the_extra_when_it_is_missing(tmp_path):
    code = (
        "import sys; sys.modules['uvicorn'] = None; sys.modules['starlette'] = None\n"
        "from jobman.cli.main import main; sys.exit(main(['serve', 'sqlite:///x.db']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "jobman: jobman serve needs the web extra: pip install 'jobman-sql[web]'"


def test_serve_runs_as_a_real_process_behind_its_token(tmp_path):
    from jobman.jobdb.store import Store

    db_url = f"sqlite:///{tmp_path / 'served.db'}?table=served"
    store = Store.open(db_url)
    fill(store)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobman.cli.main", "serve", db_url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        link = re.search(r"(http://127\.0\.0\.1:(\d+)(/s/[\w-]+)/e/[^?]+\?token=(\S+))", line)
        assert link, line
        assert "database:" in proc.stdout.readline()
        port, base, token = int(link.group(2)), link.group(3), link.group(4)
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with browser.open(link.group(1), timeout=10) as r:  # the redirect sets the cookie that lets it in
            assert r.status == 200 and r.url.endswith(f"/e/{store.experiment}")
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}{base}/e/{store.experiment}", headers={"Authorization": f"token {token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200 and b"valid_error" in r.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{base}/", timeout=10)
        assert refused.value.code == 403
        # outside the server's path, even with the token: nothing but where to go
        req = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"Authorization": f"token {token}"})
        with pytest.raises(urllib.error.HTTPError) as outside:
            urllib.request.urlopen(req, timeout=10)
        assert outside.value.code == 404 and b"open the link" in outside.value.read()
        # A second server on the same port: one sentence.
        taken = subprocess.run(
            [sys.executable, "-m", "jobman.cli.main", "serve", db_url, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert taken.returncode != 0 and f"port {port} on 127.0.0.1 is taken" in taken.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert token not in proc.stderr.read()  # the log holds no token (nor any request line)


def test_a_single_metric_search_shows_its_best_so_far_and_importances_without_a_front(jobman, db_url, store, tmp_path):
    from search_helpers import experiment_module

    exp = experiment_module(tmp_path, LEARN_MODULE, LEARN_TRAINER)
    scheduled = jobman(
        "sqlschedule", db_url, f"{LEARN_MODULE}:two", "x=uniform(-1,3)", "y=uniform(0,1)", "--samples", "6",
        "--sampler", "tpe", "--metric", "f2", "--max", env=exp.env,
    )  # fmt: skip
    assert scheduled.code == 0, scheduled
    assert jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240).code == 0
    values = [j.results["f2"] for j in store.jobs()]
    assert len(values) == 6
    text = client(db_url).get(f"/e/{store.experiment}?part=report").text
    assert re.search(r"learning search \d+: f2 highest best — 6 evaluations</h3>", text), text
    assert f"<title>best so far: {max(values):.3g}</title>" in text  # --max: the highest so far
    assert 'class="pareto"' not in text and text.count('class="bar"') == 2


def test_charts_escape_every_label_and_category():
    from jobman.web import charts

    drawn = [
        charts.scatter([(HOSTILE, 0.1, HOSTILE), ("b", 0.2, "b")], HOSTILE, HOSTILE, best=HOSTILE),
        charts.lines([(HOSTILE, [(0, 1.0), (1, 0.5)])], HOSTILE, HOSTILE),
        charts.parallel([HOSTILE], [([HOSTILE], 0.1, HOSTILE), (["x"], 0.3, "x")], HOSTILE),
        charts.best_so_far([0.3, 0.1], HOSTILE, "min"),
        charts.pareto([(0.1, 0.2, HOSTILE), (0.2, 0.3, "b")], [(0.1, 0.2, HOSTILE)], HOSTILE, HOSTILE),
        charts.bars([(HOSTILE, 0.7), ("b", 0.3)], HOSTILE),
    ]
    for svg in drawn:
        assert "<script" not in svg and "&lt;script&gt;" in svg
    assert drawn[0].count('class="pt') == 2 and drawn[0].count('class="pt best"') == 1


LEARN_MODULE = "jm_web_learn"
LEARN_TRAINER = '''
def two(x, y):
    """Two objectives whose Pareto front is every x in [0, 2]; y matters to neither."""
    return {"f1": x**2, "f2": (x - 2) ** 2 + 0 * y}
'''


def test_a_learning_search_shows_its_best_so_far_front_and_importances(jobman, db_url, store, tmp_path):
    from search_helpers import experiment_module

    exp = experiment_module(tmp_path, LEARN_MODULE, LEARN_TRAINER)
    scheduled = jobman(
        "sqlschedule", db_url, f"{LEARN_MODULE}:two", "x=uniform(-1,3)", "y=uniform(0,1)", "--samples", "12",
        "--sampler", "tpe", "--metric", "f1", "--metric", "f2", "--parallel", "2", env=exp.env,
    )  # fmt: skip
    assert scheduled.code == 0, scheduled
    ran = jobman("worker", db_url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0, ran
    jobs = store.jobs()
    assert len(jobs) == 12 and all(j.status is Status.DONE for j in jobs)
    xs = {j.id: j.params["x"] for j in jobs}
    on_front = {  # as test_search_learn checks it: nothing evaluated beats these on both metrics
        i
        for i, x in xs.items()
        if 0 <= x <= 2
        or (x < 0 and not any(x < o <= -x for k, o in xs.items() if k != i))
        or (x > 2 and not any(4 - x <= o < x for k, o in xs.items() if k != i))
    }
    text = client(db_url).get(f"/e/{store.experiment}?part=report").text
    # The report ranks by the search's first metric, lowest best as the search was told (not as f1's name suggests).
    best_row = re.search(r'<tr class="best">.*?/job/(\d+)"', text, re.S)
    assert best_row and int(best_row.group(1)) == min(xs, key=lambda i: xs[i] ** 2), text
    assert re.search(
        rf"learning search \d+: f1 lowest best, f2 lowest best — 12 evaluations, {len(on_front)} on the Pareto front",
        text,
    ), text
    section = text.split('class="charts search"', 1)[1].split("</div>", 1)[0]
    best = section.split('class="best-so-far"', 1)[1].split("</figure>", 1)[0]
    assert best.count('class="pt eval"') == 12  # every evaluation, in the order proposed
    lowest = min(x**2 for x in xs.values())
    assert f"<title>best so far: {lowest:.3g}</title>" in best
    front = section.split('class="pareto"', 1)[1].split("</figure>", 1)[0]
    assert front.count('class="pt front"') == len(on_front)
    assert front.count('class="pt eval"') == 12 - len(on_front)
    for i in on_front:
        assert re.search(rf'class="pt front"[^>]*><title>[^<]*jobs {i}</title>', front), i
    importances = section.split('class="importances"', 1)[1].split("</figure>", 1)[0]
    assert importances.count('class="bar"') == 2
    assert importances.index("<title>x: ") < importances.index("<title>y: ")  # x decides both metrics; y neither


def test_a_search_chart_counts_evaluations_in_whole_numbers():
    from jobman.web import charts

    drawn = charts.best_so_far([float(v) for v in range(12, 0, -1)], "loss", "min")
    ticks = re.findall(r'<text class="tick"[^>]*text-anchor="middle">([^<]*)</text>', drawn)
    assert ticks == ["1", "6", "12"], ticks  # evaluations: no 6.5th
    assert "<title>best so far: 1</title>" in drawn
    assert "<title>best so far: 12</title>" in charts.best_so_far([12.0, 3.0], "acc", "max")

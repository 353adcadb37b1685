"""The graph of calls: on the experiment page (each call a node coloured by its status and linking to its
page, a big graph grouped by function and phase, its page answering on time), on a job's page (what it
depends on and what depends on it, as links), and in a notebook's view of a WAITING or BLOCKED future.
Real databases on both engines, built through the store's verbs."""

from __future__ import annotations

import re

import pytest
from web_data import fill, fill_calls

import jobman
from jobman.dispatch.futures import JobFuture
from jobman.jobdb import dashboard
from jobman.jobdb.notebook import COLOURS
from jobman.jobdb.status import Status

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from jobman.web import charts
from jobman.web.app import create_app

TOKEN = "test-token-0123456789"


def client(db_url: str) -> TestClient:
    app = create_app(db_url, token=TOKEN)
    return TestClient(
        app, base_url="http://127.0.0.1:8787" + app.state.base, headers={"Authorization": f"token {TOKEN}"}
    )


def nodes_of(page: str) -> dict[int, tuple[str, str, str]]:
    """Each call node drawn: id -> (status, href, box fill)."""
    found = re.findall(
        r'<a class="node call" href="([^"]+)" data-key="(\d+)" data-status="(\w+)"><title>[^<]*</title>'
        r'<rect [^>]*fill="(#[0-9a-f]{6})"',
        page,
    )
    return {int(key): (status, href, fill) for href, key, status, fill in found}


def test_the_experiment_page_draws_each_call_coloured_by_status_and_linking_to_its_page(store, db_url):
    roles = fill_calls(store, 6)
    c = client(db_url)
    page = c.get(f"/e/{store.experiment}").text
    assert 'id="call-graph" data-grouped="no"' in page
    drawn = nodes_of(page)
    jobs = store.jobs(with_deps=True)
    assert sorted(drawn) == sorted(j.id for j in jobs) and len(drawn) == 14
    base = c.base_url.path.rstrip("/")
    for j in jobs:
        status, href, colour = drawn[j.id]
        assert status == j.status.value and colour == COLOURS[status]
        assert href == f"{base}/e/{store.experiment}/job/{j.id}"
    # one arrow per dependency, from the call taken to the call taking it
    arrows = re.findall(r'<path class="edge"[^>]*><title>(\d+) · \w+ → (\d+) · \w+</title>', page)
    expected = {(p, j.id) for j in jobs for p in j.depends_on}
    assert {(int(a), int(b)) for a, b in arrows} == expected and len(arrows) == 6 + 6 + 6
    assert drawn[roles["trains"][-1]][0] == "FAILED" and drawn[roles["summary"]][0] == "BLOCKED"
    # a call's parameters that tell it apart from the function's other calls are shown in its box
    assert re.search(r'class="node-detail"[^>]*>lr=0.001 seed=2</text>', page)
    # a link of the graph opens the job's page
    assert c.get(drawn[roles["load"]][1].removeprefix(base)).status_code == 200


def test_the_graph_is_a_live_part_of_the_page_and_follows_a_status_change(store, db_url):
    roles = fill_calls(store, 3)
    c = client(db_url)
    part = c.get(f"/e/{store.experiment}?part=graph")
    assert part.status_code == 200 and "<html" not in part.text
    running = roles["trains"][-2]
    assert nodes_of(part.text)[running][0] == "RUNNING"
    job = store.job(running)
    store.finish(running, job.lease, "DONE", results={"err": 0.2})
    assert nodes_of(c.get(f"/e/{store.experiment}?part=graph").text)[running][0] == "DONE"


def test_an_experiment_without_dependencies_has_no_graph(store, db_url):
    from web_data import fill_wide

    fill_wide(store, jobs=5)
    page = client(db_url).get(f"/e/{store.experiment}").text
    assert "Graph of calls" not in page and "call-graph" not in page
    assert dashboard.call_graph(store) is None


def test_a_thousand_calls_are_drawn_grouped_by_function(store, db_url):
    # how long the page takes is measured by bench/web_graph.py, not asserted here
    roles = fill_calls(store, 500)  # 1,002 jobs, 1,500 dependencies
    c = client(db_url)
    page = c.get(f"/e/{store.experiment}")
    assert page.status_code == 200
    html = page.text
    assert 'data-grouped="yes"' in html and "1002 calls, too many to draw one by one" in html
    assert not nodes_of(html)  # no call drawn one by one
    groups = re.findall(r'<a class="node group" href="([^"]+)" data-key="\((\d+), &#39;([\w.:]+)&#39;\)"', html)
    assert [(int(p), t) for _, p, t in groups] == [
        (0, "lab.steps:load"),
        (0, "lab.steps:train"),
        (1, "lab.steps:score"),
        (0, "lab.steps:summary"),
    ]
    # each group's bar: its calls by status, as the store counts them, each a link to them in the job table
    segments = re.findall(r'<a class="segment" href="([^"]+)" data-status="(\w+)" data-count="(\d+)">', html)
    counted: dict[str, int] = {}
    for href, status, n in segments:
        counted[status] = counted.get(status, 0) + int(n)
        assert f"status={status}" in href.replace("&amp;", "&")
    totals: dict[str, int] = {}
    for (_, status), n in store.counts().items():
        totals[status] = totals.get(status, 0) + n
    assert counted == totals and sum(counted.values()) == 1002
    assert counted["FAILED"] == 1 and counted["RUNNING"] == 1
    # the arrows between groups, each with the number of dependencies it stands for
    counts = re.findall(r'class="tick edge-count"[^>]*>(\d+)</text>', html)
    assert sorted(map(int, counts)) == [500, 500, 500]
    # a segment's link lists those calls
    failed = next(href for href, status, _ in segments if status == "FAILED").replace("&amp;", "&")
    listed = c.get(failed.removeprefix(c.base_url.path.rstrip("/"))).text
    assert f'data-id="{roles["trains"][-1]}" data-status="FAILED"' in listed
    assert listed.count('<tr class="job"') == 1
    # a box's link lists that function's calls, not its phase's: the loads and trains share phase 0
    train = next(href for href, _, t in groups if t == "lab.steps:train").replace("&amp;", "&")
    listed = c.get(train.removeprefix(c.base_url.path.rstrip("/"))).text
    assert '<span id="job-total">500</span>' in listed and 'id="target-filter"' in listed
    shown = [int(i) for i in re.findall(r'<tr class="job" data-id="(\d+)"', listed)]
    assert len(shown) == 50 and set(shown) <= set(roles["trains"])


def test_a_big_graphs_links_between_groups_are_read_again_only_when_jobs_are_added(store):
    """Redrawn every few seconds, a big graph reads its statuses each time, and the dependencies between
    its groups (every dependency of the experiment) only when its number of jobs changed."""
    import sqlalchemy as sa

    from jobman.jobdb.sweep import JobSpec
    from jobman.web import pages

    roles = fill_calls(store, 40)
    kept = pages.GraphLinks()
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))

    def draw() -> tuple[str, int]:
        statements.clear()
        svg = str(pages.call_graph(store, "/base", kept)["graph"])
        joins = [s for s in statements if "GROUP BY" in s.upper() and "parent" in s]
        return svg, len(joins)

    svg, joins = draw()
    assert joins == 1 and svg.count('class="node group"') == 4
    svg, joins = draw()
    assert joins == 0 and svg.count('class="node group"') == 4 and svg.count('class="edge"') == 3
    store.schedule([JobSpec(0, "fn", "lab.steps:publish", {}, None)], after=[roles["summary"]])
    svg, joins = draw()
    assert joins == 1 and svg.count('class="node group"') == 5 and svg.count('class="edge"') == 4


def test_a_graph_of_more_functions_than_are_drawn_says_how_many_it_leaves_out(store, db_url):
    from jobman.jobdb.sweep import JobSpec

    (load,) = store.schedule([JobSpec(0, "fn", "lab.steps:load", {}, None)]).job_ids
    specs = [JobSpec(0, "fn", f"lab.steps:step{i:02d}", {"seed": s}, None) for i in range(45) for s in range(2)]
    store.schedule(specs, after=[load])  # 91 jobs of 46 functions
    page = client(db_url).get(f"/e/{store.experiment}").text
    drawn = re.findall(r'<a class="node group"[^>]*data-key="\(0, &#39;([\w.:]+)&#39;\)"', page)
    assert len(drawn) == dashboard.GROUPS_DRAWN == 40
    assert drawn == ["lab.steps:load"] + [f"lab.steps:step{i:02d}" for i in range(39)]  # the first by job id
    assert "the first 40 of 46 boxes" in page
    assert len(re.findall(r'class="tick edge-count"[^>]*>2</text>', page)) == 39


def test_the_job_page_lists_what_a_job_depends_on_and_what_depends_on_it_as_links(store, db_url):
    roles = fill_calls(store, 60)
    c = client(db_url)
    name = store.experiment
    train = roles["trains"][0]
    page = c.get(f"/e/{name}/job/{train}").text
    parents = re.search(r'<dd id="parents">(.*?)</dd>', page, re.S).group(1)
    children = re.search(r'<dd id="children">(.*?)</dd>', page, re.S).group(1)
    load, score = roles["load"], roles["scores"][0]
    assert f'href="{c.base_url.path.rstrip("/")}/e/{name}/job/{load}">{load}</a> <code>load</code>' in parents
    assert "s-DONE" in parents
    assert f'/e/{name}/job/{score}">{score}</a> <code>score</code>' in children and "s-QUEUED" in children
    # a fan-in of sixty: the first fifty listed, the rest counted
    page = c.get(f"/e/{name}/job/{roles['summary']}").text
    parents = re.search(r'<dd id="parents">(.*?)</dd>', page, re.S).group(1)
    linked = [int(i) for i in re.findall(r'data-id="(\d+)"', parents)]
    assert linked == roles["scores"][: dashboard.NEIGHBOURS] and "and 10 more" in parents
    page = c.get(f"/e/{name}/job/{load}").text
    children = re.search(r'<dd id="children">(.*?)</dd>', page, re.S).group(1)
    assert "and 10 more" in children and "<code>train</code>" in children


def test_the_phases_sweep_of_the_dashboard_data_is_drawn_call_by_call(store, db_url):
    roles = fill(store)
    drawn = nodes_of(client(db_url).get(f"/e/{store.experiment}").text)
    assert sorted(drawn) == sorted(roles["all"])
    assert drawn[roles["hostile"]][0] == "FAILED"


def test_a_future_names_the_calls_it_waits_for_and_the_failed_call_that_blocked_it(db_url, tmp_path):
    with jobman.Experiment(db_url, backend=None, exproot=tmp_path / "runs") as exp:
        roles = fill_calls(exp.store, 3)
        # the second score waits for its train, RUNNING
        score = roles["scores"][1]
        html = JobFuture(exp, score, "lab.steps:score")._repr_html_()
        assert f'data-id="{score}" data-status="WAITING"' in html
        held = re.search(r'<span class="jobman-held">(.*?)</span></td>', html).group(1)
        assert f"job {roles['trains'][1]} <code>train</code>" in held and 'data-status="RUNNING"' in held
        # the summary takes three scores: QUEUED, WAITING and BLOCKED
        summary = exp.store.job(roles["summary"])
        assert summary.status is Status.BLOCKED
        html = JobFuture(exp, summary.id, "lab.steps:summary")._repr_html_()
        # blocked by the train that failed, two calls up, through the BLOCKED score between them
        held = re.search(r"blocked by</th><td[^>]*>(.*?)</td>", html).group(1)
        assert f"job {roles['trains'][-1]} <code>train</code>" in held and 'data-status="FAILED"' in held
        assert f"job {roles['scores'][-1]}" not in held
        # a job that is neither waiting nor blocked names nothing
        done = JobFuture(exp, roles["load"], "lab.steps:load")._repr_html_()
        assert "jobman-held" not in done


def test_a_waiting_job_with_many_open_dependencies_names_the_first_and_counts_the_rest(store):
    roles = fill_calls(store, 30)
    summary = roles["summary"]
    exp_scores = roles["scores"]
    # unblock the summary: the failed train is retried, so the summary waits for thirty scores
    store.retry([roles["trains"][-1]])
    assert store.job(summary).status is Status.WAITING
    calls, total = dashboard.held_by(store, summary, Status.WAITING)
    assert total == 30 and [c.id for c in calls] == exp_scores[: dashboard.HELD_BY]
    from jobman.jobdb.notebook import job_html

    html = job_html(store.job(summary), held=(calls, total))
    assert "waits for" in html and "and 20 more" in html


def test_the_graph_drawing_breaks_a_cycle_of_groups_and_escapes_labels():
    """A function taking its own calls makes a loop among groups: drawn, not refused; labels are text."""
    nodes = [
        charts.Node("a", "<b>a</b>", "2 calls", "/a", "a", counts=[("DONE", 2, "/a?status=DONE")]),
        charts.Node("b", "b", "1 call", "/b", "b", counts=[("WAITING", 1, "/b?status=WAITING")]),
    ]
    svg = str(charts.graph(nodes, [("a", "a", 1), ("a", "b", 1), ("b", "a", 1)], "a loop"))
    assert svg.count('class="edge"') == 3 and "<b>" not in svg and "&lt;b&gt;a&lt;/b&gt;" in svg
    xs = [float(x) for x in re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="150"', svg)]
    assert xs[0] < xs[1]  # the arrow back from b to a was dropped from the layering only
    assert charts._generations([1, 2, 3, 4], [(1, 2), (2, 3), (1, 3), (1, 4)]) == [[1], [2, 4], [3]]

"""The dashboard in a real browser: headless Chromium (Debian's) driven by Selenium, against a real
``jobman serve`` process and a real SQLite database changed under it while the page is open."""

from __future__ import annotations

import json
import os
import socket
from urllib.parse import urlsplit

import pytest
from browser import chromium, missing, served
from conftest import experiment_module, need_service
from web_data import fill, fill_wide

from jobman.jobdb.status import Status
from jobman.jobdb.store import Store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Two experiments in a database, a server with actions on, and a browser that opened its link."""
    why = missing()
    if why:
        need_service(why)
    base = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'lab.db'}"
    other = Store.open(f"{base}?table=dbn")
    fill(other, running=0, failed=0)
    other.dispose()
    store = Store.open(f"{base}?table=mlp")
    roles = fill(store)
    with served(base, "--allow-actions") as link, chromium() as driver:
        driver.get(link)  # the printed link: its token becomes the page's cookie
        yield driver, link.split("/?")[0], store, roles
    store.dispose()


def wait(driver, predicate, timeout: float = 15):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: predicate(d))


def settled(driver) -> None:
    """Wait for the page's first live update, which replaces its live parts (and their elements)."""
    wait(driver, lambda d: text_of(d, "#live-state").startswith("live"))


def click(driver, selector: str) -> None:
    """Click the element, found again if a live update replaced it in between."""
    from selenium.common.exceptions import StaleElementReferenceException

    def attempt(d) -> bool:
        try:
            by_css(d, selector)[0].click()
            return True
        except StaleElementReferenceException:
            return False

    wait(driver, attempt)


def text_of(driver, selector: str) -> str:
    """The element's text, read in one step (a live update may replace it at any time)."""
    return driver.execute_script(
        "var e = document.querySelector(arguments[0]); return e ? e.textContent : '';", selector
    )


def by_css(driver, selector: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def test_the_experiments_page_lists_the_experiments(site):
    driver, root, store, roles = site
    driver.get(root + "/")
    names = driver.execute_script("return Array.from(document.querySelectorAll('tr.experiment'), r => r.dataset.name);")
    assert names == ["dbn", "mlp"]
    best = "tr.experiment[data-name=mlp] td.best"  # arrives with the first live update
    wait(driver, lambda d: "valid_error 0.1005" in text_of(d, best))


def test_the_browser_sends_the_cookie_under_the_servers_secret_path_alone(site):
    driver, root, store, roles = site
    base = urlsplit(root).path
    assert base.startswith("/s/")
    driver.get(root + "/")
    (kept,) = [c for c in driver.get_cookies() if c["name"].startswith("jobman-")]
    assert kept["path"] == base and kept["httpOnly"] and kept["sameSite"] == "Strict"
    origin = root[: -len(base)]
    for outside in ("/", "/e/mlp", "/s/"):  # another path of this host, as another service's would be
        driver.get(origin + outside)
        assert not [c for c in driver.get_cookies() if c["name"].startswith("jobman-")], outside
        assert by_css(driver, "body")[0].text == "nothing here: open the link `jobman serve` printed", outside
    driver.get(root + "/e/mlp")  # and under the path it still lets in
    assert "mlp" in text_of(driver, "nav.crumbs")


def test_a_chart_draws_one_point_per_configuration(site):
    driver, root, store, roles = site
    driver.get(root + "/e/mlp")
    wait(driver, lambda d: by_css(d, "figure[data-param=nhid]"))  # the report arrives after the first paint
    for param in ("lr", "nhid"):
        # Drawn, not only present: each point has a size on the screen.
        drawn = driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]))"
            ".filter(c => c.getBoundingClientRect().width > 0).length;",
            f"figure[data-param={param}] svg circle.pt",
        )
        assert drawn == 5  # the five configurations with a mean valid_error
    assert driver.execute_script("return document.querySelectorAll('figure.parallel svg polyline.pc').length;") == 5


def test_the_live_page_shows_a_job_turning_done_without_a_reload(site):
    driver, root, store, roles = site
    job_id = roles["running"][0]
    driver.get(root + "/e/mlp?status=RUNNING,DONE")
    settled(driver)
    row = f"tr.job[data-id='{job_id}']"
    status = f'var row = document.querySelector("{row}"); return row && row.dataset.status;'
    assert driver.execute_script(status) == "RUNNING"
    driver.execute_script("window.notReloaded = true;")
    job = store.job(job_id)
    store.finish(job_id, job.lease, "DONE", results={"valid_error": 0.3, "train_error": 0.2})
    wait(driver, lambda d: d.execute_script(status) == "DONE")
    assert driver.execute_script("return window.notReloaded === true;")
    assert "live" in text_of(driver, "#live-state")


def test_clicking_a_job_opens_its_page(site):
    driver, root, store, roles = site
    job_id = roles["failed"][0]
    driver.get(root + "/e/mlp")
    settled(driver)
    click(driver, f"tr.job[data-id='{job_id}'] a.job-link")
    wait(driver, lambda d: d.current_url.endswith(f"/e/mlp/job/{job_id}"))
    assert text_of(driver, "h1").startswith(f"Job {job_id}")
    assert "ValueError: loss is nan" in text_of(driver, "#job-error")


def test_an_action_asks_first_then_goes_through_with_the_token(site):
    driver, root, store, roles = site
    job_id = roles["failed"][1] if roles["failed"][1] != roles["hostile"] else roles["failed"][0]
    driver.get(root + f"/e/mlp/job/{job_id}")
    settled(driver)
    before = store.job(job_id).status
    click(driver, "#act-retry")
    wait(driver, lambda d: _alert(d)).dismiss()  # "no" changes nothing
    assert store.job(job_id).status == before
    click(driver, "#act-retry")
    wait(driver, lambda d: _alert(d)).accept()
    wait(driver, lambda d: by_css(d, "#message"))
    assert "queued again" in by_css(driver, "#message")[0].text
    assert store.job(job_id).status is Status.QUEUED
    assert any(e.why == "retried by hand from the web page" for e in store.events(job_id))


def _alert(driver):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return driver.switch_to.alert
    except NoAlertPresentException:
        return None


OVERFLOWING = """
    var width = document.documentElement.clientWidth, out = [];
    document.querySelectorAll('body *').forEach(function (e) {
        var box = e.getBoundingClientRect();
        if (box.right > width + 1 && !e.closest('.wide')) out.push(e.tagName + '.' + e.className);
    });
    return [document.documentElement.scrollWidth, width, out.slice(0, 5)];"""


def test_every_page_fits_a_1180_pixel_window_without_scrolling_sideways(tmp_path):
    """Ten parameters, long values and long names: the pages wrap them, a table wider than its card
    scrolls inside the card, and the window never scrolls sideways."""
    why = missing()
    if why:
        need_service(why)
    base = f"sqlite:///{tmp_path / 'wide.db'}"
    store = Store.open(f"{base}?table=wide")
    ids = fill_wide(store)
    with served(base) as link, chromium(width=1180, height=900) as driver:
        driver.get(link)
        root = link.split("/?")[0]
        for path in ("/", "/e/wide", f"/e/wide/job/{ids[0]}"):
            driver.get(root + path)
            if path == "/e/wide":
                settled(driver)
                assert len(by_css(driver, "figure.scatter svg")) == 8  # all that vary but seed (repeats)
            scroll_width, width, wider = driver.execute_script(OVERFLOWING)
            assert width >= 1100 and scroll_width <= width and not wider, (path, scroll_width, width, wider)
    store.dispose()


def test_a_learning_search_draws_its_charts_within_a_1180_pixel_window(jobman, tmp_path):
    """A search run by a real worker: its best so far, Pareto front and importances are drawn once the
    report arrives, and the page still fits the window."""
    from search_helpers import experiment_module

    why = missing()
    if why:
        need_service(why)
    exp = experiment_module(
        tmp_path, "jm_browser_learn", "def two(x, y):\n    return {'f1': x**2, 'f2': (x - 2) ** 2 + y}\n"
    )
    url = f"sqlite:///{tmp_path / 'learn.db'}?table=learn"
    scheduled = jobman(
        "sqlschedule", url, "jm_browser_learn:two", "x=uniform(-1,3)", "y=uniform(0,1)", "--samples", "8",
        "--sampler", "tpe", "--metric", "f1", "--metric", "f2", env=exp.env,
    )  # fmt: skip
    assert scheduled.code == 0, scheduled
    ran = jobman("worker", url, "--exproot", str(exp.runs), env=exp.env, timeout=240)
    assert ran.code == 0, ran
    with served(url.split("?")[0]) as link, chromium(width=1180, height=900) as driver:
        driver.get(link)
        driver.get(link.split("/?")[0] + "/e/learn")
        settled(driver)
        wait(driver, lambda d: by_css(d, "figure.importances svg"))
        assert len(by_css(driver, "figure.best-so-far circle.pt")) == 8
        assert by_css(driver, "figure.pareto circle.pt.front")
        assert len(by_css(driver, "figure.importances rect.bar")) == 2
        for figure in by_css(driver, ".charts.search figure"):
            assert figure.size["width"] > 200 and figure.size["height"] > 80  # drawn, not collapsed
        scroll_width, width, wider = driver.execute_script(OVERFLOWING)
        assert width >= 1100 and scroll_width <= width and not wider, (scroll_width, width, wider)


def test_the_graph_of_calls_is_drawn_and_a_node_opens_its_job_within_a_1180_pixel_window(tmp_path):
    """Fourteen calls drawn one by one, each box on the screen in its status's colour; clicking one opens
    its job's page, which links back to what it depends on; the page fits the window."""
    from web_data import fill_calls

    from jobman.jobdb.notebook import COLOURS

    why = missing()
    if why:
        need_service(why)
    base = f"sqlite:///{tmp_path / 'calls.db'}"
    store = Store.open(f"{base}?table=calls")
    roles = fill_calls(store, 6)
    with served(base) as link, chromium(width=1180, height=900) as driver:
        driver.get(link)
        root = link.split("/?")[0]
        driver.get(root + "/e/calls")
        settled(driver)
        drawn = driver.execute_script(
            "return Array.from(document.querySelectorAll('#call-graph a.node.call'), a => {"
            " var box = a.querySelector('rect').getBoundingClientRect();"
            " return [Number(a.dataset.key), a.dataset.status, getComputedStyle(a.querySelector('rect')).fill,"
            " box.width, box.height]; });"
        )
        statuses = {j.id: j.status.value for j in store.jobs()}
        assert sorted(d[0] for d in drawn) == sorted(statuses)
        for key, status, fill, width, height in drawn:
            assert status == statuses[key]
            r, g, b = (int(COLOURS[status][i : i + 2], 16) for i in (1, 3, 5))
            assert fill == f"rgb({r}, {g}, {b})"
            assert width > 60 and height > 12  # drawn readable, not shrunk to nothing
        assert len(by_css(driver, "#call-graph path.edge")) == 18
        scroll_width, width, wider = driver.execute_script(OVERFLOWING)
        assert width >= 1100 and scroll_width <= width and not wider, (scroll_width, width, wider)
        failed = roles["trains"][-1]
        click(driver, f"#call-graph a.node[data-key='{failed}']")
        wait(driver, lambda d: d.current_url.endswith(f"/e/calls/job/{failed}"))
        assert text_of(driver, "h1").startswith(f"Job {failed}")
        assert f"{roles['load']} load" in " ".join(text_of(driver, "#parents").split())
        click(driver, f"#children a[data-id='{roles['scores'][-1]}']")
        wait(driver, lambda d: d.current_url.endswith(f"/e/calls/job/{roles['scores'][-1]}"))
        assert "BLOCKED" in text_of(driver, "h1")
    store.dispose()


def test_a_graph_of_a_thousand_calls_is_drawn_grouped_and_the_page_answers(tmp_path):
    """1,002 calls: four groups drawn with their bars; the FAILED call among five hundred shows, and
    its segment lists it."""
    from web_data import fill_calls

    why = missing()
    if why:
        need_service(why)
    base = f"sqlite:///{tmp_path / 'big.db'}"
    store = Store.open(f"{base}?table=big")
    roles = fill_calls(store, 500)
    with served(base) as link, chromium(width=1180, height=900) as driver:
        driver.get(link)
        root = link.split("/?")[0]
        driver.get(root + "/e/big")  # its time is measured by bench/web_graph.py, not asserted here
        settled(driver)
        assert len(by_css(driver, "#call-graph a.node.group")) == 4
        assert not by_css(driver, "#call-graph a.node.call")
        widths = driver.execute_script(
            "return Array.from(document.querySelectorAll('#call-graph a.segment[data-status=FAILED] rect'),"
            " r => r.getBoundingClientRect().width);"
        )
        assert len(widths) == 1 and widths[0] >= 3  # one call among five hundred, still to be seen
        scroll_width, width, wider = driver.execute_script(OVERFLOWING)
        assert scroll_width <= width and not wider, (scroll_width, width, wider)
        click(driver, "#call-graph a.segment[data-status=FAILED]")
        wait(driver, lambda d: "status=FAILED" in d.current_url)
        settled(driver)
        rows = driver.execute_script("return Array.from(document.querySelectorAll('tr.job'), r => r.dataset.id);")
        assert rows == [str(roles["trains"][-1])]
    store.dispose()


GANG = """
def gang(state, channel):
    print(f"rank {channel.rank} of {channel.world_size} says hello", flush=True)
    return {"rank": channel.rank}
"""


def test_a_gang_jobs_page_shows_where_each_rank_ran_and_its_log(jobman, tmp_path):
    """A job of 3 ranks run by a real worker: its page lists each rank's host, pid and log, as the ranks
    wrote them, and shows the end of every rank's output."""
    why = missing()
    if why:
        need_service(why)
    env = {**os.environ, "PYTHONPATH": experiment_module(tmp_path, "jm_gang_page", GANG)}
    base = f"sqlite:///{tmp_path / 'gangs.db'}"
    scheduled = jobman("sqlschedule", f"{base}?table=gangs", "jm_gang_page:gang", "--ranks", "3", env=env)
    assert scheduled.code == 0, scheduled.err
    ran = jobman("worker", f"{base}?table=gangs", "--exproot", str(tmp_path / "runs"), env=env)
    assert ran.code == 0, ran.err
    store = Store.open(f"{base}?table=gangs")
    [job] = store.jobs()
    store.dispose()
    assert job.status is Status.DONE, job.error
    pids = [
        int(json.loads((tmp_path / "runs" / "gangs" / str(job.id) / f"rank-{r}.where").read_text())["pid"])
        for r in range(3)
    ]
    with served(base) as link, chromium() as driver:
        driver.get(link)
        driver.get(f"{link.split('/?')[0]}/e/gangs/job/{job.id}")
        rows = driver.execute_script(
            "return Array.from(document.querySelectorAll('#ranks tr[data-rank]'),"
            " r => Array.from(r.cells, c => c.textContent));"
        )
        logs = [f"{job.workdir}/stdout.txt, {job.workdir}/stderr.txt"] + [f"{job.workdir}/rank-{r}.log" for r in (1, 2)]
        assert rows == [[str(r), socket.gethostname(), str(pids[r]), logs[r]] for r in range(3)]
        tails = driver.execute_script("return Array.from(document.querySelectorAll('pre.tail'), p => p.textContent);")
        for rank in range(3):
            assert any(f"rank {rank} of 3 says hello" in t for t in tails), tails

"""``jobman serve`` cannot be jammed by a job's files, and SIGTERM always stops it; its cookie lets in
nowhere else.

A real server process, a real FIFO as a job's ``stdout.txt``, many real requests at once, a real
SIGTERM; on PostgreSQL also a table lock that really holds the pages' reads, to stop a server whose
request threads are stuck.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from jobman.jobdb.records import WorkerInfo
from jobman.jobdb.sweep import JobSpec

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from jobman.web import pages
from jobman.web.app import create_app

TOKEN = "jam-token-0123456789"


def job_with_fifo_stdout(store, tmp_path: Path) -> int:
    """A RUNNING job whose workdir holds a FIFO as its stdout.txt (nobody ever writes to it)."""
    [job_id] = store.schedule([JobSpec(phase=0, kind="fn", target="m:f", params={"x": 1}, parent=None)]).job_ids
    claimed = store.claim(WorkerInfo.here(backend="local", backend_id="1"), str(tmp_path / "runs" / store.experiment))
    assert claimed is not None and claimed.job.id == job_id
    workdir = Path(claimed.job.workdir)
    workdir.mkdir(parents=True)
    os.mkfifo(workdir / "stdout.txt")
    (workdir / "stderr.txt").write_text("the job's own words\n")
    return job_id


class Served:
    """``jobman serve`` as a real process on a free port."""

    def __init__(self, db_url: str, **env: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobman.cli.main", "serve", db_url, "--port", "0", "--token", TOKEN],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        line = self.proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)(/s/[\w-]+)/", line)
        assert found, (line, self.proc.stderr.read() if self.proc.poll() is not None else "")
        self.port, self.base = int(found.group(1)), found.group(2)

    def get(self, path: str, timeout: float = 10) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", self.base + path, headers={"Authorization": f"token {TOKEN}"})
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def stop(self, sig: int = signal.SIGTERM) -> float:
        """Send ``sig`` (SIGTERM); the seconds it took to exit (it is killed after 30)."""
        began = time.monotonic()
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return float("inf")
        return time.monotonic() - began


def test_a_fifo_job_page_jams_nothing_and_sigterm_stops_the_server(store, db_url, tmp_path):
    job_id = job_with_fifo_stdout(store, tmp_path)
    served = Served(db_url)
    try:
        page = f"/e/{store.experiment}/job/{job_id}"
        began = time.monotonic()
        # Twice the request threads a server has (40): each answers, none waits on the FIFO.
        with ThreadPoolExecutor(max_workers=16) as pool:
            jammers = [pool.submit(served.get, page + ("?part=history" if i % 2 else ""), 30) for i in range(80)]
            while not all(j.done() for j in jammers):  # meanwhile the rest of the dashboard answers at once
                for path in ("/static/style.css", "/", f"/e/{store.experiment}"):
                    t0 = time.monotonic()
                    code, _ = served.get(path, timeout=10)
                    assert code == 200 and time.monotonic() - t0 < 5, path
            answers = [j.result() for j in jammers]
        assert time.monotonic() - began < 60
        assert {code for code, _ in answers} == {200}
        assert all("the job&#39;s own words" in text for _, text in answers)  # stderr is shown, the FIFO is not
        assert all("stdout.txt <small>" not in text for _, text in answers)
    finally:
        seconds = served.stop()
    assert seconds < 10, f"SIGTERM took {seconds:.1f} s"
    assert served.proc.returncode in (0, -signal.SIGTERM)  # it ends as SIGTERM would, once stopped
    assert "Traceback" not in served.proc.stderr.read()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_sigterm_stops_a_server_whose_requests_are_stuck_in_the_database(sig, pg_database, tmp_path):
    """Pages whose reads wait on a lock held elsewhere (PostgreSQL waits without end) do not keep a
    stopped server alive; while they wait, /static still answers."""
    import psycopg

    from jobman.jobdb.store import Store

    db_url = f"{pg_database}?table=stuck_{os.getpid()}_{sig}"
    store = Store.open(db_url)
    job_id = job_with_fifo_stdout(store, tmp_path)
    served = Served(db_url, JOBMAN_SERVE_LOCK_WAIT="0")  # pages wait for the lock without end
    assert served.get(f"/e/{store.experiment}/job/{job_id}")[0] == 200
    locker = psycopg.connect(pg_database)
    try:
        locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")  # held until rollback
        stuck = [
            threading.Thread(target=lambda: _ignore(served.get, f"/e/{store.experiment}/job/{job_id}", 60), daemon=True)
            for _ in range(45)  # more than the server's 40 request threads
        ]
        for t in stuck:
            t.start()
        time.sleep(2.0)
        assert all(t.is_alive() for t in stuck), "the lock held no page"
        t0 = time.monotonic()
        code, text = served.get("/static/style.css", timeout=10)  # served without a thread
        assert code == 200 and time.monotonic() - t0 < 5 and "body" in text
        seconds = served.stop(sig)
    finally:
        locker.rollback()
        locker.close()
        if served.proc.poll() is None:
            served.proc.kill()
        store.dispose()
    assert seconds < 15, f"{sig.name} took {seconds:.1f} s"
    assert served.proc.returncode in (-sig, 130), served.proc.returncode
    assert "Traceback" not in served.proc.stderr.read()


def test_a_page_a_database_lock_would_hold_answers_an_error_on_time(pg_database, tmp_path):
    """More requests than the server has threads, each for a page whose read a lock held elsewhere
    would hold without end: each answers an error after the lock wait, and /static answers meanwhile."""
    import psycopg

    from jobman.jobdb.store import Store

    db_url = f"{pg_database}?table=locked_{os.getpid()}"
    store = Store.open(db_url)
    job_id = job_with_fifo_stdout(store, tmp_path)
    served = Served(db_url, JOBMAN_SERVE_LOCK_WAIT="2")
    page = f"/e/{store.experiment}/job/{job_id}"
    assert served.get(page)[0] == 200
    locker = psycopg.connect(pg_database)
    try:
        locker.execute("LOCK TABLE job IN ACCESS EXCLUSIVE MODE")
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=50) as pool:
            answers = list(pool.map(lambda _: served.get(page, timeout=60), range(50)))
        assert time.monotonic() - began < 30
        assert {code for code, _ in answers} == {500}, {code for code, _ in answers}
        assert all("lock timeout" in text for _, text in answers), answers[0][1][-500:]
        assert served.get("/static/style.css", timeout=10)[0] == 200
    finally:
        locker.rollback()
        locker.close()
    try:
        assert served.get(page)[0] == 200  # the lock gone, the page is back
    finally:
        served.stop()
        store.dispose()
    assert "Traceback" not in served.proc.stderr.read()


def _ignore(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


def test_a_read_that_never_returns_costs_its_page_the_files_only(tmp_path):
    """A read that blocks for good (a FIFO opened for reading with no writer: a real blocked open)
    gives None after the timeout; once every reader is stuck, the next read gives None on time too;
    the stuck readers are daemon threads, so they hold no exit."""
    fifo = tmp_path / "never"
    os.mkfifo(fifo)

    def blocking_read() -> bytes:
        with open(fifo, "rb") as f:
            return f.read()

    try:
        for _ in range(pages.FILE_READERS + 2):
            t0 = time.monotonic()
            assert pages.off_thread(blocking_read, seconds=0.3) is None
            assert time.monotonic() - t0 < 2
        stuck = [t for t in threading.enumerate() if t.name == "jobman-file-read"]
        assert len(stuck) == pages.FILE_READERS and all(t.daemon for t in stuck)
    finally:
        for _ in range(pages.FILE_READERS):  # let the stuck readers go: each open meets a writer
            fd = os.open(fifo, os.O_WRONLY)
            os.close(fd)
        for t in [t for t in threading.enumerate() if t.name == "jobman-file-read"]:
            t.join(5)
    assert pages.off_thread(lambda: 42, seconds=1) == 42
    with pytest.raises(ZeroDivisionError):
        pages.off_thread(lambda: 1 / 0, seconds=1)


def test_a_job_page_whose_files_cannot_be_read_in_time_says_so(store, db_url, tmp_path, monkeypatch):
    """A workdir listing stuck on a real blocked read: the page answers on time, saying so."""
    job_id = job_with_fifo_stdout(store, tmp_path)
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    real_listing = pages.workdir_files

    def stuck_listing(workdir):  # a filesystem that hangs, made of a FIFO no one writes
        with open(gate, "rb") as f:
            f.read()
        return real_listing(workdir)

    monkeypatch.setattr(pages, "workdir_files", stuck_listing)
    monkeypatch.setattr(pages, "FILE_READ_SECONDS", 0.5)
    app = create_app(db_url, token=TOKEN)
    c = TestClient(app, base_url="http://127.0.0.1:8787" + app.state.base)
    try:
        t0 = time.monotonic()
        page = c.get(f"/e/{store.experiment}/job/{job_id}", headers={"Authorization": f"token {TOKEN}"})
        assert time.monotonic() - t0 < 5
        assert page.status_code == 200
        assert "could not be read within 0.5 s" in page.text
    finally:
        os.close(os.open(gate, os.O_WRONLY))


def test_the_cookie_is_not_the_token_and_lets_in_on_its_own_server_only(store, db_url):
    apps = {port: create_app(db_url, token=TOKEN, port=port) for port in (8787, 8788)}

    def get(port: int, path: str = "/", cookie: str | None = None, app=None) -> object:
        app = app or apps[port]
        c = TestClient(app, base_url=f"http://127.0.0.1:{port}{app.state.base}", follow_redirects=False)
        return c.get(path, headers={"Cookie": cookie} if cookie else {})

    first = get(8787, f"/?token={TOKEN}")
    assert first.status_code == 303
    cookie = first.headers["set-cookie"]
    kept = cookie.split(";", 1)[0]
    name, value = kept.split("=", 1)
    assert TOKEN not in cookie and value != TOKEN
    assert name.startswith("jobman-8787-") and "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
    assert get(8787, cookie=kept).status_code == 200
    assert get(8787, "/?token=wrong-token-000", cookie=kept).status_code == 403  # a token given is checked
    # Another service on this host may be sent it: it is not the token, and no other server takes it,
    # not one on another port with the same token, nor this one started again.
    other = get(8788, f"/?token={TOKEN}").headers["set-cookie"].split(";", 1)[0]
    other_name = other.split("=", 1)[0]
    assert other_name != name
    assert get(8788, cookie=kept).status_code == 403
    assert get(8788, cookie=f"{other_name}={value}").status_code == 403
    assert get(8787, cookie=kept, app=create_app(db_url, token=TOKEN, port=8787)).status_code == 403
    # the token itself in a cookie lets in nowhere: a cookie is never taken as the token
    assert get(8787, cookie=f"{name}={TOKEN}").status_code == 403
    assert get(8788, cookie=f"{other_name}={TOKEN}").status_code == 403


def test_the_cookie_is_sent_under_the_servers_secret_path_only_and_nothing_answers_outside_it(store, db_url):
    """Browsers send a host's cookies to every port: the cookie's path is the server's secret path, so
    another service on this host (which serves no such path) is not sent it, and a cookie replayed
    outside that path gets nothing."""
    store.schedule([JobSpec(phase=0, kind="fn", target="m:f", params={}, parent=None)])
    app = create_app(db_url, token=TOKEN, port=8787)
    base = app.state.base
    assert re.fullmatch(r"/s/[\w-]{20,}", base) and base != create_app(db_url, token=TOKEN, port=8787).state.base
    browser = TestClient(app, base_url="http://127.0.0.1:8787", follow_redirects=True)
    page = browser.get(f"{base}/e/{store.experiment}?token={TOKEN}")  # the printed link, as a browser follows it
    assert page.status_code == 200 and page.url.path == f"{base}/e/{store.experiment}", page.text
    assert f'href="{base}/static/style.css"' in page.text and f'href="{base}/e/{store.experiment}/job/' in page.text
    (kept,) = browser.cookies.jar
    assert kept.path == base and kept.name.startswith("jobman-8787-")
    # the browser's jar sends it under the path only: a page elsewhere on the host goes without it
    assert browser.get(f"{base}/api/experiments").status_code == 200
    for outside in ("/", "/api/experiments", f"/e/{store.experiment}", "/static/style.css", "/s/", f"{base}x/"):
        sent = browser.build_request("GET", outside)
        browser.cookies.set_cookie_header(sent)
        assert "cookie" not in sent.headers, outside
        # and replayed there by hand (or with the token), it gets one sentence and no data
        for headers in ({"Cookie": f"{kept.name}={kept.value}"}, {"Authorization": f"token {TOKEN}"}):
            r = browser.get(outside, headers=headers, follow_redirects=False)
            assert r.status_code == 404 and r.text == "nothing here: open the link `jobman serve` printed", outside
            assert "set-cookie" not in r.headers and "location" not in r.headers
    # the secret path without its slash leads to the home page
    assert browser.get(base, follow_redirects=False).headers["location"].endswith(f"{base}/")

"""Headless Chromium from Debian (``chromium``, ``chromium-driver``) driven by Selenium, and a real
``jobman serve`` for it to look at: shared by the browser tests and the screenshot script."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

CHROMIUM = os.environ.get("JOBMAN_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("JOBMAN_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def missing() -> str | None:
    """Why no browser can be started here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


@contextmanager
def chromium(width: int = 1280, height: int = 1000) -> Iterator[object]:
    """A headless Chromium with a fresh profile, closed (and its profile removed) on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="jobman-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@contextmanager
def served(db_url: str, *args: str) -> Iterator[str]:
    """``jobman serve DB --port 0 ARGS`` as a real process; yields the link it printed (with its token)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobman.cli.main", "serve", db_url, "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        found = re.search(r"http://\S+", line)
        if not found:
            raise RuntimeError(f"jobman serve printed {line!r}; stderr: {proc.stderr.read() if proc.poll() else ''}")
        yield found.group(0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

"""Screenshots of the dashboard's pages for the README, from a database ``jobman demo`` made.

    jobman demo --quick --dir /tmp/jobman-demo
    python docs/screenshots.py sqlite:////tmp/jobman-demo/demo.db

Runs ``jobman serve`` on that database, opens each page in headless Chromium (Debian's, as the
browser tests do), waits for its first live update, and saves a small palette PNG beside this file.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from browser import chromium, served  # noqa: E402

WIDTH, MAX_HEIGHT = 1180, 1500


def shoot(driver, url: str, path: Path, wait_for: str | None = None) -> None:
    driver.get(url)
    deadline = time.time() + 30
    while time.time() < deadline:
        live = driver.execute_script("var e = document.getElementById('live-state'); return e ? e.textContent : '';")
        ready = wait_for is None or driver.execute_script("return !!document.querySelector(arguments[0]);", wait_for)
        if live.startswith("live") and ready:
            break
        time.sleep(0.2)
    height = min(driver.execute_script("return document.documentElement.scrollHeight;"), MAX_HEIGHT)
    driver.set_window_size(WIDTH, height + 90)  # the window's frame is not part of the page
    time.sleep(0.3)
    raw = path.with_suffix(".raw.png")
    driver.save_screenshot(str(raw))
    from PIL import Image

    Image.open(raw).convert("RGB").quantize(colors=128).save(path, optimize=True)
    raw.unlink()
    print(f"{path.name}: {path.stat().st_size // 1024} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", help="the demo's database URL")
    parser.add_argument("--experiment", default="mlp")
    parser.add_argument("--job", type=int, default=None, help="the job page to show (default: the best job)")
    args = parser.parse_args()
    with served(args.db, "--allow-actions") as link, chromium(WIDTH, 900) as driver:
        root = link.split("/?")[0]
        driver.get(link)
        shoot(driver, root + "/", HERE / "dashboard-experiments.png", "td.best b")
        shoot(driver, f"{root}/e/{args.experiment}", HERE / "dashboard-experiment.png", "figure.scatter")
        job = args.job or int(driver.execute_script("return document.querySelector('tr.best td a').textContent;"))
        shoot(driver, f"{root}/e/{args.experiment}/job/{job}", HERE / "dashboard-job.png")


if __name__ == "__main__":
    main()

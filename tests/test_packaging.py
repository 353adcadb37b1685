"""The built distribution ships every subpackage and the migrations under the `jobman` namespace."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_wheel_holds_the_jobman_namespace_and_its_migrations(tmp_path: Path) -> None:
    # Built from a copy without build/: setuptools would otherwise ship what an earlier build left there.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("jobman_sql-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "jobman/__init__.py",
        "jobman/migrations/env.py",
        "jobman/migrations/versions/0001_initial.py",
        "jobman/jobdb/store.py",
        "jobman/dispatch/runner.py",
        "jobman/models/mlp.py",
        "jobman/cli/main.py",
        "jobman/web/app.py",
        "jobman/ps.py",
        "jobman/dispatch/ps.py",
        "jobman/web/templates/experiment.html",
        "jobman/web/static/style.css",
        "jobman/web/static/live.js",
    ):
        assert required in names, required
    top_level = {n.split("/")[0] for n in names if not n.startswith("jobman_sql-")}
    assert top_level == {"jobman"}, f"only the jobman namespace may be installed, not {top_level - {'jobman'}}"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "jobman = jobman.cli.main:run" in zipfile.ZipFile(wheel).read(entry_points).decode()
    # Every module of the tree is in the wheel: a subpackage missing from pyproject's list installs
    # with `pip install -e .` and is absent from `pip install .`.
    rooms = ("jobdb", "dispatch", "models", "cli", "web", "migrations", "examples")
    for room in rooms:
        for source in (REPO / room).rglob("*.py"):
            shipped = "jobman/" + source.relative_to(REPO).as_posix()
            assert shipped in names, f"{shipped} is not in the wheel: list its package in pyproject.toml"

"""The design's import rules, read from the code: no import cycle between modules, and no import
against the direction DESIGN.md gives the rooms.

Every module of the installed package's rooms is parsed (never imported); an import counts wherever
it is written, inside a function too, except under ``if TYPE_CHECKING:``, which never runs. The rules
are checked on a small package made for the purpose as well, so that this test cannot pass because
its checker sees nothing.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "jobman"
ROOMS = ("jobdb", "dispatch", "models", "cli", "web")
# The original jobman's names and the public API: thin, over the rooms, and imported by none of them.
TOP_MODULES = ("__init__", "sql", "tools", "experiments", "ps")
TOP_PACKAGES = ("examples",)
TOP = "top"

# Which rooms each room may import, besides itself (DESIGN.md, "Direction of imports").
MAY_IMPORT: dict[str, frozenset[str]] = {
    "jobdb": frozenset(),
    "dispatch": frozenset({"jobdb"}),
    "models": frozenset(),  # but for the experiment API, below
    # `jobman serve` starts the web layer, an optional extra; the web layer never calls the CLI.
    "cli": frozenset({"dispatch", "jobdb", "models", "web"}),
    "web": frozenset({"dispatch", "jobdb", "models"}),
    TOP: frozenset({"jobdb", "dispatch", "models", "cli", "web"}),
}
# The one module of another room a room may import although its room may not: what a job sees.
ALSO_MAY_IMPORT: dict[str, frozenset[str]] = {"models": frozenset({"jobman.dispatch.channel"})}

# Today's violations, being removed. Each is one a change has yet to remove: one that no longer
# exists fails the test below, so that this list can only shrink (and, once empty, stays empty).
KNOWN: set[str] = set()


# -- the checker ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to a module of the package."""

    importer: str
    imported: str
    line: int


def module_files(root: Path, package: str) -> dict[str, Path]:
    """The checked modules under ``root`` (the package's directory), by dotted name."""
    found: dict[str, Path] = {}
    for name in TOP_MODULES:
        path = root / f"{name}.py"
        if path.exists():
            found[package if name == "__init__" else f"{package}.{name}"] = path
    for folder in (*ROOMS, *TOP_PACKAGES):
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def installed_root(package: str = PACKAGE) -> Path:
    """The directory of the installed package, whose rooms are its subpackages."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed"
    root = Path(spec.origin).parent
    for room in ROOMS:  # each room is found where the package maps it, not assumed beside the top
        room_spec = importlib.util.find_spec(f"{package}.{room}")
        assert room_spec is not None and room_spec.submodule_search_locations, f"{package}.{room} is missing"
        assert Path(list(room_spec.submodule_search_locations)[0]).resolve() == (root / room).resolve(), (
            f"{package}.{room} is not under {root}"
        )
    return root


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST):
    """Every import statement that can run: all but those under ``if TYPE_CHECKING:`` (its else runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _package_of(module: str, path: Path) -> str:
    """The package a module's relative imports resolve against."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imports_of(module: str, path: Path, known: set[str], package: str) -> list[Import]:
    """The package's modules that ``module`` imports; ``from X import y`` names module X.y when it is one."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[Import] = []

    def add(target: str, line: int) -> None:
        while target and target not in known:  # an attribute, or a folder outside the checked rooms
            target = target.rpartition(".")[0]
        if target and target != module:
            out.append(Import(module, target, line))

    for node in _statements(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    add(alias.name, node.lineno)
            continue
        if node.level:
            base = _package_of(module, path).split(".")
            if node.level > 1:
                base = base[: -(node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        if not (source == package or source.startswith(package + ".")):
            continue
        for alias in node.names:
            if source == package and alias.name.startswith("__"):
                continue  # the package's metadata (``__version__``): its __init__ runs before any room anyway
            sub = f"{source}.{alias.name}"
            add(sub if sub in known else source, node.lineno)
    return out


def import_graph(root: Path, package: str = PACKAGE) -> dict[str, list[Import]]:
    """Each checked module and the imports it makes of the others."""
    files = module_files(root, package)
    known = set(files)
    return {module: imports_of(module, path, known, package) for module, path in files.items()}


def room_of(module: str, package: str = PACKAGE) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    return TOP


def direction_violations(graph: dict[str, list[Import]], package: str = PACKAGE) -> dict[str, Import]:
    """Imports against the direction, as ``"importer -> imported"``."""
    out: dict[str, Import] = {}
    for module, imports in graph.items():
        src = room_of(module, package)
        for imp in imports:
            dst = room_of(imp.imported, package)
            allowed_module = imp.imported.replace(package, PACKAGE, 1) in ALSO_MAY_IMPORT.get(src, frozenset())
            if dst != src and dst not in MAY_IMPORT[src] and not allowed_module:
                out.setdefault(f"{imp.importer} -> {imp.imported}", imp)
    return out


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components, iteratively (a deep import chain must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return components


def _one_loop(edges: dict[str, set[str]], members: list[str]) -> list[str]:
    """A shortest way from the component's first module back to itself: a cycle a reader can follow."""
    inside = set(members)
    start = members[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node] & inside):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    return [start, start]


def import_cycles(graph: dict[str, list[Import]]) -> dict[str, list[str]]:
    """Each set of modules that import one another, as ``"cycle: a, b, ..."``, with one loop through it."""
    edges = {module: {imp.imported for imp in imports} for module, imports in graph.items()}
    return {
        "cycle: " + ", ".join(members): _one_loop(edges, members)
        for members in _strongly_connected(edges)
        if len(members) > 1
    }


def violations(root: Path, package: str = PACKAGE) -> dict[str, str]:
    """Every cycle and wrong-direction import of the package at ``root``, each with how to find it."""
    graph = import_graph(root, package)
    found = {key: " -> ".join(loop) for key, loop in import_cycles(graph).items()}
    for key, imp in direction_violations(graph, package).items():
        where = imp.importer.split(".")[1:] or ["__init__"]
        found[key] = (
            f"{'/'.join(where)}.py line {imp.line}: {room_of(imp.importer, package)} may not import "
            f"{room_of(imp.imported, package)}"
        )
    return found


# -- the package's own imports ----------------------------------------------------------------------


def _report(found: dict[str, str]) -> str:
    return "\n".join(f"  {key}    ({why})" for key, why in sorted(found.items()))


def test_no_import_cycle_and_none_against_the_direction():
    found = violations(installed_root())
    new = {key: why for key, why in found.items() if key not in KNOWN}
    assert not new, "imports the design forbids (DESIGN.md, 'Direction of imports'):\n" + _report(new)


def test_the_list_of_known_violations_only_shrinks():
    found = violations(installed_root())
    gone = sorted(set(KNOWN) - set(found))  # set(): an emptied list may be written {}
    assert not gone, (
        "these violations are gone: take them out of KNOWN in tests/test_architecture.py, so that "
        "they cannot come back unnoticed:\n" + "\n".join(f"  {key}" for key in gone)
    )


def test_no_sql_spells_a_status_as_a_literal():
    """SQL names a status through ``Status`` (jobdb/status.py), so renaming one cannot leave a query
    that silently matches nothing."""
    import re

    from jobman.jobdb.status import Status

    quoted = re.compile("'(" + "|".join(s.value for s in Status) + ")'")
    found = []
    for path in sorted((installed_root() / "jobdb").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and quoted.search(node.value):
                found.append(f"{path.relative_to(installed_root())}:{node.lineno}: {node.value.strip()}")
    assert not found, "SQL with a status spelled as a literal:\n" + "\n".join(found)


def test_every_room_is_read():
    """The checker sees the whole package: each room's modules and imports from one room to another."""
    root = installed_root()
    graph = import_graph(root)
    rooms = {room_of(module) for module in graph}
    assert rooms == {*ROOMS, TOP}, rooms
    assert {
        "jobman.jobdb.store",
        "jobman.dispatch.worker",
        "jobman.models.mlp",
        "jobman.cli.main",
        "jobman.web.app",
        "jobman",
        "jobman.sql",
        "jobman.tools",
        "jobman.examples",
    } <= set(graph)
    crossing = {(room_of(imp.importer), room_of(imp.imported)) for imports in graph.values() for imp in imports}
    assert {("dispatch", "jobdb"), ("cli", "jobdb"), ("cli", "dispatch"), ("web", "jobdb")} <= crossing, crossing


# -- the checker, on a package made to break the rules ---------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """A package ``toy`` with every room, following the rules: each test below breaks one."""
    root = tmp_path / "toy"
    files = {f"{room}/__init__.py": "" for room in (*ROOMS, *TOP_PACKAGES)}
    files.update(
        {
            "__init__.py": "from toy.dispatch import runner\n",
            "sql.py": "from .jobdb import store\n",
            "jobdb/store.py": "import sqlalchemy\nfrom . import status\n",
            "jobdb/status.py": "",
            "dispatch/channel.py": "from ..jobdb.status import Status\n",
            "dispatch/runner.py": "from toy.jobdb import store\nfrom . import channel\n",
            "models/mlp.py": "from toy.dispatch import channel\nfrom . import layers\n",
            "models/layers.py": "import numpy\n",
            "cli/main.py": "import toy.dispatch.runner\nfrom ..models import mlp\nfrom toy.jobdb.store import Store\n",
            "web/app.py": "from ..jobdb import store\n",
        }
    )
    _write(root, files)
    return root


def test_the_checker_passes_a_package_that_follows_the_rules(toy: Path):
    assert violations(toy, "toy") == {}
    graph = import_graph(toy, "toy")
    assert {imp.imported for imp in graph["toy.cli.main"]} == {
        "toy.dispatch.runner",
        "toy.models.mlp",
        "toy.jobdb.store",
    }
    assert [imp.imported for imp in graph["toy.dispatch.channel"]] == ["toy.jobdb.status"]  # relative, two up


def test_the_checker_finds_a_cycle_and_names_its_modules(toy: Path):
    _write(
        toy,
        {
            "jobdb/status.py": "def later():\n    from .report import rows\n",  # inside a function: it counts
            "jobdb/report.py": "from .aggregates import fold\n",
            "jobdb/aggregates.py": "from toy.jobdb.store import Store\n",
        },
    )
    found = violations(toy, "toy")
    key = "cycle: toy.jobdb.aggregates, toy.jobdb.report, toy.jobdb.status, toy.jobdb.store"
    assert set(found) == {key}, found
    assert (
        found[key] == "toy.jobdb.aggregates -> toy.jobdb.store -> toy.jobdb.status -> toy.jobdb.report "
        "-> toy.jobdb.aggregates"
    )


def test_the_checker_finds_imports_against_the_direction(toy: Path):
    _write(
        toy,
        {
            "jobdb/store.py": "from . import status\nfrom toy.dispatch import runner\n",
            "models/mlp.py": "from toy.dispatch import channel, runner\nfrom ..jobdb.store import Store\n",
            "dispatch/backends/__init__.py": "",
            "dispatch/backends/zygote.py": "from ...cli import main\n",
            "web/app.py": "import toy.cli.main\nimport toy\n",
            "cli/main.py": "from toy import sql, __version__\nfrom toy.web import app\n",
        },
    )
    found = violations(toy, "toy")
    assert set(found) == {
        "toy.jobdb.store -> toy.dispatch.runner",
        "toy.models.mlp -> toy.dispatch.runner",
        "toy.models.mlp -> toy.jobdb.store",
        "toy.dispatch.backends.zygote -> toy.cli.main",
        "toy.web.app -> toy.cli.main",
        "toy.web.app -> toy",
        "toy.cli.main -> toy.sql",
        # the store imports the runner, which imports the store; the CLI and the web layer each other
        "cycle: toy.dispatch.runner, toy.jobdb.store",
        "cycle: toy.cli.main, toy.web.app",
    }, found
    assert (
        found["toy.dispatch.backends.zygote -> toy.cli.main"]
        == "dispatch/backends/zygote.py line 1: dispatch may not import cli"
    )


def test_the_checker_leaves_type_checking_imports_aside(toy: Path):
    _write(
        toy,
        {
            "jobdb/store.py": """\
            from typing import TYPE_CHECKING
            import typing
            if TYPE_CHECKING:
                from toy.dispatch.runner import Runner
            if typing.TYPE_CHECKING:
                import toy.cli.main
            else:
                from toy.models import layers  # this branch runs
        """,
        },
    )
    assert set(violations(toy, "toy")) == {"toy.jobdb.store -> toy.models.layers"}

"""Objects built from a job's state, the original jobman's way: ``make``, ``make2``, ``reval``, ``resolve``.

A parameter group with a ``__builder__`` (written ``obj::pkg.mod.Class`` on the command line)
describes an object: ``make(state.obj)`` calls the builder with the group's other keys.
``reval`` is ``eval`` with three additions: ``@a.b.c`` imports the symbol ``a.b.c``, ``%name``
is the keyword argument ``name`` and ``%%name`` is ``state.name`` in the caller's scope.
``make2`` builds with ``reval``: a builder is an expression over its group's (built) keys.
"""

from __future__ import annotations

import importlib
import io
import sys
import tokenize
from collections.abc import Callable, Mapping
from typing import Any

from jobman.jobdb.nested import DD, expand

BUILDER = "__builder__"


class BuildError(Exception):
    """A builder or an expression cannot be resolved or evaluated."""


def resolve(name: str, try_import: bool = True) -> Any:
    """The object a dotted name ``pkg.module.attr.attr`` names, importing modules on the way."""
    parts = str(name).strip().split(".")
    if not all(p.isidentifier() for p in parts):
        raise BuildError(f"{name!r} is not a dotted name such as package.module.function")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError as exc:
        raise BuildError(f"cannot resolve {name!r}: {exc}") from None
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
            continue
        except AttributeError:
            if not try_import:
                raise BuildError(f"cannot resolve {name!r}: no attribute {part!r}") from None
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError as exc:
            raise BuildError(f"cannot resolve {name!r}: {exc}") from None
    return obj


def _rewrite(expr: str) -> tuple[str, set[str]]:
    """``expr`` with ``@a.b`` as a resolve call, ``%%x`` as ``state.x`` and ``%x`` as a variable; the
    names of those variables. Only operators written against a name count (``a % b`` is modulo)."""
    try:
        tokens = [
            t
            for t in tokenize.generate_tokens(io.StringIO(expr).readline)
            if t.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER)
        ]
    except (tokenize.TokenError, SyntaxError) as exc:
        raise BuildError(f"cannot read the expression {expr!r}: {exc}") from None
    lines = expr.splitlines(keepends=True) or [""]
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def at(pos: tuple[int, int]) -> int:
        return offsets[pos[0] - 1] + pos[1]

    def touching(a: tokenize.TokenInfo, b: tokenize.TokenInfo) -> bool:
        return a.end == b.start

    out, required, last, i = [], set(), 0, 0
    while i < len(tokens):
        tok = tokens[i]
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if tok.string == "@" and nxt is not None and nxt.type == tokenize.NAME and touching(tok, nxt):
            j, names = i + 1, [nxt.string]
            while (
                j + 2 < len(tokens)
                and tokens[j + 1].string == "."
                and tokens[j + 2].type == tokenize.NAME
                and touching(tokens[j], tokens[j + 1])
                and touching(tokens[j + 1], tokens[j + 2])
            ):
                names.append(tokens[j + 2].string)
                j += 2
            out.append(expr[last : at(tok.start)] + f'__jobman_resolve__("{".".join(names)}")')
            last, i = at(tokens[j].end), j + 1
            continue
        if tok.string == "%" and nxt is not None and touching(tok, nxt):
            after = tokens[i + 2] if i + 2 < len(tokens) else None
            if nxt.string == "%" and after is not None and after.type == tokenize.NAME and touching(nxt, after):
                out.append(expr[last : at(tok.start)] + f"state.{after.string}")
                last, i = at(after.end), i + 3
                continue
            if nxt.type == tokenize.NAME:
                required.add(nxt.string)
                out.append(expr[last : at(tok.start)] + f"__jobman_var_{nxt.string}")
                last, i = at(nxt.end), i + 2
                continue
        i += 1
    out.append(expr[last:])
    return "".join(out), required


def _reval(expr: str, frame: Any, variables: Mapping[str, Any]) -> Any:
    code, required = _rewrite(str(expr))
    unused = sorted(set(variables) - required)
    if unused:
        raise BuildError(f"{expr!r} does not use %{unused[0]}, which is given to it")
    missing = sorted(required - set(variables))
    if missing:
        raise BuildError(f"{expr!r} uses %{missing[0]}, which is not given to it")
    scope = dict(frame.f_locals) if frame is not None else {}  # a copy: the expression cannot rebind them
    scope["__jobman_resolve__"] = resolve
    scope.update((f"__jobman_var_{k}", v) for k, v in variables.items())
    try:
        return eval(code.strip(), frame.f_globals if frame is not None else {}, scope)
    except BuildError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's expression, whatever it raises
        raise BuildError(f"evaluating {expr!r} raised {type(exc).__name__}: {exc}") from None


def reval(expr: str, **variables: Any) -> Any:
    """Evaluate ``expr`` in the caller's scope, with ``@a.b.c`` (the symbol a.b.c, imported),
    ``%name`` (the keyword argument ``name``; each given must be used) and ``%%name`` (``state.name``)."""
    return _reval(expr, sys._getframe(1), variables)


def evaluate(expr: str) -> Any:
    """``key:=expr`` of a command line or a configuration file: :func:`reval` in a scope of its own."""
    return _reval(expr, None, {})


def _groups(d: Mapping[str, Any]) -> DD:
    """A state or a part of one, nested (``obj.param1`` keys or ``obj: {param1: ...}``)."""
    return expand({str(k): v for k, v in d.items()})


def _built(value: Any, build: Callable[[Any, dict[str, Any]], Any]) -> Any:
    """``value`` with every group that has a builder built, innermost first, by ``build(builder, keys)``."""
    if not isinstance(value, Mapping):
        return value
    keys = {k: _built(v, build) for k, v in value.items() if k != BUILDER}
    return build(value[BUILDER], keys) if BUILDER in value else DD(keys)


def make(d: Mapping[str, Any]) -> Any:
    """Build the object ``d`` describes: ``d.__builder__(**the other keys)``, inner groups with a
    builder built first; a group without one is returned as it is."""
    return _built(_groups(d), lambda builder, keys: resolve(builder)(**keys))


def make2(d: Mapping[str, Any], **keys: Any) -> Any:
    """As :func:`make`, but each ``__builder__`` is an expression evaluated with :func:`reval` in the
    caller's scope, its group's built keys given as ``%key``; ``keys`` are added to ``d`` first."""
    frame = sys._getframe(1)
    return _built(_groups({**d, **keys}), lambda builder, built: _reval(builder, frame, built))


def defaults_merge(d: dict, defaults: Mapping[str, Any]) -> None:
    """Fill ``d`` with what ``defaults`` has and it lacks, group by group."""
    for key, value in defaults.items():
        if isinstance(value, Mapping):
            defaults_merge(d.setdefault(key, DD()), value)
        else:
            d.setdefault(key, value)

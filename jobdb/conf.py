"""The original jobman's parameter forms, turned into the sweep grammar's ``key=value`` tokens.

``key::builder`` is ``key.__builder__=builder``; ``key:=expression`` is ``key=`` the value of
the expression (computed once, here, and stored); ``path/to/file.conf`` reads one such form per
line (``#`` starts a comment; a line may name another file, relative to the file); ``key <- file``
reads a file under the prefix ``key``. A value read from a file is a default: a later token
(or a later file) setting the same key replaces it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .errors import SweepError
from .nested import RESERVED, flatten
from .sweep import PHASE_SEPARATOR, format_value

# The key, then the first of ':=', '=' or '::' (as the original split a parameter).
_FORM = re.compile(r"^([^:=]*?)\s*(:=|=|::)\s*(.*)$", re.S)
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_MAX_DEPTH = 20  # files including files


def is_conf_token(token: str) -> bool:
    """True for a token in one of the original's forms that the sweep grammar does not read itself."""
    m = _FORM.match(token)
    if m is not None:
        return m.group(2) != "="
    return "<-" in token or os.path.isfile(token)


def expand_tokens(  # noqa: C901
    tokens: Sequence[str],
    *,
    evaluate: Callable[[str], Any],
    cwd: str | os.PathLike = ".",
    later_wins: bool = False,
) -> list[str]:
    """``tokens`` with every form of the original written as ``key=value`` tokens.

    A token that is neither a form nor a file is left as it is (a target, a phase separator,
    ``k={{a,b}}``). A key set twice keeps its last value when one of the two was read from a file,
    or always with ``later_wins`` (the original's ``cmdline``); else both stay, for the sweep to refuse.
    """
    out: list[str | None] = []
    where: dict[str, tuple[int, bool]] = {}  # key -> (index in out, read from a file)

    def put(key: str, token: str, from_file: bool) -> None:
        if key in where and (where[key][1] or from_file or later_wins):
            out[where[key][0]] = None
        where[key] = (len(out), from_file)
        out.append(token)

    def form(text: str, origin: str, prefix: str, base: Path, from_file: bool, depth: int) -> None:
        m = _FORM.match(text)
        if m is not None:
            key, op, raw = m.group(1).strip(), m.group(2), m.group(3).strip()
            if prefix:
                key = f"{prefix}.{key}"
            elif from_file and key.split(".", 1)[0] == RESERVED:
                return  # an orig.conf or current.conf read back: jobman's own record, not a parameter
            if not _KEY.match(key):
                raise SweepError(f"{origin}: {key!r} is not a valid parameter name")
            if op == "=":
                put(key, f"{key}={raw}", from_file)
            elif op == "::":
                if not raw:
                    raise SweepError(f"{origin}: '::' needs a builder after it, such as pkg.module.Class")
                put(f"{key}.{_BUILDER}", f"{key}.{_BUILDER}={format_value(raw)}", from_file)
            else:
                for sub, value in _computed(key, raw, origin, evaluate).items():
                    put(sub, f"{sub}={format_value(value)}", from_file)
            return
        if "<-" in text:
            sub, _, path = (p.strip() for p in text.partition("<-"))
            if not _KEY.match(sub):
                raise SweepError(f"{origin}: {sub!r} is not a valid parameter name (write key <- file.conf)")
            read(path, f"{prefix}.{sub}" if prefix else sub, base, origin, depth)
            return
        read(text, prefix, base, origin, depth)

    def read(path_text: str, prefix: str, base: Path, origin: str, depth: int) -> None:
        path = Path(path_text).expanduser()
        if not path.is_absolute():
            path = base / path
        if depth > _MAX_DEPTH:
            raise SweepError(f"{origin}: configuration files include each other more than {_MAX_DEPTH} deep")
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            raise SweepError(f"{origin}: no configuration file {path_text!r} (and it is not key=value)") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise SweepError(f"{origin}: cannot read {path_text!r}: {exc}") from None
        for number, line in enumerate(lines, start=1):
            text = _uncommented(line).strip()
            if text:
                form(text, f"{path_text} line {number}", prefix, path.parent, True, depth + 1)

    base = Path(cwd)
    for index, token in enumerate(tokens):
        if token == PHASE_SEPARATOR:
            where.clear()  # a phase's keys are its own
            out.append(token)
        elif is_conf_token(token) and not (index == 0 and _looks_like_target(token)):
            form(token, f"argument {index + 1} {token!r}", "", base, False, 0)
        elif "=" in token:
            key = token.partition("=")[0]
            if _KEY.match(key):
                put(key, token, False)
            else:
                out.append(token)
        else:
            out.append(token)
    return [t for t in out if t is not None]


_BUILDER = "__builder__"


def _looks_like_target(token: str) -> bool:
    """The first token names the function unless it is a file or a form of the original."""
    return _FORM.match(token) is None and "<-" not in token and not os.path.isfile(token)


def _uncommented(line: str) -> str:
    """``line`` up to a ``#`` that is outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


def _computed(key: str, expr: str, origin: str, evaluate: Callable[[str], Any]) -> dict[str, Any]:
    """``key:=expr``: the expression's value (a dict gives one key per entry), as stored JSON values."""
    if not expr:
        raise SweepError(f"{origin}: ':=' needs an expression after it, such as @random.uniform(0, 1)")
    try:
        value = evaluate(expr)
    except Exception as exc:  # noqa: BLE001 - the user's expression, whatever it raises
        raise SweepError(f"{origin}: {exc}") from None
    try:
        value = json.loads(json.dumps(value, default=_plain))
    except (TypeError, ValueError) as exc:
        raise SweepError(
            f"{origin}: the expression gave {type(value).__name__}, which is not a number, text, "
            f"bool, None, list or dict of them ({exc})"
        ) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise SweepError(f"{origin}: the expression gave {value}, which the database cannot store")
    if isinstance(value, dict):
        return {f"{key}.{k}": v for k, v in flatten(value).items()} if value else {key: {}}
    return {key: value}


def _plain(value: Any) -> Any:
    """NumPy scalars and arrays as numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not a JSON value")

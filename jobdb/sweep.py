"""The sweep grammar: ``TARGET k=v k={{a,b,c}} -- [TARGET2] k2={{x,y}}``.

``{{a,b,c}}`` gives one job per value and several give their product; each ``--``
starts a phase whose jobs are made once per job of the phase before, inherit its
parameters and depend on it. Values are typed as jobman did: int, float, bool,
None, str, plus ``[lists]``; ``"quoted"`` text stays a string. Parsing is pure;
errors say which argument and which character.
"""

from __future__ import annotations

import itertools
import json
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import distributions
from .canonical import encode_value
from .distributions import Distribution
from .errors import SweepError
from .nested import check_names
from .shape import MAX_DEPTH

PHASE_SEPARATOR = "--"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")
_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*(:[A-Za-z_][A-Za-z0-9_.]*)?$")
_SPECIAL = set(",{}[]\"'")
_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\((.*)\)$", re.S)
_CALL_START = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\(")


@dataclass(frozen=True)
class Assignment:
    key: str
    values: tuple[Any, ...]  # one Distribution when the value is drawn
    grid: bool  # written as {{...}}
    where: tuple[int, str] | None = field(default=None, compare=False)  # (argument index, token), for errors

    @property
    def distribution(self) -> Distribution | None:
        value = self.values[0]
        return value if not self.grid and isinstance(value, Distribution) else None


@dataclass
class Phase:
    target: str | None  # None: same target as the phase before
    assignments: list[Assignment] = field(default_factory=list)


@dataclass
class Sweep:
    phases: list[Phase]
    kind: str = "fn"  # "fn" (a Python function path) or "cmd" (a command line)

    def targets(self) -> list[str]:
        """The target each phase runs, inherited where a phase names none."""
        out: list[str] = []
        current: str | None = None
        for phase in self.phases:
            current = phase.target or current
            out.append(current)  # type: ignore[arg-type]  # parse_sweep refuses a first phase without a target
        return out


class JobSpec(NamedTuple):
    """One job to schedule. ``parent`` is the index of the job it depends on, if any.

    A named tuple: a sweep makes one per job, 100,000 at a time. ``params_json`` is the
    canonical JSON of ``params`` when ``expand`` made it already (None: the store encodes
    them); whoever replaces ``params`` must drop it.
    """

    phase: int
    kind: str
    target: str
    params: dict[str, Any]
    parent: int | None
    params_json: str | None = None


def canonical_target(target: str) -> str:
    """The one spelling of a function target that a job's identity uses: ``pkg.mod:fn`` (given
    ``pkg.mod.fn``, the last dot splits module from function, as importing it does)."""
    if ":" in target:
        return target
    module, _, name = target.rpartition(".")
    return f"{module}:{name}" if module and name else target


def _fail(arg_index: int, token: str, message: str, pos: int | None = None) -> SweepError:
    where = f" at character {pos + 1}" if pos is not None else ""
    return SweepError(f"argument {arg_index + 1} {token!r}: {message}{where}")


# -- values ----------------------------------------------------------------------


class _Quotes:
    """Which characters of a value, read left to right, belong to a quoted string ('...' or "...",
    a backslash escaping in the latter): the scanners below skip them."""

    def __init__(self) -> None:
        self.open: str | None = None  # the quote character of the string being read
        self._escaped = False

    def take(self, ch: str) -> bool:
        """Read ``ch``; True when it is part of a quoted string (its quotes included)."""
        if self.open:
            if self._escaped:
                self._escaped = False
            elif ch == "\\" and self.open == '"':
                self._escaped = True
            elif ch == self.open:
                self.open = None
            return True
        if ch in "\"'":
            self.open = ch
            return True
        return False


def split_top_level(text: str, offset: int = 0) -> list[tuple[str, int]]:
    """Split at commas outside brackets and quotes; each piece with its start position."""
    pieces: list[tuple[str, int]] = []
    depth, start, quotes = 0, 0, _Quotes()
    for i, ch in enumerate(text):
        if quotes.take(ch):
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"']' without '['@{offset + i}")
        elif ch == "," and depth == 0:
            pieces.append((text[start:i], offset + start))
            start = i + 1
    if quotes.open:
        raise ValueError(f"quote {quotes.open} is never closed@{offset + text.rindex(quotes.open)}")
    if depth:
        raise ValueError(f"'[' is never closed@{offset + text.index('[')}")
    pieces.append((text[start:], offset + start))
    return pieces


def parse_value(text: str, offset: int = 0) -> Any:  # noqa: C901
    """One typed value. Raises ValueError('message@position') when malformed."""
    s = text.strip()
    lead = offset + (len(text) - len(text.lstrip()))
    if s in ("True", "true"):
        return True
    if s in ("False", "false"):
        return False
    if s in ("None", "null"):
        return None
    if _INT.match(s):
        return int(s)
    if _FLOAT.match(s):
        number = float(s)
        if number in (float("inf"), float("-inf")):  # 1e999: JSON, so the database, cannot hold it
            raise ValueError(f"the number is too large to store@{lead}")
        return number
    if s.startswith("[") and s.endswith("]"):
        if _bracket_depth(s) > MAX_DEPTH:  # refused before the recursion below could follow it
            raise ValueError(f"the list is nested more than {MAX_DEPTH} levels deep@{lead}")
        inner = s[1:-1]
        if not inner.strip():
            return []
        return [_plain(piece, pos, "a list") for piece, pos in split_top_level(inner, lead + 1)]
    call = _CALL.match(s)
    if call:
        return _distribution(call, lead)
    head = _CALL_START.match(s)
    if head and head.group(1) in distributions.NAMES:  # a distribution's call, cut short or followed
        close = s.rfind(")")
        if close < 0:
            raise ValueError(f"{head.group(1)}( is never closed by ')'@{lead + len(s)}")
        raise ValueError(f"unexpected text after the call of {head.group(1)}()@{lead + close + 1}")
    if len(s) >= 2 and s[0] == s[-1] == '"':
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            raise ValueError(f"malformed quoted string@{lead}") from None
    if len(s) >= 2 and s[0] == s[-1] == "'":
        return s[1:-1]
    for i, ch in enumerate(s):
        if ch in "{}[]":
            raise ValueError(f"unexpected {ch!r}@{lead + i}")
        if ch in "\"'":
            raise ValueError(f"stray quote {ch}@{lead + i}")
    return s


def _bracket_depth(text: str) -> int:
    """How deep the brackets of ``text`` nest (quotes not told apart: an upper bound)."""
    depth = deepest = 0
    for ch in text:
        if ch == "[":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == "]":
            depth -= 1
    return deepest


def _distribution(call: re.Match, lead: int) -> Distribution:
    name = call.group(1)
    if name not in distributions.NAMES:
        raise ValueError(
            f"{name}(...) is not a distribution (they are {', '.join(distributions.NAMES)}); "
            f"quote the value to pass it as text@{lead}"
        )
    inner, start = call.group(2), lead + len(name) + 1
    args = [] if not inner.strip() else [_plain(p, pos, "a distribution") for p, pos in split_top_level(inner, start)]
    why = distributions.check(name, args)
    if why:
        raise ValueError(f"{why}@{start}")
    return Distribution(name, tuple(args))


def _plain(piece: str, pos: int, where: str) -> Any:
    """A value inside a list, grid or distribution: a distribution there is refused."""
    head = _CALL_START.match(piece)
    if head and head.group(1) in distributions.NAMES:
        raise ValueError(f"a distribution cannot be inside {where}@{pos + piece.index(head.group(1))}")
    return parse_value(piece, pos)


def format_value(value: Any) -> str:
    """The printed form of a value, such that ``parse_value(format_value(v)) == v``."""
    if isinstance(value, Distribution):
        return f"{value.name}({','.join(format_value(v) for v in value.args)})"
    if value is True or value is False or value is None:
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    text = str(value)
    plain = text == text.strip() and text and not (_SPECIAL & set(text))
    if plain:
        try:
            if parse_value(text) == text:
                return text
        except ValueError:
            pass
    return json.dumps(text)


# -- expressions -------------------------------------------------------------------


def parse_assignment(token: str, arg_index: int) -> Assignment:
    """``k=v`` or ``k={{a,b,c}}``."""
    if "=" not in token:
        raise _fail(
            arg_index,
            token,
            "'=' is missing: parameters are written key=value"
            + (" (and no such configuration file exists)" if token.endswith(".conf") else ""),
        )
    key, _, raw = token.partition("=")
    if not _KEY.match(key):
        raise _fail(arg_index, token, f"{key!r} is not a valid parameter name", 0)
    start = len(key) + 1
    try:
        if raw.startswith("{{"):
            closes = _find_unquoted(raw[2:], ("}}",))
            if 0 <= closes < len(raw) - 4 and _find_unquoted(raw[2 : 2 + closes], ("{{",)) < 0:
                raise ValueError(
                    f"the grid closes here and more follows: give one key one grid "
                    f"(write every value inside one {{{{...}}}})@{start + 2 + closes}"
                )
            if not raw.endswith("}}") or len(raw) < 4:
                raise ValueError(f"'{{{{' is never closed with '}}}}'@{start}")
            inner = raw[2:-2]
            bad = _find_unquoted(inner, ("{{", "}}"))
            if bad >= 0:
                raise ValueError(f"grids cannot be nested@{start + 2 + bad}")
            if not inner.strip():
                raise ValueError(f"the grid is empty@{start}")
            values = []
            for piece, pos in split_top_level(inner, start + 2):
                if not piece.strip():
                    raise ValueError(f"the grid has an empty value@{pos}")
                values.append(_plain(piece, pos, "a grid"))
            return Assignment(key, tuple(values), True, (arg_index, token))
        bad = _find_unquoted(raw, ("}}",))
        if bad >= 0:
            raise ValueError(f"'}}}}' without '{{{{'@{start + bad}")
        value = parse_value(raw, start)
        if isinstance(value, str) and raw.strip()[:1] not in ("'", '"') and "," in raw:
            # Hydra's sweep syntax (lr=0.1,0.2) would otherwise be one string, failing only at run time.
            raise ValueError(
                f"a comma list is not a sweep here: write {key}={{{{{raw}}}}} for one job per value, "
                f"or quote it ({key}='\"{raw}\"') for one string@{start + raw.index(',')}"
            )
        return Assignment(key, (value,), False, (arg_index, token))
    except ValueError as exc:
        message, _, at = str(exc).rpartition("@")
        raise _fail(arg_index, token, message, int(at)) from None


def _find_unquoted(text: str, needles: tuple[str, ...]) -> int:
    """The index of the first of ``needles`` outside quoted strings, or -1."""
    quotes = _Quotes()
    for i, ch in enumerate(text):
        if not quotes.take(ch) and text.startswith(needles, i):
            return i
    return -1


_SHELL_EXPANDED = re.compile(r"^([A-Za-z_][A-Za-z0-9_.]*)=\{([^{}]*)\}$")


def rejoin_shell_expansion(tokens: Sequence[str]) -> list[str]:
    """Undo the shell's brace expansion: an unquoted ``k={{a,b}}`` reaches us as ``k={a} k={b}``."""
    out: list[str] = []
    run_key: str | None = None
    run_values: list[str] = []

    def flush() -> None:
        nonlocal run_key, run_values
        if run_key is not None:
            out.append(f"{run_key}={{{{{','.join(run_values)}}}}}")
        run_key, run_values = None, []

    for token in tokens:
        m = _SHELL_EXPANDED.match(token)
        if m and (run_key is None or m.group(1) == run_key):
            run_key = m.group(1)
            run_values.append(m.group(2))
            continue
        flush()
        m = _SHELL_EXPANDED.match(token)
        if m:
            run_key, run_values = m.group(1), [m.group(2)]
        else:
            out.append(token)
    flush()
    return out


def parse_sweep(tokens: Sequence[str], command: str | None = None) -> Sweep:
    """Parse a sweep. With ``command`` (``--cmd``), the first phase runs that command line.

    Grids the shell has brace-expanded (``k={a} k={b}``) are joined back first.
    """
    tokens = rejoin_shell_expansion(tokens)
    if not tokens and command is None:
        raise SweepError("the sweep is empty: give a target such as mypkg.train:main and parameters")
    phases: list[Phase] = [Phase(target=command)]
    seen: dict[str, int] = {}
    expect_target = command is None
    for i, token in enumerate(tokens):
        if token == PHASE_SEPARATOR:
            if i == len(tokens) - 1:
                raise SweepError(f"argument {i + 1} '--': a phase separator must be followed by a phase")
            if not phases[-1].assignments and phases[-1].target is None:
                raise SweepError(f"argument {i + 1} '--': the phase before it is empty")
            phases.append(Phase(target=None))
            expect_target = True
            continue
        if expect_target and "=" not in token:
            if not _TARGET.match(token):
                raise _fail(i, token, "is neither key=value nor a target like package.module:function")
            phases[-1].target = token
            expect_target = False
            continue
        expect_target = False
        assignment = parse_assignment(token, i)
        if assignment.key in seen:
            where = "this phase" if seen[assignment.key] == len(phases) - 1 else f"phase {seen[assignment.key]}"
            raise _fail(i, token, f"parameter {assignment.key!r} is already set in {where}")
        seen[assignment.key] = len(phases) - 1
        phases[-1].assignments.append(assignment)
    if phases[0].target is None:
        raise SweepError("the sweep has no target: start it with a function such as mypkg.train:main")
    check_names(seen)  # dotted names nest: 'hyper' and 'hyper.lr' cannot both be set
    return Sweep(phases, "cmd" if command is not None else "fn")


def format_sweep(sweep: Sweep) -> list[str]:
    """The tokens that parse back to ``sweep`` (the command, for ``--cmd`` sweeps, is not a token)."""
    tokens: list[str] = []
    for index, phase in enumerate(sweep.phases):
        if index:
            tokens.append(PHASE_SEPARATOR)
        if phase.target is not None and not (index == 0 and sweep.kind == "cmd"):
            tokens.append(phase.target)
        for a in phase.assignments:
            if a.grid:
                tokens.append(f"{a.key}={{{{" + ",".join(format_value(v) for v in a.values) + "}}")
            else:
                tokens.append(f"{a.key}={format_value(a.values[0])}")
    return tokens


def _grid(phase: Phase) -> Iterator[dict[str, Any]]:
    keys = [a.key for a in phase.assignments]
    return map(dict, map(zip, itertools.repeat(keys), itertools.product(*(a.values for a in phase.assignments))))


def _drawn(phase: Phase) -> dict[str, Distribution]:
    return {a.key: a.distribution for a in phase.assignments if a.distribution is not None}


def _combos(phase: Phase, number: int, samples: int | None, seed: int, sampler: str) -> list[dict[str, Any]]:
    """Every point of a phase: its grid, times ``samples`` draws when it has distributions
    (each grid point gets the same draws, so that grid values are compared on equal terms)."""
    return list(_points(phase, number, samples, seed, sampler)())


def _points(
    phase: Phase, number: int, samples: int | None, seed: int, sampler: str
) -> Callable[[], Iterator[dict[str, Any]]]:
    """A maker of fresh iterators over the points of a phase (see :func:`_combos`): the grid is
    walked as it is read; only the ``samples`` draws, if any, are held."""
    drawn = _drawn(phase)
    if not drawn:
        return lambda: _grid(phase)
    fixed = Phase(phase.target, [a for a in phase.assignments if a.key not in drawn])
    points = distributions.draws(drawn, samples or 0, seed=seed, phase=number, sampler=sampler)
    order = [a.key for a in phase.assignments]
    return lambda: ({k: ({**g, **d})[k] for k in order} for g in _grid(fixed) for d in points)


def check_samples(sweep: Sweep, samples: int | None) -> None:
    """Refuse distributions without ``samples``, and ``samples`` without distributions."""
    drawn = [a for phase in sweep.phases for a in phase.assignments if a.distribution is not None]
    if drawn and samples is None:
        first = drawn[0]
        arg, token = first.where or (0, f"{first.key}={format_value(first.values[0])}")
        raise _fail(arg, token, "a distribution needs --samples N, the number of points to draw", len(first.key) + 1)
    if samples is not None and not drawn:
        raise SweepError(
            "--samples draws from distributions such as lr=loguniform(1e-4,1e-1), and no parameter of this sweep is one"
        )
    if samples is not None and samples < 1:
        raise SweepError(f"--samples must be at least 1, not {samples}")


def _grid_json(phase: Phase) -> Iterator[str] | None:
    """The canonical JSON of each combination of ``_grid``, in its order, joined from each value's
    encoding made once; None when a key repeats or a value is not JSON (the store says why)."""
    keys = [a.key for a in phase.assignments]
    if len(set(keys)) != len(keys):
        return None
    try:
        pieces = [[f"{encode_value(a.key)}: {encode_value(v)}" for v in a.values] for a in phase.assignments]
    except (TypeError, ValueError, RecursionError):
        return None
    if len(keys) < 2:
        return ("{" + "".join(c) + "}" for c in itertools.product(*pieces))
    in_key_order = operator.itemgetter(*sorted(range(len(keys)), key=keys.__getitem__))
    return ("{" + ", ".join(in_key_order(c)) + "}" for c in itertools.product(*pieces))


def repeated_values(sweep: Sweep) -> list[str]:
    """A sentence for each grid value given twice (by its stored form): its jobs are made once."""
    out = []
    for phase in sweep.phases:
        for a in phase.assignments:
            if not a.grid:
                continue
            seen: dict[str, int] = {}
            for v in a.values:
                try:
                    form = encode_value(v)
                except (TypeError, ValueError, RecursionError):
                    continue
                seen[form] = seen.get(form, 0) + 1
            twice = [form for form, n in seen.items() if n > 1]
            if twice:
                grid = ",".join(format_value(v) for v in a.values)
                out.append(f"{a.key}={{{{{grid}}}}} gives {', '.join(twice)} more than once: its jobs are made once")
    return out


def _distinct_values(phase: Phase) -> bool:
    """Whether every grid of a phase lists each value once (by its stored form), so that no two
    points of the phase are the same parameters."""
    try:
        return all(len({encode_value(v) for v in a.values}) == len(a.values) for a in phase.assignments)
    except (TypeError, ValueError, RecursionError):
        return False


class Expansion:
    """Every job of a sweep, parents before children, made as it is read: a sweep of a million jobs
    is never a million objects at once. Iterable again and again (a retried transaction reads it anew).

    Distributions are drawn ``samples`` times from ``seed`` (see :mod:`.distributions`):
    the same arguments give the same jobs, and a larger ``samples`` only adds to them.
    """

    def __init__(
        self, sweep: Sweep, *, samples: int | None = None, seed: int = 0, sampler: str = "random", phase_offset: int = 0
    ) -> None:
        check_samples(sweep, samples)
        self.sweep, self.samples, self.seed, self.sampler = sweep, samples, seed, sampler
        self.phase_offset = phase_offset  # a fan-in sweep's phases come after the jobs it waits for
        targets = sweep.targets()
        kinds: list[str] = []
        self._phases: list[tuple[str, str, Callable[[], Iterator[dict[str, Any]]]]] = []
        for number, phase in enumerate(sweep.phases):
            kinds.append(sweep.kind if number == 0 else ("fn" if phase.target else kinds[-1]))
            target = canonical_target(targets[number]) if kinds[-1] == "fn" else targets[number]
            self._phases.append((kinds[-1], target, _points(phase, number, samples, seed, sampler)))
        self._sizes = _phase_sizes(sweep, samples)

    def __len__(self) -> int:
        return sum(self._sizes)

    def shifted(self, offset: int) -> Expansion:
        """The same jobs with their phases numbered from ``offset``."""
        return Expansion(self.sweep, samples=self.samples, seed=self.seed, sampler=self.sampler, phase_offset=offset)

    def function_parameters(self) -> list[tuple[str, list[str]]]:
        """The function each phase of kind "fn" runs, with the names of the parameters its jobs get:
        the phase's own and those inherited from the phases before."""
        out: list[tuple[str, list[str]]] = []
        names: dict[str, None] = {}
        for (kind, target, _), phase in zip(self._phases, self.sweep.phases):
            names.update(dict.fromkeys(a.key for a in phase.assignments))
            if kind == "fn":
                out.append((target, list(names)))
        return out

    @property
    def parents(self) -> bool:
        """Whether some job depends on another of the sweep (it has more than one phase)."""
        return len(self._phases) > 1

    @property
    def distinct(self) -> bool:
        """Whether no two jobs of the sweep are the same job: grids of distinct values, no draws, and
        no phase setting a key of the phase before (the grammar refuses that anyway)."""
        keys: set[str] = set()
        for phase in self.sweep.phases:
            own = {a.key for a in phase.assignments}
            if _drawn(phase) or own & keys or len(own) != len(phase.assignments) or not _distinct_values(phase):
                return False
            keys |= own
        return True

    def _params(self, number: int) -> Iterator[dict[str, Any]]:
        """The parameters of each job of phase ``number``, in order: its parent's, then its own point."""
        points = self._phases[number][2]
        if number == 0:
            return points()
        return ({**base, **combo} for base in self._params(number - 1) for combo in points())

    def __iter__(self) -> Iterator[JobSpec]:
        new = tuple.__new__  # the named tuple's own __new__ is a Python function: a million calls
        kind, target, points = self._phases[0]
        phase = self.phase_offset
        encoded = None if _drawn(self.sweep.phases[0]) else _grid_json(self.sweep.phases[0])
        if encoded is None:
            yield from (new(JobSpec, (phase, kind, target, combo, None, None)) for combo in points())
        else:
            yield from (
                new(JobSpec, (phase, kind, target, combo, None, text)) for combo, text in zip(points(), encoded)
            )
        start = 0  # index of the first job of the phase before
        for number in range(1, len(self._phases)):
            kind, target, _points_of = self._phases[number]
            phase = self.phase_offset + number
            per_parent = self._sizes[number] // max(1, self._sizes[number - 1])
            for ordinal, params in enumerate(self._params(number)):
                yield new(JobSpec, (phase, kind, target, params, start + ordinal // per_parent, None))
            start += self._sizes[number - 1]


def expand(sweep: Sweep, *, samples: int | None = None, seed: int = 0, sampler: str = "random") -> list[JobSpec]:
    """Every job of the sweep, parents before children (:class:`Expansion`, made at once)."""
    return list(Expansion(sweep, samples=samples, seed=seed, sampler=sampler))


def _phase_sizes(sweep: Sweep, samples: int | None) -> list[int]:
    """How many jobs each phase of ``sweep`` has."""
    out, per_parent = [], 1
    for phase in sweep.phases:
        size = 1
        for a in phase.assignments:
            size *= 1 if a.distribution is not None else len(a.values)
        if _drawn(phase):
            size *= samples or 0
        per_parent *= size
        out.append(per_parent)
    return out


def count_jobs(sweep: Sweep, samples: int | None = None) -> int:
    """How many jobs ``expand`` makes, without making them."""
    return sum(_phase_sizes(sweep, samples))

"""Distributions as sweep values (``lr=loguniform(1e-4,1e-1)``) and reproducible draws from them.

Each draw is a pure function of (seed, phase, key, index): the first N samples are the same
whatever N is, so a sweep scheduled again adds nothing and a larger ``--samples`` adds only the
new points. A draw maps a number u in [0, 1) through the distribution's inverse CDF; u comes
from a keyed hash (``random``) or from a Halton sequence, randomly shifted by the seed
(``halton``: a low-discrepancy sequence, written here because it is twenty lines and keeps
point i independent of N, which Sobol points, made in powers of two, do not).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

SAMPLERS = ("random", "halton")

# name: (argument names, check of the arguments or None, whether a parameter of it is on a log scale)
_SIGNATURES: dict[str, tuple[str, ...]] = {
    "uniform": ("low", "high"),
    "loguniform": ("low", "high"),
    "quniform": ("low", "high", "q"),
    "qloguniform": ("low", "high", "q"),
    "randint": ("low", "high"),
    "normal": ("mu", "sigma"),
    "qnormal": ("mu", "sigma", "q"),
}
NAMES = (*_SIGNATURES, "choice")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@dataclass(frozen=True)
class Distribution:
    """One of ``uniform(a,b)``, ``loguniform(a,b)``, ``randint(a,b)`` (both ends included),
    ``normal(mu,sigma)``, ``choice(x,y,...)`` and the quantized ``quniform``, ``qloguniform``,
    ``qnormal`` (rounded to a multiple of their last argument)."""

    name: str
    args: tuple[Any, ...]

    @property
    def log_scale(self) -> bool:
        return self.name in ("loguniform", "qloguniform")

    def draw(self, u: float) -> Any:
        """The value at quantile ``u`` in [0, 1)."""
        a = self.args
        if self.name == "choice":
            return a[min(int(u * len(a)), len(a) - 1)]
        if self.name == "randint":
            return int(a[0]) + min(int(u * (a[1] - a[0] + 1)), a[1] - a[0])
        if self.name in ("uniform", "quniform"):
            value = a[0] + u * (a[1] - a[0])
        elif self.name in ("loguniform", "qloguniform"):
            value = math.exp(math.log(a[0]) + u * (math.log(a[1]) - math.log(a[0])))
        else:  # normal, qnormal
            value = NormalDist(a[0], a[1]).inv_cdf(min(max(u, 1e-12), 1 - 1e-12))
        if self.name.startswith("q"):
            value = round(value / a[2]) * a[2]
            if self.name != "qnormal":  # rounding must not step out of the bounds
                lo = math.ceil(a[0] / a[2] - 1e-9) * a[2]
                hi = math.floor(a[1] / a[2] + 1e-9) * a[2]
                value = min(max(value, lo), hi)
            if all(isinstance(x, int) for x in a):
                return int(round(value))
            return float(round(value, 12))
        return float(value)


def check(name: str, args: Sequence[Any]) -> str | None:
    """Why ``name(args)`` is not a distribution (a sentence), or None when it is one."""
    if name == "choice":
        return None if args else "choice() needs at least one value"
    names = _SIGNATURES[name]
    if len(args) != len(names):
        return f"{name}() takes {len(names)} numbers ({', '.join(names)}), not {len(args)}"
    if not all(_number(x) for x in args):
        return f"the arguments of {name}() are numbers"
    if name == "randint" and not all(isinstance(x, int) for x in args):
        return "the bounds of randint() are whole numbers"
    if name in ("normal", "qnormal"):
        if args[1] <= 0:
            return f"the sigma of {name}() must be above 0"
    elif not args[0] < args[1] and not (name == "randint" and args[0] == args[1]):
        return f"the low bound of {name}() must be below the high bound"
    if name in ("loguniform", "qloguniform") and args[0] <= 0:
        return f"the bounds of {name}() must be above 0 (a log scale)"
    if name.startswith("q") and args[-1] <= 0:
        return f"the step q of {name}() must be above 0"
    return None


# -- from Python: jobman.uniform(1e-4, 1e-1) is the sweep's uniform(1e-4,1e-1) ----------------------


def _make(name: str, *args: Any) -> Distribution:
    from .errors import UsageError

    why = check(name, args)
    if why:
        raise UsageError(why)
    return Distribution(name, tuple(args))


def uniform(low: float, high: float) -> Distribution:
    return _make("uniform", low, high)


def loguniform(low: float, high: float) -> Distribution:
    return _make("loguniform", low, high)


def quniform(low: float, high: float, q: float) -> Distribution:
    return _make("quniform", low, high, q)


def qloguniform(low: float, high: float, q: float) -> Distribution:
    return _make("qloguniform", low, high, q)


def randint(low: int, high: int) -> Distribution:
    return _make("randint", low, high)


def normal(mu: float, sigma: float) -> Distribution:
    return _make("normal", mu, sigma)


def qnormal(mu: float, sigma: float, q: float) -> Distribution:
    return _make("qnormal", mu, sigma, q)


def choice(*values: Any) -> Distribution:
    return _make("choice", *values)


# -- the numbers u ------------------------------------------------------------------------------


def _hashed(seed: int, phase: int, key: str, index: int) -> float:
    digest = hashlib.blake2b(f"{seed}\x00{phase}\x00{key}\x00{index}".encode(), digest_size=8).digest()
    return (struct.unpack(">Q", digest)[0] >> 11) * 2.0**-53


_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97)


def _radical_inverse(index: int, base: int) -> float:
    out, f = 0.0, 1.0 / base
    while index:
        index, digit = divmod(index, base)
        out += digit * f
        f /= base
    return out


def _halton(seed: int, phase: int, key: str, index: int, dim: int) -> float:
    # Point index+1 (the 0th Halton point is all zeros), shifted modulo 1 by a per-(seed, key) offset:
    # a randomized quasi-Monte-Carlo draw that keeps the sequence's even spread.
    base = _PRIMES[dim % len(_PRIMES)]
    return (_radical_inverse(index + 1, base) + _hashed(seed, phase, key, -1)) % 1.0


def draws(
    dists: dict[str, Distribution], count: int, *, seed: int, phase: int = 0, sampler: str = "random"
) -> list[dict[str, Any]]:
    """``count`` points, each a value per key; point i depends on (seed, phase, key, i) only."""
    if sampler not in SAMPLERS:
        raise ValueError(f"unknown sampler {sampler!r}")
    keys = sorted(dists)
    unit: Callable[[str, int, int], float]
    if sampler == "halton":
        unit = lambda key, i, dim: _halton(seed, phase, key, i, dim)  # noqa: E731
    else:
        unit = lambda key, i, dim: _hashed(seed, phase, key, i)  # noqa: E731
    return [{k: dists[k].draw(unit(k, i, d)) for d, k in enumerate(keys)} for i in range(count)]

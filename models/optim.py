"""Optimizers as updaters: each keeps its state in per-parameter slots that checkpoints save.

An optimizer is built over a dict of parameter arrays and updates them in place
from a dict of gradients of the same names. Its state is ``slots[param][slot]``
(momentum velocity, Adam's moments) plus a step count, all exported as arrays by
:meth:`Optimizer.state_dict` so a restored run continues bit for bit.

When the parameters and gradients are views of flat buffers (a
:class:`~jobman.models.layers.Network`'s are), pass the buffers as ``flat=`` and
every step runs once over the whole vector; the slots are then views of flat
buffers too, and are saved and restored by name all the same.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .buffers import is_view_set, views_of

FLUSH_EVERY = 50  # steps between two flushes of tiny slot values (0.9 ** 50 keeps them far from denormal)
TINY = 1e-30


class Optimizer:
    """Base updater: ``update(grads)`` changes every parameter in place."""

    slot_names: tuple[str, ...] = ()

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        lr: float,
        weight_decay: float = 0.0,
        flat: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        self.params = dict(params)
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.t = 0
        self.flat = None
        self._grads_seen: object = None
        if flat is not None:
            p_buf, g_buf = flat
            if not is_view_set(self.params, p_buf) or p_buf.shape != g_buf.shape:
                raise ValueError("flat= must be the buffer the parameters are views of, and a gradient buffer like it")
            shapes = {k: v.shape for k, v in self.params.items()}
            self._flat_slots = {s: np.zeros_like(p_buf) for s in self.slot_names}
            per_slot = {s: views_of(buf, shapes) for s, buf in self._flat_slots.items()}
            self.slots = {k: {s: per_slot[s][k] for s in self.slot_names} for k in self.params}
            # Weight decay (L2) applies to matrices only, never to biases.
            mask = np.zeros_like(p_buf)
            for v in views_of(mask, shapes).values():
                if v.ndim > 1:
                    v[...] = 1
            self._decay = self.weight_decay * mask
            self.flat = (p_buf, g_buf)
            self._scratch = {"flat": np.empty_like(p_buf)}
        else:
            self.slots = {k: {s: np.zeros_like(p) for s in self.slot_names} for k, p in self.params.items()}
            self._scratch = {k: np.empty_like(p) for k, p in self.params.items()}

    def update(self, grads: Mapping[str, np.ndarray]) -> None:
        """Apply one step from ``grads`` (with ``flat=``, the gradient buffer is read instead)."""
        self.begin_step()
        if self.t % FLUSH_EVERY == 0:
            self._flush_tiny()
        if self.flat is not None:
            p, g = self.flat
            if grads is not self._grads_seen:
                if not is_view_set(grads, g):
                    raise ValueError("with flat=, update() takes the gradients that are views of the flat buffer")
                self._grads_seen = grads
            if self.weight_decay:
                g = g + self._decay * p
            self._step(p, g, self._flat_slots, self._scratch["flat"])
            return
        for name, p in self.params.items():
            g = grads[name]
            if self.weight_decay and p.ndim > 1:
                g = g + self.weight_decay * p
            self._step(p, g, self.slots[name], self._scratch[name])

    def begin_step(self) -> None:
        """Count one more step and set its constants; then :meth:`apply` it to each part of the parameters."""
        self.t += 1
        self._prepare()

    def apply(
        self,
        p: np.ndarray,
        g: np.ndarray,
        slots: Mapping[str, np.ndarray],
        decay: np.ndarray | None = None,
        tmp: np.ndarray | None = None,
    ) -> None:
        """This step on arrays held elsewhere (a variable's, with its own slots): ``p`` updated in place from
        ``g``, its slots too; ``decay`` is the weight decay per value (already times ``weight_decay``), ``tmp``
        scratch space like ``p``."""
        if self.t % FLUSH_EVERY == 0:
            for buf in slots.values():
                if buf.dtype.kind == "f":
                    buf[np.abs(buf) < TINY] = 0
        if decay is not None and self.weight_decay:
            g = g + decay * p
        self._step(p, g, dict(slots), np.empty_like(p) if tmp is None else tmp)

    def _flush_tiny(self) -> None:
        """Zero slot values that decay towards the denormal range.

        A unit whose gradient stays zero (a dead ReLU, a blank pixel) sees its
        momentum shrink geometrically; once denormal, every operation on it costs
        many times a normal one and a whole epoch slows down by half or more.
        Values below TINY change no update that float32 can represent.
        """
        buffers = (
            self._flat_slots.values()
            if self.flat is not None
            else [a for slot in self.slots.values() for a in slot.values()]
        )
        for buf in buffers:
            if buf.dtype.kind == "f":
                buf[np.abs(buf) < TINY] = 0

    def _prepare(self) -> None:
        """Per-update constants (Adam's bias correction)."""

    def _step(
        self, p: np.ndarray, g: np.ndarray, slot: dict[str, np.ndarray], tmp: np.ndarray
    ) -> None:  # pragma: no cover - abstract
        """Update ``p`` in place; ``tmp`` is scratch space of p's shape (no allocation per step)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, np.ndarray]:
        """Slots as ``"<param>/<slot>"`` arrays, the step count ``"t"`` and the learning rate ``"lr"``."""
        out = {f"{name}/{s}": arr for name, slot in self.slots.items() for s, arr in slot.items()}
        out["t"] = np.array(self.t, dtype=np.int64)
        out["lr"] = np.array(self.lr, dtype=np.float64)  # schedules change it
        return out

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        for name, slot in self.slots.items():
            for s, arr in slot.items():
                arr[...] = arrays[f"{name}/{s}"]
        self.t = int(arrays["t"])
        if "lr" in arrays:
            self.lr = float(arrays["lr"])


class SGD(Optimizer):
    """Plain stochastic gradient descent: ``p -= lr * g``."""

    def _step(self, p: np.ndarray, g: np.ndarray, slot: dict[str, np.ndarray], tmp: np.ndarray) -> None:
        np.multiply(g, self.lr, out=tmp)
        p -= tmp


class Momentum(Optimizer):
    """Heavy-ball momentum (Nesterov's variant with ``nesterov=True``); slot ``v`` is the velocity."""

    slot_names = ("v",)

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        lr: float,
        momentum: float = 0.9,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        flat: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        super().__init__(params, lr, weight_decay, flat)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

    def _step(self, p: np.ndarray, g: np.ndarray, slot: dict[str, np.ndarray], tmp: np.ndarray) -> None:
        v = slot["v"]
        v *= self.momentum
        np.multiply(g, self.lr, out=tmp)
        v -= tmp
        if self.nesterov:  # p += momentum * v - lr * g
            p -= tmp
            np.multiply(v, self.momentum, out=tmp)
        else:
            tmp[...] = v
        p += tmp


class Adam(Optimizer):
    """Adam with bias correction; slots ``m`` and ``v`` are the first and second moments."""

    slot_names = ("m", "v")

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        lr: float,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        flat: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        super().__init__(params, lr, weight_decay, flat)
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)

    def _prepare(self) -> None:
        # The bias correction depends on t only: fold it into the step size and epsilon.
        t = self.t
        self._alpha = float(self.lr * np.sqrt(1 - self.beta2**t) / (1 - self.beta1**t))
        self._eps_hat = float(self.eps * np.sqrt(1 - self.beta2**t))

    def _step(self, p: np.ndarray, g: np.ndarray, slot: dict[str, np.ndarray], tmp: np.ndarray) -> None:
        m, v = slot["m"], slot["v"]
        np.subtract(g, m, out=tmp)  # m += (1 - beta1) (g - m)
        tmp *= 1 - self.beta1
        m += tmp
        np.multiply(g, g, out=tmp)  # v += (1 - beta2) (g^2 - v)
        tmp -= v
        tmp *= 1 - self.beta2
        v += tmp
        np.sqrt(v, out=tmp)  # p -= alpha m / (sqrt(v) + eps)
        tmp += self._eps_hat
        np.divide(m, tmp, out=tmp)
        tmp *= self._alpha
        p -= tmp


OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam")


def make_optimizer(
    name: str,
    params: Mapping[str, np.ndarray],
    lr: float,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    flat: tuple[np.ndarray, np.ndarray] | None = None,
) -> Optimizer:
    """Build an optimizer by name: ``sgd``, ``momentum``, ``nesterov`` or ``adam``."""
    key = str(name).lower()
    if key == "sgd":
        return SGD(params, lr, weight_decay=weight_decay, flat=flat)
    if key in ("momentum", "nesterov"):
        return Momentum(params, lr, momentum=momentum, nesterov=key == "nesterov", weight_decay=weight_decay, flat=flat)
    if key == "adam":
        return Adam(params, lr, weight_decay=weight_decay, flat=flat)
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, not {name!r}")

"""Bernoulli-Bernoulli restricted Boltzmann machine trained by contrastive divergence.

``RBM.cd_grads`` fills the gradients of CD-k (Hinton 2002) or, with a persistent
chain, of persistent CD (Tieleman 2008), as gradients of a loss to *minimise*,
so any updater of :mod:`optim` trains it. Visible units take values in [0, 1]
(grey levels are used as probabilities). The persistent chain is part of the
state that checkpoints save.
"""

from __future__ import annotations

import numpy as np

from .buffers import flatten
from .layers import sigmoid


class RBM:
    """Weights ``W`` (visible x hidden), biases ``vbias`` and ``hbias``; flat buffers like a Network's."""

    def __init__(self, n_visible: int, n_hidden: int, rng: np.random.Generator, dtype: type = np.float32) -> None:
        init: dict[str, np.ndarray] = {
            "W": rng.normal(0, 0.01, size=(n_visible, n_hidden)).astype(dtype),
            "vbias": np.zeros(n_visible, dtype=dtype),
            "hbias": np.zeros(n_hidden, dtype=dtype),
        }
        self.flat_params, self.params = flatten(init)
        self.flat_grads, self.grads = flatten({k: np.zeros_like(v) for k, v in init.items()})
        self.chain: np.ndarray | None = None  # hidden states of the persistent chains (PCD)

    @property
    def n_hidden(self) -> int:
        return int(self.params["W"].shape[1])

    def hidden_probs(self, v: np.ndarray) -> np.ndarray:
        return sigmoid(v @ self.params["W"] + self.params["hbias"])

    def visible_probs(self, h: np.ndarray) -> np.ndarray:
        return sigmoid(h @ self.params["W"].T + self.params["vbias"])

    @staticmethod
    def sample(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return (rng.random(p.shape, dtype=p.dtype) < p).astype(p.dtype)

    def cd_grads(self, v0: np.ndarray, rng: np.random.Generator, k: int = 1, persistent: bool = False) -> None:
        """Fill ``self.grads`` from the batch ``v0`` with CD-k, or PCD-k when ``persistent``."""
        n = len(v0)
        h0 = self.hidden_probs(v0)
        if persistent:
            if self.chain is None:
                self.chain = self.sample(h0, rng)
            if len(self.chain) < n:
                extra = self.sample(h0[len(self.chain) :], rng)
                self.chain = np.concatenate([self.chain, extra])
            h = self.chain[:n]
        else:
            h = self.sample(h0, rng)
        for step in range(int(k)):
            vk = self.visible_probs(h)
            if persistent:  # a persistent chain must really sample to mix
                vk = self.sample(vk, rng)
            hk = self.hidden_probs(vk)
            if step < k - 1 or persistent:
                h = self.sample(hk, rng)
        if persistent:
            assert self.chain is not None  # made above
            self.chain[:n] = h
        g = self.grads
        np.matmul(vk.T, hk, out=g["W"])
        g["W"] -= v0.T @ h0
        g["W"] /= n
        np.subtract(vk.sum(axis=0), v0.sum(axis=0), out=g["vbias"])
        g["vbias"] /= n
        np.subtract(hk.sum(axis=0), h0.sum(axis=0), out=g["hbias"])
        g["hbias"] /= n

    def reconstruction_error(self, v: np.ndarray) -> float:
        """Mean squared error of the mean-field reconstruction: a cheap, deterministic progress measure."""
        return float(np.mean((v - self.visible_probs(self.hidden_probs(v))) ** 2))

    def state_dict(self) -> dict[str, np.ndarray]:
        out = dict(self.params)
        if self.chain is not None:
            out["chain"] = self.chain
        return out

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        for name, value in self.params.items():
            value[...] = arrays[name]
        self.chain = arrays["chain"].copy() if "chain" in arrays else None

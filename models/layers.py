"""Coarse-grained layers with forward and backward passes, and a sequential network.

Each layer keeps what its backward pass needs from the last forward pass, and
its parameters and gradients in dicts keyed by name, so an optimizer can update
them in place and a checkpoint can save them. Arrays are float32 by default
(fast BLAS); tests build float64 networks for gradient checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import numpy as np

from .buffers import flatten


class Layer:
    """A differentiable block: ``forward`` then ``backward`` on the same batch.

    ``backward`` may overwrite the ``dy`` it is given (the networks pass it fresh arrays).
    """

    params: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]

    def __init__(self) -> None:
        self.params = {}
        self.grads = {}

    def forward(self, x: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def backward(self, dy: np.ndarray, need_dx: bool = True) -> np.ndarray | None:  # pragma: no cover
        raise NotImplementedError


class Dense(Layer):
    """``y = x @ W + b``. Glorot-uniform initialisation (scaled for sigmoid units)."""

    def __init__(
        self,
        n_in: int,
        n_out: int,
        rng: np.random.Generator | None = None,
        dtype: type = np.float32,
        scale: float = 1.0,
        W: np.ndarray | None = None,
        b: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        if W is None:
            if rng is None:
                raise ValueError("Dense needs an rng when no initial W is given")
            bound = scale * np.sqrt(6.0 / (n_in + n_out))
            W = rng.uniform(-bound, bound, size=(n_in, n_out))
        self.params["W"] = np.array(W, dtype=dtype)
        self.params["b"] = np.zeros(n_out, dtype=dtype) if b is None else np.array(b, dtype=dtype)
        self.grads["W"] = np.zeros_like(self.params["W"])
        self.grads["b"] = np.zeros_like(self.params["b"])
        self._x: np.ndarray | None = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._x = x
        out = x @ self.params["W"]
        out += self.params["b"]
        return out

    def backward(self, dy: np.ndarray, need_dx: bool = True) -> np.ndarray | None:
        assert self._x is not None, "backward before forward"
        np.matmul(self._x.T, dy, out=self.grads["W"])
        np.sum(dy, axis=0, out=self.grads["b"])
        return dy @ self.params["W"].T if need_dx else None


class ReLU(Layer):
    """``max(x, 0)``."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._y = np.maximum(x, 0)
        return self._y

    def backward(self, dy: np.ndarray, need_dx: bool = True) -> np.ndarray:
        dy *= self._y > 0
        return dy


class Tanh(Layer):
    """Hyperbolic tangent."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._y = np.tanh(x)
        return self._y

    def backward(self, dy: np.ndarray, need_dx: bool = True) -> np.ndarray:
        dy *= 1 - self._y * self._y
        return dy


class Sigmoid(Layer):
    """Logistic function, the unit of RBMs (a DBN fine-tunes a stack of these)."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._y = sigmoid(x)
        return self._y

    def backward(self, dy: np.ndarray, need_dx: bool = True) -> np.ndarray:
        dy *= self._y * (1 - self._y)
        return dy


ACTIVATIONS: dict[str, type[Layer]] = {"relu": ReLU, "tanh": Tanh, "sigmoid": Sigmoid}


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Numerically safe logistic function that keeps the input's dtype."""
    return 0.5 * (1 + np.tanh(0.5 * x))


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    e /= e.sum(axis=1, keepdims=True)
    return e


class SoftmaxCrossEntropy:
    """Mean cross-entropy of softmax(logits) against integer labels; its gradient w.r.t. logits."""

    def forward(self, logits: np.ndarray, y: np.ndarray) -> float:
        self._p = softmax(logits)
        self._y = y
        self._rows = np.arange(len(y))
        picked = self._p[self._rows, y]
        return float(-np.log(np.maximum(picked, 1e-12)).sum()) / max(len(y), 1)

    def backward(self) -> np.ndarray:
        """The gradient w.r.t. the logits (computed in the softmax's buffer: call once per forward)."""
        d = self._p
        d[self._rows, self._y] -= 1
        d *= 1.0 / len(self._y)
        return d


class Network:
    """A stack of layers ending in a softmax classifier.

    Parameters are exposed as one dict (``"0.W"``, ``"0.b"``, ``"2.W"``, ...) whose
    arrays are the layers' own, so updating them in place updates the network; they
    are views of one buffer, ``flat_params`` (and the gradients of ``flat_grads``).
    """

    def __init__(self, layers: Iterable[Layer]) -> None:
        self.layers = list(layers)
        self.loss = SoftmaxCrossEntropy()
        params = {f"{i}.{k}": v for i, layer in enumerate(self.layers) for k, v in layer.params.items()}
        # Parameters and gradients live in two flat buffers; layers hold views of them.
        self.flat_params, self.params = flatten(params)
        self.flat_grads, self.grads = flatten({k: np.zeros_like(v) for k, v in params.items()})
        for i, layer in enumerate(self.layers):
            for k in layer.params:
                layer.params[k] = self.params[f"{i}.{k}"]
                layer.grads[k] = self.grads[f"{i}.{k}"]

    def forward(self, x: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray) -> float:
        """Forward and backward on one batch; fills ``self.grads`` and returns the mean loss."""
        loss = self.loss.forward(self.forward(x), y)
        d = self.loss.backward()
        first_trainable = next(i for i, layer in enumerate(self.layers) if layer.params)
        for i in range(len(self.layers) - 1, first_trainable - 1, -1):
            # None only from the first trainable layer, the loop's last
            d = cast(np.ndarray, self.layers[i].backward(d, need_dx=i > first_trainable))
        return loss

    def predict(self, x: np.ndarray, batch_size: int = 4096) -> np.ndarray:
        """Predicted class of each row."""
        out = [self.forward(x[i : i + batch_size]).argmax(axis=1) for i in range(0, len(x), batch_size)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.intp)

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 4096) -> tuple[float | None, float | None]:
        """(error, mean cross-entropy) on a set in one pass, or (None, None) for an empty set."""
        if len(y) == 0:
            return None, None
        wrong, loss = 0, 0.0
        for i in range(0, len(x), batch_size):
            logits = self.forward(x[i : i + batch_size])
            yb = y[i : i + batch_size]
            wrong += int(np.sum(logits.argmax(axis=1) != yb))
            loss += SoftmaxCrossEntropy().forward(logits, yb) * len(yb)
        return wrong / len(y), loss / len(y)

    def error(self, x: np.ndarray, y: np.ndarray) -> float | None:
        """Fraction misclassified, or None for an empty set."""
        if len(y) == 0:
            return None
        return float(np.mean(self.predict(x) != y))

    def state_dict(self) -> dict[str, np.ndarray]:
        return dict(self.params)

    def load_state_dict(self, arrays: dict[str, np.ndarray]) -> None:
        """Copy saved arrays into the live parameters (in place, so optimizers keep their views)."""
        for name, value in self.params.items():
            value[...] = arrays[name]


def mlp(
    sizes: list[int], activation: str = "relu", rng: np.random.Generator | None = None, dtype: type = np.float32
) -> Network:
    """A fully connected network ``sizes[0] -> ... -> sizes[-1]`` with ``activation`` between layers."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, not {activation!r}")
    layers: list[Layer] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = i == len(sizes) - 2
        scale = 4.0 if activation == "sigmoid" and not last else 1.0
        layers.append(Dense(n_in, n_out, rng, dtype=dtype, scale=scale))
        if not last:
            layers.append(ACTIVATIONS[activation]())
    return Network(layers)

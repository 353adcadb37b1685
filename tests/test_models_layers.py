"""Layers and networks of the bundled workloads: gradients checked against finite differences."""

import numpy as np
import pytest

from jobman.models import layers


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


@pytest.mark.parametrize("activation", ["relu", "tanh", "sigmoid"])
def test_network_gradients_match_finite_differences(activation):
    rng = np.random.default_rng(1)
    net = layers.mlp([5, 7, 6, 3], activation, rng, dtype=np.float64)
    x = rng.normal(size=(4, 5))
    y = np.array([0, 2, 1, 2])
    net.loss_and_grads(x, y)
    analytic = {k: v.copy() for k, v in net.grads.items()}
    for name, param in net.params.items():
        num = numeric_grad(lambda: net.loss.forward(net.forward(x), y), param)
        assert np.allclose(analytic[name], num, rtol=1e-5, atol=1e-7), name


def test_input_gradient_of_each_layer():
    rng = np.random.default_rng(2)
    for layer in (layers.Dense(4, 3, rng, dtype=np.float64), layers.ReLU(), layers.Tanh(), layers.Sigmoid()):
        x = rng.normal(size=(2, 4))
        w = rng.normal(size=layer.forward(x).shape)  # loss = sum(w * layer(x))
        layer.forward(x)
        dx = layer.backward(w.copy())
        num = numeric_grad(lambda w=w, layer=layer, x=x: float(np.sum(w * layer.forward(x))), x)
        assert np.allclose(dx, num, rtol=1e-5, atol=1e-7), type(layer).__name__


def test_softmax_cross_entropy_value_and_gradient():
    logits = np.array([[2.0, 1.0, 0.1], [0.0, 0.0, 0.0]])
    y = np.array([0, 2])
    loss = layers.SoftmaxCrossEntropy()
    value = loss.forward(logits, y)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert value == pytest.approx(-np.mean(np.log(p[[0, 1], [0, 2]])))
    num = numeric_grad(lambda: layers.SoftmaxCrossEntropy().forward(logits, y), logits)
    assert np.allclose(loss.backward(), num, atol=1e-7)


def test_softmax_is_stable_for_huge_logits():
    p = layers.softmax(np.array([[1000.0, 0.0], [-1000.0, 1000.0]], dtype=np.float32))
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(1), 1)


def test_parameters_are_views_of_the_flat_buffer():
    net = layers.mlp([3, 4, 2], "relu", np.random.default_rng(0))
    assert net.flat_params.size == 3 * 4 + 4 + 4 * 2 + 2
    net.flat_params[:] = 0.5
    assert np.all(net.layers[0].params["W"] == 0.5)
    net.loss_and_grads(np.array([[0, 1, 0], [1, 0, 1]], np.float32), np.array([0, 0]))
    assert np.shares_memory(net.grads["0.W"], net.flat_grads)
    assert net.flat_grads.any()


def test_float32_by_default_and_predictions():
    rng = np.random.default_rng(0)
    net = layers.mlp([2, 8, 2], "relu", rng)
    assert net.flat_params.dtype == np.float32
    x = np.array([[0, 0], [1, 1]], dtype=np.float32)
    assert net.forward(x).dtype == np.float32
    assert net.predict(x).shape == (2,)
    assert net.error(x[:0], np.zeros(0, int)) is None


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation"):
        layers.mlp([2, 2], "swish", np.random.default_rng(0))

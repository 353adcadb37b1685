"""Optimizers: they descend, their slots hold their state, and a restored optimizer continues bit for bit."""

import numpy as np
import pytest

from jobman.models import layers, optim
from jobman.models.checkpoint import load_npz, prefixed, save_npz, unprefixed

NAMES = ["sgd", "momentum", "nesterov", "adam"]


def quadratic_run(name, steps, flat):
    target = np.array([1.0, -2.0, 3.0, 0.5], dtype=np.float32)
    net_params = {"w": np.zeros((2, 2), np.float32), "b": np.zeros(0, np.float32)}
    from jobman.models.buffers import flatten

    p_buf, params = flatten(net_params)
    g_buf, grads = flatten({k: np.zeros_like(v) for k, v in net_params.items()})
    opt = optim.make_optimizer(name, params, lr=0.05, flat=(p_buf, g_buf) if flat else None)
    for _ in range(steps):
        grads["w"][...] = (params["w"].reshape(-1) - target).reshape(2, 2)
        opt.update(grads)
    return float(np.sum((params["w"].reshape(-1) - target) ** 2))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("flat", [False, True])
def test_each_optimizer_minimises_a_quadratic(name, flat):
    start = float(np.sum(np.array([1.0, -2.0, 3.0, 0.5]) ** 2))
    assert quadratic_run(name, 300, flat) < 0.01 * start


def test_adam_first_step_is_lr_times_sign():
    p = {"w": np.array([0.0, 0.0], np.float32)}
    opt = optim.Adam(p, lr=0.1)
    opt.update({"w": np.array([3.0, -0.5], np.float32)})
    assert np.allclose(p["w"], [-0.1, 0.1], atol=1e-6)
    assert opt.t == 1 and set(opt.slots["w"]) == {"m", "v"}


def test_momentum_accumulates_velocity():
    p = {"w": np.zeros(1)}
    opt = optim.Momentum(p, lr=1.0, momentum=0.5)
    for _ in range(2):
        opt.update({"w": np.ones(1)})
    assert p["w"][0] == pytest.approx(-1.0 - 1.5)
    assert opt.slots["w"]["v"][0] == pytest.approx(-1.5)


def test_weight_decay_spares_biases():
    p = {"W": np.ones((2, 2)), "b": np.ones(2)}
    opt = optim.SGD(p, lr=0.1, weight_decay=1.0)
    opt.update({"W": np.zeros((2, 2)), "b": np.zeros(2)})
    assert np.allclose(p["W"], 0.9) and np.allclose(p["b"], 1.0)


def test_flat_update_refuses_foreign_gradients():
    net = layers.mlp([2, 3, 2], "relu", np.random.default_rng(0))
    opt = optim.make_optimizer("adam", net.params, 0.1, flat=(net.flat_params, net.flat_grads))
    with pytest.raises(ValueError, match="views"):
        opt.update({k: np.zeros_like(v) for k, v in net.params.items()})


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="optimizer"):
        optim.make_optimizer("rmsprop", {}, 0.1)


def batches(seed, n):
    rng = np.random.default_rng(seed)
    return [(rng.random((8, 6), dtype=np.float32), rng.integers(0, 3, 8)) for _ in range(n)]


@pytest.mark.parametrize("name", NAMES)
def test_slots_checkpoint_and_restore_bit_exact(name, tmp_path):
    data = batches(0, 20)

    def fresh():
        net = layers.mlp([6, 5, 3], "tanh", np.random.default_rng(3))
        opt = optim.make_optimizer(name, net.params, 0.05, weight_decay=1e-3, flat=(net.flat_params, net.flat_grads))
        return net, opt

    def train(net, opt, part):
        for x, y in part:
            net.loss_and_grads(x, y)
            opt.update(net.grads)

    net, opt = fresh()
    train(net, opt, data)
    straight = net.flat_params.copy()

    net, opt = fresh()
    train(net, opt, data[:7])
    save_npz(tmp_path / "ck.npz", {**prefixed("net", net.state_dict()), **prefixed("opt", opt.state_dict())})
    train(net, opt, data[7:9])  # work after the checkpoint is lost

    net2, opt2 = fresh()
    arrays = load_npz(tmp_path / "ck.npz")
    net2.load_state_dict(unprefixed("net", arrays))
    opt2.load_state_dict(unprefixed("opt", arrays))
    assert opt2.t == 7
    train(net2, opt2, data[7:])
    assert np.array_equal(net2.flat_params, straight)
    if name != "sgd":
        slot = next(iter(opt2.slots.values()))
        assert any(a.any() for a in slot.values())


def test_restoring_without_slots_would_differ(tmp_path):
    """The check above can fail: dropping Adam's moments changes the trajectory."""
    data = batches(1, 10)
    net = layers.mlp([6, 5, 3], "relu", np.random.default_rng(3))
    opt = optim.Adam(net.params, 0.05, flat=(net.flat_params, net.flat_grads))
    for x, y in data:
        net.loss_and_grads(x, y)
        opt.update(net.grads)
    net2 = layers.mlp([6, 5, 3], "relu", np.random.default_rng(3))
    opt2 = optim.Adam(net2.params, 0.05, flat=(net2.flat_params, net2.flat_grads))
    for x, y in data[:5]:
        net2.loss_and_grads(x, y)
        opt2.update(net2.grads)
    opt3 = optim.Adam(net2.params, 0.05, flat=(net2.flat_params, net2.flat_grads))
    for x, y in data[5:]:
        net2.loss_and_grads(x, y)
        opt3.update(net2.grads)
    assert not np.array_equal(net.flat_params, net2.flat_params)


def test_decaying_slots_are_flushed_before_they_turn_denormal():
    net = layers.mlp([3, 4, 2], "relu", np.random.default_rng(0))
    opt = optim.Adam(net.params, 0.01, flat=(net.flat_params, net.flat_grads))
    net.flat_grads[:] = 1.0
    opt.update(net.grads)
    net.flat_grads[:] = 0.0  # a unit that never gets a gradient again: m shrinks by 0.9 a step
    for _ in range(2000):
        opt.update(net.grads)
    m = opt.slots["0.W"]["m"]
    assert np.all(m == 0)  # 0.1 * 0.9 ** 2000 would be far below float32's smallest normal number
    assert np.all(opt.slots["0.W"]["v"] > 0)  # v decays slower and is still a normal number

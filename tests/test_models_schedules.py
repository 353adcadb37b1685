"""Schedules, timelines and the built-in plugins of the training loop."""

import io

import numpy as np
import pytest

from jobman.dispatch.channel import COMPLETE, INCOMPLETE, DirectChannel
from jobman.models.loop import Loop
from jobman.models.optim import SGD
from jobman.models.plugins import (
    EarlyStopping,
    Plugin,
    ReduceOnPlateau,
    always,
    at,
    checkpoint,
    each,
    early_stopping,
    evaluate,
    log_metrics,
    never,
    progress,
    remote_stop,
)


def fired(schedule, points):
    """The evaluation points (after the first) at which ``schedule`` fires, walking ``points`` in order."""
    return [now for prev, now in zip(points, points[1:]) if schedule.fires(prev, now)]


def test_each_fires_once_per_crossed_multiple():
    assert fired(each(3), list(range(0, 10))) == [3, 6, 9]
    assert each(5).fires(4, 5) and not each(5).fires(5, 9)
    assert each(5).fires(9, 16)  # crossing 10 and 15 at once still fires (once)
    assert not each(5).fires(0, 0)


def test_each_on_uneven_float_steps():
    assert fired(each(1.0), [0.0, 0.4, 0.9, 1.3, 2.6, 2.7, 3.0]) == [1.3, 2.6, 3.0]


def test_each_with_start():
    assert fired(each(10, start=5), list(range(0, 30))) == [5, 15, 25]


def test_each_needs_a_positive_period():
    with pytest.raises(ValueError):
        each(0)


def test_at_fires_at_its_points_only():
    assert fired(at(2, 7), list(range(0, 10))) == [2, 7]
    assert at(3).fires(2.5, 3) and not at(3).fires(3, 4)
    assert fired(at(5), [0, 4, 6, 8]) == [6]


def test_and_or_not():
    pts = list(range(0, 13))
    assert fired(each(2) & ~each(3), pts) == [2, 4, 8, 10]
    assert fired(each(4) | at(3), pts) == [3, 4, 8, 12]
    assert fired(~each(2), list(range(0, 6))) == [1, 3, 5]
    assert fired(each(2) & (at(4) | at(6)), pts) == [4, 6]
    assert fired(always(), [0, 1, 2]) == [1, 2] and fired(never(), [0, 1, 2]) == []


def test_unknown_timeline_is_refused():
    with pytest.raises(ValueError, match="timeline"):
        Plugin(each(1), "minutes", lambda loop: None)


class FakeTime:
    """A clock that steps advance by 1 s and plugins by 0.5 s."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_loop(tmp_path, plugins, n=10, batch=4, epochs=3, timer=None, step=None):
    channel = DirectChannel(job_id=None, phase=0, attempt=1, workdir=tmp_path, params={})
    channel.bind({})
    return Loop(
        n_examples=n,
        batch_size=batch,
        max_epochs=epochs,
        step=step or (lambda idx: 0.0),
        rng=np.random.default_rng(0),
        channel=channel,
        plugins=plugins,
        timer=timer or FakeTime(),
    )


def recorder(log, timeline):
    return lambda loop: log.append(loop.clock.value(timeline))


def test_all_timelines_in_a_loop(tmp_path):
    clock = FakeTime()
    seen = {}

    def step(idx):
        clock.now += 1.0
        return 0.0

    def slow_plugin(loop):
        clock.now += 0.5

    plugins = [Plugin(always(), "iterations", slow_plugin)]
    for name, sched in [
        ("iterations", each(2)),
        ("epochs", each(1)),
        ("examples", each(8)),
        ("train_time", each(2.0)),
        ("wall_time", each(3.0)),
    ]:
        seen[name] = []
        plugins.append(Plugin(sched, name, recorder(seen[name], name)))
    loop = make_loop(tmp_path, plugins, timer=clock, step=step)
    assert loop.run() == COMPLETE
    # 10 examples in batches of 4: 3 iterations per epoch (4, 4, 2 examples), 3 epochs.
    assert loop.clock.iterations == 9 and loop.clock.epochs == 3 and loop.clock.examples == 30
    assert seen["iterations"] == [2, 4, 6, 8]
    assert seen["epochs"] == [1, 2, 3]
    # Examples after each iteration: 4 8 10 14 18 20 24 28 30; 16 is crossed in (14, 18].
    assert seen["examples"] == [8, 18, 24]
    # Training time is 1 s per iteration: the plugin's 0.5 s never counts.
    assert seen["train_time"] == [2.0, 4.0, 6.0, 8.0]
    assert loop.clock.train_time == 9.0
    # Wall time at iteration k is k + 0.5 (k - 1): 1 2.5 4 5.5 7 8.5 10 11.5 13.
    assert seen["wall_time"] == [4.0, 7.0, 10.0, 13.0]
    assert loop.clock.wall_time == 9.0 + 9 * 0.5


def test_plugins_run_in_order_and_see_metrics(tmp_path):
    order = []
    plugins = [
        evaluate(lambda loop: {"score": loop.clock.epochs * 1.0, "none": None}),
        Plugin(each(1), "epochs", lambda loop: order.append(dict(loop.metrics))),
    ]
    loop = make_loop(tmp_path, plugins, epochs=2)
    loop.run()
    assert [m["score"] for m in order] == [1.0, 2.0]
    assert "none" not in order[0] and "train_loss" in order[0]


def test_early_stopping_counts_evaluations_and_ties_improve():
    stops = []

    class FakeLoop:
        def __init__(self):
            self.metrics, self.clock = {}, type("C", (), {"epochs": 0})()

        def stop(self, reason, incomplete=False):
            stops.append(reason)

    improved = []
    es = EarlyStopping("err", patience=2, on_improve=lambda loop: improved.append(loop.metrics["err"]))
    loop = FakeLoop()
    for value in [0.5, 0.4, 0.4, 0.45, 0.41]:
        loop.metrics["err"] = value
        es(loop)
    assert improved == [0.5, 0.4, 0.4]
    assert es.best == 0.4 and es.waited == 2 and len(stops) == 1
    restored = EarlyStopping("err", patience=2)
    restored.load_state_dict(es.state_dict())
    assert (restored.best, restored.waited) == (0.4, 2)


def test_early_stopping_max_mode_and_missing_metric():
    stops = []
    loop = type(
        "L",
        (),
        {
            "metrics": {},
            "clock": type("C", (), {"epochs": 0})(),
            "stop": lambda self, r, incomplete=False: stops.append(r),
        },
    )()
    es = EarlyStopping("acc", patience=1, mode="max")
    es(loop)  # no metric yet: nothing happens
    assert es.best is None
    for v in (0.5, 0.6, 0.55):
        loop.metrics["acc"] = v
        es(loop)
    assert es.best == 0.6 and len(stops) == 1


def test_early_stopping_plugin_ends_the_loop(tmp_path):
    values = iter([3.0, 2.0, 2.5, 2.6, 2.7, 1.0])
    plugins = [evaluate(lambda loop: {"valid_error": next(values)}), early_stopping("valid_error", patience=3)]
    loop = make_loop(tmp_path, plugins, epochs=10)
    assert loop.run() == COMPLETE
    assert loop.clock.epochs == 5 and "early stopping" in loop.stop_reason


def test_log_metrics_writes_learning_curves(tmp_path):
    plugins = [evaluate(lambda loop: {"valid_error": 0.1 * loop.clock.epochs}), log_metrics(prefix="x_")]
    loop = make_loop(tmp_path, plugins, epochs=3)
    loop.run()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    import json

    rows = [json.loads(line) for line in lines]
    assert [(r["step"], r["value"]) for r in rows if r["name"] == "x_valid_error"] == [
        (1, pytest.approx(0.1)),
        (2, pytest.approx(0.2)),
        (3, pytest.approx(0.3)),
    ]
    assert {r["name"] for r in rows} == {"x_valid_error", "x_train_loss"}


def test_remote_stop_checkpoints_and_ends_incomplete(tmp_path):
    plugins = [Plugin(at(4), "iterations", lambda loop: loop.channel.request_stop("cancel requested")), remote_stop()]
    loop = make_loop(tmp_path, plugins, epochs=5)
    loop.checkpoint_path = tmp_path / "ck.npz"
    assert loop.run() == INCOMPLETE
    assert loop.clock.iterations == 4 and loop.stop_reason == "cancel requested"
    assert (tmp_path / "ck.npz").exists() and (tmp_path / "state.json").exists()
    assert not loop.finished


def test_checkpoint_plugin_on_a_schedule(tmp_path):
    saves = []
    loop = make_loop(tmp_path, [checkpoint(each(2), "epochs")], epochs=5)
    loop.on_checkpoint = lambda lp: saves.append(lp.clock.epochs)
    loop.run()
    assert saves == [2, 4, 5]  # on schedule, then once at the end


def test_progress_prints_a_line(tmp_path):
    out = io.StringIO()
    loop = make_loop(tmp_path, [progress(each(1), "epochs", stream=out, label="job ")], epochs=2)
    loop.run()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("job epoch 1 iter 3")


def test_reduce_on_plateau_divides_the_rate_a_limited_number_of_times():
    opt = SGD({"w": np.zeros(1)}, lr=1.0)
    plateau = ReduceOnPlateau(opt, "valid_loss", patience=2, factor=10, max_reductions=2)
    loop = type("L", (), {"metrics": {}})()
    rates = []
    for value in [1.0, 0.9, 0.95, 0.91, 0.9, 0.92, 0.93, 0.5, 0.6, 0.7, 0.8, 0.9]:
        loop.metrics["valid_loss"] = value
        plateau(loop)
        rates.append(opt.lr)
    assert rates == [1, 1, 1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01]
    again = ReduceOnPlateau(opt, "valid_loss")
    again.load_state_dict(plateau.state_dict())
    assert (again.best, again.reductions) == (0.9, 2)  # no tracking after the last reduction
    assert float(opt.state_dict()["lr"]) == pytest.approx(0.01)


def test_logger_writes_each_measurement_once_at_the_epoch_it_was_made(tmp_path):
    plugins = [evaluate(lambda loop: {"v": float(loop.clock.iterations)}, each(5), "iterations"), log_metrics()]
    loop = make_loop(tmp_path, plugins, n=10, batch=4, epochs=4)  # 3 iterations per epoch
    loop.run()
    import json

    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # measured at iterations 5, 10 (epochs 2 and 4); epoch 3 has nothing new to write but its loss
    assert [(r["step"], r["value"]) for r in rows if r["name"] == "v"] == [(2, 5.0), (4, 10.0)]
    assert [r["step"] for r in rows if r["name"] == "train_loss"] == [1, 2, 3, 4]

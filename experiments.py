"""Ready-made experiments the original jobman documentation runs (``jobman.experiments.print_state``)."""

from __future__ import annotations

import time

from jobman.jobdb.nested import flatten


def example1(state, channel):
    """The smallest experiment: say so, and finish."""
    print("example experiment")
    return channel.COMPLETE


def print_state(state, channel):
    """Print the state it is given, one ``key = value`` line per parameter, and finish."""
    for key, value in sorted(flatten({k: v for k, v in state.items() if k != "jobman"}).items()):
        print(f"{key} = {value!r}")
    return channel.COMPLETE


def example_sleep(state, channel):
    """Sleep ``state.sleep`` seconds in tenths, checkpointing ``state.slept`` when ``channel.switch()``
    asks, and returning INCOMPLETE when it says to stop or to finish up (run it again to go on)."""
    state.slept = state.get("slept", 0.0)
    while state.slept < float(state.sleep):
        answer = channel.switch()
        if answer in ("stop", "finish-up"):
            return channel.INCOMPLETE
        if answer == "save":
            channel.save()
        step = min(0.1, float(state.sleep) - state.slept)
        time.sleep(step)
        state.slept = round(state.slept + step, 6)
    return channel.COMPLETE

"""The documentation's first experiment: add two numbers of the state."""


def addition_example(state, channel):
    """``state.result = state.first + state.second``, printed as it goes."""
    print("state.first =", state.first)
    print("state.second =", state.second)
    state.result = state.first + state.second
    print("result =", state.result)
    return channel.COMPLETE

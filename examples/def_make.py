"""The documentation's builder example: ``obj::jobman.examples.def_make.MakeExample`` makes
``state.obj`` a description of an object, and ``make(state.obj)`` builds it.

    jobman cmdline jobman.examples.def_make.experiment \\
        obj::jobman.examples.def_make.MakeExample obj.param1=2 obj.param2='jobman rules'
"""

from jobman import make


class MakeExample:
    """An object built from the state: ``MakeExample(param1=..., param2=...)``."""

    def __init__(self, param1=2, param2="message"):
        self.value = param1
        self.msg = param2
        print("Created MakeExample object successfully.")

    def test(self):
        print("self.value = ", self.value)
        print(self.msg)


def experiment(state, channel):
    """Build ``state.obj`` with its builder and use it."""
    obj = make(state.obj)
    obj.test()
    return channel.COMPLETE

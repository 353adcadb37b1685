"""The documentation's ``make2`` example: a builder that is an expression, evaluated with ``reval``.

With ``test.conf`` (shipped beside this module; ``python -m jobman.examples .`` copies it here)::

    plumber :: @jobman.examples.def_make2.Plumber(%itsa, %%me, %luigi)
    plumber.itsa = "it's a "
    plumber.luigi :: "luigi" + exclamation_mark
    me = "me, "

``jobman cmdline jobman.examples.def_make2.experiment test.conf`` prints ``it's a me, luigi!``:
``%itsa`` and ``%luigi`` are the built keys of ``plumber``, ``%%me`` is ``state.me``, and
``exclamation_mark`` is found where ``make2`` is called.
"""

from jobman import make2


class Plumber:
    """Three words joined into ``statement``."""

    def __init__(self, itsa, me, mario):
        self.statement = itsa + me + mario


def experiment(state, channel):
    """Build ``state.plumber`` with ``make2`` and print what it says."""
    exclamation_mark = "!"  # noqa: F841 - used by the builder expression of plumber.luigi
    obj = make2(state.plumber)
    print(obj.statement)
    return channel.COMPLETE

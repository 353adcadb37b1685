"""The original jobman's ``jobman.tools``: ``DD``, ``flatten`` and ``expand`` for nested state, and
``make``, ``make2``, ``reval``, ``resolve`` to build objects from it."""

from jobman.dispatch.builders import defaults_merge, make, make2, resolve, reval
from jobman.jobdb.nested import DD, expand, flatten

__all__ = ["DD", "flatten", "expand", "make", "make2", "reval", "resolve", "defaults_merge"]

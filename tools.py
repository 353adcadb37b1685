"""The original jobman's ``jobman.tools``: ``DD``, ``flatten`` and ``expand`` for nested state."""

from jobman.jobdb.nested import DD, expand, flatten

__all__ = ["DD", "flatten", "expand"]

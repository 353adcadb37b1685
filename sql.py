"""The original jobman's ``jobman.sql``: ``db``, ``insert_job``, ``insert_dict``, ``hash_state``.

Thin names over the store; see ``jobman.jobdb.classic``.
"""

from jobman.jobdb.classic import *  # noqa: F403
from jobman.jobdb.classic import __all__  # noqa: F401

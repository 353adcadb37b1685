"""The experiments the original jobman documentation imports and runs: ``def_addition``,
``def_make``, ``def_make2`` and ``mlp_jobman`` (``python -m jobman.examples DIR`` copies
``mlp_jobman.py``, ``mlp_jobman.conf`` and ``test.conf`` where the tutorials expect them)."""

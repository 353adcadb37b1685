"""The tiny experiments the original jobman documentation imports (``jobman.examples.def_addition``)."""

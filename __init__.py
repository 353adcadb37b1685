"""jobman: a job database and experiment scheduler for machine-learning research."""

__version__ = "0.1.0"

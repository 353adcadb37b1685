"""Choosing hyperparameters: jobs grouped into configurations, their results aggregated and ranked.

Jobs whose parameters differ only by a fold or seed key (the *group keys*) are one
configuration. Each numeric result of a configuration's DONE jobs is summarised by
n, mean, sample standard deviation (ddof=1; blank when n=1), min and max; jobs that
are not DONE are counted, never averaged.

Conventions, fixed here so the CLI, the plots and fan-in jobs agree:

- Default group keys: parameters named ``fold``, ``*_fold``, ``fold_*``, ``seed``,
  ``*_seed`` or ``seed_*``; never counts (``nb_*``, ``n_*``, ``num_*``) and never outer
  folds. A parameter naming an outer fold (``id_outer_fold``, ``outer_fold``) splits
  the report: nested cross-validation is ranked per outer fold, then summarised over
  the outer folds' winners (the names are :mod:`jobman.jobdb.selection`'s).
- A configuration is complete when every one of its jobs is DONE with the metric and it
  has as many jobs as the largest configuration of its scope (phase, target and outer
  fold). Only complete configurations are eligible for best, unless ``allow_incomplete``.
- Ranking: the better mean (compared to 12 significant digits), then more runs, then
  the lower std (unknown std last), then the configuration scheduled first (lowest id).
- Jobs of a phase and target where no DONE job reports the metric are left out
  (a pretraining phase, a fan-in job), and said so in :attr:`Report.dropped`.

The package's rooms: :mod:`.model` (what a report holds), :mod:`.inpython` (the engine over records
in memory, the reference), :mod:`.indatabase` (the engine over a store, its steps) with
:mod:`.queries` (its SQL, all of it), and :mod:`.jsonrows` (the JSON of a streamed report).
"""

from __future__ import annotations

from ..selection import Condition, default_group_keys, default_outer_key, format_number, format_param, parse_where
from .indatabase import from_store, open_report
from .inpython import best, build_report, from_store_in_python, spread, summarize
from .model import AUTO, STD_DDOF, ConfigRow, NothingEligible, Overview, Report, Stat, UnknownMetric

__all__ = [
    "best",
    "summarize",
    "build_report",
    "from_store",
    "from_store_in_python",
    "open_report",
    "spread",
    "parse_where",
    "default_group_keys",
    "default_outer_key",
    "ConfigRow",
    "Report",
    "Stat",
    "Overview",
    "Condition",
    "NothingEligible",
    "UnknownMetric",
    "STD_DDOF",
    "AUTO",
    "format_number",
    "format_param",
]

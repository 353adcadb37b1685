"""SQLite without its memory statistics, in the processes jobman starts itself.

SQLite counts the memory it holds (``SQLITE_CONFIG_MEMSTATUS``) unless told not to, and SQLite's own
advice on speed is to turn the count off. While it is on, every allocation of every connection
takes one mutex of the whole process: two threads reading the database at once then run no faster
than one, and one alone runs about a tenth slower on reads that parse JSON (a report's grouping).
Python's ``sqlite3`` never reads those statistics.

The setting can change only while the library is shut down, which is safe only before a process's
first connection. So a process says so with :func:`allow` (jobman's command and its zygote, before
they open anything) and its first SQLite engine calls :func:`apply`; a program that imports jobman
(a notebook with its own connections open) keeps SQLite as it was. Where the library's functions
cannot be reached (a Python with SQLite linked in statically), nothing changes.
"""

from __future__ import annotations

import threading

_allowed = False
_lock = threading.Lock()
_SQLITE_CONFIG_MEMSTATUS = 9  # from sqlite3.h


def allow() -> None:
    """This process has opened no SQLite database, and no other thread of it will before its first
    SQLite engine is made."""
    global _allowed
    _allowed = True


def apply() -> None:
    """Turn the statistics off, once, if :func:`allow` said this process may."""
    global _allowed
    if not _allowed:
        return
    with _lock:  # another thread making an engine meanwhile waits here until it is done
        if _allowed:
            _turn_off()
            _allowed = False


def _turn_off() -> None:
    import _sqlite3
    import ctypes

    try:
        lib = ctypes.CDLL(_sqlite3.__file__)
        shutdown, config, initialize = lib.sqlite3_shutdown, lib.sqlite3_config, lib.sqlite3_initialize
    except (OSError, AttributeError):
        return
    if shutdown() == 0:
        config(_SQLITE_CONFIG_MEMSTATUS, ctypes.c_int(0))
        initialize()

"""A command job's relative paths, anchored in the directory it was scheduled from.

A command job runs in its own workdir, so ``python3 train_cli.py`` would look for the script there;
the user meant the file beside them when they scheduled it.
"""

from __future__ import annotations

import os
import shlex


def anchored_command(command: str, here: str) -> str:
    """``command`` with each argument that names an existing file relative to ``here`` made absolute;
    the program itself only when written as a path (``./run.sh``: a bare name is looked up on PATH).
    A command with nothing to anchor comes back as it was written."""
    try:
        argv = shlex.split(command)
    except ValueError:  # unbalanced quotes: the sweep parser says so in its own words
        return command
    out: list[str] = []
    for index, token in enumerate(argv):
        anchor = (
            token
            and not os.path.isabs(token)
            and not token.startswith("-")
            and "{" not in token
            and (index > 0 or "/" in token)
            and os.path.isfile(os.path.join(here, token))
        )
        out.append(os.path.normpath(os.path.join(here, token)) if anchor else token)
    return command if out == argv else shlex.join(out)

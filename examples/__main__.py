"""``python -m jobman.examples [DIR]``: copy the tutorials' files into DIR (default: here).

The MLP tutorial runs ``mlp_jobman.experiment`` with ``mlp_jobman.conf`` from the directory it
is typed in, and the ``make2`` one reads ``test.conf``: this puts them there, as the original's
examples directory did. Files already there are left alone.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

FILES = ("mlp_jobman.py", "mlp_jobman.conf", "test.conf")


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python -m jobman.examples [DIR]", file=sys.stderr)
        return 2
    target = Path(argv[0] if argv else ".")
    if target.exists() and not target.is_dir():
        print(f"{target} is not a directory", file=sys.stderr)
        return 1
    target.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    for name in FILES:
        dest = target / name
        if dest.exists():
            print(f"kept {dest} (already there)")
            continue
        shutil.copyfile(here / name, dest)
        print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Run every benchmark and write bench/RESULTS.md: machine, versions, date, every figure.

    python bench/run_all.py [--quick]

Each benchmark runs as its own process and prints its figures beside the baseline it
measured in the same run; this collects what they print. Nothing here is a test:
a missed target is reported, never raised.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, machine  # noqa: E402

# (name, script, flags of the full run, flags of --quick)
BENCHES = [
    ("schedule", "schedule.py", [], ["--quick"]),
    ("claim", "claim.py", [], ["--quick"]),
    ("end to end", "dispatch_overhead.py", ["--no-write"], ["--no-write", "--quick"]),
    ("monitor and cascade", "graph.py", [], ["--quick"]),
    ("report", "report_bench.py", [], ["--jobs", "10000"]),
    ("web dashboard", "web.py", [], ["--jobs", "20000", "--repeat", "2"]),
    ("calls from Python", "python_api.py", [], ["--quick"]),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a smoke run of about a minute")
    parser.add_argument("--only", help="comma-separated names of benchmarks to run")
    args = parser.parse_args(argv)
    info = machine()
    sections = []
    for name, script, full, quick in BENCHES:
        if args.only and name not in args.only.split(","):
            continue
        flags = quick if args.quick else full
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / script), *flags], capture_output=True, text=True)
        print(proc.stdout, end="", flush=True)
        if proc.returncode:
            print(proc.stderr[-2000:], file=sys.stderr)
        sections.append((name, script, flags, proc.stdout.strip(), proc.returncode, time.perf_counter() - start))
    lines = ["# Benchmark results", "",
             f"`python bench/run_all.py{' --quick' if args.quick else ''}`, {info['date']}.", "",
             "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in info.items() if k != "date"]
    lines += ["", "SQLite runs in WAL mode with synchronous=NORMAL (durable across process crashes; "
              "a power loss may lose the last transactions) and a page cache of up to 64 MiB per connection; "
              "the raw-driver baselines use the driver's defaults. PostgreSQL at its defaults (fsync on).", ""]
    for name, script, flags, text, code, seconds in sections:
        lines += [f"## {name}", "", f"`python bench/{script} {' '.join(flags)}`".replace(" `", "`"), "", "```text",
                  text or "(no output)", "```", ""]
        if code:
            lines += [f"(exited with {code})", ""]
        lines[-1:] = [f"({seconds:.0f} s)", ""]
    (HERE / "RESULTS.md").write_text("\n".join(lines))
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

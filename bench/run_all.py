"""Run every benchmark and write bench/RESULTS.md: machine, versions, date, every figure.

    python bench/run_all.py [--quick]
    python bench/run_all.py --scale [--ten-million]

``--scale`` runs bench/scale.py and bench/report_scale.py at 1,000,000 jobs on both engines and writes their figures
into their own section of bench/RESULTS.md, beside the 100,000-job figures, which it leaves as they are.

Each benchmark runs as its own process and prints its figures beside the baseline it
measured in the same run; this collects what they print. Nothing here is a test:
a missed target is reported, never raised.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import HERE, machine

# (name, script, flags of the full run, flags of --quick)
BENCHES = [
    ("schedule", "schedule.py", [], ["--quick"]),
    ("claim", "claim.py", [], ["--quick"]),
    ("end to end", "dispatch_overhead.py", ["--no-write"], ["--no-write", "--quick"]),
    ("monitor and cascade", "graph.py", [], ["--quick"]),
    ("report", "report_bench.py", [], ["--jobs", "10000"]),
    ("web dashboard", "web.py", ["--no-write"], ["--no-write", "--jobs", "20000", "--repeat", "2"]),
    ("calls from Python", "python_api.py", [], ["--quick"]),
    ("an experiment in a notebook", "notebook.py", [], ["--jobs", "5000", "--repeat", "2"]),
    ("code records", "code_record.py", [], ["--jobs", "300", "--turns", "1"]),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes: a smoke run of about a minute")
    parser.add_argument("--only", help="comma-separated names of benchmarks to run")
    parser.add_argument("--scale", action="store_true", help="1,000,000 jobs, both engines (bench/scale.py)")
    parser.add_argument("--ten-million", action="store_true", help="with --scale: schedule 10,000,000 jobs too")
    args = parser.parse_args(argv)
    info = machine()
    if args.scale:
        return scale(info, args.ten_million)
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
    lines = [
        "# Benchmark results",
        "",
        f"`python bench/run_all.py{' --quick' if args.quick else ''}`, {info['date']}.",
        "",
        "| machine | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in info.items() if k != "date"]
    lines += [
        "",
        "SQLite runs in WAL mode with synchronous=NORMAL (durable across process crashes; "
        "a power loss may lose the last transactions) and a page cache of up to 64 MiB per connection; "
        "the raw-driver baselines use the driver's defaults. PostgreSQL at its defaults (fsync on).",
        "",
    ]
    for name, script, flags, text, code, seconds in sections:
        lines += [
            f"## {name}",
            "",
            f"`python bench/{script} {' '.join(flags)}`".replace(" `", "`"),
            "",
            "```text",
            text or "(no output)",
            "```",
            "",
        ]
        if code:
            lines += [f"(exited with {code})", ""]
        lines[-1:] = [f"({seconds:.0f} s)", ""]
    old = (HERE / "RESULTS.md").read_text() if (HERE / "RESULTS.md").exists() else ""
    if SCALE_START in old and SCALE_END in old:  # the million-job figures stay until --scale runs again
        lines += [SCALE_START + old.split(SCALE_START, 1)[1].split(SCALE_END, 1)[0] + SCALE_END, ""]
    (HERE / "RESULTS.md").write_text("\n".join(lines))
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


SCALE_START, SCALE_END = "<!-- scale -->", "<!-- /scale -->"


def scale(info: dict[str, str], ten_million: bool) -> int:
    """Run bench/scale.py and put its figures in RESULTS.md's section of a million jobs."""
    flags = ["--ten-million"] if ten_million else []
    print("== a million jobs", flush=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(HERE / "scale.py"), *flags], capture_output=True, text=True)
    print(proc.stdout, end="", flush=True)
    if proc.returncode:
        print(proc.stderr[-2000:], file=sys.stderr)
    # What scale.py leaves out of the report: 200,000 configurations × 5 folds, the json format, and the
    # in-Python report as a baseline.
    report = subprocess.run(
        [sys.executable, str(HERE / "report_scale.py"), "--beside-scale"], capture_output=True, text=True
    )
    print(report.stdout, end="", flush=True)
    if report.returncode:
        print(report.stderr[-2000:], file=sys.stderr)
    proc.stdout = proc.stdout.rstrip("\n") + "\n" + report.stdout
    proc.returncode = proc.returncode or report.returncode
    seconds = time.perf_counter() - start
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    section = [
        SCALE_START,
        "## a million jobs",
        "",
        f"`python bench/run_all.py --scale{' --ten-million' if ten_million else ''}`, {info['date']}, "
        f"on the machine above (load average at the end: {load}). A 1,000 x 1,000 grid per engine; "
        '"store call" is the read alone in a warm process, "CLI" is the command as a user runs it, '
        "process start included; peak memory is each command's own.",
        "",
        "```text",
        proc.stdout.strip() or "(no output)",
        "```",
        "",
    ]
    if proc.returncode:
        section += [f"(exited with {proc.returncode})", ""]
    section += [f"({seconds:.0f} s)", SCALE_END]
    results = HERE / "RESULTS.md"
    text = results.read_text() if results.exists() else "# Benchmark results\n"
    if SCALE_START in text and SCALE_END in text:
        before, rest = text.split(SCALE_START, 1)
        text = before + "\n".join(section) + rest.split(SCALE_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(section) + "\n"
    results.write_text(text)
    print(f"wrote the section of a million jobs in {results}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())

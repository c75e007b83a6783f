"""Start-up: how long whole `preemptctl` processes take, interpreter start included.

    .venv/bin/python benchmarks/startup.py                    # this tree's preemptctl
    .venv/bin/python benchmarks/startup.py --vs /other/.venv/bin/preemptctl   # side by side

Runs `preemptctl --help` and `preemptctl decide` on the smallest bundled example
case RUNS times each (after one warm-up), alternating with `--vs` when given, and
prints the minimum and median wall time of each, and their ratio pair by pair: on a
noisy machine only figures measured side by side in one run compare. The target
(issue 24) is `preemptctl --help` within 0.3 s; it is measured here, never asserted
in a test (tests/test_startup.py checks what each command imports instead).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = ROOT / "examples" / "cases" / "01-example1-c-preempts-a-and-b.yaml"
RUNS = 10


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preemptctl", default=str(Path(sys.executable).parent / "preemptctl"))
    parser.add_argument("--vs", metavar="PREEMPTCTL", help="another preemptctl, timed in turn with this one")
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    programs = [args.preemptctl] + ([args.vs] if args.vs else [])
    for label, tail in (("--help", ["--help"]), ("decide", ["decide", str(CASE), "--output", "json"])):
        times: dict[str, list[float]] = {p: [] for p in programs}
        for program in programs:
            wall([program, *tail])  # warm-up: file cache, .pyc
        for _ in range(args.runs):
            for program in programs:
                times[program].append(wall([program, *tail]))
        for program in programs:
            t = times[program]
            print(f"{label:8} {program}: min {min(t):.3f} s, median {statistics.median(t):.3f} s")
        if args.vs:
            ratios = [a / b for a, b in zip(times[programs[0]], times[programs[1]], strict=True)]
            print(f"{label:8} ratio this/other: median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

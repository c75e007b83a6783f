"""`preemptctl bench engine|pipeline`: the benchmark group (each kind registers its own flags)."""

from __future__ import annotations

import argparse

from streams.bench import engine, pipeline

HELP = "benchmarks (engine, pipeline)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help=HELP, description="Run a benchmark.")
    kinds = bench.add_subparsers(dest="bench", metavar="KIND")
    engine.register(kinds)
    pipeline.register(kinds)

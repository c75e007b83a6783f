"""Subcommands beyond `decide`, registered on the `preemptctl` parser."""

from __future__ import annotations

import argparse

from streams import bench_engine, replay_cmd, run, worker_app


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="benchmarks (engine, pipeline)", description="Run a benchmark.")
    kinds = bench.add_subparsers(dest="bench", metavar="KIND")
    bench_engine.register(kinds)
    worker_app.register(sub)
    run.register(sub)
    replay_cmd.register(sub)

"""Subcommands beyond `decide`, registered on the `preemptctl` parser."""

from __future__ import annotations

import argparse

from streams import (
    actuator,
    audit,
    bench_engine,
    bench_pipeline,
    explain,
    export,
    replay_cmd,
    run,
    source,
    worker_app,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="benchmarks (engine, pipeline)", description="Run a benchmark.")
    kinds = bench.add_subparsers(dest="bench", metavar="KIND")
    bench_engine.register(kinds)
    bench_pipeline.register(kinds)
    source.register(sub)
    worker_app.register(sub)
    actuator.register(sub)
    run.register(sub)
    replay_cmd.register(sub)
    audit.register(sub)
    export.register(sub)
    explain.register(sub)

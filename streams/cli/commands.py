"""Subcommands beyond `decide`, registered on the `preemptctl` parser."""

from __future__ import annotations

import argparse

from streams.audit import explain, export, replay, verify
from streams.bench import engine, pipeline
from streams.kube import actuator, source
from streams.pipeline import app
from streams.sim import run


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="benchmarks (engine, pipeline)", description="Run a benchmark.")
    kinds = bench.add_subparsers(dest="bench", metavar="KIND")
    engine.register(kinds)
    pipeline.register(kinds)
    source.register(sub)
    app.register(sub)
    actuator.register(sub)
    run.register(sub)
    replay.register(sub)
    verify.register(sub)
    export.register(sub)
    explain.register(sub)

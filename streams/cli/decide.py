"""`preemptctl decide`: answer preemption questions given as case files (docs/case-format.md)."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import orjson

HELP = "answer preemption questions given as case files"
EXAMPLES = """examples:
  preemptctl decide case.yaml                      a readable explanation per case
  preemptctl decide cases/*.yaml --output json     one JSON answer per line, in order
  preemptctl decide big-cluster.json               large cases as JSON parse much faster
  cat case.yaml | preemptctl decide -              a case on standard input
"""


def cmd_decide(args: argparse.Namespace) -> int:
    from engine import case as case_mod
    from streams.cli import cases, render

    if sum(1 for p in args.cases if p == cases.STDIN) > 1:
        from streams.common.errors import UsageError

        raise UsageError("standard input (-) can be given once")
    # Loading builds every object of every case at once and makes no garbage cycles: the automatic
    # collections it would trigger rescan all of it again and again (a third of the command's CPU
    # on a 5,000-node case). What is loaded then lives until exit, so it is frozen out of the scans.
    gc.disable()
    try:
        loaded = [cases.load(Path(p)) for p in args.cases]  # validate all before printing any
    finally:
        gc.freeze()
        gc.enable()
    out = sys.stdout
    for c in loaded:
        decision = case_mod.answer(c)
        if args.output == "json":
            answer = {"name": c.name, **decision.answer()}
            out.write(orjson.dumps(answer).decode() + "\n")
        else:
            out.write(render.decision_text(c.name, decision) + "\n\n")
        for warning in c.cluster.warnings.values():
            print(f"warning: {c.name}: {warning}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    decide = sub.add_parser(
        "decide",
        help=HELP,
        description="Decide each case file (docs/case-format.md) and print the answers.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    decide.add_argument(
        "cases", nargs="+", metavar="CASE", help="case file (.yaml, .yml or .json), or - for standard input"
    )
    decide.add_argument(
        "--output", choices=("json", "text"), default="text", help="answer format (default text)"
    )
    decide.set_defaults(func=cmd_decide)

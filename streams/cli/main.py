"""The `preemptctl` command line: one subcommand per capability (DESIGN §10).

Data goes to stdout, progress and logs to stderr; bad input exits 2 with one
clear line and nothing on stdout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

from streams.cli import cases, render
from streams.common.errors import UsageError

EXIT_USAGE = 2

DECIDE_EXAMPLES = """examples:
  preemptctl decide case.yaml                      one JSON answer per case, in order
  preemptctl decide cases/*.yaml --output text     a readable explanation per case
  preemptctl decide big-cluster.json               large cases as JSON parse much faster
"""


def cmd_decide(args: argparse.Namespace) -> int:
    from engine import case as case_mod

    loaded = [cases.load(Path(p)) for p in args.cases]  # validate all before printing any
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="preemptctl",
        description="Event-sourced streaming preemption controller for Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    decide = sub.add_parser(
        "decide",
        help="answer preemption questions given as case files",
        description="Decide each case file (conformance/FORMAT.md) and print the answers.",
        epilog=DECIDE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    decide.add_argument("cases", nargs="+", metavar="CASE", help="case file (.yaml, .yml or .json)")
    decide.add_argument(
        "--output", choices=("json", "text"), default="text", help="answer format (default text)"
    )
    decide.set_defaults(func=cmd_decide)
    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


# Other modules add their subcommands here (run, replay, bench, ...), keeping this file small.
_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = []


def main(argv: Sequence[str] | None = None) -> int:
    _load_commands()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        result: int = args.func(args)
        return result
    except UsageError as exc:
        print(f"preemptctl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        from streams.kafka.topics import BrokerUnavailable

        if not isinstance(exc, BrokerUnavailable):
            raise
        print(f"preemptctl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("preemptctl: interrupted", file=sys.stderr)
        return 130


def _load_commands() -> None:
    import importlib

    for name in ("streams.cli.commands",):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        register = getattr(module, "register", None)
        if register is not None and register not in _EXTRA_COMMANDS:
            _EXTRA_COMMANDS.append(register)


if __name__ == "__main__":
    sys.exit(main())

"""The `preemptctl` command line: one subcommand per capability (docs/architecture.md §5).

Data goes to stdout, progress and logs to stderr; bad input exits 2 with one
clear line and nothing on stdout.

Start-up imports only what the command in hand uses: the table below names each
subcommand and the module that defines it, and only that module is imported
(`preemptctl decide` never loads faust, aiokafka or the Kubernetes client;
`--help` and `--version` load no command at all). tests/test_startup.py holds
it to that in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from engine import ENGINE_VERSION
from streams.common import logs
from streams.common.errors import UsageError

EXIT_USAGE = 2
# What a shell reports for a process killed by SIGPIPE (128 + 13): `preemptctl ... | head -1`
# ends the way any Unix filter ends when its reader goes away, without a traceback.
EXIT_BROKEN_PIPE = 141

VERSION = ENGINE_VERSION


@dataclass(frozen=True)
class Command:
    """A subcommand: its one-line help (the top-level `--help`), and the module whose
    `register(sub)` adds its full parser, imported only when the command is asked for."""

    name: str
    help: str
    module: str


COMMANDS: tuple[Command, ...] = (
    Command("decide", "answer preemption questions given as case files", "streams.cli.decide"),
    Command("run", "the whole pipeline on an embedded broker and a simulated cluster", "streams.cli.run"),
    Command("source", "list+watch a Kubernetes cluster into preemption.cluster-events", "streams.cli.source"),
    Command("worker", "fold cluster-events and emit decisions (faust app)", "streams.cli.worker"),
    Command(
        "actuator", "act on preemption decisions (evict, delete or label victims)", "streams.cli.actuator"
    ),
    Command(
        "replay",
        "re-derive decisions from an event log (JSONL or kafka://) and compare",
        "streams.cli.replay",
    ),
    Command(
        "audit", "verify the decision log's hash chain and signatures; print its head", "streams.cli.audit"
    ),
    Command(
        "export",
        "write a topic as JSONL: cluster-events as a trace, decisions/evictions as records",
        "streams.cli.export",
    ),
    Command(
        "explain",
        "why a pod was (or was not) a victim or preemptor, from the decision records",
        "streams.cli.explain",
    ),
    Command("bench", "benchmarks (engine, pipeline)", "streams.cli.bench"),
)
BY_NAME = {c.name: c for c in COMMANDS}

DESCRIPTION = "Event-sourced streaming preemption controller for Kubernetes."
EPILOG = """examples:
  preemptctl decide examples/cases/01-example1-c-preempts-a-and-b.yaml
  preemptctl run --until-idle
  preemptctl worker --help

`preemptctl COMMAND --help` describes each command."""


def requested(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line: the first argument, unless it is an option."""
    first = argv[0] if argv else ""
    return first if first in BY_NAME else None


def build_parser(commands: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser with the full definition of `commands`; the others are listed by name and help only."""
    parser = argparse.ArgumentParser(
        prog="preemptctl",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"preemptctl {VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        if command.name in commands:
            importlib.import_module(command.module).register(sub)
        else:
            sub.add_parser(command.name, help=command.help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    name = requested(arguments)
    try:
        parser = build_parser([name] if name else [])
        args = parser.parse_args(arguments)
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        result: int = args.func(args)
        sys.stdout.flush()  # a closed pipe is reported here, not at interpreter exit
        return result
    except UsageError as exc:
        # A config's error may quote what it read, a password included: masked as in the logs.
        print(f"preemptctl: error: {logs.redact(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("preemptctl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # Not imported up front (`decide` never loads the Kafka layer); an exception of that
        # layer means it is loaded already.
        connection = sys.modules.get("streams.kafka.connection")
        if connection is None or not isinstance(exc, connection.BrokerUnavailable):
            raise
        print(f"preemptctl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())

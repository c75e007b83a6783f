"""`preemptctl run`: its flags; the command is streams.sim.run's."""

from __future__ import annotations

import argparse

from streams.kafka import connection
from streams.sim import run

HELP = "the whole pipeline on an embedded broker and a simulated cluster"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help=HELP,
        description=run.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  preemptctl run                    bundled example trace, Ctrl-C to stop\n"
        "  preemptctl run --trace t.jsonl --until-idle --decisions-out d.jsonl\n"
        "  preemptctl run --bootstrap-server 127.0.0.1:9092 --until-idle      an existing Kafka\n"
        "  preemptctl run --bootstrap-server 127.0.0.1:9093 --kafka-config client.properties --until-idle",
    )
    p.add_argument("--trace", help="JSONL trace (docs/case-format.md, traces); default: the bundled example")
    connection.add_arguments(p, required=False)
    p.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    p.add_argument("--decisions-out", help="write the decision log here (JSONL)")
    p.add_argument(
        "--until-idle", action="store_true", help="exit once the trace is consumed and nothing is in flight"
    )
    p.add_argument("--config", help="engine config YAML")
    p.add_argument("--hmac-key-file", help="sign decision records with this key")
    p.set_defaults(func=run.cmd)

"""`preemptctl explain`: its flags; the command is streams.audit.explain's."""

from __future__ import annotations

import argparse

from streams.audit import explain
from streams.kafka import connection

HELP = "why a pod was (or was not) a victim or preemptor, from the decision records"
EXAMPLES = """examples:
  preemptctl explain default/ex1-a --decisions decisions.jsonl           a victim: by whom, where, and why
  preemptctl explain default/ex4-f --decisions decisions.jsonl           a preemptor that stayed pending
  preemptctl explain team-a/job1-0 --decisions kafka://127.0.0.1:9092/preemption.decisions --output json

  preemptctl explain default/web-1 --decisions kafka://kafka:9092/preemption.decisions --since 2h

Exit 0: the records mention the pod; 1: none does (the answer says so); 2: bad NAMESPACE/POD,
--since or unreadable DECISIONS.
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain",
        help=HELP,
        description="Answer from the decision records: for a victim, which decision, preemptor and node and "
        "why this pod rather than its neighbours; for a spared neighbour, why it survived; for a preemptor, "
        "where it landed and why, or why it stayed pending.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("pod", metavar="NAMESPACE/POD", help="the pod asked about, e.g. default/web-1")
    p.add_argument(
        "--decisions",
        required=True,
        metavar="DECISIONS",
        help="decision log: JSONL file or kafka://host:port/topic",
    )
    p.add_argument("--cluster", metavar="NAME", help="only this cluster's decisions")
    p.add_argument(
        "--since",
        metavar="WHEN",
        help="only decisions made since WHEN: a duration before now (30m, 2h, 7d) or an RFC 3339 time; "
        "a topic is then read from there, not from its start",
    )
    p.add_argument("--output", choices=("text", "json"), default="text", help="answer format (default text)")
    connection.add_arguments(p, required=False)
    p.set_defaults(func=explain.cmd)

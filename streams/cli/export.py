"""`preemptctl export`: its flags; the command is streams.audit.export's."""

from __future__ import annotations

import argparse

from streams.audit import export
from streams.kafka import connection

HELP = "write a topic as JSONL: cluster-events as a trace, decisions/evictions as records"
EXAMPLES = """examples:
  preemptctl export kafka://127.0.0.1:9092/preemption.cluster-events --out events.jsonl
  preemptctl export kafka://127.0.0.1:9092/preemption.decisions --cluster prod-eu --out decisions.jsonl
  preemptctl export kafka://127.0.0.1:9092/preemption.evictions > evictions.jsonl

  then, anywhere:
  preemptctl audit verify decisions.jsonl
  preemptctl replay events.jsonl --compare decisions.jsonl     0 differences: they follow from the log
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export",
        help=HELP,
        description="Read a whole topic from its beginning and write it as JSON Lines, so an audit can be "
        "archived and replayed anywhere: cluster-events as a trace (one event per line, with its cluster), "
        "decision and eviction records one per line, unchanged. Progress and the summary go to stderr.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("topic", metavar="kafka://host:port/topic", help="the topic to export")
    p.add_argument("--out", metavar="FILE", help="write here (default: stdout); appears only when complete")
    p.add_argument("--cluster", metavar="NAME", help="only this cluster's events or records")
    connection.add_arguments(p, required=False)
    p.set_defaults(func=export.cmd)

"""`preemptctl replay`: its flags; the command is streams.audit.replay's."""

from __future__ import annotations

import argparse

from schemas import chain
from streams.audit import replay
from streams.kafka import connection

HELP = "re-derive decisions from an event log (JSONL or kafka://) and compare"
EXAMPLES = """examples:
  preemptctl replay trace.jsonl --simulate --decisions-out d.jsonl     the run, without a broker
  preemptctl replay exported-events.jsonl --compare decisions.jsonl     audit a recorded run
  preemptctl replay kafka://127.0.0.1:9092/preemption.cluster-events \\
      --compare kafka://127.0.0.1:9092/preemption.decisions
  preemptctl replay kafka://127.0.0.1:9092/team-a.cluster-events --hmac-key-file worker.pem \\
      --install-id team-a. --compare kafka://127.0.0.1:9092/team-a.decisions   signatures too
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay",
        help=HELP,
        description="Fold a cluster-events log as recorded (the audit path), or run a trace through the "
        "simulated cluster (--simulate), and print or write the decision log.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("log", metavar="LOG", help="JSONL trace/export, or kafka://host:port/topic")
    p.add_argument(
        "--simulate", action="store_true", help="treat LOG as a trace and add the cluster's reactions"
    )
    p.add_argument("--decisions-out", metavar="FILE", help="write the decision log here (JSONL)")
    p.add_argument("--log-out", metavar="FILE", help="with --simulate: write the full event log here")
    p.add_argument(
        "--compare",
        metavar="RECORDED",
        help="recorded decisions (JSONL or kafka://): report missing, extra, doubled and differing "
        "records by id; exit 1 if any, 2 if RECORDED is not a decision log",
    )
    p.add_argument("--config", help="engine config YAML")
    p.add_argument(
        "--hmac-key-file",
        help="sign re-derived records with this key, as the worker did (to compare signed logs): "
        "its Ed25519 private key (PEM), or its HMAC key",
    )
    p.add_argument(
        "--install-id",
        metavar="ID",
        help="with --hmac-key-file: the install the worker signed for (its --install-id, else its "
        f"--topic-prefix; default {chain.DEFAULT_INSTALL})",
    )
    p.add_argument(
        "--unbound-hmac",
        action="store_true",
        help="with an HMAC --hmac-key-file: sign as workers did before signatures were bound to an "
        "install (a bare HMAC of the hash), to compare such a log",
    )
    connection.add_arguments(p, required=False)
    p.set_defaults(func=replay.cmd)

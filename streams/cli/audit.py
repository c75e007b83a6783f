"""`preemptctl audit verify|head`: their flags; the commands are streams.audit.verify's."""

from __future__ import annotations

import argparse
import sys

from streams.audit import verify as verify_mod
from streams.common import signing
from streams.common.errors import UsageError
from streams.kafka import connection

HELP = "verify the decision log's hash chain and signatures; print its head"
VERIFY_EXAMPLES = """examples:
  preemptctl audit verify decisions.jsonl
  preemptctl audit verify decisions.jsonl --signing-key-file k1.pub    every record signed (Ed25519)
  preemptctl audit verify decisions.jsonl --hmac-key-file key          (HMAC compatibility mode)
  preemptctl audit verify decisions.jsonl --signing-keys-dir keys/ --install-id preemption.staging.
  preemptctl audit verify kafka://127.0.0.1:9092/preemption.decisions --cluster prod-eu
  preemptctl audit verify decisions.jsonl --anchor 5f3c...e1            the log must still reach this head
  preemptctl audit verify decisions.jsonl --anchor-file anchor.json     (from: audit head --output json)
  preemptctl audit verify kafka://127.0.0.1:9092/preemption.decisions --pruned   retention deleted the start

exit status: 0 intact, 1 a bad record (the first one is named), the anchor is not reached or
there is no record to verify, 2 unreadable input (missing file, bad URL, not a decision log).
"""


HEAD_EXAMPLES = """examples:
  preemptctl audit head decisions.jsonl
  preemptctl audit head kafka://127.0.0.1:9092/preemption.decisions --output json > anchor.json
  preemptctl audit verify kafka://127.0.0.1:9092/preemption.decisions --anchor-file anchor.json

Publish the head somewhere the log's writers cannot change (a ticket, a signed
commit, another system's log): a later `verify --anchor` then detects a log
whose tail was cut off, which the hash chain alone cannot.
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "decisions", metavar="DECISIONS", help="decision log: JSONL file or kafka://host:port/topic"
    )
    signing.add_verification_arguments(
        p, what="every record must carry a sig that verifies with one of the keys (several: a rotation)"
    )
    p.add_argument("--cluster", metavar="NAME", help="only this cluster's chain (others are skipped)")
    p.add_argument(
        "--allow-duplicates",
        action="store_true",
        help="skip byte-identical re-deliveries of a record instead of failing on them",
    )
    p.add_argument(
        "--pruned",
        action="store_true",
        help="the log's oldest records were deleted (retention): a chain may continue from a record that "
        "is gone; where it starts is reported",
    )
    p.add_argument("--output", choices=("text", "json"), default="text", help="report format (default text)")
    connection.add_arguments(p, required=False)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = sub.add_parser(
        "audit",
        help=HELP,
        description="Check that a decision log is complete and unmodified (docs/audit.md).",
    )
    kinds = audit.add_subparsers(dest="audit", metavar="ACTION")
    verify = kinds.add_parser(
        "verify",
        help="check every record's hash, chain link, id, seq (and sig with a key)",
        description="Verify a decision log per cluster: each hash recomputes, each prevHash is the previous "
        "record's hash (the first is the genesis hash), ids are unique, seq never goes back and, with "
        "--hmac-key-file, every record is signed. The first bad record is named with its position and why.",
        epilog=VERIFY_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(verify)
    verify.add_argument(
        "--anchor",
        metavar="HASH",
        action="append",
        help="a chain head recorded earlier (audit head): the log must still reach it",
    )
    verify.add_argument("--anchor-file", metavar="F", help="anchors from `audit head --output json`")
    verify.set_defaults(func=verify_mod.cmd_verify)
    head = kinds.add_parser(
        "head",
        help="print each cluster's chain head (last hash and record count): an anchor to publish",
        description="Verify the log, then print the head of each cluster's chain. Keep it elsewhere; "
        "`audit verify --anchor` later proves the log was not truncated.",
        epilog=HEAD_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(head)
    head.set_defaults(func=verify_mod.cmd_head)
    audit.set_defaults(func=lambda args: _no_action(audit))


def _no_action(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    raise UsageError("audit needs an action: verify or head")

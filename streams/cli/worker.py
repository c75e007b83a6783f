"""`preemptctl worker`: its flags; the command is streams.pipeline.app's (the faust app)."""

from __future__ import annotations

import argparse

from streams.common import health as health_mod
from streams.common import logs, options
from streams.kafka import connection, lag
from streams.kafka import topics as kafka_topics
from streams.pipeline import app
from streams.pipeline import partitions as partitions_mod

HELP = "fold cluster-events and emit decisions (faust app)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "worker",
        help=HELP,
        description=app.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  preemptctl worker --bootstrap-server 127.0.0.1:9092 --store-dir /var/lib/pc\n"
        "  preemptctl worker --bootstrap-server kafka-0.kafka:9093,kafka-1.kafka:9093 \\\n"
        "      --kafka-config /etc/preemptctl/kafka/client.properties --store-dir /var/lib/pc",
    )
    connection.add_arguments(p)
    p.add_argument(
        "--store-dir",
        default="./preemptctl-state",
        help="local rocksdict state, and faust's own directory (default ./preemptctl-state)",
    )
    p.add_argument("--config", help="engine config YAML (README: config keys; docs/semantics.md)")
    p.add_argument(
        "--hmac-key-file",
        metavar="F",
        help="sign decision records with this key: an Ed25519 private key (PEM PKCS#8; actuators "
        "hold its public key) or, in the HMAC compatibility mode, a shared key",
    )
    p.add_argument(
        "--hmac-key-id",
        metavar="ID",
        help="the key's id, sent with each decision (default: the key file's name); docs/topics.md",
    )
    p.add_argument(
        "--install-id",
        metavar="ID",
        help="the install each signature binds, as this install's actuators check it (their "
        "--install-id; default: the topic prefix)",
    )
    p.add_argument(
        "--processing-guarantee",
        choices=("at_least_once", "exactly_once"),
        default="at_least_once",
        help="exactly_once: transactional publishing and fencing (Kafka with transactions only)",
    )
    p.add_argument(
        "--group-id",
        "--group",  # the spelling before 0.2.0, kept so deployments that pass it go on working
        dest="group",
        default=lag.DEFAULT_GROUP,
        metavar="G",
        help=f"consumer group, also the faust app id (default {lag.DEFAULT_GROUP})",
    )
    p.add_argument(
        "--no-create-topics",
        action="store_true",
        help="do not create missing topics (the operator made them; the principal has no Create ACL)",
    )
    kafka_topics.add_arguments(p)
    p.add_argument(
        "--session-timeout",
        type=options.bounded(float, least=0, above=True, what="a number of seconds above 0"),
        default=app.SESSION_TIMEOUT_S,
        metavar="SECONDS",
        help=f"consumer group session timeout (default {app.SESSION_TIMEOUT_S:g})",
    )
    logs.add_arguments(p)
    # Fault injection for tests/chaos (streams.pipeline.faults): KIND=N, repeatable.
    p.add_argument("--inject-fault", action="append", metavar="KIND=N", help=argparse.SUPPRESS)
    # Snapshot every N events instead of the size-scaled policy (tests, benchmarks).
    p.add_argument("--snapshot-every", type=int, metavar="EVENTS", help=argparse.SUPPRESS)
    # How long a partition may have no owner in the group before the worker re-subscribes (tests).
    p.add_argument(
        "--unowned-grace", type=float, default=partitions_mod.UNOWNED_GRACE_S, help=argparse.SUPPRESS
    )
    health_mod.add_arguments(p)
    p.add_argument(
        "--tables-port",
        type=int,
        metavar="PORT",
        help="serve the materialized tables (/partitions, /clusters/...) on this port (default: off); "
        "never on --health-port, which Prometheus scrapes",
    )
    p.add_argument(
        "--tables-host",
        default=health_mod.LOCALHOST,
        metavar="HOST",
        help=f"address the tables bind (default {health_mod.LOCALHOST}: kubectl port-forward reaches it)",
    )
    p.set_defaults(func=app.cmd)

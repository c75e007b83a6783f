"""What every long-running component's command shares: flags, logging, signals, connections.

The source, the worker and the actuator are separate processes (`preemptctl
source|worker|actuator`) with the same operational surface: the Kafka
connection flags (streams.kafka.connection),
`--kubeconfig/--context`, `--log-level`, `--log-format`, `--no-create-topics`, the health
flags (streams.common.health), SIGTERM/SIGINT for a clean stop, and waiting for a
broker that starts after them instead of crash-looping.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable

from aiokafka.errors import KafkaError
from kubernetes_asyncio import client
from kubernetes_asyncio.config import ConfigException

from streams.common import health, logs
from streams.common.backoff import Backoff
from streams.common.errors import UsageError
from streams.kafka import connection, topics
from streams.kube import api, lease

log = logging.getLogger(__name__)


def add_kubernetes_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig", metavar="F", help="kubeconfig file (default: in-cluster, else $KUBECONFIG/~/.kube)"
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")


def add_lease_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """--lease-name/--lease-namespace/--identity and the Lease timings: only the holder may `what`."""
    parser.add_argument("--lease-name", metavar="N", help=f"hold this Lease to {what}")
    parser.add_argument("--lease-namespace", metavar="NS", help="namespace of the Lease")
    parser.add_argument(
        "--identity", metavar="ID", help="this process's Lease identity (default: $POD_NAME, else hostname)"
    )
    parser.add_argument(
        "--lease-duration",
        type=int,
        default=round(lease.LEASE_DURATION_S),
        metavar="S",
        help="whole seconds a holder's claim lasts unrenewed: the failover time after a holder dies "
        f"(default {lease.LEASE_DURATION_S:g}; the Lease records whole seconds)",
    )
    parser.add_argument(
        "--renew-deadline",
        type=float,
        default=lease.RENEW_DEADLINE_S,
        metavar="S",
        help="a holder that could not renew for S seconds stops writing; below --lease-duration and "
        f"above the {api.WRITE_TIMEOUT_S:g} s write timeout (default {lease.RENEW_DEADLINE_S:g})",
    )
    parser.add_argument(
        "--retry-period",
        type=float,
        default=lease.RETRY_PERIOD_S,
        metavar="S",
        help=f"seconds between renewals and between tries to take the Lease; below --renew-deadline "
        f"(default {lease.RETRY_PERIOD_S:g})",
    )


def check_lease_arguments(args: argparse.Namespace) -> None:
    """Refuse Lease flags that pair up wrongly or time out of order, in one line each (exit 2)."""
    if bool(args.lease_name) != bool(args.lease_namespace):
        raise UsageError("--lease-name and --lease-namespace go together")
    try:
        lease.check_timings(
            lease_duration_s=args.lease_duration,
            renew_deadline_s=args.renew_deadline,
            retry_period_s=args.retry_period,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def identity(args: argparse.Namespace) -> str:
    return str(args.identity or os.environ.get("POD_NAME") or socket.gethostname())


def elector(
    args: argparse.Namespace, api_client: client.ApiClient, state: health.Health
) -> lease.LeaseElector | None:
    """The LeaseElector the flags ask for, if any, its loop already a /livez check of `state`.

    Registered here, not by each command: a Lease loop that died or stopped making rounds
    leaves a process that never leads again, and only a red /livez gets it restarted.
    """
    if not args.lease_name:
        return None
    elected = lease.LeaseElector(
        api_client,
        name=args.lease_name,
        namespace=args.lease_namespace,
        identity=identity(args),
        component=state.component,
        lease_duration_s=args.lease_duration,
        renew_deadline_s=args.renew_deadline,
        retry_period_s=args.retry_period,
    )
    state.add_liveness("lease", elected.liveness)
    return elected


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-create-topics",
        action="store_true",
        help="do not create missing topics at start (the operator made them; no Create ACL)",
    )
    topics.add_arguments(parser)
    health.add_arguments(parser)
    logs.add_arguments(parser)


def kafka_of(args: argparse.Namespace) -> connection.KafkaConfig:
    """The Kafka the connection flags name (streams.kafka.connection); UsageError when they are wrong."""
    return connection.from_args(args)


def configure_logging(args: argparse.Namespace, *, component: str) -> None:
    """Logs to stderr (stdout is for data: docs/architecture.md §5) as `--log-format`, `--log-level` say."""
    logs.configure(component=component, level=args.log_level, fmt=args.log_format)


async def connect(args: argparse.Namespace) -> client.ApiClient:
    """The ApiClient for `--kubeconfig/--context`; a config that cannot be loaded is a usage error."""
    try:
        return await api.connect(args.kubeconfig, context=args.context)
    except (OSError, ConfigException) as exc:
        raise UsageError(f"cannot load Kubernetes config: {exc}") from exc


def stop_on_signals(stop: Callable[[], None]) -> None:
    """SIGTERM (a kubelet or compose stopping the container) and Ctrl-C end the work in hand cleanly."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


def layout_of(args: argparse.Namespace) -> topics.Layout:
    """The topic names and creation settings the topic flags name; UsageError when they are wrong."""
    return topics.from_args(args)


async def prepare_broker(
    kafka: connection.KafkaConfig, *, create_topics: bool, layout: topics.Layout = topics.DEFAULT_LAYOUT
) -> None:
    """Reach Kafka and create missing topics, retrying with backoff while it does not answer.

    Kafka often starts after (or restarts beside) its clients, and a credential may
    reach the broker moments after the Secret that holds it: waiting here keeps the
    process live and unready instead of crash-looping, and each wait says why in one line.
    """
    backoff = Backoff()
    while True:
        try:
            await connection.reach(kafka)
            if create_topics:
                await topics.ensure_topics(kafka, layout.specs())
            return
        except (KafkaError, OSError, connection.BrokerUnavailable) as exc:
            delay = backoff.delay()
            log.warning("%s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)

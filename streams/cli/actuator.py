"""`preemptctl actuator`: its flags, and the process around streams.kube.actuator's `Actuator`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from pathlib import Path

from schemas import records
from schemas.names import dns_label
from streams.common import health, options, signing
from streams.common.errors import UsageError
from streams.kafka import acls, connection, lag
from streams.kafka import topics as topics_mod
from streams.kafka.sink import KafkaSink
from streams.kube import actuator as actuator_mod
from streams.kube import component, eviction
from streams.kube.actuator import Actuator, Freshness, Topics
from streams.kube.ledger import Ledger
from streams.kube.preemptor_events import PreemptorEvents

# The actuator's own logger: what the command says of its set-up reads as the actuator's lines.
log = logging.getLogger(actuator_mod.__name__)

HELP = "act on preemption decisions (evict, delete or label victims)"
# The scheduler profile docs/deploy.md sets up (DefaultPreemption disabled) and the chart's
# source.schedulerName: a hand-run actuator acts for the same pods as the chart's unless told.
DEFAULT_SCHEDULER_PROFILE = "preemptctl-scheduler"

EXAMPLES = """examples:
  preemptctl actuator --bootstrap-server kafka:9092 --hmac-keys-dir /etc/preemptctl/signing \\
      --lease-name preemptctl-actuator --lease-namespace preemptctl --identity "$POD_NAME"
  preemptctl actuator --bootstrap-server kafka:9092 --scheduler-name batch-scheduler
  preemptctl actuator --bootstrap-server kafka:9092 --any-scheduler --accept-unsigned --dry-run
  preemptctl actuator --bootstrap-server kafka:9093 --kafka-config client.properties --dry-run
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "actuator",
        help=HELP,
        description="Consume preemption.decisions, nominate each preemptor, act on its victims and "
        "write one outcome per victim to preemption.evictions.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    connection.add_arguments(parser)
    component.add_kubernetes_arguments(parser)
    parser.add_argument(
        "--cluster", default=records.DEFAULT_CLUSTER, metavar="NAME", help="act on this cluster's decisions"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="send dryRun=All on every write; change nothing"
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--scheduler-name",
        action="append",
        default=[],
        metavar="NAME",
        help="act only for preemptors of this scheduler (repeatable; the source's --scheduler-name): "
        "any other decision is refused, no victim touched (default: "
        f"{DEFAULT_SCHEDULER_PROFILE}, the profile docs/deploy.md sets up and the chart scopes to)",
    )
    scope.add_argument(
        "--any-scheduler",
        action="store_true",
        help="act for every scheduler's preemptors (the source runs without --scheduler-name): "
        "kube-scheduler's own DefaultPreemption may then preempt for the same pods",
    )
    parser.add_argument(
        "--protected-namespaces",
        type=_namespaces,
        default=actuator_mod.DEFAULT_PROTECTED_NAMESPACES,
        metavar="NS[,NS...]",
        help="never take a victim in these namespaces: a decision naming one is refused whole, no "
        f"victim touched ('' for none; default {','.join(actuator_mod.DEFAULT_PROTECTED_NAMESPACES)})",
    )
    parser.add_argument(
        "--max-victims",
        type=_positive,
        default=actuator_mod.DEFAULT_MAX_VICTIMS,
        metavar="N",
        help=f"refuse a decision naming more victims than this (default {actuator_mod.DEFAULT_MAX_VICTIMS})",
    )
    parser.add_argument(
        "--max-decision-age",
        type=_seconds,
        default=actuator_mod.DEFAULT_MAX_DECISION_AGE_S,
        metavar="SECONDS",
        help="refuse a preempt decision whose own ts is older than this against this host's clock, "
        f"no victim touched (0: no bound; default {actuator_mod.DEFAULT_MAX_DECISION_AGE_S:g})",
    )
    parser.add_argument(
        "--fetch-max-wait-ms",
        type=_fetch_wait,
        default=actuator_mod.FETCH_MAX_WAIT_MS,
        metavar="MS",
        help="how long the broker may hold a fetch for decisions not there yet (default "
        f"{actuator_mod.FETCH_MAX_WAIT_MS}: the embedded tansu answers only when it runs out; "
        "Apache Kafka answers as soon as a decision arrives, so 500 there costs no latency and less "
        "idle CPU)",
    )
    signing.add_verification_arguments(
        parser, what="refuse (dead-letter) decisions not signed by an accepted key"
    )
    parser.add_argument(
        "--accept-unsigned",
        action="store_true",
        help="without signing keys, act on unsigned decisions (anyone who can write the decisions "
        "topic then chooses what is evicted); without keys and without this flag the actuator "
        "does not start",
    )
    component.add_lease_arguments(parser, what="act (when several actuators run)")
    parser.add_argument(
        "--ledger-file",
        metavar="F",
        help="JSON-lines ledger kept across restarts (default: none; the evictions topic is read back)",
    )
    parser.add_argument(
        "--group-id", metavar="G", help="consumer group (default preemptctl-actuator-CLUSTER)"
    )
    component.add_runtime_arguments(parser)
    lag.add_arguments(parser)  # the worker's lag, measured from outside the worker
    parser.set_defaults(func=cmd_actuator)


def _namespaces(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    bad = [n for n in names if not dns_label(n)]
    if bad:
        raise argparse.ArgumentTypeError(f"not a namespace name: {bad[0][:80]!r}")
    return names


_seconds = options.bounded(float, least=0, what="a number of seconds, at least 0")
_positive = options.bounded(int, least=1, what="a whole number of at least 1")


def cmd_actuator(args: argparse.Namespace) -> int:
    component.configure_logging(args, component="actuator")
    kafka = component.kafka_of(args)
    layout = component.layout_of(args)
    keys = signing.keyring_from_args(args)
    component.check_lease_arguments(args)
    if keys is None and not args.accept_unsigned:
        raise UsageError(
            "no signing keys: pass --signing-keys-dir (Ed25519 public keys) or, in the HMAC "
            "compatibility mode, --hmac-keys-dir; or --accept-unsigned to act on unsigned decisions"
        )
    if keys is None:
        log.warning(
            "accepting UNSIGNED decisions (--accept-unsigned): whoever can write %s chooses what is evicted",
            layout.names.decisions,
        )
    elif keys.mode == "hmac":
        log.warning(
            "HMAC compatibility mode: every holder of the key can sign decisions; Ed25519 keys "
            "(--signing-keys-dir) let only the worker sign"
        )
    if args.any_scheduler:
        log.warning(
            "acting for EVERY scheduler's preemptors (--any-scheduler): kube-scheduler's own "
            "DefaultPreemption may preempt for the same pods (docs/deploy.md)"
        )
    else:
        log.info("acting only for preemptors of scheduler %s", ", ".join(scope_of(args) or ()))
    asyncio.run(_serve(args, kafka, keys, layout))
    return 0


_fetch_wait = options.bounded(
    int,
    least=0,
    most=actuator_mod.MAX_FETCH_MAX_WAIT_MS,
    what=f"a whole number of milliseconds from 0 to {actuator_mod.MAX_FETCH_MAX_WAIT_MS}",
)


def scope_of(args: argparse.Namespace) -> tuple[str, ...] | None:
    """The schedulers whose preemptors the actuator acts for; None for every scheduler."""
    if args.any_scheduler:
        return None
    return tuple(sorted(set(args.scheduler_name or [DEFAULT_SCHEDULER_PROFILE])))


async def _serve(
    args: argparse.Namespace,
    kafka: connection.KafkaConfig,
    keys: signing.Keyring | None,
    layout: topics_mod.Layout,
) -> None:
    identity = component.identity(args)
    group_id = args.group_id or acls.default_actuator_group(args.cluster, dry_run=args.dry_run)
    api = await component.connect(args)
    state = health.Health("actuator")
    try:
        ledger = Ledger(Path(args.ledger_file) if args.ledger_file else None)
    except OSError as exc:
        await api.close()
        raise UsageError(f"cannot open --ledger-file: {exc}") from exc
    elector = None
    if args.lease_name and not args.dry_run:
        elector = component.elector(args, api, state)
    elif args.lease_name:
        log.info("dry run: not taking part in leader election (dry-run writes change nothing)")
    actions = eviction.Actions(
        api, dry_run=args.dry_run, identity=identity, guard=elector.check if elector else lambda: None
    )
    try:
        async with health.HealthServer(state, host=args.health_host, port=args.health_port):
            await component.prepare_broker(kafka, create_topics=not args.no_create_topics, layout=layout)
            async with KafkaSink(kafka, client_id=f"preemptctl-actuator-{identity}") as sink:
                announcer = PreemptorEvents(
                    api,
                    identity=identity,
                    dry_run=args.dry_run,
                    guard=elector.check if elector else lambda: None,
                )
                actuator = Actuator(
                    actions,
                    sink,
                    ledger,
                    cluster=args.cluster,
                    keys=keys,
                    elector=elector,
                    scope=scope_of(args),
                    topics=Topics.of(layout.names),
                    preemptor_events=announcer,
                    protected_namespaces=args.protected_namespaces,
                    max_victims=args.max_victims,
                    freshness=Freshness(max_age_s=args.max_decision_age or None),
                    fetch_max_wait_ms=args.fetch_max_wait_ms,
                )
                actuator.health = state
                await actuator_mod.warn_nested_prefixes(kafka, layout.names.prefix)
                lagging = lag.start(kafka, args, topic=layout.names.cluster_events)
                try:
                    await actuator_mod.serve(actuator, state, kafka, group_id=group_id, elector=elector)
                finally:
                    if lagging is not None:
                        lagging.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await lagging
    finally:
        ledger.close()
        await api.close()

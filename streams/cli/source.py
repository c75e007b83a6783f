"""`preemptctl source`: its flags, and the process around streams.kube.source's `Source`."""

from __future__ import annotations

import argparse
import asyncio

from schemas import records
from streams.common import health, options
from streams.common.errors import UsageError
from streams.kafka import connection, topics
from streams.kafka.sink import KafkaSink
from streams.kube import component, source

HELP = "list+watch a Kubernetes cluster into preemption.cluster-events"
EXAMPLES = """examples:
  preemptctl source --bootstrap-server kafka:9092
  preemptctl source --bootstrap-server kafka:9092 --kubeconfig ~/.kube/config --cluster prod-eu1
  preemptctl source --bootstrap-server kafka-0.kafka:9093 --kafka-config /etc/preemptctl/client.properties
  preemptctl source --bootstrap-server kafka:9092 --namespace team-a --namespace team-b \\
      --scheduler-name batch-scheduler          beside kube-scheduler: only batch-scheduler's pending pods
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "source",
        help=HELP,
        description="Watch Pods, Nodes, PriorityClasses, Namespaces, PodDisruptionBudgets and "
        "ElasticQuotas and write their events, batched, to the cluster-events topic.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    connection.add_arguments(parser)
    component.add_kubernetes_arguments(parser)
    parser.add_argument(
        "--cluster",
        default=records.DEFAULT_CLUSTER,
        metavar="NAME",
        help="cluster name: the record key (default)",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch namespaced kinds only here (repeatable or comma-separated; default all)",
    )
    parser.add_argument("--label-selector", metavar="S", help="server-side label selector for pods")
    parser.add_argument(
        "--scheduler-name",
        metavar="NAME",
        help="decide only for this scheduler's pods (recorded in the log for the worker); leave out "
        "pending pods of other schedulers (bound and nominated pods are always written)",
    )
    component.add_lease_arguments(parser, what="write the cluster's log (one source per cluster)")
    parser.add_argument(
        "--tick-seconds",
        type=_positive_float,
        default=source.DEFAULT_TICK_SECONDS,
        metavar="N",
        help=f"write a TICK every N seconds (default {source.DEFAULT_TICK_SECONDS:g})",
    )
    component.add_runtime_arguments(parser)
    parser.set_defaults(func=cmd_source)


_positive_float = options.bounded(float, least=0, above=True, what="a number above 0")


def cmd_source(args: argparse.Namespace) -> int:
    component.configure_logging(args, component="source")
    problem = records.cluster_problem(args.cluster)  # the worker would dead-letter every record
    if problem:
        raise UsageError(f"--cluster: {problem}")
    kafka = component.kafka_of(args)
    component.check_lease_arguments(args)
    namespaces = tuple(
        dict.fromkeys(ns.strip() for arg in args.namespace for ns in arg.split(",") if ns.strip())
    )
    scope = source.Scope(
        cluster=args.cluster,
        namespaces=namespaces,
        label_selector=args.label_selector,
        scheduler_name=args.scheduler_name,
    )
    layout = component.layout_of(args)
    asyncio.run(_serve(args, kafka, scope, layout))
    return 0


async def _serve(
    args: argparse.Namespace, kafka: connection.KafkaConfig, scope: source.Scope, layout: topics.Layout
) -> None:
    api = await component.connect(args)
    state = health.Health("source")
    try:
        async with health.HealthServer(state, host=args.health_host, port=args.health_port):
            await component.prepare_broker(kafka, create_topics=not args.no_create_topics, layout=layout)
            async with KafkaSink(kafka, client_id=f"preemptctl-source-{scope.cluster}") as sink:
                elector = component.elector(args, api, state)
                src = source.Source(
                    api,
                    sink,
                    scope=scope,
                    tick_seconds=args.tick_seconds,
                    health_state=state,
                    elector=elector,
                    topic=layout.names.cluster_events,
                )
                component.stop_on_signals(src.stop)
                await src.run()
    finally:
        await api.close()

"""What the worker believes, over HTTP: partitions and each cluster's tables.

Read-only JSON views of the in-memory state (what the next decision reads),
for an operator comparing the worker's view with the cluster's. They are the
whole inventory of every cluster the worker folds, so they are off unless
`--tables-port` is given, and then served on that port alone, bound to
127.0.0.1 (`--tables-host`): `kubectl port-forward pod/<worker> 9103` reaches
them, the metrics port (which Prometheus and the NetworkPolicy open) never does.

    GET /partitions                          position, committed offset, latest snapshot, clusters
    GET /clusters/{cluster}/nodes            per node: allocatable, used, free, bound pods, taints
    GET /clusters/{cluster}/pods             ?node= ?namespace= ?limit= (default DEFAULT_LIMIT)
    GET /clusters/{cluster}/nominations      live nominations and victims marked leaving

Quantities are the engine's integers (cpu in millicores, memory in bytes); times
are RFC 3339. An unknown cluster answers 404.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from engine import timeutil
from engine.objects import Pod
from fold.controller import Controller
from streams.common.health import Route
from streams.pipeline.partitions import Partitions

# Pods listed per request unless ?limit= says otherwise: a 150,000-pod cluster's
# full list is ~40 MB of JSON, too much for a glance.
DEFAULT_LIMIT = 1000


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


def _pod(pod: Pod) -> dict[str, Any]:
    return {
        "uid": pod.uid,
        "namespace": pod.namespace,
        "name": pod.name,
        "node": pod.node,
        "nominatedNode": pod.nominated,
        "priority": pod.priority,
        "requests": pod.requests,
        "unschedulable": pod.unschedulable,
        "deleting": pod.deleting,
        "terminal": pod.terminal,
        "resourceVersion": pod.resource_version,
    }


def routes(partitions: Partitions) -> list[Route]:
    def controller(request: web.Request) -> Controller:
        name = request.match_info["cluster"]
        for worker in partitions.workers.values():
            ctl = worker.controllers.get(name)
            if ctl is not None:
                return ctl
        raise web.HTTPNotFound(text=f"cluster {name!r} is not folded by this worker\n")

    async def list_partitions(request: web.Request) -> web.Response:
        rows = []
        for p, worker in sorted(partitions.workers.items()):
            rows.append(
                {
                    "partition": p,
                    "position": worker.position,
                    "committed": worker.committed,
                    "stored": worker.stored,
                    "snapshot": None if worker.manifest is None else worker.manifest.position,
                    "eventsSinceSnapshot": worker.since_snapshot,
                    "clusters": {
                        name: {
                            "seq": ctl.seq,
                            "decisions": ctl.decisions,
                            "lastDecision": ctl.last_id or None,
                        }
                        for name, ctl in sorted(worker.controllers.items())
                    },
                }
            )
        return _json({"partitions": rows, "opening": sorted(partitions.opening)})

    async def nodes(request: web.Request) -> web.Response:
        cluster = controller(request).cluster
        rows = []
        for name in sorted(cluster.nodes):
            state = cluster.nodes[name]
            rows.append(
                {
                    "name": name,
                    "unschedulable": state.node.unschedulable,
                    "taints": [
                        {"key": t.key, "value": t.value, "effect": t.effect} for t in state.node.taints
                    ],
                    "allocatable": state.node.allocatable,
                    "used": state.used,
                    "free": cluster.free(state),
                    "pods": sorted(p.key for p in state.pods.values()),
                    "nominated": sorted(p.key for p in cluster.nominated_on(name).values()),
                }
            )
        return _json({"nodes": rows})

    async def pods(request: web.Request) -> web.Response:
        cluster = controller(request).cluster
        node = request.query.get("node")
        namespace = request.query.get("namespace")
        try:
            limit = int(request.query.get("limit", DEFAULT_LIMIT))
        except ValueError:
            raise web.HTTPBadRequest(text="limit must be an integer\n") from None
        selected = sorted(
            (
                p
                for p in cluster.pods.values()
                if (node is None or p.node == node) and (namespace is None or p.namespace == namespace)
            ),
            key=lambda p: (p.namespace, p.name, p.uid),
        )
        return _json({"pods": [_pod(p) for p in selected[:limit]], "total": len(selected)})

    async def nominations(request: web.Request) -> web.Response:
        ctl = controller(request)
        return _json(
            {
                "nominations": {
                    uid: {
                        "node": n.node,
                        "decisionId": n.decision_id,
                        "since": timeutil.render(n.since),
                        "expires": timeutil.render(n.expires),
                    }
                    for uid, n in sorted(ctl.nominations.items())
                },
                "leaving": {uid: timeutil.render(t) for uid, t in sorted(ctl.leaving.items())},
            }
        )

    return [
        ("/partitions", list_partitions),
        ("/clusters/{cluster}/nodes", nodes),
        ("/clusters/{cluster}/pods", pods),
        ("/clusters/{cluster}/nominations", nominations),
    ]

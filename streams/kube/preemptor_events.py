"""The Event on the pending preemptor: what preemptctl decided about it, where `kubectl describe pod` looks.

kube-scheduler writes its scheduling failures on the pod itself (events.k8s.io/v1:
reason FailedScheduling, action Scheduling, type Warning, a note such as "0/3 nodes
are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: ...");
preemptctl, which takes over the preemption part, writes its answer the same way,
one Event per decision about the pod:
- `preempt`: type Normal, reason Preempting, related to the chosen Node, note
  "preempting N pod(s) on node X: ns/a, ns/b" (a job: on each member, with its node);
- `wait`: type Normal, reason Preempting: the victims of an earlier decision are
  still leaving the nominated node;
- `unschedulable`: type Warning, reason FailedScheduling, note
  "preemption: 0/N nodes are available: <count> <reason>, ..." from the record's
  explanation.
(`fits` needs no Event: kube-scheduler binds the pod.) Every Event names its decision in
its note and in the DECISION_ANNOTATION annotation, and its name is derived from
(decision, pod), so a redelivered decision posts nothing new (409 is success).

Rate-limited, because a pod that stays pending is decided for again and again:
- the same Event (pod, reason, note) again within SAME_EVENT_WINDOW_S is not
  posted (counted as `repeated`); client-go's event recorder folds such repeats
  into one Event the same way;
- at most EVENTS_BURST Events at once and EVENTS_PER_S after that, over all pods
  (a token bucket; the rest are counted as `rate-limited`), so a burst of
  unschedulable decisions cannot flood the API server with Events.
An Event is best effort: one attempt, with the write timeout; a failure is
logged and counted and never holds up the decision.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import Counter

from schemas.records import DecisionRecord
from streams.common import logs
from streams.kube import api as kube
from streams.kube import eviction

log = logging.getLogger(__name__)

ACTION = "Preempting"
REASON_PREEMPTING = "Preempting"
# kube-scheduler's reason for a pod it cannot place: tools and people already look for it.
REASON_FAILED = "FailedScheduling"
# Identical Events closer than this are one (client-go's events library keeps a series this long).
SAME_EVENT_WINDOW_S = 360.0
# The token bucket over all Events: a burst of unschedulable decisions (a new cluster, a big
# job) posts at most EVENTS_BURST at once, then EVENTS_PER_S; the API server's Event storage
# (etcd, a one-hour TTL) is shared with everything else in the cluster.
EVENTS_BURST = 25
EVENTS_PER_S = 5.0
# How many Events (pod, reason, note) the repeat filter remembers: bounded memory, oldest first out.
REMEMBERED_EVENTS = 10_000
# A job decision posts on at most this many members (a gang of thousands would be thousands of
# writes for one decision); the note of each says how many members there are.
JOB_MEMBERS_LIMIT = 16
# How many victims a note names before "and N more" (the note is capped at 1 kB anyway).
NAMED_VICTIMS = 5

PREEMPTOR_EVENTS = Counter(
    "preemptctl_actuator_preemptor_events_total",
    "Events on pending preemptors, by decision outcome and result (posted, repeated, rate-limited, failed).",
    ["outcome", "result"],
)


@dataclass(frozen=True)
class PodEvent:
    """One Event to post on one pod."""

    namespace: str
    name: str
    uid: str
    type: str
    reason: str
    note: str
    node: str = ""


class TokenBucket:
    """`take()` is True while tokens are left; they refill at `rate` per second up to `burst`."""

    def __init__(self, *, burst: int, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst, self._rate, self._clock = float(burst), rate, clock
        self._tokens, self._at = float(burst), clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def events_for(decision: Mapping[str, Any]) -> Iterator[PodEvent]:
    """The Events a decision calls for, one per pod it is about (none for `fits`)."""
    outcome = decision.get("outcome")
    if outcome not in ("preempt", "wait", "unschedulable"):
        return
    decision_id = str(decision.get("id", ""))
    tail = f" (preemptctl decision {decision_id})"
    if outcome == "unschedulable":
        kind, reason, note = "Warning", REASON_FAILED, _unschedulable_note(decision)
    elif outcome == "wait":
        kind, reason, note = "Normal", REASON_PREEMPTING, f"waiting: {decision.get('reason', '')}"
    else:
        kind, reason, note = "Normal", REASON_PREEMPTING, _preempt_note(decision)
    placements: Mapping[str, str] = decision.get("placements") or {}
    if decision.get("flow") == "job":
        members = sorted(placements) or [
            str(m) for m in (decision.get("explanation") or {}).get("members", [])
        ]
        for member in members[:JOB_MEMBERS_LIMIT]:
            namespace, _, name = member.partition("/")
            if not name:
                continue
            node = placements.get(member, "")
            where = f"; this member on node {node}" if node else ""
            job = f"job {decision.get('preemptor', '')} ({len(members)} member(s)): "
            yield PodEvent(
                namespace, name, "", kind, reason, eviction.truncate(job + note + where + tail), node
            )
        return
    namespace, _, name = str(decision.get("preemptor", "")).partition("/")
    if name:
        uid = str(decision.get("preemptorUid") or "")
        yield PodEvent(
            namespace,
            name,
            uid,
            kind,
            reason,
            eviction.truncate(note + tail),
            str(decision.get("node") or ""),
        )


def _preempt_note(decision: Mapping[str, Any]) -> str:
    victims = list(decision.get("victims") or [])
    fresh = [f"{v['namespace']}/{v['name']}" for v in victims if not v.get("terminating")]
    leaving = len(victims) - len(fresh)
    nodes = decision.get("node") or ", ".join(sorted(set((decision.get("placements") or {}).values())))
    named = ", ".join(fresh[:NAMED_VICTIMS]) + (
        f" and {len(fresh) - NAMED_VICTIMS} more" if len(fresh) > NAMED_VICTIMS else ""
    )
    note = f"preempting {len(fresh)} pod(s) on node {nodes}" + (f": {named}" if fresh else "")
    if leaving:
        note += f" ({leaving} already leaving)"
    return note


def _unschedulable_note(decision: Mapping[str, Any]) -> str:
    explanation: Mapping[str, Any] = decision.get("explanation") or {}
    reasons: Mapping[str, int] = explanation.get("rejectedReasons") or {}
    if not reasons:
        return f"preemption: {decision.get('reason', '')}."
    total = int(explanation.get("rejectedCount") or 0) + int(explanation.get("candidateCount") or 0)
    counted = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"preemption: 0/{total} nodes are available: " + ", ".join(f"{n} {r}" for r, n in counted) + "."


def event_body(event: PodEvent, *, decision_id: str, identity: str, now: str) -> dict[str, Any]:
    """The events.k8s.io/v1 Event, shaped as kube-scheduler's (see the module docstring)."""
    digest = hashlib.sha256(f"{decision_id}\x00{event.namespace}/{event.name}".encode()).hexdigest()[:16]
    regarding: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": event.namespace,
        "name": event.name,
    }
    if event.uid:
        regarding["uid"] = event.uid
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {
            "name": f"{event.name[: 253 - len(digest) - 1].rstrip('-.')}.{digest}",
            "namespace": event.namespace,
            "annotations": {eviction.DECISION_ANNOTATION: decision_id},
        },
        "eventTime": now,
        "reportingController": eviction.COMPONENT,
        "reportingInstance": identity[-eviction.REPORTING_INSTANCE_LIMIT :],
        "action": ACTION,
        "reason": event.reason,
        "type": event.type,
        "note": event.note,
        "regarding": regarding,
    }
    if event.node:
        body["related"] = {"apiVersion": "v1", "kind": "Node", "name": event.node}
    return body


class PreemptorEvents:
    """Posts the Events of each decision on its pending preemptor(s), rate-limited (module docstring)."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        identity: str = eviction.COMPONENT,
        dry_run: bool = False,
        guard: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        bucket: TokenBucket | None = None,
    ) -> None:
        self._events = client.EventsV1Api(api)
        self._identity = identity
        self._dry_run = dry_run
        self._guard = guard
        self._clock = clock
        self._bucket = bucket or TokenBucket(burst=EVENTS_BURST, rate=EVENTS_PER_S, clock=clock)
        self._recent: OrderedDict[tuple[str, str, str, str], float] = OrderedDict()

    async def post(self, decision: DecisionRecord | Mapping[str, Any]) -> list[str]:
        """Post the decision's Events; returns each one's result (posted, repeated, rate-limited, failed)."""
        results = []
        for event in events_for(decision):
            result = await self._post_one(event, decision)
            PREEMPTOR_EVENTS.labels(str(decision.get("outcome")), result).inc()
            results.append(result)
        return results

    def _repeated(self, event: PodEvent) -> bool:
        key = (event.namespace, event.name, event.reason, _without_decision(event.note))
        now = self._clock()
        seen = self._recent.get(key)
        if seen is not None and now - seen < SAME_EVENT_WINDOW_S:
            return True
        self._recent[key] = now
        self._recent.move_to_end(key)
        while len(self._recent) > REMEMBERED_EVENTS:
            self._recent.popitem(last=False)
        return False

    async def _post_one(self, event: PodEvent, decision: Mapping[str, Any]) -> str:
        if self._repeated(event):
            return "repeated"
        if not self._bucket.take():
            return "rate-limited"
        decision_id = str(decision.get("id", ""))
        body: Any = event_body(
            event, decision_id=decision_id, identity=self._identity, now=kube.micro_time(kube.now())
        )
        options: dict[str, Any] = {"_request_timeout": kube.write_timeout()}
        if self._dry_run:
            options["dry_run"] = "All"
        self._guard()  # NotLeader propagates: a deposed actuator writes nothing, Events included
        pod = f"{event.namespace}/{event.name}"
        try:
            with kube.checked_when_sent(self._guard):  # again as it is sent (api.checked_when_sent)
                await self._events.create_namespaced_event(event.namespace, body, **options)
        except ApiException as exc:
            if exc.status == 409:  # posted before a redelivery or a restart
                return "posted"
            log.warning(
                "Event on preemptor %s/%s failed: %s %s", event.namespace, event.name, exc.status, exc.reason,
                extra=logs.decision_fields(decision, pod=pod),
            )  # fmt: skip
            return "failed"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning(
                "Event on preemptor %s/%s failed: %s", event.namespace, event.name, exc,
                extra=logs.decision_fields(decision, pod=pod),
            )  # fmt: skip
            return "failed"
        return "posted"


def _without_decision(note: str) -> str:
    """The note without its decision id: two decisions that say the same thing are one repeat."""
    return note.rsplit(" (preemptctl decision ", 1)[0]

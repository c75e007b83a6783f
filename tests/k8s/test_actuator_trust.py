"""Issue 29: the actuator believes no decision the live objects contradict, whatever reaches Kafka.

Every decision here is signed with the accepted key, as the worker would sign a decision derived
from forged cluster events (or as a buggy worker would write it): signing is not what stops
these. The actuator checks what it reads anyway, before any write:
- the live preemptor (each job member) exists with the decision's uid, unbound, in scope, and may
  preempt (`preemptionPolicy` not `Never`; a DaemonSet-flow preemptor is a DaemonSet's pod);
- each victim it would write to is, live, below the preemptor's priority (the DaemonSet flow: at
  most equal) and on one of the decision's nodes;
- no victim is in a protected namespace, the decision names no more victims than the cap, a
  `preempt` says where the preemptor goes, a gang names every member's uid.
One failing refuses the whole decision: no pod is written to, and the OUTCOME says why.
Records the actuator cannot rely on (schema, types, names) are dead-lettered; anything a record
makes it raise is dead-lettered too, and the loop goes on.
The fake API stages what a real API server will not (a pod renamed `..`, any priority).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
from collections.abc import Iterator
from typing import Any, cast

import kmock
import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client

from schemas import chain, decisions, validate
from schemas.records import VictimRecord
from streams.cli import actuator as actuator_cli
from streams.kafka.deadletter import Origin
from streams.kafka.sink import MemorySink
from streams.kube import actuator, api, eviction
from streams.kube.actuator import Actuator
from streams.kube.ledger import Ledger
from tests.k8s import objects
from tests.k8s.decisions import (
    FAST,
    KEY,
    ORIGIN,
    SCHEDULER,
    OneBatchConsumer,
    Pods,
    cluster,
    decision,
    outcome_events,
    outcomes,
    pod_writes,
    victim,
)
from tests.k8s.fakeapi import FakeApi


def make(api_client: client.ApiClient, **options: Any) -> tuple[Actuator, MemorySink]:
    sink = MemorySink()
    actions = eviction.Actions(api_client, identity="test", retry=FAST)
    return Actuator(actions, sink, Ledger(), hmac_key=KEY, scope=(SCHEDULER,), **options), sink


def pod_calls(fake: FakeApi) -> list[tuple[str, str | None]]:
    return [(c.method, c.name) for c in fake.calls if c.plural == "pods"]


def gang(pods: Pods, victims: list[VictimRecord], **fields: Any) -> dict[str, Any]:
    """A job decision placing w-0 and w-1 on n1, signed (memberUids unless given otherwise)."""
    record: dict[str, Any] = {
        "flow": "job",
        "preemptorUid": pods["w-0"]["metadata"]["uid"],
        "placements": {"default/w-0": "n1", "default/w-1": "n1"},
        "memberUids": {f"default/{m}": pods[m]["metadata"]["uid"] for m in ("w-0", "w-1")},
        "explanation": {"members": ["default/w-0", "default/w-1"]},
        **fields,
    }
    sealed = decision(pods["high"], victims, decision_id="default/77/w-0-uid", **record)
    sealed["preemptor"] = "default/train"  # namespace/pod-group
    sealed.pop("node", None)
    for name, value in fields.items():
        if value is None:
            sealed.pop(name, None)
    return chain.seal(sealed, chain.GENESIS, KEY)


async def refused(
    fake: FakeApi, act: Actuator, sink: MemorySink, record: dict[str, Any], *, said: str
) -> dict[str, Any]:
    """Handle `record`; it must be refused whole with `said` in the reason, nothing written to a
    pod. Returns the OUTCOME."""
    await act.handle(orjson.dumps(record), key=b"default", origin=ORIGIN)
    assert pod_writes(fake) == []
    found = outcomes(sink)
    assert set(found) == {v["name"] for v in record["victims"]}
    for outcome in found.values():
        assert outcome["result"] == "error" and said in outcome["message"], outcome
        assert outcome["message"].endswith(eviction.UNTOUCHED)
    (event,) = outcome_events(sink)
    assert said in event["outcome"]["message"]
    assert set(event["outcome"]["victims"].values()) == {"error"}
    assert not sink.on("preemption.dead-letter")
    return cast(dict[str, Any], event["outcome"])


# ---- the live preemptor and its victims ------------------------------------------------------


async def test_a_forged_priority_cannot_take_a_pod_above_the_live_preemptor(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """Issue 29, 2: a forged MODIFIED event raised a pending pod's priority in the worker's view;
    coredns was deleted. The live preemptor (1000) may not take coredns (2e9), nor a pod above
    it, nor one of its own priority: the whole decision is refused, the other victims kept."""
    fake, api_client = served
    pods = cluster(fake)
    for target in ("coredns", "above", "equal"):
        fake.calls.clear()
        act, sink = make(api_client, protected_namespaces=())
        victims = [victim(pods["v-delete"], "delete"), victim(pods[target], "delete")]
        record = decision(pods["high"], victims, decision_id=f"default/1/{target}")
        outcome = await refused(fake, act, sink, record, said="not below the preemptor's 1000")
        assert outcome["nomination"] == "error"
        assert target in outcome["message"]
    assert fake.get("pods", "kube-system", "coredns")["metadata"].get("deletionTimestamp") is None  # type: ignore[index]


async def test_victims_must_be_on_the_decisions_node(served: tuple[FakeApi, client.ApiClient]) -> None:
    """Issue 29, 2: a decision naming victims really on another node deleted them."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    elsewhere = victim(pods["elsewhere"], "evict")  # the record says n1; the pod is on n2
    record = decision(pods["high"], [victim(pods["v-evict"], "evict"), elsewhere])
    await refused(fake, act, sink, record, said="default/elsewhere is on node n2, not on n1")


async def test_a_preempt_without_node_or_placements_is_refused_unread(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """Issue 29, 2: a `preempt` with neither `node` nor `placements` deleted its victims, no
    nomination at all."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    record = decision(pods["high"], [victim(pods["v-delete"], "delete")])
    del record["node"]
    chain.seal(record, chain.GENESIS, KEY)
    await refused(fake, act, sink, record, said="without node or placements")
    assert pod_calls(fake) == []  # refused before any API call


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("never", "preemptionPolicy Never"),
        ("gone", "is gone"),
        ("recreated", "was recreated"),
        ("bound", "already bound"),
        ("other-scheduler", "default-scheduler's"),
    ],
)
async def test_the_live_preemptor_must_be_pending_in_scope_and_able_to_preempt(
    served: tuple[FakeApi, client.ApiClient], change: str, said: str
) -> None:
    fake, api_client = served
    pods = cluster(fake)
    if change == "never":
        fake.modify("pods", "default", "high", {"spec": {"preemptionPolicy": "Never"}})
    if change in ("gone", "recreated"):
        fake.remove("pods", "default", "high")
    if change == "recreated":
        fake.create("pods", objects.pod("high", priority=1000, unschedulable=True, scheduler=SCHEDULER))
    if change == "bound":
        fake.modify("pods", "default", "high", {"spec": {"nodeName": "n2"}})
    if change == "other-scheduler":
        fake.modify("pods", "default", "high", {"spec": {"schedulerName": "default-scheduler"}})
    act, sink = make(api_client)
    record = decision(pods["high"], [victim(pods["v-delete"], "delete"), victim(pods["v-label"], "label")])
    await refused(fake, act, sink, record, said=said)


async def test_a_decision_passing_every_check_is_acted_on(served: tuple[FakeApi, client.ApiClient]) -> None:
    """The checks refuse only what they should: the same world, a sound decision, all done."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    victims = [
        victim(pods[n], a) for n, a in (("v-evict", "evict"), ("v-delete", "delete"), ("v-label", "label"))
    ]
    await act.handle(orjson.dumps(decision(pods["high"], victims)), key=b"default", origin=ORIGIN)
    assert {n: o["result"] for n, o in outcomes(sink).items()} == dict.fromkeys(
        ("v-evict", "v-delete", "v-label"), "done"
    )
    (event,) = outcome_events(sink)
    assert event["outcome"]["nomination"] == "done"
    assert fake.get("pods", "default", "high")["status"]["nominatedNodeName"] == "n1"  # type: ignore[index]


async def test_the_daemonset_flow_takes_equal_priority_only_for_a_daemonset_pod(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """docs/semantics.md §1: in the DaemonSet flow a victim may be of the preemptor's own priority.
    A decision saying `daemonset` for a preemptor no DaemonSet owns is refused: the flow name
    cannot buy an equal-priority victim."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    record = decision(pods["high"], [victim(pods["equal"], "delete")], flow="daemonset")
    await refused(fake, act, sink, record, said="not a DaemonSet's pod")
    owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "agent",
        "uid": "ds-uid",
        "controller": True,
    }
    fake.modify("pods", "default", "high", {"metadata": {"ownerReferences": [owner]}})
    act, sink = make(api_client)
    again = decision(
        pods["high"], [victim(pods["equal"], "delete")], flow="daemonset", decision_id="default/2/x"
    )
    await act.handle(orjson.dumps(again), key=b"default", origin=ORIGIN)
    assert outcomes(sink)["equal"]["result"] == "done"
    act, sink = make(api_client)
    above = decision(
        pods["high"], [victim(pods["above"], "delete")], flow="daemonset", decision_id="default/3/x"
    )
    outcome = await act.handle(orjson.dumps(above), key=b"default", origin=ORIGIN)
    assert [o["result"] for o in outcome] == ["error"]
    assert "not at most the preemptor's 1000" in outcome[0].get("message", "")


# ---- decision-wide limits ---------------------------------------------------------------------


async def test_protected_namespaces_and_the_victim_cap_refuse_before_any_call(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)  # kube-system is protected by default
    low_system = fake.create("pods", objects.pod("proxy", namespace="kube-system", node="n1", priority=0))
    record = decision(pods["high"], [victim(pods["v-delete"], "delete"), victim(low_system, "delete")])
    await refused(fake, act, sink, record, said="protected namespace(s) kube-system")
    assert pod_calls(fake) == []
    capped, capped_sink = make(api_client, max_victims=2)
    three = [victim(pods[n], "evict") for n in ("v-evict", "v-delete", "v-label")]
    await refused(fake, capped, capped_sink, decision(pods["high"], three), said="3 victims, more than the 2")
    assert pod_calls(fake) == []
    assert actuator.DEFAULT_PROTECTED_NAMESPACES == ("kube-system",) and actuator.DEFAULT_MAX_VICTIMS == 100


def test_the_command_line_sets_the_limits() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    actuator_cli.register(sub)
    args = parser.parse_args(["actuator"])
    assert (args.protected_namespaces, args.max_victims) == (("kube-system",), 100)
    args = parser.parse_args(
        ["actuator", "--protected-namespaces", "kube-system,infra", "--max-victims", "5"]
    )
    assert (args.protected_namespaces, args.max_victims) == (("kube-system", "infra"), 5)
    assert parser.parse_args(["actuator", "--protected-namespaces", ""]).protected_namespaces == ()
    for bad in (["--max-victims", "0"], ["--protected-namespaces", "kube_system"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["actuator", *bad])


# ---- gangs -----------------------------------------------------------------------------------


async def test_a_gang_of_pods_that_do_not_exist_is_refused(served: tuple[FakeApi, client.ApiClient]) -> None:
    """Issue 29, 1: two forged pending pods labelled as one pod group were decided, and real pods
    soft-evicted: a gang's nomination checked no member. Now every member needs its uid, and a
    member that does not exist refuses the whole decision."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    invented = {"default/ghost-0": "n1", "default/ghost-1": "n1"}
    record = gang(pods, [victim(pods["v-label"], "label")], placements=invented, memberUids=None)
    await refused(fake, act, sink, record, said="no uid for job member(s) default/ghost-0, default/ghost-1")
    assert pod_calls(fake) == []
    act, sink = make(api_client)
    uids = {"default/ghost-0": "g0", "default/ghost-1": "g1"}
    record = gang(pods, [victim(pods["v-label"], "label")], placements=invented, memberUids=uids)
    outcome = await refused(fake, act, sink, record, said="preemptor default/ghost-0 is gone")
    assert outcome["nomination"] == "gone"


@pytest.mark.parametrize("member_state", ["gone", "recreated", "bound", "never", "other-scheduler"])
async def test_one_failing_member_refuses_the_whole_gang(
    served: tuple[FakeApi, client.ApiClient], member_state: str
) -> None:
    fake, api_client = served
    pods = cluster(fake)
    if member_state in ("gone", "recreated"):
        fake.remove("pods", "default", "w-1")
    if member_state == "recreated":
        fake.create("pods", objects.pod("w-1", priority=700, unschedulable=True, scheduler=SCHEDULER))
    if member_state == "bound":
        fake.modify("pods", "default", "w-1", {"spec": {"nodeName": "n2"}})
    if member_state == "never":
        fake.modify("pods", "default", "w-1", {"spec": {"preemptionPolicy": "Never"}})
    if member_state == "other-scheduler":
        fake.modify("pods", "default", "w-1", {"spec": {"schedulerName": "default-scheduler"}})
    act, sink = make(api_client)
    await refused(fake, act, sink, gang(pods, [victim(pods["v-label"], "label")]), said="default/w-1")
    # No member was nominated: w-0 (fine on its own) is untouched too.
    assert "nominatedNodeName" not in (fake.get("pods", "default", "w-0") or {}).get("status", {})


async def test_a_gang_takes_victims_below_its_lowest_member_only(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """docs/semantics.md §5: a job's priority is its lowest member's (w-0, 500)."""
    fake, api_client = served
    pods = cluster(fake)
    middle = fake.create("pods", objects.pod("middle", node="n1", priority=600))
    act, sink = make(api_client)
    victims = [victim(pods["v-label"], "label"), victim(middle, "label")]
    await refused(fake, act, sink, gang(pods, victims), said="priority 600, not below the preemptor's 500")
    act, sink = make(api_client)
    sound = gang(
        pods, [victim(pods["v-label"], "label")], explanation={"members": ["default/w-0", "default/w-1"]}
    )
    sound["id"] = "default/78/w-0-uid"
    chain.seal(sound, chain.GENESIS, KEY)
    await act.handle(orjson.dumps(sound), key=b"default", origin=ORIGIN)
    assert outcomes(sink)["v-label"]["result"] == "done"
    for member in ("w-0", "w-1"):
        assert fake.get("pods", "default", member)["status"]["nominatedNodeName"] == "n1"  # type: ignore[index]


# ---- records the actuator cannot rely on -------------------------------------------------------


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (lambda r: r.update(placements=["n1"]), "placements must be an object"),
        (lambda r: r.update(explanation=["x"]), "explanation must be an object"),
        (lambda r: r["victims"][0].update(priority="10"), "victims[0].priority must be an integer"),
        (lambda r: r["victims"][0].update(name=".."), "is not a pod name"),
        (lambda r: r["victims"][0].update(name="."), "is not a pod name"),
        (lambda r: r["victims"][0].update(namespace="default/pods/x"), "is not a pod name"),
        (lambda r: r["victims"][0].update(name="v\nWARNING forged line"), "is not a pod name"),
        (lambda r: r.update(preemptor="default/high\nINFO forged"), "is not namespace/name"),
        (lambda r: r.update(node="../n1"), "is not a node name"),
        (lambda r: r.update(ts="yesterday"), "not an RFC 3339 date-time"),
        (lambda r: r.update(seq=True), "seq must be an integer"),
        (lambda r: r.update(id="d\x1b[2J"), "control characters"),
        (lambda r: r["victims"].append(dict(r["victims"][0])), "named twice"),
        (lambda r: r.update(explanation={"members": [1]}), "explanation.members"),
        (lambda r: r.update(memberUids={"default/w": ""}), "memberUids.default/w needs at least 1"),
    ],
)
async def test_records_the_actuator_cannot_rely_on_are_dead_lettered_unread(
    served: tuple[FakeApi, client.ApiClient], tamper: Any, said: str
) -> None:
    """Issue 29, 3 and 7: `placements` as a list crash-looped the actuator; a victim named `..`
    made the client request another URL; a newline in a name wrote forged log lines. Each is
    refused (MalformedDecision) even signed, before any API call."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    record = decision(pods["high"], [victim(pods["v-delete"], "delete")])
    tamper(record)
    chain.seal(record, chain.GENESIS, KEY)
    value = orjson.dumps(record)
    assert await act.handle(value, key=b"default", origin=ORIGIN) == []
    (dead,) = sink.on("preemption.dead-letter")
    headers = dict(dead.headers)
    assert dead.value == value and headers["error-class"] == b"MalformedDecision"
    assert said in headers["error"].decode(), headers["error"]
    assert fake.calls == [] and not sink.on("preemption.evictions")


async def test_whatever_a_record_makes_the_actuator_raise_dead_letters_it(
    served: tuple[FakeApi, client.ApiClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29, 3: handle() caught only Refused, and the offset was committed after it: one record
    killed every restart. Now anything but a lost Lease or an infrastructure failure is the
    record's: dead-lettered with its class, and handle() returns."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)

    def broken(decision: Any) -> Any:
        raise KeyError("a field no check foresaw")

    monkeypatch.setattr(actuator, "_context", broken)
    value = orjson.dumps(decision(pods["high"], [victim(pods["v-delete"], "delete")]))
    assert await act.handle(value, key=b"default", origin=ORIGIN) == []
    (dead,) = sink.on("preemption.dead-letter")
    assert dict(dead.headers)["error-class"] == b"KeyError" and dead.value == value
    assert pod_writes(fake) == []

    def lost(decision: Any) -> Any:
        raise actuator.lease.NotLeader("lost")

    monkeypatch.setattr(actuator, "_context", lost)
    with pytest.raises(actuator.lease.NotLeader):  # the loop's to handle: not the record's fault
        await act.handle(value, key=b"default", origin=ORIGIN)


async def test_the_loop_commits_a_bad_record_and_acts_on_the_next(
    served: tuple[FakeApi, client.ApiClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consume loop past a record refused (off the schema) and one that makes handling raise:
    both committed and dead-lettered, and the decision behind them acted on."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    malformed = decision(pods["high"], [victim(pods["v-delete"], "delete")], decision_id="default/1/a")
    malformed["placements"] = ["n1"]
    chain.seal(malformed, chain.GENESIS, KEY)
    raising = decision(pods["high"], [victim(pods["v-delete"], "delete")], decision_id="default/2/boom")
    good = decision(pods["high"], [victim(pods["v-evict"], "evict")], decision_id="default/3/b")
    context = actuator._context

    def unforeseen(record: Any) -> Any:
        if record["id"] == "default/2/boom":
            raise TypeError("unforeseen")
        return context(record)

    monkeypatch.setattr(actuator, "_context", unforeseen)
    stopping = asyncio.Event()
    consumer = OneBatchConsumer([orjson.dumps(r) for r in (malformed, raising, good)], stopping)
    await asyncio.wait_for(act._poll(cast(Any, consumer), stopping), 30)
    assert consumer.commits == [1, 2, 3]
    dead = [dict(r.headers)["error-class"] for r in sink.on("preemption.dead-letter")]
    assert dead == [b"MalformedDecision", b"TypeError"]
    assert set(outcomes(sink)) == {"v-evict"} and outcomes(sink)["v-evict"]["result"] == "done"


# ---- the property: mutated signed records -------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
# Values an attacker would reach for: names of real pods (elsewhere, above, protected), node names,
# uids of pods that exist, priorities, the other flows and outcomes.
PLAUSIBLE = st.sampled_from(
    [
        "n1", "n2", "", "..", "default", "kube-system", "coredns", "above", "equal", "elsewhere",
        "default/high", "default/w-0", "job", "daemonset", "default", "preempt", "wait", "delete",
        "evict", "label", 0, 1000, 2_000_000_000, -1, True, [], {},
        {"default/w-0": "n1", "default/w-1": "n2"}, {"default/w-0": "n1", "default/high": "n1"},
    ]
)  # fmt: skip
MUTATIONS = ("replace", "delete", "add")
# Every pod of `cluster`: a victim retargeted at one takes its real namespace, name and uid, as an
# attacker reading cluster-events could write them; a member retargeted takes its uid.
POD_NAMES = ("high", "v-evict", "v-delete", "v-label", "coredns", "above", "equal", "elsewhere", "w-0", "w-1")


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _paths(inner, (*prefix, i))


def _mutate(record: dict[str, Any], path: tuple[Any, ...], how: str, value: Any) -> None:
    if not path:
        return
    *parents, last = path
    node: Any = record
    for part in parents:
        node = node[part]
    if how == "delete":
        del node[last]
    elif how == "add" and isinstance(node, dict):
        node[f"{last}-extra"] = value
    else:
        node[last] = value


def _retarget(record: dict[str, Any], pods: Pods, index: int, name: str) -> None:
    """Point a victim (or a gang member's uid, or the preemptor) at a real pod, by its real identity."""
    meta = pods[name]["metadata"]
    targets = ["victim", "preemptor"] + (["member"] if isinstance(record.get("memberUids"), dict) else [])
    target = targets[index % len(targets)]
    victims = record.get("victims")
    if target == "victim" and isinstance(victims, list) and victims and isinstance(victims[0], dict):
        victims[index % len(victims)].update(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"])
    elif target == "member":
        member = sorted(record["memberUids"])[index % len(record["memberUids"])]
        record["memberUids"][member] = meta["uid"]
    else:
        record.update(preemptor=f"{meta['namespace']}/{meta['name']}", preemptorUid=meta["uid"])


def _base(pods: Pods, kind: str) -> dict[str, Any]:
    if kind == "gang":
        return gang(pods, [victim(pods["v-label"], "label"), victim(pods["v-evict"], "evict")])
    victims = [victim(pods["v-evict"], "evict"), victim(pods["v-delete"], "delete")]
    return decision(pods["high"], victims)


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, list[tuple[tuple[Any, ...], str, Any]]]:
    kind = draw(st.sampled_from(["single", "gang"]))
    return kind, draw(
        st.lists(
            st.one_of(
                st.tuples(st.integers(0, 10_000), st.sampled_from(MUTATIONS), st.one_of(JSON, PLAUSIBLE)),
                st.tuples(st.integers(0, 10_000), st.just("retarget"), st.sampled_from(POD_NAMES)),
            ),
            min_size=1,
            max_size=3,
        )
    )


# Pods a mutated decision could aim at: only these three may ever be written to (besides the
# preemptor's and members' nominations), being live below every preemptor, on n1.
ACTIONABLE = {"v-evict", "v-delete", "v-label"}
PREEMPTORS = {"high", "w-0", "w-1"}
EXAMPLES = int(os.environ.get("ACTUATOR_TRUST_EXAMPLES", "150"))


async def _never_stops(kind: str, mutations: list[tuple[tuple[Any, ...], str, Any]]) -> None:
    async with kmock.KubernetesScaffold() as handler, kmock.Server(handler) as server:
        served = api.for_host(str(server.url))
        try:
            fake = FakeApi(handler, elastic_quotas=False)
            pods = cluster(fake)
            record = copy.deepcopy(_base(pods, kind))
            for index, how, value in mutations:
                if how == "retarget":
                    _retarget(record, pods, index, value)
                    continue
                paths = [p for p in _paths(record) if p and p[0] not in ("hash", "sig", "prevHash")]
                _mutate(record, paths[index % len(paths)], how, copy.deepcopy(value))
            chain.seal(
                record, chain.GENESIS, KEY
            )  # signed: a compromised worker, or one deriving from forged events
            act, sink = make(served)
            value = orjson.dumps(record)
            # Never raises, whatever the record: it is dead-lettered, acted on, refused or skipped.
            await asyncio.wait_for(act.handle(value, key=b"default", origin=Origin("d", 0, 1)), 60)
            dead = sink.on("preemption.dead-letter")
            acted = any(
                c.method != "PATCH" or c.subresource != "status" for c in fake.writes() if c.plural == "pods"
            )
            event(
                "dead-lettered" if dead else "wrote to a victim" if acted else "nothing written to a victim"
            )
            schema_ok = validate.problem(record, validate.load(decisions.SCHEMA)) is None
            if not schema_ok:
                assert dead and not pod_writes(fake), "a record off the schema is dead-lettered unread"
            for method, name, subresource in pod_writes(fake):
                if name in PREEMPTORS:
                    assert (method, subresource) == ("PATCH", "status"), (method, name, subresource)
                else:
                    assert name in ACTIONABLE, (method, name, subresource, record)
            for name in ("coredns", "above", "equal", "elsewhere"):
                namespace = "kube-system" if name == "coredns" else "default"
                live = fake.get("pods", namespace, name)
                assert live is not None and not live["metadata"].get("deletionTimestamp"), name
                assert eviction.SOFT_EVICTION not in live["metadata"].get("labels", {}), name
        finally:
            await served.close()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated())
def test_mutated_signed_records_never_stop_the_actuator_nor_reach_a_pod_they_should_not(
    case: tuple[str, list[tuple[tuple[Any, ...], str, Any]]],
) -> None:
    """Any field of a signed decision (single or gang) replaced by any JSON value, deleted, or
    joined by another: handle() returns, and no pod but the three live low-priority pods on n1
    is ever deleted, evicted or labelled (the preemptors only get their nominations)."""
    asyncio.run(_never_stops(*case))

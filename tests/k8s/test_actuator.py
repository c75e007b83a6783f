"""The actuator against a kmock API server: outcomes, injected faults, idempotence, forgeries.

kmock is kept for what a real API server will not do on demand (a 503, a 403, an
eviction answered 429 then 200) and for scenarios that need no server semantics;
the actuator's writes as kube-apiserver answers them (PDBs, uid races, dry run,
Events, the Lease) are tested against a real one in tests/k8s/test_real_api.py.
Most scenarios call `Actuator.handle` with records captured in memory; the
redelivery scenario runs the whole Kafka loop on a real broker (tansu, and
Apache Kafka where Java is available) and restarts the actuator with its
ledger lost, so the evictions topic alone must keep outcomes unique.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import kmock
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client
from prometheus_client import REGISTRY

from schemas import chain
from schemas.records import VictimRecord
from streams.common import signing
from streams.common.backoff import Backoff
from streams.kafka import topics as kafka_topics
from streams.kafka.deadletter import Origin
from streams.kafka.sink import KafkaSink, MemorySink
from streams.kube import actuator, api, eviction, lease
from streams.kube.actuator import Actuator, Topics
from streams.kube.ledger import Ledger
from tests.k8s import objects
from tests.k8s.decisions import (
    FAST,
    KEY,
    ORIGIN,
    STEP_TIMEOUT_S,
    Pods,
    decision,
    outcome_events,
    outcomes,
    produce,
    victim,
    wait_until,
    world,
)
from tests.k8s.fakeapi import FakeApi
from tests.support.topics import fresh_topic


def make(
    api: client.ApiClient,
    *,
    sink: MemorySink | None = None,
    key: bytes | None = KEY,
    ledger: Ledger | None = None,
    scope: tuple[str, ...] | None = None,
) -> tuple[Actuator, MemorySink]:
    sink = sink or MemorySink()
    actions = eviction.Actions(api, identity="test", retry=FAST)
    ledger = ledger if ledger is not None else Ledger()
    return Actuator(actions, sink, ledger, hmac_key=key, scope=scope), sink


# ---- one outcome each ---------------------------------------------------------------


async def test_gone_terminating_and_recreated_pods_are_left_alone(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, api = served
    pods = world(fake)
    gone = victim(pods["v-evict"], "evict")
    fake.remove("pods", "default", "v-evict")
    fake.modify("pods", "default", "v-delete", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    recreated = victim(pods["v-label"], "delete")
    fake.remove("pods", "default", "v-label")
    fake.create("pods", objects.pod("v-label", node="n1"))  # same name, new uid
    marked = victim(pods["v-other"], "evict", terminating=True)
    record = decision(pods["high"], [gone, victim(pods["v-delete"], "delete"), recreated, marked])
    act, sink = make(api)
    await act.handle(orjson.dumps(record), key=None, origin=ORIGIN)

    assert {n: (o["result"], o["attempts"]) for n, o in outcomes(sink).items()} == {
        "v-evict": ("already-gone", 0),
        "v-delete": ("already-terminating", 0),
        "v-label": ("uid-changed", 0),
        "v-other": ("already-terminating", 0),
    }
    assert all(c.name == "high" for c in fake.writes())  # only the nomination was written
    # A victim marked terminating in the decision costs no API call at all, not even a read.
    assert not [c for c in fake.calls if c.name == "v-other"]
    assert not [o for (p, _, _), o in fake.objects.items() if p == "events"]


async def test_eviction_429_then_200_is_done_on_the_second_attempt(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, api = served
    pods = world(fake)
    fake.evictions_answer("default", "v-evict", [429, 200])
    act, sink = make(api)
    await act.handle(
        orjson.dumps(decision(pods["high"], [victim(pods["v-evict"], "evict")])), key=None, origin=ORIGIN
    )
    found = outcomes(sink)["v-evict"]
    assert (found["result"], found["attempts"]) == ("done", 2)
    assert len([c for c in fake.writes() if c.subresource == "eviction"]) == 2


async def test_server_errors_are_retried_then_reported(served: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api = served
    pods = world(fake)
    fake.fail("DELETE", "pods", 503)  # one transient failure: retried
    fake.fail("PATCH", "pods", 403, times=1)  # forbidden: not retried, reported
    act, sink = make(api)
    record = decision(pods["high"], [victim(pods["v-delete"], "delete"), victim(pods["v-label"], "label")])
    await act.handle(orjson.dumps(record), key=None, origin=ORIGIN)
    found = outcomes(sink)
    assert found["v-delete"]["result"] == "done"
    assert found["v-label"]["result"] == "error" and found["v-label"]["message"].startswith(
        "label failed: 403"
    )


@pytest.mark.parametrize("change", ["gone", "recreated", "bound"])
async def test_no_victim_is_touched_for_a_preemptor_that_no_longer_needs_it(
    served: tuple[FakeApi, client.ApiClient], change: str
) -> None:
    fake, api = served
    pods = world(fake)
    if change in ("gone", "recreated"):
        fake.remove("pods", "default", "high")
    if change == "recreated":
        fake.create("pods", objects.pod("high", priority=1000, cpu="3", unschedulable=True))
    if change == "bound":
        fake.modify("pods", "default", "high", {"spec": {"nodeName": "n2"}})
    act, sink = make(api)
    value = orjson.dumps(
        decision(pods["high"], [victim(pods["v-evict"], "evict"), victim(pods["v-delete"], "delete")])
    )
    await act.handle(value, key=None, origin=ORIGIN)
    found = outcomes(sink)
    assert {o["result"] for o in found.values()} == {"error"}
    assert change in found["v-evict"]["message"] and "no victim was touched" in found["v-evict"]["message"]
    assert fake.writes() == []
    # The worker learns of the refusal through the cluster's log: nothing was done.
    (event,) = outcome_events(sink)
    assert event["outcome"]["nomination"] == change
    assert set(event["outcome"]["victims"].values()) == {"error"}
    # Redelivered: no more outcomes, and still nothing is touched; the OUTCOME again says so.
    assert await act.handle(value, key=None, origin=ORIGIN) == []
    assert fake.writes() == [] and len(outcomes(sink)) == 2
    assert [e["outcome"]["victims"] for e in outcome_events(sink)] == [event["outcome"]["victims"]] * 2


# ---- idempotence ----------------------------------------------------------------------


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_decision_delivered_three_times_evicts_once(
    served: tuple[FakeApi, client.ApiClient], broker: str, tmp_path: Path
) -> None:
    fake, api = served
    pods = world(fake)
    topics = Topics(fresh_topic("decisions"), fresh_topic("evictions"), fresh_topic("dead-letter"))
    await kafka_topics.ensure_topics(broker, [kafka_topics.TopicSpec(t) for t in vars(topics).values()])
    value = orjson.dumps(decision(pods["high"], [victim(pods["v-evict"], "evict")]))
    await produce(broker, topics.decisions, [value] * 3)
    duplicates = sample("preemptctl_actuator_duplicates_total")

    async with KafkaSink(broker) as sink:
        actions = eviction.Actions(api, identity="a", retry=FAST)
        act = Actuator(actions, sink, Ledger(tmp_path / "ledger.jsonl"), hmac_key=KEY, topics=topics)
        assert await actuator.read_back(broker, act) == 0
        stopping = asyncio.Event()
        consuming = asyncio.create_task(
            act.consume(broker, group_id=fresh_topic("group"), stopping=stopping, session_timeout_ms=6000)
        )
        await wait_until(
            lambda: sample("preemptctl_actuator_duplicates_total") - duplicates >= 2, "redeliveries"
        )
        stopping.set()
        await asyncio.wait_for(consuming, STEP_TIMEOUT_S)

    assert len([c for c in fake.writes() if c.subresource == "eviction"]) == 1
    # Restarted with its ledger lost: the evictions topic alone says the outcome exists.
    memory = MemorySink()
    again = Actuator(
        eviction.Actions(api, identity="b", retry=FAST), memory, Ledger(), hmac_key=KEY, topics=topics
    )
    assert await actuator.read_back(broker, again) == 1
    assert await again.handle(value, key=b"default", origin=ORIGIN) == []
    assert {r.topic for r in memory.records} == {"preemption.cluster-events"}  # only the OUTCOME again
    assert len([c for c in fake.writes() if c.subresource == "eviction"]) == 1
    # ... and the ledger file alone says so too (a restart with the topic unreadable).
    ledger = Ledger(tmp_path / "ledger.jsonl")
    third, third_sink = make(api, ledger=ledger)
    assert await third.handle(value, key=b"default", origin=ORIGIN) == []
    assert {r.topic for r in third_sink.records} == {"preemption.cluster-events"}


async def test_a_crash_between_the_write_and_its_record_resumes_as_done(
    served: tuple[FakeApi, client.ApiClient], tmp_path: Path
) -> None:
    fake, api = served
    pods = world(fake)
    record = decision(pods["high"], [victim(pods["v-evict"], "evict")])

    class Crash(Exception):
        pass

    class CrashingSink(MemorySink):
        async def send(
            self, topic: str, value: bytes, *, key: bytes | None = None, headers: Any = ()
        ) -> None:
            raise Crash("killed between the eviction and its outcome record")

    path = tmp_path / "ledger.jsonl"
    crashing, _ = make(api, sink=CrashingSink(), ledger=Ledger(path))
    with pytest.raises(Crash):
        await crashing.handle(orjson.dumps(record), key=None, origin=ORIGIN)
    assert fake.get("pods", "default", "v-evict")["metadata"]["deletionTimestamp"]  # type: ignore[index]

    restarted, sink = make(api, ledger=Ledger(path))
    await restarted.handle(orjson.dumps(record), key=None, origin=ORIGIN)
    found = outcomes(sink)["v-evict"]
    assert found["result"] == "done"  # our own eviction, not someone else's termination
    assert len([c for c in fake.writes() if c.subresource == "eviction"]) == 1


async def test_the_ledger_makes_lines_durable_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: the lines appended before a sync share one fsync (not one each, in a row, on
    the preemptor's critical path); a line appended while an fsync runs waits for the next."""
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger(path)
    seen: list[int] = []  # lines in the file when each fsync started
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        seen.append(len(path.read_bytes().splitlines()))
        time.sleep(0.05)  # a slow disk: the fsync is still running when the next line comes
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    for i in range(8):
        ledger.mark_pending(("d", f"v{i}"))
    await asyncio.gather(*(ledger.sync() for _ in range(8)))
    assert seen == [8]
    first = asyncio.ensure_future(ledger.sync())  # nothing new: returns at once
    ledger.mark_recorded(("d", "v0"))
    running = asyncio.ensure_future(ledger.sync())
    await asyncio.sleep(0.01)
    ledger.mark_recorded(("d", "v1"))  # appended during that fsync
    await asyncio.gather(first, running, ledger.sync())
    assert seen == [8, 9, 10]
    monkeypatch.setattr(os, "fsync", real_fsync)
    ledger.close()
    again = Ledger(path)
    assert again.recorded(("d", "v0")) and again.recorded(("d", "v1")) and again.pending(("d", "v7"))
    again.close()


async def test_api_calls_take_no_thread_hop_and_keep_the_environments_proxy(
    served: tuple[FakeApi, client.ApiClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp's trust_env looked ~/.netrc up in a thread pool on every request (a thread hop per
    API call, on the preemptor's critical path); the proxy it also read is taken once instead."""
    fake, served_api = served
    pods = world(fake)
    loop = asyncio.get_running_loop()
    hops: list[Any] = []
    real = loop.run_in_executor

    def counted(executor: Any, func: Any, *args: Any) -> Any:
        hops.append(func)
        return real(executor, func, *args)

    monkeypatch.setattr(loop, "run_in_executor", counted)
    act, sink = make(served_api)
    await act.handle(
        orjson.dumps(decision(pods["high"], [victim(pods["v-delete"], "delete")])), key=None, origin=ORIGIN
    )
    assert outcomes(sink)["v-delete"]["result"] == "done"
    assert hops == []
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "kubernetes.default.svc,.internal")
    assert api.environment_proxy("https://10.0.0.1:6443") == "http://proxy.example:3128"
    assert api.environment_proxy("https://kubernetes.default.svc:443") is None
    assert api.environment_proxy("https://api.cluster.internal") is None
    proxied = api.for_host("https://10.0.0.1:6443")
    assert proxied.rest_client.proxy == "http://proxy.example:3128"
    await proxied.close()


class Fence:
    """The Lease's margin as the actuator checks it (lease.LeaseElector.check): holds until `lose()`."""

    def __init__(self, *, lose_after: int | None = None) -> None:
        self.passed = 0
        self.lose_after = lose_after  # the margin runs out after this many checks passed
        self.checked = asyncio.Event()  # a check passed

    def lose(self) -> None:
        self.lose_after = self.passed

    def check(self) -> None:
        if self.lose_after is not None and self.passed >= self.lose_after:
            raise lease.NotLeader("not the holder of the Lease (test)")
        self.passed += 1
        self.checked.set()


async def test_a_write_is_checked_again_when_it_is_sent(served: tuple[FakeApi, client.ApiClient]) -> None:
    """Issue 22: a frozen actuator's DELETE reached the API server 5.6 s after its successor took
    the Lease over. Its Lease check had passed before the request waited for a connection (opened
    one: TCP and TLS) and for its body-writing task; frozen in between, it sent the write on
    waking. Each write is checked again as it is sent: once the margin is gone, nothing leaves."""
    fake, served_api = served
    pods = world(fake)
    configuration = client.Configuration()
    configuration.host = served_api.configuration.host
    configuration.connection_pool_maxsize = 1  # the write waits for the one connection
    one = api.TimedApiClient(configuration)
    held, arrived = asyncio.Event(), asyncio.Event()

    async def before(call: Any) -> None:
        if (call.method, call.name) == ("GET", "v-other"):
            arrived.set()
            await held.wait()

    fake.before = before
    context = eviction.Context(
        decision_id="d1", preemptor="default/high", node="n1", preemptor_uid=pods["high"]["metadata"]["uid"]
    )
    done = eviction.Outcome("done", 1)
    try:
        reading = asyncio.create_task(api.json_request(one, "GET", "/api/v1/namespaces/default/pods/v-other"))
        await asyncio.wait_for(arrived.wait(), STEP_TIMEOUT_S)  # the connection is busy
        fence = Fence()
        actions = eviction.Actions(one, identity="test", guard=fence.check, retry=FAST)
        posting = asyncio.create_task(actions.post_event(victim(pods["v-evict"], "evict"), context, done))
        await asyncio.wait_for(fence.checked.wait(), STEP_TIMEOUT_S)  # checked before the call ...
        fence.lose()  # ... and the margin runs out while it waits for a connection
        held.set()
        await reading
        with pytest.raises(lease.NotLeader):
            await asyncio.wait_for(posting, STEP_TIMEOUT_S)
        assert fake.writes() == []
        # Sent on its connection, it is checked once more as its headers and body are written
        # (from a task of aiohttp's own, scheduled after the request was handed its connection).
        for lose_after in (1, 2):
            fence = Fence(lose_after=lose_after)
            actions = eviction.Actions(one, identity="test", guard=fence.check, retry=FAST)
            with pytest.raises(lease.NotLeader):
                await actions.post_event(victim(pods["v-evict"], "evict"), context, done)
            assert fake.writes() == []
        fence = Fence()  # and with the margin, it is written
        actions = eviction.Actions(one, identity="test", guard=fence.check, retry=FAST)
        await actions.post_event(victim(pods["v-evict"], "evict"), context, done)
        assert [(c.method, c.plural) for c in fake.writes()] == [("POST", "events")]
        assert fence.passed == 3  # before the call, as it is sent, as its bytes are written
    finally:
        held.set()
        await one.close()


# ---- forgeries -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tamper", "error_class"),
    [
        (lambda r: chain.seal(r, chain.GENESIS, b"someone-else's-key"), "ForgedDecision"),
        (lambda r: chain.seal(r, chain.GENESIS, None) and r.pop("sig"), "UnsignedDecision"),
        (lambda r: r["victims"].append(dict(r["victims"][0], name="v-other")), "TamperedDecision"),
        (lambda r: r.update(victims="everyone"), "MalformedDecision"),
    ],
    ids=["forged", "unsigned", "tampered", "malformed"],
)
async def test_refused_decisions_go_to_the_dead_letter_topic(
    served: tuple[FakeApi, client.ApiClient], tamper: Callable[[dict[str, Any]], Any], error_class: str
) -> None:
    fake, api = served
    pods = world(fake)
    record = decision(pods["high"], [victim(pods["v-evict"], "evict")])
    tamper(record)
    value = orjson.dumps(record)
    act, sink = make(api)
    assert await act.handle(value, key=b"default", origin=Origin("preemption.decisions", 2, 41)) == []

    (dead,) = sink.on("preemption.dead-letter")
    assert dead.value == value and dead.key == b"default"
    headers = dict(dead.headers)
    assert headers["origin-topic"] == b"preemption.decisions"
    assert (headers["origin-partition"], headers["origin-offset"]) == (b"2", b"41")
    assert headers["error-class"] == error_class.encode() and headers["error"]
    assert not [c for c in fake.calls if c.plural == "pods"] and not sink.on("preemption.evictions")


K1, K2, K3 = b"first-signing-key", b"second-signing-key", b"third-signing-key"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _signed(pods: Pods, secret: bytes, decision_id: str) -> bytes:
    return orjson.dumps(
        decision(pods["high"], [victim(pods["v-evict"], "evict")], key=secret, decision_id=decision_id)
    )


async def test_keys_rotate_without_downtime_and_a_retired_key_is_refused(
    served: tuple[FakeApi, client.ApiClient], tmp_path: Path
) -> None:
    """The documented rotation (docs/topics.md) against one running actuator reading a keys dir:
    k1 only; k1 and k2 (records of either act); k2 only: a k1 record is refused, dead-lettered,
    and no pod is touched; a record naming k2 but signed with k1 is forged."""
    fake, api = served
    pods = world(fake)
    keys_dir = tmp_path / "signing"
    keys_dir.mkdir()
    (keys_dir / "k1").write_bytes(K1 + b"\n")
    clock = Clock()
    ring = signing.Keyring({}, directory=keys_dir, reload_interval_s=1.0, clock=clock)
    actions = eviction.Actions(api, identity="test", retry=FAST)
    sink = MemorySink()
    act = Actuator(actions, sink, Ledger(), keys=ring)

    def header(kid: str) -> list[tuple[str, bytes]]:
        return [(signing.KEY_ID_HEADER, kid.encode())]

    assert await act.handle(
        _signed(pods, K1, "default/1/a"), key=b"default", origin=ORIGIN, headers=header("k1")
    )
    (keys_dir / "k2").write_bytes(K2)  # step 1: the new key is accepted too
    clock.now += 2
    assert ring.key_ids() == ["k1", "k2"]
    assert sample("preemptctl_actuator_signing_keys", key_id="k2") == 1
    second = fake.create("pods", objects.pod("v-evict-2", node="n1"))
    record = decision(pods["high"], [victim(second, "evict")], key=K2, decision_id="default/2/b")
    assert await act.handle(orjson.dumps(record), key=b"default", origin=ORIGIN, headers=header("k2"))
    (keys_dir / "k1").unlink()  # step 3: k1 is retired
    clock.now += 2
    writes = len(fake.writes())
    third = fake.create("pods", objects.pod("v-evict-3", node="n1"))
    late = orjson.dumps(decision(pods["high"], [victim(third, "evict")], key=K1, decision_id="default/3/c"))
    assert await act.handle(late, key=b"default", origin=ORIGIN, headers=header("k1")) == []
    assert await act.handle(late, key=b"default", origin=ORIGIN) == []  # no header: every accepted key
    relabelled = await act.handle(late, key=b"default", origin=ORIGIN, headers=header("k2"))
    assert relabelled == [] and len(fake.writes()) == writes
    dead = [dict(r.headers) for r in sink.on("preemption.dead-letter")]
    assert [d["error-class"] for d in dead] == [b"UnacceptedKey", b"ForgedDecision", b"ForgedDecision"]
    assert b"'k1', which is not accepted (accepted: k2)" in dead[0]["error"]
    assert sample("preemptctl_actuator_signing_keys", key_id="k1") == 0


def test_verify_with_key_ids() -> None:
    """Accepted keys by id: the header picks the key; without it any accepted key may have signed."""
    record = decision({"metadata": {"namespace": "d", "name": "p", "uid": "u"}}, [], key=K1)
    value = orjson.dumps(record)
    both = signing.Keyring({"k1": K1, "k2": K2})
    assert actuator.verify(value, keys=both, key_id="k1")["id"] == record["id"]
    assert actuator.verify(value, keys=both, key_id=None)["id"] == record["id"]
    with pytest.raises(actuator.ForgedDecision):
        actuator.verify(value, keys=both, key_id="k2")
    with pytest.raises(actuator.UnacceptedKey):
        actuator.verify(value, keys=signing.Keyring({"k2": K2, "k3": K3}), key_id="k1")
    with pytest.raises(actuator.ForgedDecision):
        actuator.verify(value, keys=signing.Keyring({"k2": K2, "k3": K3}), key_id=None)
    assert actuator.verify(value, keys=None)["id"] == record["id"]  # no keys: signatures are not checked


async def test_decisions_without_action_or_for_other_clusters_do_nothing(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, api = served
    pods = world(fake)
    act, sink = make(api)
    for record in (
        decision(pods["high"], [], outcome="wait"),
        decision(pods["high"], [victim(pods["v-evict"], "evict")], cluster="another"),
    ):
        await act.handle(orjson.dumps(record), key=None, origin=ORIGIN)
    assert sink.records == [] and fake.writes() == []


def test_event_messages_and_names_stay_within_limits() -> None:
    assert eviction.truncate("x" * 5000) == "x" * 1021 + "..."
    assert len(eviction.truncate("y" * 5000)) == eviction.EVENT_MESSAGE_LIMIT
    assert eviction.truncate("short") == "short"
    # The server counts a note's bytes, not its characters.
    wide = eviction.truncate("é" * 1000)
    assert len(wide.encode()) <= eviction.EVENT_MESSAGE_LIMIT and wide.endswith("...")
    # A cut name never ends a DNS label with '-' or '.'.
    assert eviction.event_name("a" * 235 + "-.b" + "c" * 20, "d", "u").startswith("a" * 235 + ".")
    name = eviction.event_name("p" * 300, "cluster/1/uid", "uid")
    assert len(name) <= 253 and name == eviction.event_name("p" * 300, "cluster/1/uid", "uid")
    assert name != eviction.event_name("p" * 300, "cluster/2/uid", "uid")


def _api_exception(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    from kubernetes_asyncio.client.exceptions import ApiException

    exc = ApiException(status=status, reason="x")
    exc.body = json.dumps(body)
    exc.headers = headers or {}
    return exc


async def test_eviction_answers_are_read_as_the_server_means_them() -> None:
    """429 with a DisruptionBudget cause is a PDB; without, it is API priority-and-fairness throttling."""
    pdb_429 = eviction.Answer.of(
        _api_exception(
            429,
            {
                "message": "Cannot evict pod",
                "details": {"causes": [{"reason": "DisruptionBudget", "message": "m"}]},
            },
        )
    )
    assert pdb_429.pdb_blocked and not pdb_429.transient and pdb_429.pdb_cause == "m"
    throttled = eviction.Answer.of(_api_exception(429, {"message": "too many"}, {"Retry-After": "3"}))
    assert throttled.transient and not throttled.pdb_blocked and throttled.retry_after_s == 3.0
    # Retry-After from the Status when a proxy dropped the header (the server sends both).
    bare = eviction.Answer.of(
        _api_exception(429, {"message": "too many", "details": {"retryAfterSeconds": 4}})
    )
    assert bare.transient and bare.retry_after_s == 4.0
    two = eviction.Answer.of(
        _api_exception(500, {"message": "This pod has more than one PodDisruptionBudget, which ..."})
    )
    assert two.multiple_pdbs and not two.transient
    assert eviction.Answer.of(_api_exception(503, {})).transient
    assert eviction.Answer.of(TimeoutError()).transient
    # The wait before a retry honours Retry-After (capped), never less than the backoff.
    actions = eviction.Actions(api.for_host("http://127.0.0.1:9"), retry=FAST)
    assert actions._wait(Backoff(0.01, 0.02, jitter=0), throttled) == 3.0
    capped = eviction.Answer(429, retry_after_s=10_000)
    assert actions._wait(Backoff(0.01, 0.02, jitter=0), capped) == FAST.retry_after_max_s
    await actions.api.close()


async def test_a_preemptor_of_another_scheduler_is_refused(served: tuple[FakeApi, client.ApiClient]) -> None:
    """Issue 22, 2: the actuator acts only for its schedulers' preemptors; kube-scheduler's own
    preemptor (default-scheduler) is refused whatever the decision says: no victim is touched."""
    fake, api = served
    pods = world(fake)
    act, sink = make(api, scope=("preemptctl-scheduler",))
    value = orjson.dumps(decision(pods["high"], [victim(pods["v-evict"], "evict")]))
    await act.handle(value, key=None, origin=ORIGIN)
    assert fake.writes() == []
    assert "default-scheduler" in outcomes(sink)["v-evict"]["message"]
    (event,) = outcome_events(sink)
    assert (event["outcome"]["nomination"], event["outcome"]["victims"]) == (
        "out-of-scope",
        {pods["v-evict"]["metadata"]["uid"]: "error"},
    )
    # Its own scheduler's preemptor is acted on.
    fake.modify("pods", "default", "high", {"spec": {"schedulerName": "preemptctl-scheduler"}})
    other = decision(pods["high"], [victim(pods["v-delete"], "delete")], decision_id="default/43/high-uid")
    await act.handle(orjson.dumps(other), key=None, origin=ORIGIN)
    assert outcomes(sink)["v-delete"]["result"] == "done"
    assert outcome_events(sink)[-1]["outcome"]["nomination"] == "done"


class _Slow:
    """Actions whose every victim takes a while: how many are in flight at once?"""

    dry_run = False
    identity = "slow"

    def __init__(self) -> None:
        self.active = self.most = 0

    async def read_preemptor(self, member: str) -> tuple[dict[str, Any], None]:
        pod = objects.pod("high", priority=1000)
        pod["metadata"]["uid"] = "high-uid"
        return pod, None

    async def nominate(self, member: str, node: str, **_: Any) -> eviction.Nomination:
        return eviction.Nomination("done", proceed=True)

    async def act(
        self, victim: VictimRecord, context: Any, *, gate: eviction.Gate, limit: asyncio.Semaphore, **_: Any
    ) -> eviction.Outcome:
        gate.read(victim, None)
        async with limit:
            self.active += 1
            self.most = max(self.most, self.active)
            await asyncio.sleep(0.05)
            self.active -= 1
        return eviction.Outcome("done", 1)

    async def post_event(self, *_: Any) -> None:
        return None


async def test_victims_of_one_decision_are_acted_on_concurrently_within_the_bound() -> None:
    slow = _Slow()
    sink = MemorySink()
    act = Actuator(cast(eviction.Actions, slow), sink, Ledger(), hmac_key=KEY)
    pods = {f"v{i}": objects.pod(f"v{i}", node="n1") for i in range(actuator.VICTIM_CONCURRENCY * 2 + 1)}
    for i, pod in enumerate(pods.values()):
        pod["metadata"]["uid"] = f"v{i}-uid"
        pod["metadata"].setdefault("namespace", "default")
    high = objects.pod("high", priority=1000, cpu="3", unschedulable=True)
    high["metadata"].update({"uid": "high-uid", "namespace": "default"})
    value = orjson.dumps(decision(high, [victim(p, "delete") for p in pods.values()]))
    written = await act.handle(value, key=None, origin=ORIGIN)
    assert slow.most == actuator.VICTIM_CONCURRENCY
    # One outcome each, reported in the decision's order whatever order they finished in.
    assert [r["victim"]["name"] for r in written] == list(pods)


async def test_a_consumer_that_cannot_leave_its_group_does_not_hold_up_a_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 19 #11: under load, the actuator did not exit within 30 s of SIGTERM: its consumer's
    close waited for a group rejoin on a slow broker to settle. Stopping bounds the close."""
    monkeypatch.setattr(actuator, "CONSUMER_CLOSE_TIMEOUT_S", 0.05)
    never = asyncio.Event()

    class Rejoining:
        async def stop(self) -> None:
            await never.wait()  # leaving the group waits for a rebalance that does not settle

    stopping = asyncio.Event()
    stopping.set()
    await asyncio.wait_for(actuator._close(cast(Any, Rejoining()), stopping), 5)


async def test_a_stop_is_never_held_up_by_the_consume_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22: a leader woken (SIGCONT) after its successor took over sat in aiokafka's group
    join at SIGTERM, and the process never exited. Whatever the consume loop awaits, a stop
    gives it STOP_TIMEOUT_S, then cancels it."""
    monkeypatch.setattr(actuator, "STOP_TIMEOUT_S", 0.05)
    never, cancelled = asyncio.Event(), asyncio.Event()

    async def joining() -> None:
        try:
            await never.wait()  # a group join that does not settle
        except asyncio.CancelledError:
            cancelled.set()
            raise

    stopping = asyncio.Event()
    running = asyncio.create_task(actuator._until_stopped(joining(), stopping))
    await asyncio.sleep(0)
    assert not running.done()  # nothing ends it before the stop
    stopping.set()
    # Cut short: its writes may still land, so the caller leaves the Lease to expire.
    assert await asyncio.wait_for(running, STEP_TIMEOUT_S) is True
    assert cancelled.is_set()

    async def ending() -> None:
        await asyncio.sleep(0)

    asked = asyncio.Event()
    asked.set()
    assert await actuator._until_stopped(ending(), asked) is False  # ended in time: released

    async def failing() -> None:
        raise lease.NotLeader("lost")

    with pytest.raises(lease.NotLeader):  # the loop's own failure is its caller's, as before
        await actuator._until_stopped(failing(), asyncio.Event())


# ---- the preemptor's nomination and its victims, in step ------------------------------------

SCHEDULER = "preemptctl-scheduler"
# How the preemptor stands when the decision is handled; "-after-read": it changes between
# the actuator's read of it and its nomination (kube-scheduler binds it, or it is replaced).
PREEMPTOR_STATES = (
    "ok",
    "gone",
    "recreated",
    "bound",
    "other-scheduler",
    "gone-after-read",
    "recreated-after-read",
    "bound-after-read",
)
# "marked": the decision says it is terminating; "disruption-target": DisruptionTarget=True
# already (an eviction that did not go through), still running.
VICTIM_STATES = ("running", "running", "gone", "recreated", "terminating", "marked", "disruption-target")
ACTIONS = ("delete", "evict", "label")
# Request latencies (s) drawn per request kind: the concurrent requests land in every order.
DELAYS = (0.0, 0.0, 0.002, 0.006)
REQUEST_KINDS = ("GET", "PATCH", "DELETE", "POST")


@st.composite
def in_step_cases(draw: st.DrawFn) -> tuple[str, list[tuple[str, str]], dict[tuple[str, str], float]]:
    preemptor = draw(st.sampled_from(PREEMPTOR_STATES))
    victims = draw(
        st.lists(st.tuples(st.sampled_from(VICTIM_STATES), st.sampled_from(ACTIONS)), min_size=1, max_size=5)
    )
    names = ["high", *(f"v{i}" for i in range(len(victims)))]
    keys = [(method, name) for name in names for method in REQUEST_KINDS]
    delays = draw(st.lists(st.sampled_from(DELAYS), min_size=len(keys), max_size=len(keys)))
    return preemptor, victims, dict(zip(keys, delays, strict=True))


def _expected(preemptor: str, state: str, action: str) -> str:
    """The reference: what one victim's outcome must be, whatever order the requests land in."""
    if preemptor in ("gone", "recreated", "bound", "other-scheduler"):
        return "error"  # refused on reading the preemptor: nothing is touched
    settled = {
        "marked": "already-terminating",
        "gone": "already-gone",
        "recreated": "uid-changed",
        "terminating": "already-terminating",
    }
    if state in settled:
        return settled[state]
    return "error" if preemptor.endswith("-after-read") else "done"


async def _in_step(
    preemptor: str, victims: list[tuple[str, str]], delays: dict[tuple[str, str], float]
) -> None:
    async with kmock.KubernetesScaffold() as handler, kmock.Server(handler) as server:
        served = api.for_host(str(server.url))
        try:
            await _in_step_on(FakeApi(handler, elastic_quotas=False), served, preemptor, victims, delays)
        finally:
            await served.close()


async def _in_step_on(
    fake: FakeApi,
    served: client.ApiClient,
    preemptor: str,
    victims: list[tuple[str, str]],
    delays: dict[tuple[str, str], float],
) -> None:
    fake.create("nodes", objects.node("n1"))
    high = fake.create(
        "pods", objects.pod("high", priority=1000, cpu="3", unschedulable=True, scheduler=SCHEDULER)
    )
    records = []
    for i, (state, action) in enumerate(victims):
        pod = fake.create("pods", objects.pod(f"v{i}", node="n1", grace=30))
        records.append(victim(pod, action, **({"terminating": True} if state == "marked" else {})))
        if state in ("gone", "recreated"):
            fake.remove("pods", "default", f"v{i}")
        if state == "recreated":
            fake.create("pods", objects.pod(f"v{i}", node="n1", grace=30))
        if state == "terminating":
            fake.modify(
                "pods", "default", f"v{i}", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}
            )
        if state == "disruption-target":
            condition = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
            fake.modify("pods", "default", f"v{i}", {"status": {"conditions": [condition]}})

    def change(how: str) -> None:
        if how in ("gone", "recreated"):
            fake.remove("pods", "default", "high")
        if how == "recreated":
            fake.create("pods", objects.pod("high", priority=1000, cpu="3", scheduler=SCHEDULER))
        if how == "bound":
            fake.modify("pods", "default", "high", {"spec": {"nodeName": "n2"}})
        if how == "other-scheduler":
            fake.modify("pods", "default", "high", {"spec": {"schedulerName": "default-scheduler"}})

    change(preemptor)

    async def before(call: Any) -> None:
        if preemptor.endswith("-after-read") and (call.name, call.subresource) == ("high", "status"):
            change(preemptor.removesuffix("-after-read"))  # between its read and its nomination
        await asyncio.sleep(delays.get((call.method, str(call.name)), 0.0))

    fake.before = before
    act, sink = make(served, scope=(SCHEDULER,))
    await act.handle(orjson.dumps(decision(high, records)), key=None, origin=ORIGIN)

    found = outcomes(sink)
    assert sorted(found) == [f"v{i}" for i in range(len(victims))]  # one outcome each
    refused = preemptor in ("gone", "recreated", "bound", "other-scheduler")
    race = preemptor.endswith("-after-read")
    (event,) = outcome_events(sink)
    said = {"ok": "done", "other-scheduler": "out-of-scope"}.get(
        preemptor, preemptor.removesuffix("-after-read")
    )
    assert event["outcome"]["nomination"] == said
    if refused:
        assert fake.writes() == []
    history = [(rv, e["object"]) for rv, plural, e in fake.history if plural == "pods"]
    nominated = [
        rv for rv, o in history if o["metadata"]["name"] == "high" and o["status"].get("nominatedNodeName")
    ]
    assert bool(nominated) == (not refused and not race)
    for i, (state, action) in enumerate(victims):
        name = f"v{i}"
        outcome = found[name]
        assert outcome["result"] == _expected(preemptor, state, action), (name, state, action, outcome)
        if outcome["result"] == "error" and not (action == "delete" and race and state == "running"):
            assert outcome["message"].endswith(eviction.UNTOUCHED), outcome
        if state not in ("running", "disruption-target"):
            continue
        pod = fake.get("pods", "default", name)
        assert pod is not None
        leaving = bool(pod["metadata"].get("deletionTimestamp"))
        target = [c for c in (pod["status"].get("conditions") or []) if c["type"] == "DisruptionTarget"]
        labelled = eviction.SOFT_EVICTION in (pod["metadata"].get("labels") or {})
        acted = outcome["result"] == "done"
        assert leaving == (acted and action != "label") and labelled == (acted and action == "label")
        if acted:
            # Deleted, evicted or labelled only once its preemptor was nominated.
            first = min(
                rv
                for rv, o in history
                if o["metadata"]["name"] == name
                and (
                    o["metadata"].get("deletionTimestamp")
                    or eviction.SOFT_EVICTION in o["metadata"]["labels"]
                )
            )
            assert first > nominated[0]
        if state == "disruption-target":
            assert [(c["status"], c["reason"]) for c in target] == [("True", "EvictionByEvictionAPI")]
        elif action == "delete" and acted:
            assert [(c["status"], c["reason"]) for c in target] == [("True", "PreemptionByScheduler")]
        elif action == "delete" and race:
            # Marked while its preemptor was nominated, the nomination failed: unmarked, not deleted.
            assert [(c["status"], c["reason"]) for c in target] == [("False", eviction.WITHDRAWN_REASON)]
            assert "DisruptionTarget withdrawn" in outcome["message"]
        else:
            assert target == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=in_step_cases())
def test_victims_move_in_step_with_their_preemptors_nomination(
    case: tuple[str, list[tuple[str, str]], dict[tuple[str, str], float]],
) -> None:
    """The victims are read while the preemptor is, marked while it is nominated, acted on once it
    is: whatever order the requests land in, each victim's outcome and final state are the
    reference's, no victim is touched for a preemptor refused on reading, none is deleted,
    evicted or labelled before the nomination, and one marked for a nomination that then fails
    is unmarked and kept."""
    asyncio.run(_in_step(*case))

"""The source against a kmock API server: list, watch, 410, ticks, backoff, scope, batching.

Bookmarks, list-then-watch order and 410 after a real compaction are tested
against a real kube-apiserver in tests/k8s/test_real_api.py.

The first two scenarios write to a real (embedded tansu) broker and read the
topic back; the rest capture records in memory, which is the same code path
behind the sink.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from kubernetes_asyncio import client

from streams.common.backoff import Backoff
from streams.kafka import topics
from streams.kafka.sink import KafkaSink, MemorySink
from streams.kube import api as kube
from streams.kube import lease, source
from streams.kube.publisher import Publisher
from tests.k8s import objects
from tests.k8s.cluster_events import (
    STEP_TIMEOUT_S,
    Event,
    read_topic,
    running,
)
from tests.k8s.fakeapi import KINDS, FakeApi
from tests.support.topics import fresh_topic

SCHEMA = json.loads((Path(source.__file__).parents[2] / "schemas" / "cluster-events.schema.json").read_text())
PLURALS = {k.kind: plural for plural, k in KINDS.items()}


def seed(fake: FakeApi) -> None:
    fake.create("nodes", objects.node("n1"))
    fake.create("nodes", objects.node("n2"))
    fake.create("priorityclasses", objects.priority_class("high", 1000))
    fake.create("poddisruptionbudgets", objects.pdb("web"))
    fake.create("elasticquotas", objects.elastic_quota("team"))
    fake.create("pods", objects.pod("a", node="n1", labels={"app": "web"}))
    fake.create("pods", objects.pod("b", node="n2"))
    fake.create("pods", objects.pod("c", node="n2"))


def memory_events(sink: MemorySink) -> list[Event]:
    return [e for r in sink.records for e in orjson.loads(r.value)["events"]]


async def wait_events(sink: MemorySink, until: Callable[[list[Event]], bool]) -> list[Event]:
    await sink.wait_for(lambda _: until(memory_events(sink)), timeout=STEP_TIMEOUT_S)
    return memory_events(sink)


async def watching(fake: FakeApi, plural: str) -> None:
    """Wait until the source has a watch open on `plural`."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while not fake.open_watches(plural):
        assert time.monotonic() < deadline, f"no watch on {plural}"
        await asyncio.sleep(0.01)


def names(events: list[Event], event_type: str | None = None) -> list[tuple[str, str]]:
    return [
        (e["object"]["kind"], e["object"]["metadata"]["name"])
        for e in events
        if "object" in e and (event_type is None or e["type"] == event_type)
    ]


def deleted(name: str) -> Callable[[list[Event]], bool]:
    return lambda events: ("Pod", name) in names(events, "DELETED")


# ---- through a real broker ------------------------------------------------------------


async def test_initial_list_and_watch_reach_the_log(
    served: tuple[FakeApi, client.ApiClient], tansu: str
) -> None:
    fake, api = served
    seed(fake)
    topic = fresh_topic("cluster-events")
    await topics.ensure_topics(tansu, [topics.TopicSpec(topic)])
    async with (
        KafkaSink(tansu) as sink,
        running(api, sink, scope=source.Scope(cluster="prod-eu1"), topic=topic),
    ):
        fake.create("pods", objects.pod("d", node="n1"))
        fake.modify("pods", "default", "d", {"status": {"phase": "Succeeded"}})
        fake.remove("pods", "default", "d")
        events, raw = await read_topic(tansu, topic, deleted("d"))

    listed = {
        ("Node", "n1"), ("Node", "n2"), ("PriorityClass", "high"), ("PodDisruptionBudget", "web"),
        ("ElasticQuota", "team"), ("Pod", "a"), ("Pod", "b"), ("Pod", "c"),
    }  # fmt: skip
    assert events[0]["type"] == "RESYNC" and "object" not in events[0]
    initial = events[1 : 1 + len(listed)]
    assert {e["type"] for e in initial} == {"ADDED"}
    assert set(names(initial)) == listed
    # Nodes come before pods, so a relist restates capacity before what uses it.
    assert names(initial).index(("Node", "n1")) < names(initial).index(("Pod", "a"))
    for event in initial:
        obj = event["object"]
        held = fake.get(PLURALS[obj["kind"]], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        assert held is not None
        assert obj["apiVersion"] and obj["metadata"]["uid"] == held["metadata"]["uid"]
        assert obj["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events[1 + len(listed) :]] == [
        ("ADDED", "d"),
        ("MODIFIED", "d"),
        ("DELETED", "d"),
    ]
    assert events[-2]["object"]["status"]["phase"] == "Succeeded"  # the raw object, as the API sent it
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    for key, value in raw:
        assert key == b"prod-eu1"
        record = orjson.loads(value)
        jsonschema.validate(record, SCHEMA)
        assert record["v"] == 1 and record["cluster"] == "prod-eu1"


# ---- in memory ------------------------------------------------------------------------


async def test_ticks_advance_the_clock_while_idle(served: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api = served
    seed(fake)
    sink = MemorySink()
    async with running(api, sink, tick_seconds=0.05):
        events = await wait_events(sink, lambda evs: [e["type"] for e in evs].count("TICK") >= 3)
    ticks = [e for e in events if e["type"] == "TICK"]
    assert all("object" not in e for e in ticks)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    # Idle: one event per record.
    assert all(len(orjson.loads(r.value)["events"]) == 1 for r in sink.records[-3:])


async def test_api_errors_back_off_then_recover(served: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api = served
    seed(fake)
    fake.fail("GET", "pods", 500, times=3)
    delays: list[float] = []

    class Recording(Backoff):
        def delay(self) -> float:
            delays.append(super().delay())
            return delays[-1]

    sink = MemorySink()
    async with running(api, sink, backoff=lambda: Recording(initial_s=0.01, max_s=1.0, jitter=0.0)):
        fake.fail("GET", "nodes", 503)  # a watch failing later is retried too
        fake.create("pods", objects.pod("h", node="n1"))
        events = await wait_events(sink, lambda evs: ("Pod", "h") in names(evs))
    assert [round(d, 3) for d in delays[:3]] == [0.01, 0.02, 0.04]  # exponential
    assert len([c for c in fake.calls if c.plural == "pods" and "watch" not in c.params]) == 4
    assert ("Pod", "a") in names(events, "ADDED")


async def test_without_the_elastic_quota_crd(served_without_quotas: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api = served_without_quotas
    fake.create("nodes", objects.node("n1"))
    fake.create("pods", objects.pod("a", node="n1"))
    sink = MemorySink()
    async with running(api, sink):
        events = memory_events(sink)
    assert names(events) == [("Node", "n1"), ("Pod", "a")]
    assert not [c for c in fake.calls if c.plural == "elasticquotas"]


async def test_quota_crd_installed_later_is_noticed(
    served_without_quotas: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, api = served_without_quotas
    fake.create("nodes", objects.node("n1"))
    fake.create("elasticquotas", objects.elastic_quota("team"))
    sink = MemorySink()
    async with running(api, sink, crd_recheck_s=0.05):
        assert ("ElasticQuota", "team") not in names(memory_events(sink))
        fake.serve("elasticquotas")
        events = await wait_events(sink, lambda evs: ("ElasticQuota", "team") in names(evs))
    assert [e["type"] for e in events].count("RESYNC") == 2


async def test_scope_namespaces_selector_and_scheduler(served: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api = served
    fake.create("nodes", objects.node("n1"))
    fake.create("poddisruptionbudgets", objects.pdb("web", namespace="team-a"))
    fake.create("poddisruptionbudgets", objects.pdb("web", namespace="team-b"))
    batch = {"tier": "batch"}
    fake.create("pods", objects.pod("mine", namespace="team-a", scheduler="batch", labels=batch))
    fake.create("pods", objects.pod("theirs", namespace="team-a", labels=batch))  # default-scheduler, pending
    fake.create("pods", objects.pod("bound", namespace="team-a", node="n1", labels=batch))
    fake.create("pods", objects.pod("unlabelled", namespace="team-a", node="n1"))
    fake.create("pods", objects.pod("elsewhere", namespace="team-b", node="n1", labels=batch))
    scope = source.Scope(namespaces=("team-a",), label_selector="tier=batch", scheduler_name="batch")
    sink = MemorySink()
    async with running(api, sink, scope=scope):
        initial = names(memory_events(sink))
        # kube-scheduler binds its pod: it now uses capacity, so it enters the log as ADDED.
        fake.modify("pods", "team-a", "theirs", {"spec": {"nodeName": "n1"}})
        events = await wait_events(sink, lambda evs: ("Pod", "theirs") in names(evs))
    assert sorted(initial) == [
        ("Node", "n1"),
        ("Pod", "bound"),
        ("Pod", "mine"),
        ("PodDisruptionBudget", "web"),
    ]
    assert events[-1]["type"] == "ADDED" and events[-1]["object"]["metadata"]["name"] == "theirs"
    paths = {(c.plural, c.namespace) for c in fake.calls}
    assert ("pods", "team-a") in paths and ("pods", None) not in paths and ("nodes", None) in paths
    assert all(c.params.get("labelSelector") == "tier=batch" for c in fake.calls if c.plural == "pods")


async def test_lists_are_paginated(served: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api = served
    fake.create("nodes", objects.node("n1"))
    for i in range(7):
        fake.create("pods", objects.pod(f"p{i}", node="n1"))
    sink = MemorySink()
    async with running(api, sink, page_size=3):
        events = memory_events(sink)
    assert sorted(n for k, n in names(events) if k == "Pod") == [f"p{i}" for i in range(7)]
    pages = [c for c in fake.calls if c.plural == "pods" and "watch" not in c.params]
    assert [c.params.get("continue") for c in pages] == [None, "3", "6"]


# ---- batching -------------------------------------------------------------------------


class SlowSink(MemorySink):
    """A sink whose writes take a while, as a broker's round trip does."""

    async def send(self, topic: str, value: bytes, *, key: bytes | None = None, headers: Any = ()) -> None:
        await asyncio.sleep(0.002)
        await super().send(topic, value, key=key, headers=headers)


async def test_publisher_batches_under_load_and_not_when_idle() -> None:
    sink = SlowSink()
    publisher = Publisher(sink, cluster="c", max_record_bytes=4096)
    task = asyncio.create_task(publisher.run())
    try:
        for i in range(1000):
            await publisher.put({"ts": "2026-01-01T00:00:00Z", "type": "TICK", "i": i})
        await asyncio.wait_for(publisher.flush(), STEP_TIMEOUT_S)
        loaded = list(sink.records)
        await publisher.put({"ts": "2026-01-01T00:00:01Z", "type": "TICK", "i": 1000})
        await asyncio.wait_for(publisher.flush(), STEP_TIMEOUT_S)
    finally:
        task.cancel()
    batches = [orjson.loads(r.value) for r in loaded]
    assert [e["i"] for b in batches for e in b["events"]] == list(range(1000))  # in order, none lost
    assert len(batches) < 100 and all(len(r.value) <= 4096 + 64 for r in loaded)
    assert len(orjson.loads(sink.records[-1].value)["events"]) == 1
    assert {r.key for r in sink.records} == {b"c"}


# ---- the single-writer Lease ------------------------------------------------------------


async def test_a_write_the_lease_check_refused_is_restated_by_a_relist(
    served: tuple[FakeApi, client.ApiClient], caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal that comes late (a slow API server) leaves the holder less validity than a write
    needs, without losing the Lease: the publisher refuses the record in hand. If the renewal then
    lands, the source is leader again and goes on writing, so the refused events must come back
    through a relist (RESYNC restates the cluster); otherwise the log silently lacks them."""
    fake, api = served
    fake.create("nodes", objects.node("n1"))
    clock = [0.0]
    # One round at start, none during the test: the test renews by hand.
    elector = lease.LeaseElector(
        api, name="src", namespace="default", identity="me", retry_period_s=9.0, monotonic=lambda: clock[0]
    )
    sink = MemorySink()
    caplog.set_level(logging.WARNING, logger="streams.kube.publisher")
    async with running(api, sink, elector=elector):
        # Still the holder, but with less validity left than one write's timeout.
        clock[0] = lease.RENEW_DEADLINE_S - kube.WRITE_TIMEOUT_S + 1.0
        assert elector.is_leader()
        fake.create("pods", objects.pod("refused", node="n1"))
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while "not writing" not in caplog.text:
            assert time.monotonic() < deadline, "the publisher never met the Lease check"
            await asyncio.sleep(0.005)
        assert await elector.try_acquire_or_renew()  # the late renewal lands
        fake.create("pods", objects.pod("after", node="n1"))
        events = await wait_events(sink, lambda evs: ("Pod", "after") in names(evs))
        events = await wait_events(sink, lambda evs: ("Pod", "refused") in names(evs))
    # A RESYNC stands between the gap and anything written after it.
    gap = max(i for i, e in enumerate(events) if e["type"] == "RESYNC")
    assert gap > 0 and ("Pod", "refused") in names(events[gap:])


async def test_a_watch_that_ends_at_once_is_retried_with_backoff(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """A watch answered 200 and closed at once with nothing in it (a proxy or load balancer cutting
    streams, an API server shutting down) is a fault: resumed at once it would loop as fast as the
    server answers. Like client-go's "very short watch", it backs off."""
    fake, api = served
    fake.create("nodes", objects.node("n1"))
    sink = MemorySink()

    def backoff() -> Backoff:
        return Backoff(initial_s=0.1, max_s=0.4, jitter=0.0)

    fake.short_watches = True
    async with running(api, sink, backoff=backoff):
        before = len([c for c in fake.calls if c.plural == "nodes" and "watch" in c.params])
        await asyncio.sleep(1.0)
        watches = len([c for c in fake.calls if c.plural == "nodes" and "watch" in c.params]) - before
        fake.short_watches = False
        fake.create("pods", objects.pod("later", node="n1"))  # and it still follows afterwards
        await wait_events(sink, lambda evs: ("Pod", "later") in names(evs))
    # 0.1 + 0.2 + 0.4 + 0.4: about 4 in a second (as fast as the server answers without the backoff).
    assert 1 <= watches <= 8, watches


async def test_an_object_too_large_for_a_record_does_not_stop_the_log(
    served: tuple[FakeApi, client.ApiClient], tansu: str
) -> None:
    """A pod whose JSON exceeds what the producer may send (2 MiB: env values, command lines; an
    object at etcd's 1.5 MiB limit grows in JSON) must not stop the log: the producer would refuse
    the record for good, and retrying it forever would hold back every event after it. Its
    projection, without those fields, is what is written, and the log goes on."""
    fake, api = served
    fake.create("nodes", objects.node("n1"))
    big = objects.pod("big", node="n1")
    big["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": '"' * 1024} for i in range(1300)]
    topic = fresh_topic("cluster-events")
    await topics.ensure_topics(tansu, [topics.TopicSpec(topic)])
    async with KafkaSink(tansu) as sink, running(api, sink, topic=topic):
        fake.create("pods", big)
        fake.create("pods", objects.pod("after", node="n1"))
        events, _ = await read_topic(tansu, topic, lambda evs: ("Pod", "after") in names(evs))
    (written,) = [e["object"] for e in events if e.get("object", {}).get("metadata", {}).get("name") == "big"]
    container = written["spec"]["containers"][0]
    assert "env" not in container and container["resources"] == big["spec"]["containers"][0]["resources"]


async def test_an_object_too_large_even_projected_is_left_out_and_its_deletion_is_a_tombstone(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """What the projection cannot shrink (labels, say) is left out, counted, and the log goes on;
    the deletion of such an object still reaches the log, as its tombstone."""
    fake, api = served
    fake.create("nodes", objects.node("n1"))
    huge = objects.pod("huge", node="n1", labels={f"k{i}": "v" * 60 for i in range(100)})
    sink = MemorySink()
    dropped = source.OVERSIZED.labels("Pod", "dropped")._value.get()
    async with running(api, sink, max_event_bytes=4096):
        fake.create("pods", huge)
        fake.create("pods", objects.pod("after", node="n1"))
        await wait_events(sink, lambda evs: ("Pod", "after") in names(evs))
        fake.remove("pods", "default", "huge")
        events = await wait_events(sink, deleted("huge"))
    assert ("Pod", "huge") not in names(events, "ADDED")
    assert source.OVERSIZED.labels("Pod", "dropped")._value.get() == dropped + 1
    (tombstone,) = [e["object"] for e in events if e["type"] == "DELETED"]
    assert set(tombstone["metadata"]) == {"name", "namespace", "uid", "resourceVersion"}

"""Issue 29, deliverable 3: freshness. The actuator keeps each cluster's chain head (the last
record's `seq` and `hash`, in the ledger), and dead-letters a record that does not link to it or
goes back; a redelivery of what it already acted on stays idempotent. A `preempt` older than
the age bound is refused, and so is one superseded by a later decision for its preemptor.

Every record here is signed with the accepted key: these are replays and re-orderings of real
decisions, which a signature does not stop.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from kubernetes_asyncio import client

from engine import timeutil
from schemas import chain
from schemas.records import VictimRecord
from streams.cli import actuator as actuator_cli
from streams.kafka import topics as kafka_topics
from streams.kafka.sink import MemorySink
from streams.kube import actuator, eviction
from streams.kube.actuator import Actuator, Freshness, Topics
from streams.kube.ledger import Ledger
from tests.k8s.decisions import (
    FAST,
    KEY,
    ORIGIN,
    SCHEDULER,
    STEP_TIMEOUT_S,
    OneBatchConsumer,
    cluster,
    decision,
    outcome_events,
    outcomes,
    pod_writes,
    produce,
    victim,
    wait_until,
)
from tests.k8s.fakeapi import FakeApi
from tests.support.topics import fresh_topic

TS = "2026-01-01T00:00:00Z"
NOW = timeutil.parse(TS) / timeutil.SECOND + 10  # the actuator's clock: 10 s after the decisions


def make(
    api_client: client.ApiClient, ledger: Ledger | None = None, *, now: float = NOW, **fresh: Any
) -> tuple[Actuator, MemorySink]:
    sink = MemorySink()
    actions = eviction.Actions(api_client, identity="test", retry=FAST)
    freshness = Freshness(clock=lambda: now, **fresh)
    act = Actuator(
        actions,
        sink,
        ledger if ledger is not None else Ledger(),
        hmac_key=KEY,
        scope=(SCHEDULER,),
        freshness=freshness,
    )
    return act, sink


def after(prev: dict[str, Any] | None, pods: dict[str, Any], victims: list[VictimRecord], *,
          seq: int, name: str, preemptor: str = "high", **fields: Any) -> dict[str, Any]:  # fmt: skip
    """A decision at `seq` continuing the chain from `prev` (from genesis when None)."""
    record = decision(pods[preemptor], victims, decision_id=f"default/{seq}/{name}", seq=seq, ts=TS, **fields)
    return chain.seal(record, prev["hash"] if prev else chain.GENESIS, KEY)


async def handle(act: Actuator, record: dict[str, Any], cluster_name: str = "default") -> None:
    await act.handle(orjson.dumps(record), key=cluster_name.encode(), origin=ORIGIN)


def dead(sink: MemorySink) -> list[bytes]:
    return [dict(r.headers)["error-class"] for r in sink.on("preemption.dead-letter")]


def evicted(fake: FakeApi) -> list[str | None]:
    return [c.name for c in fake.writes() if c.plural == "pods" and c.subresource == "eviction"]


# ---- the chain ----------------------------------------------------------------------------------


async def test_a_record_that_does_not_link_or_goes_back_is_dead_lettered(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """Issue 29, 4: a record linking to nothing at seq 999999, and an old record re-produced, are
    dead-lettered without a call to the API; the chain goes on from the last record accepted."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    first = after(None, pods, [victim(pods["v-evict"], "evict")], seq=10, name="a")
    await handle(act, first)
    assert evicted(fake) == ["v-evict"]
    unlinked = after(None, pods, [victim(pods["v-delete"], "delete")], seq=999_999, name="b")
    unlinked["prevHash"] = "f" * 64
    chain.seal(unlinked, unlinked["prevHash"], KEY)
    writes = len(fake.writes())
    await handle(act, unlinked)
    assert dead(sink) == [b"OutOfChain"] and len(fake.writes()) == writes
    assert (
        b"is not the hash of the last record accepted"
        in dict(sink.on("preemption.dead-letter")[0].headers)["error"]
    )
    second = after(first, pods, [victim(pods["v-label"], "label")], seq=11, name="c")
    await handle(act, second)
    assert set(outcomes(sink)) == {"v-evict", "v-label"}
    # An older decision, re-produced (it never ran: a new victim), goes back: dead-lettered.
    older = after(None, pods, [victim(pods["v-delete"], "delete")], seq=5, name="old")
    writes = len(fake.writes())
    await handle(act, older)
    assert dead(sink) == [b"OutOfChain", b"OutOfChain"] and len(fake.writes()) == writes
    # Equal seq is legitimate when it links (one event decided for several pods).
    sibling = after(second, pods, [], seq=11, name="d", outcome="wait", node=None)
    sibling.pop("node")
    chain.seal(sibling, second["hash"], KEY)
    await handle(act, sibling)
    assert dead(sink) == [b"OutOfChain", b"OutOfChain"]


async def test_a_redelivery_after_a_crash_is_idempotent_not_a_replay(
    served: tuple[FakeApi, client.ApiClient], tmp_path: Path
) -> None:
    """The head is in the ledger file and read back at start. The record handled when the
    actuator crashed (its offset not committed) comes again: it is carried on (the victim our
    eviction took is done), not dead-lettered; an earlier record whose outcomes are all
    recorded, redelivered, is a duplicate; a record going back that never ran is refused."""
    fake, api_client = served
    pods = cluster(fake)
    path = tmp_path / "ledger.jsonl"
    first = after(None, pods, [victim(pods["v-label"], "label")], seq=1, name="a")
    crashed = after(first, pods, [victim(pods["v-evict"], "evict")], seq=2, name="b")

    class Crash(OSError):  # what the loop retries (a broker away): the record is not committed
        pass

    class CrashingSink(MemorySink):
        async def send(
            self, topic: str, value: bytes, *, key: bytes | None = None, headers: Any = ()
        ) -> None:
            if topic == "preemption.evictions" and b"v-evict" in value:
                raise Crash("killed between the eviction and its outcome record")
            await super().send(topic, value, key=key, headers=headers)

    act, _ = make(api_client, Ledger(path))
    act._sink = CrashingSink()
    await handle(act, first)
    with pytest.raises(Crash):
        await handle(act, crashed)
    act._ledger.close()
    assert evicted(fake) == ["v-evict"]

    ledger = Ledger(path)
    head = ledger.head("default")
    assert head is not None and head.seq == 2 and head.hash == crashed["hash"]
    restarted, sink = make(api_client, ledger)
    await handle(restarted, crashed)  # the redelivery
    assert dead(sink) == []
    assert outcomes(sink)["v-evict"]["result"] == "done" and evicted(fake) == ["v-evict"]
    await handle(restarted, first)  # an earlier one, every outcome recorded: a duplicate
    assert dead(sink) == [] and [e["outcome"]["decisionId"] for e in outcome_events(sink)][-1] == first["id"]
    never_ran = after(None, pods, [victim(pods["v-delete"], "delete")], seq=1, name="z")
    await handle(restarted, never_ran)
    assert dead(sink) == [b"OutOfChain"] and evicted(fake) == ["v-evict"]


async def test_the_record_in_hand_redelivered_without_a_restart_is_carried_on(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """Its offset's commit failed (the broker away): the consumer reads it again in the same
    process, where every record must link. It is the head itself: handled idempotently."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    first = after(None, pods, [victim(pods["v-label"], "label")], seq=1, name="a")
    second = after(first, pods, [victim(pods["v-evict"], "evict")], seq=2, name="b")
    for record in (first, second, second):
        await handle(act, record)
    assert dead(sink) == [] and evicted(fake) == ["v-evict"]
    assert [e["outcome"]["decisionId"] for e in outcome_events(sink)] == [
        first["id"],
        second["id"],
        second["id"],
    ]


class _Config:
    def __init__(self, consumer: OneBatchConsumer) -> None:
        self._consumer = consumer

    def consumer(self, *topics: str, **options: Any) -> OneBatchConsumer:
        return self._consumer


async def test_a_new_consumer_may_follow_records_another_actuator_handled(
    served: tuple[FakeApi, client.ApiClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one consumer reads, every record must link; a consumer started again (the Lease
    taken back, a broker failure) may first read a record following ones it never saw."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)

    async def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(actuator.connection, "of", lambda kafka: kafka)
    monkeypatch.setattr(actuator.connection, "start", nothing)
    monkeypatch.setattr(actuator, "_close", nothing)
    first = after(None, pods, [victim(pods["v-label"], "label")], seq=1, name="a")
    gap = after(None, pods, [victim(pods["v-evict"], "evict")], seq=9, name="b")
    gap["prevHash"] = "9" * 64  # 2-8 were handled by the other actuator
    chain.seal(gap, gap["prevHash"], KEY)
    for records in ([first, gap], [gap]):
        stopping = asyncio.Event()
        consumer = OneBatchConsumer([orjson.dumps(r) for r in records], stopping)
        await asyncio.wait_for(
            act._consume_once(
                cast(Any, _Config(consumer)), group_id="g", stopping=stopping, session_timeout_ms=6000
            ),
            30,
        )
    # The first consumer: the gap does not link; the second: it is the first record read.
    assert dead(sink) == [b"OutOfChain"] and evicted(fake) == ["v-evict"]


async def test_the_first_record_after_a_start_need_not_link_but_must_not_go_back(
    served: tuple[FakeApi, client.ApiClient], tmp_path: Path
) -> None:
    """An empty ledger: the first record is accepted whatever it links to (the age bound guards
    it). After a restart, the first record may follow records another actuator handled (the
    Lease moved): it must not go back, and from then on every record must link."""
    fake, api_client = served
    pods = cluster(fake)
    path = tmp_path / "ledger.jsonl"
    act, sink = make(api_client, Ledger(path))
    mid = after(None, pods, [victim(pods["v-label"], "label")], seq=40, name="a")
    mid["prevHash"] = "a" * 64
    chain.seal(mid, mid["prevHash"], KEY)
    await handle(act, mid)
    assert dead(sink) == [] and set(outcomes(sink)) == {"v-label"}
    act._ledger.close()

    restarted, sink = make(api_client, Ledger(path))
    back = after(None, pods, [victim(pods["v-delete"], "delete")], seq=39, name="b")
    back["prevHash"] = "b" * 64
    chain.seal(back, back["prevHash"], KEY)
    await handle(restarted, back)
    assert dead(sink) == [b"OutOfChain"]
    gap = after(None, pods, [victim(pods["v-evict"], "evict")], seq=55, name="c")
    gap["prevHash"] = "c" * 64  # records 41-54 were handled by the other actuator
    chain.seal(gap, gap["prevHash"], KEY)
    await handle(restarted, gap)
    assert dead(sink) == [b"OutOfChain"] and set(outcomes(sink)) == {"v-evict"}
    unlinked = after(None, pods, [victim(pods["v-delete"], "delete")], seq=56, name="d")
    unlinked["prevHash"] = "d" * 64
    chain.seal(unlinked, unlinked["prevHash"], KEY)
    await handle(restarted, unlinked)
    assert dead(sink) == [b"OutOfChain", b"OutOfChain"]


async def test_each_cluster_has_its_own_chain(
    served: tuple[FakeApi, client.ApiClient], tmp_path: Path
) -> None:
    """Records of another cluster, interleaved on the topic, neither break this cluster's chain
    nor move its head; the ledger keeps each cluster's head."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client, Ledger(tmp_path / "ledger.jsonl"))
    first = after(None, pods, [victim(pods["v-evict"], "evict")], seq=1, name="a")
    theirs = after(None, pods, [victim(pods["v-delete"], "delete")], seq=7, name="x", cluster="other")
    second = after(first, pods, [victim(pods["v-label"], "label")], seq=2, name="b")
    for record, name in ((first, "default"), (theirs, "other"), (second, "default")):
        await handle(act, record, name)
    assert dead(sink) == [] and set(outcomes(sink)) == {"v-evict", "v-label"}
    head = act._ledger.head("default")
    assert head is not None and head.hash == second["hash"] and act._ledger.head("other") is None
    act._ledger.close()
    ledger = Ledger(tmp_path / "two.jsonl")
    ledger.set_head("default", 2, "1" * 64)
    ledger.set_head("other", 9, "2" * 64)
    ledger.set_head("default", 3, "3" * 64)
    ledger.close()
    again = Ledger(tmp_path / "two.jsonl")
    assert again.head("default") == (3, "3" * 64) and again.head("other") == (9, "2" * 64)
    assert len((tmp_path / "two.jsonl").read_bytes().splitlines()) == 2  # compacted


# ---- age and superseding ------------------------------------------------------------------------


async def test_a_preempt_older_than_the_bound_is_refused(served: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client, now=NOW - 10 + 301)  # 301 s after the decision
    old = after(None, pods, [victim(pods["v-evict"], "evict")], seq=1, name="a")
    await handle(act, old)
    assert pod_writes(fake) == []
    (event,) = outcome_events(sink)
    assert "decided at 2026-01-01T00:00:00Z, 301 s ago, more than the 300 s" in event["outcome"]["message"]
    assert outcomes(sink)["v-evict"]["result"] == "error"
    # Within the bound (a shorter one configured): acted on.
    act, sink = make(api_client, now=NOW - 10 + 299)
    await handle(act, after(None, pods, [victim(pods["v-evict"], "evict")], seq=2, name="b"))
    assert outcomes(sink)["v-evict"]["result"] == "done"


async def test_a_started_decision_is_carried_on_whatever_its_age(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """A decision the actuator began before a crash (a victim pending in the ledger) is not
    refused as stale when it comes again: its victims' outcomes say what was done."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client, now=NOW + 3600)
    record = after(None, pods, [victim(pods["v-evict"], "evict")], seq=1, name="a")
    act._ledger.mark_pending((record["id"], pods["v-evict"]["metadata"]["uid"]))
    await handle(act, record)
    assert outcomes(sink)["v-evict"]["result"] == "done"


async def test_a_later_decision_for_the_same_preemptor_supersedes_an_earlier_one(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """Issue 29, 4: a re-decision (seq 30, node n2) fetched behind an earlier, unexecuted one
    (seq 10, node n1): the earlier is refused (no victim of it touched), the later acted on."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    earlier = after(None, pods, [victim(pods["v-evict"], "evict")], seq=10, name="a")
    later = after(earlier, pods, [victim(pods["elsewhere"], "evict", node="n2")], seq=30, name="b", node="n2")
    stopping = asyncio.Event()
    consumer = OneBatchConsumer([orjson.dumps(r) for r in (earlier, later)], stopping)
    await asyncio.wait_for(act._poll(cast(Any, consumer), stopping), 30)
    assert consumer.commits == [1, 2] and dead(sink) == []
    assert evicted(fake) == ["elsewhere"]
    first, second = outcome_events(sink)
    assert "superseded by a later decision for default/high (seq 30)" in first["outcome"]["message"]
    assert second["outcome"]["decisionId"] == later["id"] and "message" not in second["outcome"]


async def test_a_later_decision_far_behind_in_the_log_supersedes_too(
    served: tuple[FakeApi, client.ApiClient], broker: str
) -> None:
    """The later decision waits 3 * MAX_POLL_RECORDS records behind the earlier one, in the real
    topic: not in the batch being handled. The look-ahead reads on to the log's end, so the
    earlier decision is still refused as superseded (before it, only a later decision fetched in
    the same batch of MAX_POLL_RECORDS superseded)."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    act.topics = Topics(fresh_topic("decisions"), fresh_topic("evictions"), fresh_topic("dead-letter"))
    await kafka_topics.ensure_topics(broker, [kafka_topics.TopicSpec(t) for t in vars(act.topics).values()])
    earlier = after(None, pods, [victim(pods["v-evict"], "evict")], seq=10, name="a")
    log, prev = [earlier], earlier
    for i in range(3 * actuator.MAX_POLL_RECORDS):  # decisions for another preemptor, in between
        prev = after(prev, pods, [], seq=11 + i, name=f"w{i}", preemptor="w-0", outcome="wait", node=None)
        prev.pop("node")
        log.append(chain.seal(prev, log[-1]["hash"], KEY))
    later = after(log[-1], pods, [victim(pods["elsewhere"], "evict", node="n2")], seq=90, name="b", node="n2")
    log.append(later)
    await produce(broker, act.topics.decisions, [orjson.dumps(r) for r in log])
    stopping = asyncio.Event()
    consuming = asyncio.create_task(
        act.consume(broker, group_id=fresh_topic("group"), stopping=stopping, session_timeout_ms=6000)
    )
    try:
        await wait_until(lambda: len(outcome_events(sink)) >= 2, "both preempt decisions handled")
    finally:
        stopping.set()
        await asyncio.wait_for(consuming, STEP_TIMEOUT_S)
    assert dead(sink) == [] and evicted(fake) == ["elsewhere"]
    first, second = outcome_events(sink)
    assert "superseded by a later decision for default/high (seq 90)" in first["outcome"]["message"]
    assert second["outcome"]["decisionId"] == later["id"]


async def test_a_decision_seen_later_is_not_superseded_by_a_forgery(
    served: tuple[FakeApi, client.ApiClient],
) -> None:
    """Only records that verify supersede: an unsigned one with a higher seq does not."""
    fake, api_client = served
    pods = cluster(fake)
    act, sink = make(api_client)
    real = after(None, pods, [victim(pods["v-evict"], "evict")], seq=10, name="a")
    forged = after(real, pods, [], seq=99, name="f", outcome="wait")
    forged.pop("sig")
    stopping = asyncio.Event()
    consumer = OneBatchConsumer([orjson.dumps(r) for r in (real, forged)], stopping)
    await asyncio.wait_for(act._poll(cast(Any, consumer), stopping), 30)
    assert evicted(fake) == ["v-evict"] and dead(sink) == [b"UnsignedDecision"]


def test_the_command_line_bounds_the_age() -> None:
    parser = argparse.ArgumentParser()
    actuator_cli.register(parser.add_subparsers())
    args = parser.parse_args(["actuator"])
    assert args.max_decision_age == actuator.DEFAULT_MAX_DECISION_AGE_S == 300
    assert parser.parse_args(["actuator", "--max-decision-age", "0"]).max_decision_age == 0
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(SystemExit):
            parser.parse_args(["actuator", "--max-decision-age", bad])

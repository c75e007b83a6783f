"""Issue 33: every Kafka failure in the worker's timers and loops, the exit codes, and a re-created topic.

The rule (docs/topics.md, "Progress"): a Kafka client that fails, in a timer, a
rebalance callback or the agent, leaves the process unready and trying again,
or ends it with a documented exit code; never an exception that escapes into
faust (which crashed the app with exit 1 when a SASL password was rotated).
Each test drives the code path with a fake client that raises, the way a
PartitionReader or an admin client does when new connections are refused
(BrokerUnreachable, from connection.start).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from engine.config import Config
from fold import fleet
from schemas import records
from streams.brokers import process
from streams.common.health import Health
from streams.kafka import connection
from streams.kafka.memory import MemoryBroker
from streams.pipeline import app as app_mod
from streams.pipeline import checkpoint, outbox, recovery, worker
from streams.pipeline import partitions as partitions_mod
from streams.pipeline.partitions import Partitions
from streams.sim import simulator, traces
from tests.support.memory_pipeline import Pipeline, batches

REFUSED = connection.BrokerUnreachable(
    "cannot connect to Kafka at 127.0.0.1:9 (SASL_SSL): Authentication failed", auth=True
)


def _log(nodes: int = 10) -> list[dict[str, Any]]:
    return simulator.simulate(traces.basic(nodes), Config()).log


def _reference(events: list[Any]) -> list[dict[str, Any]]:
    return [dict(d) for d in fleet.fold(events, Config()).decisions]


class Refusing:
    """A Setup.reader that refuses the next `failures` readers as a PartitionReader does when new
    connections are refused (connection.start raises BrokerUnreachable in __aenter__)."""

    def __init__(self, inner: Any, exc: BaseException = REFUSED) -> None:
        self.inner = inner
        self.exc = exc
        self.failures = 0
        self.refused = 0

    def __call__(self) -> Any:
        outer = self

        class Reader:
            async def __aenter__(self) -> Any:
                if outer.failures > 0:
                    outer.failures -= 1
                    outer.refused += 1
                    raise outer.exc
                self._reader = outer.inner()
                return await self._reader.__aenter__()

            async def __aexit__(self, *exc: object) -> None:
                await self._reader.__aexit__(*exc)

        return Reader()


def _refusing(p: Pipeline, exc: BaseException = REFUSED) -> Refusing:
    refusing = Refusing(p.setup.reader, exc)
    p.setup = dataclasses.replace(p.setup, reader=refusing)
    return refusing


class Admin:
    """An admin client whose group owns every partition (describe_topics: none known)."""

    def __init__(self, exc: BaseException | None = None) -> None:
        self.exc = exc

    async def describe_topics(self, topics: list[str]) -> list[Any]:
        if self.exc is not None:
            raise self.exc
        return []


# ---- the ownership timer -------------------------------------------------------------------


def test_a_refused_reader_in_the_ownership_check_leaves_the_worker_up_and_unready(tmp_path: Path) -> None:
    """Issue 33 #2: `check_logs` opened a reader per partition; BrokerUnreachable escaped the faust
    timer and the app crashed with exit 1 four seconds after a SCRAM password was rotated."""
    p = Pipeline(tmp_path)
    p.produce(batches(_log(), per_record=10))
    refusing = _refusing(p)

    async def scenario() -> None:
        health = Health("worker")
        parts = Partitions(p.setup, health=health, on_fatal=p.fatal.append)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        assert health.ready
        refusing.failures = 1_000  # the password rotated: every new connection is refused
        for _ in range(3):
            await app_mod.ownership_check(
                connection.KafkaConfig(bootstrap="127.0.0.1:9"), [Admin()], parts, group="g", topic="t"
            )
            assert not health.ready and parts.kafka_away and "Authentication failed" in parts.kafka_away
        assert refusing.refused == 3  # tried again at every check
        refusing.failures = 0  # the new secret is mounted
        await app_mod.ownership_check(
            connection.KafkaConfig(bootstrap="127.0.0.1:9"), [Admin()], parts, group="g", topic="t"
        )
        assert health.ready and parts.kafka_away is None
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal
    assert p.decisions() == _reference(_log())


@pytest.mark.parametrize(
    "exc",
    [REFUSED, KafkaConnectionError("connection reset"), OSError("no route to host")],
    ids=["refused", "kafka-error", "os-error"],
)
def test_a_failing_admin_in_the_ownership_check_raises_nothing(tmp_path: Path, exc: BaseException) -> None:
    p = Pipeline(tmp_path)

    async def scenario() -> None:
        health = Health("worker")
        parts = Partitions(p.setup, health=health, on_fatal=p.fatal.append)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        await app_mod.ownership_check(
            connection.KafkaConfig(bootstrap="127.0.0.1:9"), [Admin(exc)], parts, group="g", topic="t"
        )
        # New connections refused: unready until a check gets through; a failed request: as it was.
        assert health.ready is not isinstance(exc, connection.BrokerUnavailable)
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal


def test_a_timer_never_lets_an_exception_reach_faust(tmp_path: Path) -> None:
    """`guarded`: a Kafka failure makes the process unready; anything else is a documented exit."""
    p = Pipeline(tmp_path)
    fatal: list[BaseException] = []

    async def refused() -> None:
        raise REFUSED

    async def bug() -> None:
        raise ValueError("a bug")

    async def scenario() -> None:
        health = Health("worker")
        parts = Partitions(p.setup, health=health, on_fatal=p.fatal.append)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        assert health.ready
        await app_mod.guarded("commit", refused, parts, fatal.append)()
        assert not health.ready and not fatal
        await app_mod.guarded("commit", bug, parts, fatal.append)()
        assert len(fatal) == 1 and app_mod.exit_code(fatal[0]) == app_mod.EXIT_FATAL
        await parts.close()

    asyncio.run(scenario())


# ---- rebalances and the agent --------------------------------------------------------------


def test_a_refused_reader_at_a_revoke_closes_the_partition(tmp_path: Path) -> None:
    """`revoke` reads the output ends to keep a worker aside: refused, it closes it instead."""
    p = Pipeline(tmp_path)
    p.produce(batches(_log(), per_record=10))
    refusing = _refusing(p)

    async def scenario() -> None:
        parts = Partitions(p.setup, on_fatal=p.fatal.append)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        refusing.failures = 1
        await parts.revoke([0])
        assert refusing.refused == 1 and not parts.suspended and not parts.workers
        await parts.assign([0])  # given back: opened from the store
        await asyncio.gather(*parts.opening.values())
        assert parts.workers[0].position == len(batches(_log(), per_record=10)) - 1
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal
    assert p.decisions() == _reference(_log())


def test_a_refused_reader_when_a_partition_is_given_back_reopens_it(tmp_path: Path) -> None:
    """`_resumed` checks the output ends and the log of a worker kept aside: refused, the
    partition is opened from its store (which waits while Kafka does not answer)."""
    p = Pipeline(tmp_path)
    log = _log()
    recs = batches(log, per_record=10)
    p.produce(recs[:5])
    refusing = _refusing(p)

    async def scenario() -> None:
        parts = Partitions(p.setup, on_fatal=p.fatal.append)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        await parts.revoke([0])
        assert 0 in parts.suspended
        refusing.failures = 1
        await parts.assign([0])
        opened = await asyncio.gather(*parts.opening.values())
        assert opened[0] is not None and refusing.refused == 1
        p.produce(recs[5:])
        for m in p.broker.messages(records.CLUSTER_EVENTS):
            await parts.handle(0, m.offset, m.key, m.value)
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal
    assert p.decisions() == _reference(log)


def test_a_refused_reader_while_reading_a_gap_reopens_the_partition(tmp_path: Path) -> None:
    """`handle` reads the log before a record past the state (the group's offset ahead of the
    store): a reader refused there escaped into faust's agent. Now the partition reopens."""
    p = Pipeline(tmp_path)
    log = _log()
    recs = batches(log, per_record=10)
    p.produce(recs[:5])
    refusing = _refusing(p)

    async def scenario() -> None:
        parts = Partitions(p.setup, on_fatal=p.fatal.append)
        await parts.assign([0])
        await asyncio.gather(*parts.opening.values())
        p.produce(recs[5:])
        refusing.failures = 1
        last = p.broker.messages(records.CLUSTER_EVENTS)[-1]
        await parts.handle(0, last.offset, last.key, last.value)  # a gap before it: read first
        assert refusing.refused == 1
        assert parts.workers[0].position == last.offset
        await parts.close()

    asyncio.run(scenario())
    assert not p.fatal
    assert p.decisions() == _reference(log)


def test_a_transactional_producer_refused_by_kafka_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """exactly_once: InitProducerId timing out while Kafka refuses connections is not "a broker
    without transactions" (exit 3): it is BrokerUnreachable, which the partition waits out."""
    reachable = True

    async def start_transactional(kafka: Any, transactional_id: str) -> Any:
        raise outbox.TransactionsUnavailable("no InitProducerId within 30s")

    async def reach(kafka: Any, **kwargs: Any) -> None:
        if not reachable:
            raise REFUSED

    monkeypatch.setattr(outbox, "start_transactional", start_transactional)
    monkeypatch.setattr(connection, "reach", reach)
    kafka = connection.KafkaConfig(bootstrap="127.0.0.1:9")
    with pytest.raises(outbox.TransactionsUnavailable):
        asyncio.run(app_mod.start_producer(kafka, "g-t-0"))
    reachable = False
    with pytest.raises(connection.BrokerUnreachable):
        asyncio.run(app_mod.start_producer(kafka, "g-t-0"))


# ---- exit codes ----------------------------------------------------------------------------


def test_a_store_that_cannot_be_opened_exits_with_its_own_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33 #4: a full or read-only volume exited 3 ("the broker away") on every restart."""
    monkeypatch.setattr(partitions_mod, "REOPEN_BACKOFF_S", 0.0)
    p = Pipeline(tmp_path)
    p.produce(batches(_log(), per_record=10))
    (tmp_path / "cluster-events-0").write_bytes(b"")  # the store's directory cannot be made
    asyncio.run(p.run())
    assert len(p.fatal) == 1
    assert isinstance(p.fatal[0], recovery.StoreUnavailable), p.fatal
    assert app_mod.exit_code(p.fatal[0]) == app_mod.EXIT_STORE == 5


def test_exit_codes_are_distinct() -> None:
    assert app_mod.exit_code(checkpoint.Stalled(0, "x")) == app_mod.EXIT_STALLED == 4
    assert app_mod.exit_code(partitions_mod.Fatal("fenced")) == app_mod.EXIT_FATAL == 3
    assert len({0, 2, app_mod.EXIT_FATAL, app_mod.EXIT_STALLED, app_mod.EXIT_STORE}) == 5


def test_sigterm_while_waiting_for_kafka_exits_0(tmp_path: Path) -> None:
    """Issue 33 #5: a worker waiting at start-up for Kafka ended with -15 on SIGTERM, not 0."""
    log_path = tmp_path / "worker.log"
    cmd = [
        sys.executable, "-m", "streams.cli", "worker",
        "--bootstrap-server", "127.0.0.1:9",  # nothing listens: it waits, with backoff
        "--bootstrap-timeout", "1",
        "--store-dir", str(tmp_path / "store"),
        "--health-host", "127.0.0.1",
        "--health-port", str(process.free_loopback_port()),
    ]  # fmt: skip
    with log_path.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)
    try:
        deadline = time.monotonic() + 120
        while "trying again" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- exactly_once: a failed send's future --------------------------------------------------


class FailingProducer:
    """An aiokafka producer whose sends all fail (a revoked Write ACL)."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[Any]] = []

    async def begin_transaction(self) -> None:
        return None

    async def abort_transaction(self) -> None:
        return None

    async def send(self, topic: str, value: Any, **kwargs: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_exception(TopicAuthorizationFailedError(topic))
        self.futures.append(fut)
        return fut


def test_a_failed_transactional_flush_leaves_no_future_unretrieved() -> None:
    """Issue 33 #5: under exactly_once a revoked Write ACL logged "Future exception was never
    retrieved": the flush stopped at the first failed send and the rest were dropped."""
    unretrieved: list[dict[str, Any]] = []

    async def scenario() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
        producer = FailingProducer()
        box = outbox.KafkaOutbox(producer, transactional=True, owns_producer=False)
        for i in range(3):
            await box.send(outbox.Outgoing(records.DECISIONS, 0, b"c", b"%d" % i))
        await asyncio.sleep(0)  # the done callbacks run
        with pytest.raises(outbox.SendFailed):
            await box.flush()
        await box.abort()
        producer.futures.clear()
        gc.collect()

    asyncio.run(scenario())
    gc.collect()
    assert not unretrieved, unretrieved


# ---- a re-created cluster-events topic -----------------------------------------------------


def a_day_later(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same objects relisted a day later: the same ids, new times (so new decision bytes)."""

    def later(ts: str) -> str:
        day = datetime.strptime(ts[:10], "%Y-%m-%d") + timedelta(days=1)
        return day.strftime("%Y-%m-%d") + ts[10:]

    return [dict(e, ts=later(e["ts"])) if isinstance(e.get("ts"), str) else e for e in events]


def _recreated(old: MemoryBroker) -> MemoryBroker:
    """`old` with cluster-events deleted and created again (empty); every other topic kept."""
    new = MemoryBroker()
    for (topic, partition), log in old._logs.items():
        if topic != records.CLUSTER_EVENTS:
            new._logs[(topic, partition)] = log
    return new


@pytest.mark.parametrize("store", ["kept", "lost"])
def test_a_relist_into_a_recreated_topic_loses_no_decision(tmp_path: Path, store: str) -> None:
    """Issue 33 #1: after a re-creation `_read_published` read the old topic's decisions too, and
    a relist folded from scratch reproduced their ids with new bytes: each was taken for a
    divergent re-derivation and withheld ("keeps the published one"). 3 of 3 were lost."""
    first = _log()
    second = a_day_later(first)
    assert _reference(first) and [d["id"] for d in _reference(first)] == [d["id"] for d in _reference(second)]
    p = Pipeline(tmp_path / "store")
    p.produce(batches(first, per_record=10))
    asyncio.run(p.run())
    before = len(p.decisions())
    assert before == len(_reference(first))
    if store == "lost":
        import shutil

        shutil.rmtree(tmp_path / "store")
    again = Pipeline(tmp_path / "store", broker=_recreated(p.broker))
    again.produce(batches(second, per_record=10))
    divergent = _divergent()
    asyncio.run(again.run())
    after = again.decisions()[before:]
    assert after == _reference(second)  # every decision of the new log, none withheld
    assert _divergent() == divergent  # and none taken for a divergent re-derivation
    assert not again.fatal


def test_the_same_log_refolded_differently_is_still_divergent(tmp_path: Path) -> None:
    """Divergence detection stays for the real case: a decision re-derived from the same log (the
    same incarnation) to other bytes under a published id is divergent, and not sent again;
    one of another incarnation is neither; a record of a worker before the header counts as
    the same log, as it always did."""
    log = _log()
    p = Pipeline(tmp_path / "store")
    p.produce(batches(log, per_record=10))
    asyncio.run(p.run())
    published = p.decisions()
    messages = p.broker.messages(records.DECISIONS)
    incarnations = {dict(m.headers)[outbox.INCARNATION_HEADER].decode() for m in messages}
    assert len(incarnations) == 1  # every decision names the log it was folded from
    (incarnation,) = incarnations

    def read(*, legacy: bool = False) -> worker.Published:
        seen = worker.Published()
        for m in messages:
            seen.add(m.value, () if legacy else m.headers)
        return seen

    divergent = _divergent()
    same = read()
    assert all(same.seen(dict(d, hash="0"), incarnation) for d in published)
    assert _divergent() == divergent + len(published)
    other = read()
    assert not any(other.seen(dict(d, hash="0"), "0-another") for d in published)
    assert _divergent() == divergent + len(published)
    legacy = read(legacy=True)
    assert all(legacy.seen(d, "0-another") for d in published)  # identical bytes: not divergent
    assert _divergent() == divergent + len(published)


def _divergent() -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("preemptctl_worker_divergent_decisions_total") or 0.0


def test_decisions_carry_their_incarnation_and_the_state_keeps_it(tmp_path: Path) -> None:
    log = _log()
    p = Pipeline(tmp_path)
    recs = batches(log, per_record=10)
    p.produce(recs)
    asyncio.run(p.run())
    first = p.broker.messages(records.CLUSTER_EVENTS)[0]
    want = worker.incarnation_of(first.offset, first.key, first.value).encode()
    assert all(
        dict(m.headers)[outbox.INCARNATION_HEADER] == want for m in p.broker.messages(records.DECISIONS)
    )
    state = orjson.loads(bytes(_state(tmp_path / "cluster-events-0")))
    assert state["incarnation"] == want.decode()


def _state(path: Path) -> bytes:
    from streams.pipeline.store import Store

    with Store(path) as store:
        state = store.state()
    assert state is not None
    return orjson.dumps(state)

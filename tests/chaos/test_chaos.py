"""Fault injection on real Apache Kafka: every disturbed run publishes exactly the undisturbed decisions.

Workers run as `preemptctl worker --processing-guarantee exactly_once`, as the
chart deploys them; what counts is what a read_committed consumer (the
actuator) sees, compared by id and by bytes with the undisturbed decisions
(harness.expected). Seeded (CHAOS_SEEDS seeds each) and bounded in time.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import records
from streams.brokers.kafka_local import LocalKafka
from streams.kafka.reading import PartitionReader
from streams.pipeline import outbox, partitions, snapshot
from streams.pipeline.app import EXIT_FATAL, EXIT_STALLED
from tests.chaos import harness
from tests.chaos.harness import Worker, assert_same, expected, log_of, produce, recreate, wait_published
from tests.support import mixed_logs

NODES = 60  # ~900 events and 60 decisions per cluster log
# The worker says Kafka does not answer, and turns unready, within this of the broker's death.
OUTAGE_TIMEOUT_S = 180.0
# Longer than a partition's reopen attempts wait in all (1+2+4+8+16+16 s, plus a probe each):
# an outage this long would have exhausted them.
_BACKOFFS = (partitions.REOPEN_BACKOFF_S * 2**i for i in range(partitions.REOPEN_ATTEMPTS))
REOPEN_WINDOW_S = 5.0 + sum(min(b, partitions.REOPEN_BACKOFF_MAX_S) for b in _BACKOFFS)
# A paused worker's partition is taken over (session timeout, join, open, catch up) and
# its decisions published within this long: well under the transaction timeout.
TAKEOVER_S = 0.6 * outbox.TRANSACTION_TIMEOUT_MS / 1000


def _split(rnd: random.Random, log: list[dict[str, Any]], parts: int) -> list[list[dict[str, Any]]]:
    cuts = sorted(rnd.sample(range(1, len(log)), parts - 1))
    return [log[a:b] for a, b in zip([0, *cuts], [*cuts, len(log)], strict=True)]


def _sizes(rnd: random.Random) -> list[int]:
    return [rnd.randint(1, 25) for _ in range(7)]


def test_worker_sigkilled_at_random_points(kafka: LocalKafka, tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    cluster = f"kill-{seed}"
    log = log_of(cluster, NODES)
    want = expected(log)
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-kill", extra=["--snapshot-every", "150"]).start()
    try:
        w.wait_ready()
        for part in _split(rnd, log, 4):
            asyncio.run(produce(kafka.bootstrap, cluster, part, _sizes(rnd)))
            time.sleep(rnd.uniform(0.1, 2.0))  # a random instant: mid-record, mid-commit, mid-snapshot
            w.kill()
            if rnd.random() < 0.5:
                shutil.rmtree(w.store, ignore_errors=True)  # the store lost with the pod
            w.start()
        got = wait_published(kafka.bootstrap, cluster, len(want))
    finally:
        w.stop()
    assert_same(got, want)


def test_send_failure_at_the_nth_send(kafka: LocalKafka, tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    cluster = f"send-{seed}"
    log = log_of(cluster, NODES)
    want = expected(log)
    n = rnd.randint(1, len(want))
    asyncio.run(produce(kafka.bootstrap, cluster, log, _sizes(rnd)))
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-send", extra=["--inject-fault", f"fail-send={n}"])
    try:
        w.start()
        got = wait_published(kafka.bootstrap, cluster, len(want))
    finally:
        w.stop()
    assert "injected fail-send" in w.log_text()
    assert_same(got, want)


def test_exactly_once_an_aborted_transaction_publishes_nothing(kafka: LocalKafka, tmp_path: Path) -> None:
    """Decisions are in the partition's transaction: aborted after the send, read_committed never sees them.

    The worker's first commit with decisions aborts after every record was written;
    the worker reopens and publishes them again. A read_uncommitted reader sees both
    copies; the actuator (read_committed) exactly one. Were the decisions sent outside
    the transaction, the first copies would be visible and never re-sent: both
    readers would agree.
    """
    cluster = "abort"
    log = log_of(cluster, NODES)
    want = expected(log)
    asyncio.run(produce(kafka.bootstrap, cluster, log, [50]))
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-abort", extra=["--inject-fault", "abort-commit=1"])
    try:
        w.start()
        got = wait_published(kafka.bootstrap, cluster, len(want))
    finally:
        w.stop()
    assert_same(got, want)
    everything = asyncio.run(harness.published(kafka.bootstrap, cluster, read_committed=False))
    aborted = len(everything) - len(got)
    assert aborted > 0, "the aborted attempt's decisions were not in a transaction"
    assert sorted(everything) == sorted([*got, *everything[:aborted]])  # the aborted ones came first


def test_broker_sigkilled_and_restarted_mid_trace(kafka: LocalKafka, tmp_path: Path, seed: int) -> None:
    """The broker dies while the worker folds a backlog and publishes; the worker stalls, then goes on."""
    rnd = random.Random(seed)
    cluster = f"broker-{seed}"
    log = log_of(cluster, NODES)
    want = expected(log)
    cut = len(log) * 9 // 10
    asyncio.run(produce(kafka.bootstrap, cluster, log[:cut], [1, 2, 3]))  # a backlog of small records
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-broker").start()
    supervising = threading.Event()

    def supervisor() -> None:
        # Kubernetes' part: a worker that gave up (exit 3 after its retries) is started again.
        while not supervising.is_set():
            if not w.alive():
                w.start()
            time.sleep(0.5)

    thread = threading.Thread(target=supervisor, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + harness.READY_TIMEOUT_S
        while "opened at offset" not in w.log_text():  # folding the backlog and publishing now
            assert time.monotonic() < deadline, w.tail()
            time.sleep(0.05)
        time.sleep(rnd.uniform(0.1, 0.6))
        kafka.kill()
        time.sleep(rnd.uniform(4.0, 7.0))
        kafka.restart()
        asyncio.run(produce(kafka.bootstrap, cluster, log[cut:], _sizes(rnd)))
        got = wait_published(kafka.bootstrap, cluster, len(want))
    finally:
        supervising.set()
        thread.join(5)
        w.stop()
    assert_same(got, want)


def test_a_kafka_outage_longer_than_the_reopen_attempts_keeps_the_worker_up(
    kafka: LocalKafka, tmp_path: Path, seed: int
) -> None:
    """Kafka gone for longer than a partition's reopen attempts last: the worker waits for it,
    unready, saying why, and never exits (a restart could only wait the same way, and Kubernetes
    would back its restarts off); once the broker is back it folds on, nothing lost or doubled."""
    rnd = random.Random(seed)
    cluster = f"outage-{seed}"
    log = log_of(cluster, NODES)
    want = expected(log)
    cut = len(log) * 9 // 10
    # A backlog of one event a record: the worker is still catching up when the broker dies.
    asyncio.run(produce(kafka.bootstrap, cluster, log[:cut], [1]))
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-outage").start()
    try:
        deadline = time.monotonic() + harness.READY_TIMEOUT_S
        while "opened at offset" not in w.log_text():  # catching up with the backlog now
            assert time.monotonic() < deadline, w.tail()
            time.sleep(0.02)
        kafka.kill()
        # Whether the partition was still opening (its opens then fail, and used to count until
        # the process exited) or already open (the ownership check notices) depends on the
        # machine's speed: either way the worker must say so, turn unready, and stay up for
        # longer than every reopen attempt's backoff together (tests/test_progress.py holds
        # the counting itself deterministically).
        deadline = time.monotonic() + OUTAGE_TIMEOUT_S
        while "Kafka does not answer" not in w.log_text() or w.ready():
            assert w.alive(), f"the worker exited during the outage: {w.tail()}"
            assert time.monotonic() < deadline, w.tail()
            time.sleep(0.5)
        outlasted = time.monotonic() + REOPEN_WINDOW_S
        while time.monotonic() < outlasted:
            assert w.alive(), f"the worker exited during the outage: {w.tail()}"
            time.sleep(0.5)
        assert w.alive() and not w.ready(), w.tail()
        kafka.restart()
        asyncio.run(produce(kafka.bootstrap, cluster, log[cut:], _sizes(rnd)))
        got = wait_published(kafka.bootstrap, cluster, len(want))
        assert w.alive() and w.starts == 1, w.tail()
    finally:
        w.stop()
    assert_same(got, want)


def test_two_workers_one_killed_its_partitions_move(kafka4: LocalKafka, tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    clusters = harness.clusters_on_partitions(f"four-{seed}", 4)
    logs = {c: log_of(c, 30) for c in clusters}
    a = Worker(kafka4.bootstrap, tmp_path / "a", "g-four").start()
    b = Worker(kafka4.bootstrap, tmp_path / "b", "g-four").start()
    try:
        a.wait_ready()
        b.wait_ready()
        halves = {c: _split(rnd, logs[c], 2) for c in clusters}
        for c in clusters:
            asyncio.run(produce(kafka4.bootstrap, c, halves[c][0], _sizes(rnd)))
        time.sleep(rnd.uniform(0.5, 3.0))
        a.kill()  # its partitions go to b once a's session times out
        for c in clusters:
            asyncio.run(produce(kafka4.bootstrap, c, halves[c][1], _sizes(rnd)))
        for c in clusters:
            want = expected(logs[c])
            assert_same(wait_published(kafka4.bootstrap, c, len(want), partitions=4), want)
    finally:
        a.stop()
        b.stop()
    assert "opened at offset" in a.log_text() and "opened at offset" in b.log_text()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_paused_worker_resumed_after_its_partition_moved_publishes_nothing(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """A zombie: paused with decisions sent in an open transaction; another worker takes over; it resumes."""
    cluster = "zombie"
    log = log_of(cluster, NODES)
    want = expected(log)
    a = Worker(kafka.bootstrap, tmp_path / "a", "g-zombie", extra=["--inject-fault", "stop-before-commit=2"])
    b = Worker(kafka.bootstrap, tmp_path / "b", "g-zombie")
    try:
        a.start().wait_ready()
        asyncio.run(produce(kafka.bootstrap, cluster, log, [5]))
        deadline = time.monotonic() + harness.DECISIONS_TIMEOUT_S
        assert a.proc is not None
        while not _stopped(a.proc.pid):
            assert time.monotonic() < deadline and a.alive(), a.tail()
            time.sleep(0.1)
        b.start()  # joins; a's session times out; b opens the partition and fences a
        # Fenced, a's open transaction is aborted at once and b's decisions show well before
        # the broker would have timed that transaction out (outbox.TRANSACTION_TIMEOUT_MS).
        got = wait_published(kafka.bootstrap, cluster, len(want), timeout=TAKEOVER_S)
        assert_same(got, want)
        a.signal(signal.SIGCONT)
        assert a.wait_exit(60) == EXIT_FATAL, a.tail()
        time.sleep(2)
        assert_same(asyncio.run(harness.published(kafka.bootstrap, cluster)), want)
    finally:
        a.stop()
        b.stop()
    assert "fenced" in a.log_text().lower()


async def _delete_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, partition): RecordsToDelete(offset)})
    finally:
        await admin.close()


async def _latest_snapshot(bootstrap: str) -> tuple[snapshot.Manifest, dict[str, Any]] | None:
    async with PartitionReader(bootstrap, read_committed=True) as reader:
        manifest = await snapshot.latest(reader, 0)
        if manifest is None:
            return None
        state, _ = await snapshot.load(reader, manifest)
        return manifest, state


def test_retention_deletes_the_log_head_then_a_worker_without_store(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    cluster = "retention"
    log = log_of(cluster, NODES)
    want = expected(log)
    first, second = log[: 2 * len(log) // 3], log[2 * len(log) // 3 :]
    before = len(expected(first))
    a = Worker(kafka.bootstrap, tmp_path / "a", "g-ret-a", extra=["--snapshot-every", "100"]).start()
    try:
        a.wait_ready()
        asyncio.run(produce(kafka.bootstrap, cluster, first, [7]))
        wait_published(kafka.bootstrap, cluster, before)
    finally:
        a.stop()
    latest = asyncio.run(_latest_snapshot(kafka.bootstrap))
    assert latest is not None
    manifest, state = latest
    # Retention by age: everything older than the snapshot goes, in both topics.
    asyncio.run(_delete_before(kafka.bootstrap, records.CLUSTER_EVENTS, 0, manifest.position + 1))
    asyncio.run(_delete_before(kafka.bootstrap, records.DECISIONS, 0, int(state["decisionsNext"])))
    asyncio.run(produce(kafka.bootstrap, cluster, second, [7]))
    visible = asyncio.run(harness.published(kafka.bootstrap, cluster))  # published after the snapshot
    b = Worker(kafka.bootstrap, tmp_path / "b", "g-ret-b").start()
    try:
        got = wait_published(kafka.bootstrap, cluster, len(visible) + len(want) - before)
    finally:
        b.stop()
    assert_same(got, [*visible, *want[before:]])
    assert f"loading the snapshot at {manifest.position}" in b.log_text()
    assert "gone" not in b.log_text()


def test_all_decisions_expired_the_store_is_kept(kafka: LocalKafka, tmp_path: Path) -> None:
    """Issue 12: a cluster whose decisions had all expired was taken for "store ahead" (store destroyed)."""
    cluster = "expired"
    log = log_of(cluster, NODES)
    want = expected(log)
    first, second = log[: len(log) // 2], log[len(log) // 2 :]
    before = len(expected(first))
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-expired").start()
    try:
        w.wait_ready()
        asyncio.run(produce(kafka.bootstrap, cluster, first, [7]))
        wait_published(kafka.bootstrap, cluster, before)
        w.stop()
        end = asyncio.run(_end(kafka.bootstrap, records.DECISIONS))
        asyncio.run(_delete_before(kafka.bootstrap, records.DECISIONS, 0, end))
        asyncio.run(produce(kafka.bootstrap, cluster, second, [7]))
        w.start()
        got = wait_published(kafka.bootstrap, cluster, len(want) - before)
    finally:
        w.stop()
    assert_same(got, want[before:])  # nothing re-sent, nothing re-derived from the log start
    assert "starts at" not in w.log_text() and "another cluster-events topic" not in w.log_text()


async def _end(bootstrap: str, topic: str) -> int:
    async with PartitionReader(bootstrap) as reader:
        return (await reader.bounds(topic, 0))[1]


@pytest.fixture
def garbage_worker(kafka: LocalKafka, tmp_path: Path) -> Iterator[Worker]:
    """One worker for every example (each example uses a fresh cluster); stopped before its broker."""
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-garbage").start()
    w.wait_ready()
    yield w
    w.stop()


@settings(
    max_examples=int(os.environ.get("CHAOS_EXAMPLES", "3")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=mixed_logs.mixed_logs(), sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_garbage_inside_valid_batches_never_stalls_the_partition(
    kafka: LocalKafka, garbage_worker: Worker, case: tuple[list[Any], set[int]], sizes: list[int]
) -> None:
    mixed, bad = case
    cluster = f"garbage-{os.urandom(4).hex()}"
    good = [dict(e, cluster=cluster) for i, e in enumerate(mixed) if i not in bad]
    want = expected(good)
    asyncio.run(produce(kafka.bootstrap, cluster, mixed, sizes))
    deadline = time.monotonic() + harness.DECISIONS_TIMEOUT_S
    while True:
        dead = asyncio.run(harness.published(kafka.bootstrap, cluster, topic=records.DEAD_LETTER))
        got = asyncio.run(harness.published(kafka.bootstrap, cluster))
        if (len(dead) >= len(bad) and len(got) >= len(want)) or time.monotonic() > deadline:
            break
        time.sleep(harness.POLL_S)
    assert garbage_worker.alive(), garbage_worker.tail()
    assert_same(got, want)
    assert len(dead) == len(bad)  # each bad event alone, never its record


# ---- issue 19: no silent failure -------------------------------------------------------------------


def test_a_paused_at_least_once_worker_given_its_partition_back_publishes_nothing_twice(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """Issue 19 #3: A (at_least_once, the CLI default) is paused; B takes the partition, folds,
    publishes and leaves; A resumes and gets it back. It continued from its stale position in
    memory and published B's decisions again (89 of 254)."""
    cluster = "paused"
    log = log_of(cluster, NODES)
    want = expected(log)
    first, second, third = (
        log[: len(log) // 3],
        log[len(log) // 3 : 2 * len(log) // 3],
        log[2 * len(log) // 3 :],
    )
    group = "g-paused"
    a = Worker(kafka.bootstrap, tmp_path / "a", group, guarantee="at_least_once")
    b = Worker(kafka.bootstrap, tmp_path / "b", group, guarantee="at_least_once")
    try:
        a.start().wait_ready()
        asyncio.run(produce(kafka.bootstrap, cluster, first, [5]))
        wait_published(kafka.bootstrap, cluster, len(expected(first)))
        a.signal(signal.SIGSTOP)
        b.start().wait_ready()  # joins; A's session times out; B owns the partition
        asyncio.run(produce(kafka.bootstrap, cluster, second, [5]))
        wait_published(kafka.bootstrap, cluster, len(expected([*first, *second])))
        b.stop()  # B leaves: the partition goes back to A once it is back in the group
        a.signal(signal.SIGCONT)
        asyncio.run(produce(kafka.bootstrap, cluster, third, [5]))
        got = wait_published(kafka.bootstrap, cluster, len(want))
    finally:
        a.stop()
        b.stop()
    assert_same(got, want)
    assert "did not run for" in a.log_text() or "reopening from the store" in a.log_text(), a.tail()


def test_cluster_events_recreated_under_a_running_worker_is_followed(
    kafka: LocalKafka, tmp_path: Path
) -> None:
    """Issue 19 #7: the worker ended with an empty assignment, ready, deciding nothing until restarted."""
    before, after = "before-recreate", "after-recreate"
    first, second = log_of(before, 20), log_of(after, NODES)
    exits: list[int | None] = []
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-recreate", extra=["--unowned-grace", "10"])
    supervising = threading.Event()

    def supervisor() -> None:  # Kubernetes' part: an exited worker is started again
        while not supervising.is_set():
            if not w.alive():
                assert w.proc is not None
                exits.append(w.proc.returncode)
                w.start()
            time.sleep(0.5)

    w.start().wait_ready()
    thread = threading.Thread(target=supervisor, daemon=True)
    thread.start()
    try:
        asyncio.run(produce(kafka.bootstrap, before, first, [5]))
        wait_published(kafka.bootstrap, before, len(expected(first)))
        asyncio.run(recreate(kafka.bootstrap, records.CLUSTER_EVENTS))
        asyncio.run(produce(kafka.bootstrap, after, second, [5]))
        got = wait_published(kafka.bootstrap, after, len(expected(second)))
    finally:
        supervising.set()
        thread.join(5)
        w.stop()
    assert_same(got, expected(second))
    assert set(exits) <= {EXIT_STALLED}, (exits, w.tail())

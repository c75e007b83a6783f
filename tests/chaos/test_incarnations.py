"""Issue 33 #1 on real Kafka: decisions are known per cluster-events incarnation.

preemption.cluster-events is deleted and created again, and the source relists
the same objects (a day later: the same uids and names, new times). Folded from
scratch, the relist reproduces the old decisions' ids (cluster, sequence,
preemptor uid) with new bytes; the decisions topic still holds the old log's.
Before, the worker read those as "already published", counted each new one as
divergent and withheld it (3 of 3 lost in a minimal run). Now every decision
the new topic calls for is published, compared with `replay` of the new topic
(harness.expected) by id and bytes, and none is taken for a divergence.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from schemas import records
from streams.brokers.kafka_local import LocalKafka
from streams.pipeline.app import EXIT_STALLED
from tests.chaos.harness import (
    Worker,
    a_day_later,
    assert_same,
    expected,
    log_of,
    produce,
    recreate,
    wait_published,
)

NODES = 20


@pytest.mark.parametrize("running", [True, False], ids=["worker-running", "worker-stopped"])
def test_a_relist_into_a_recreated_cluster_events_loses_no_decision(
    kafka: LocalKafka, tmp_path: Path, running: bool
) -> None:
    cluster = "relisted"
    first = log_of(cluster, NODES)
    second = a_day_later(first)
    old, new = expected(first), expected(second)
    assert [v for v in old if v in new] == []  # new bytes ...
    exits: list[int | None] = []
    w = Worker(kafka.bootstrap, tmp_path / "store", "g-relist", extra=["--unowned-grace", "10"])
    supervising = threading.Event()

    def supervisor() -> None:  # Kubernetes' part: an exited worker is started again
        while not supervising.is_set():
            if running and not w.alive():
                assert w.proc is not None
                exits.append(w.proc.returncode)
                w.start()
            time.sleep(0.5)

    w.start().wait_ready()
    thread = threading.Thread(target=supervisor, daemon=True)
    thread.start()
    try:
        asyncio.run(produce(kafka.bootstrap, cluster, first, [5]))
        assert_same(wait_published(kafka.bootstrap, cluster, len(old)), old)
        if not running:
            w.stop()  # the store is kept: it is of the old topic, and dropped at the next start
        asyncio.run(recreate(kafka.bootstrap, records.CLUSTER_EVENTS))
        asyncio.run(produce(kafka.bootstrap, cluster, second, [5]))
        if not running:
            w.start()
        got = wait_published(kafka.bootstrap, cluster, len(old) + len(new))
    finally:
        supervising.set()
        thread.join(5)
        w.stop()
    assert_same(got[: len(old)], old)
    assert_same(got[len(old) :], new)  # ... under the same ids: every one published
    assert "differs from the published record" not in w.log_text(), w.tail()
    assert set(exits) <= {EXIT_STALLED}, (exits, w.tail())

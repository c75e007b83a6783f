"""Issue 33 #2 on the secured Apache Kafka: a SCRAM password rotated under a running worker.

The worker (exactly_once) logs in as a SCRAM user of its own whose password its
properties file names in a mounted Secret (`${directory:DIR:password}`, as the
chart mounts it). It folds the first third of a cluster's log; then the
operator rotates the user's password on the broker (kafka-configs --alter
--add-config SCRAM-SHA-512=[password=...]) while the source (here the admin
principal) keeps writing the second third. Connections already open stay
logged in (Kafka does not re-authenticate them), so the worker goes on folding
and publishing on them; every new connection is refused. The worker must stay
alive (before the fix: exit 1 with faust tracebacks, 4 s after the rotation) and
turn unready within a bound, and stay unready, saying why, while the Secret still
holds the old password. Then the new password is written into the mounted file
(atomically, as the kubelet swaps a Secret's files) and the worker, the same
process, must become ready again, then fold the last third. The decisions topic
is compared with `preemptctl replay` of the cluster-events topic on the broker,
by id and bytes (and by `replay --compare`): every decision exactly once.
Before the password was read again (streams.kafka.connection), the worker stayed
unready until restarted.

Then the clients opened before a rotation: on a broker of its own, the password
is rotated and the new Secret mounted, and the broker restarts, so every client
of the worker opens its connections again (faust's consumer included). Before
they followed the Secret (connection.follow, app.follow_password), they were
refused for as long as the process lived while the worker stayed ready.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from schemas import VERSION
from streams.kafka import acls, connection, topics
from streams.kafka.reading import PartitionReader
from streams.pipeline.app import OWNERSHIP_CHECK_INTERVAL_S
from tests.chaos.harness import DECISIONS_TIMEOUT_S, POLL_S, Worker, assert_same, expected, log_of
from tests.support import secure_kafka as sk
from tests.support import tools

NODES = 20
# A refused connection is found by the ownership check (every OWNERSHIP_CHECK_INTERVAL_S): one
# check, plus one probe of the broker and a loaded machine's slack.
UNREADY_WITHIN_S = 3 * OWNERSHIP_CHECK_INTERVAL_S + 30
# How long the worker must stay unready (and alive) while the Secret holds the old password:
# more than one further check, each refused again.
HOLD_UNREADY_S = 1.5 * OWNERSHIP_CHECK_INTERVAL_S
# The new password is read at the next check that opens a connection.
READY_AGAIN_WITHIN_S = 3 * OWNERSHIP_CHECK_INTERVAL_S + 30
# `preemptctl replay` of the topics on the broker.
REPLAY_TIMEOUT_S = 180.0


def _cuts(log: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """Two cut points in `log` whose prefixes call for about a third and two thirds of its decisions."""
    total = len(expected(log))

    def first_with(count: int) -> int:  # the shortest prefix calling for `count` decisions
        lo, hi = 1, len(log)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if len(expected(log[:mid])) < count else (lo, mid)
        return lo

    return first_with(max(1, total // 3)), first_with(max(2, 2 * total // 3))


async def _produce(kafka: connection.KafkaConfig, topic: str, cluster: str, events: Sequence[Any]) -> None:
    """cluster-events records of 5 events each, in order, as the source writes them."""
    producer = kafka.producer(linger_ms=2, acks="all")
    await connection.start(kafka, producer)
    try:
        for i in range(0, len(events), 5):
            chunk = [{k: v for k, v in e.items() if k != "cluster"} for e in events[i : i + 5]]
            value = orjson.dumps({"v": VERSION, "cluster": cluster, "events": chunk})
            await producer.send_and_wait(topic, key=cluster.encode(), value=value)
    finally:
        await producer.stop()


async def _published(kafka: connection.KafkaConfig, topic: str, cluster: str) -> list[bytes]:
    """The committed decisions for `cluster` (the actuator's view), in log order."""
    async with PartitionReader(kafka, read_committed=True) as reader:
        start, _ = await reader.bounds(topic, 0)
        return [m.value async for m in reader.read(topic, 0, start) if m.key == cluster.encode()]


def _wait_published(kafka: connection.KafkaConfig, topic: str, cluster: str, count: int) -> list[bytes]:
    """Until `count` decisions are there (then once more, so a duplicate would show)."""
    deadline = time.monotonic() + DECISIONS_TIMEOUT_S
    got: list[bytes] = []
    while time.monotonic() < deadline:
        got = asyncio.run(_published(kafka, topic, cluster))
        if len(got) >= count:
            time.sleep(4 * POLL_S)
            return asyncio.run(_published(kafka, topic, cluster))
        time.sleep(POLL_S)
    return got


def _mount(secret_dir: Path, password: str) -> None:
    """Write the Secret's `password` file as the kubelet updates a mounted Secret: all at once."""
    staged = secret_dir / f".password.{secrets.token_hex(4)}"
    staged.write_text(password)
    os.replace(staged, secret_dir / "password")


def _until(worker: Worker, what: str, timeout: float, check: Callable[[], bool]) -> float:
    """Seconds until `check()` holds, the worker alive all along; AssertionError otherwise."""
    began = time.monotonic()
    while True:
        assert worker.alive(), f"worker exited (rc {worker.proc and worker.proc.returncode}): {worker.tail()}"
        if check():
            return time.monotonic() - began
        assert time.monotonic() - began < timeout, f"not {what} within {timeout:.0f}s: {worker.tail()}"
        time.sleep(0.2)


def _replay(props: Path, bootstrap: str, names: topics.Names, out: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable, "-m", "streams.cli", "replay",
        f"kafka://{bootstrap}/{names.cluster_events}",
        "--kafka-config", str(props),
        "--decisions-out", str(out),
        "--compare", f"kafka://{bootstrap}/{names.decisions}",
    ]  # fmt: skip
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=REPLAY_TIMEOUT_S,
    )


@dataclass
class Rotated:
    """A worker logging in as a SCRAM user of its own, its password in a mounted Secret."""

    kafka: sk.SecureKafka
    worker: Worker
    admin: connection.KafkaConfig
    names: topics.Names
    cluster: str
    user: str
    secret_dir: Path
    old: str
    new: str


def _rotated(secure_kafka: sk.SecureKafka, tmp_path: Path) -> Rotated:
    run = uuid.uuid4().hex[:8]
    user, group, cluster = f"rotated-{run}", f"g-rotation-{run}", f"rotation-{run}"
    # Topics of its own on the broker: this worker folds no other test's clusters.
    names = topics.Names(f"rotation-{run}.")
    admin = secure_kafka.admin_config()
    old, new = secrets.token_hex(16), secrets.token_hex(16)
    sk.set_scram_password(secure_kafka, user, old)
    asyncio.run(topics.ensure_topics(admin, topics.topic_specs(names=names)))
    asyncio.run(sk.grant(admin, user, acls.required("worker", names=names, worker_group=group)))
    secret_dir = tmp_path / "kafka-user"
    secret_dir.mkdir()
    _mount(secret_dir, old)
    props = tmp_path / "worker.properties"
    props.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        f"sasl.username={user}\n"
        f"sasl.password=${{directory:{secret_dir}:password}}\n"
        f"ssl.ca.location={secure_kafka.pki.ca_crt}\n"
    )
    worker = Worker(
        secure_kafka.sasl_bootstrap,
        tmp_path / "store",
        group,
        extra=["--kafka-config", str(props), "--no-create-topics", "--topic-prefix", names.prefix],
    )
    return Rotated(secure_kafka, worker, admin, names, cluster, user, secret_dir, old, new)


def _fold(r: Rotated, events: Sequence[dict[str, Any]], decisions: Sequence[bytes]) -> None:
    """Write `events` and wait for the worker to publish `decisions` (all it published so far)."""
    asyncio.run(_produce(r.admin, r.names.cluster_events, r.cluster, events))
    assert_same(_wait_published(r.admin, r.names.decisions, r.cluster, len(decisions)), decisions)


def _compare_with_replay(r: Rotated, tmp_path: Path, want: Sequence[bytes]) -> None:
    """The decisions topic is `want` (by id and bytes), and `replay` of the cluster-events topic on
    the broker re-derives exactly it (`--compare`: no decision missing, extra, doubled or differing)."""
    got = asyncio.run(_published(r.admin, r.names.decisions, r.cluster))
    assert_same(got, want)
    admin_props = tmp_path / "admin.properties"
    admin_props.write_text(r.kafka.properties(sk.ADMIN))
    replayed = _replay(admin_props, r.kafka.sasl_bootstrap, r.names, tmp_path / "replayed.jsonl")
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr[-2000:]
    lines = (tmp_path / "replayed.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line) for line in lines] == [orjson.loads(v) for v in got]


def _clean_log(r: Rotated) -> str:
    text = r.worker.log_text()
    assert r.worker.proc is not None and r.worker.proc.returncode == 0, text[-3000:]  # SIGTERM: 0
    assert "Traceback" not in text, text[-3000:]
    assert r.old not in text and r.new not in text, "the worker logged a password"
    return text


def test_a_rotated_scram_password_leaves_the_worker_alive_and_unready_until_the_new_secret_is_mounted(
    secure_kafka: sk.SecureKafka, tmp_path: Path
) -> None:
    """On the session's secured broker (a user, topics and a group of its own)."""
    r = _rotated(secure_kafka, tmp_path)
    log = log_of(r.cluster, NODES)
    first, second = _cuts(log)
    began = time.monotonic()
    r.worker.start().wait_ready()
    try:
        _fold(r, log[:first], expected(log[:first]))
        # The operator rotates the password; the Secret the worker reads still holds the old one.
        sk.set_scram_password(r.kafka, r.user, r.new)
        rotated = time.monotonic()
        asyncio.run(_produce(r.admin, r.names.cluster_events, r.cluster, log[first:second]))
        _until(r.worker, "unready", UNREADY_WITHIN_S, lambda: not r.worker.ready())
        went = time.monotonic() - rotated
        held = time.monotonic()
        while time.monotonic() - held < HOLD_UNREADY_S:  # refused at every check, alive all along
            assert r.worker.alive() and not r.worker.ready(), r.worker.tail()
            time.sleep(0.5)
        _mount(r.secret_dir, r.new)  # the rotated Secret reaches the pod
        back = _until(r.worker, "ready again", READY_AGAIN_WITHIN_S, r.worker.ready)
        _fold(r, log[second:], expected(log))
        assert r.worker.alive() and r.worker.starts == 1, r.worker.tail()
    finally:
        r.worker.stop()
    print(
        f"\nunready {went:.1f}s after the rotation, ready {back:.1f}s after the new Secret; "
        f"{len(expected(log))} decisions; {time.monotonic() - began:.0f}s in all"
    )
    _compare_with_replay(r, tmp_path, expected(log))
    text = _clean_log(r)
    assert "Kafka does not answer" in text and "SaslAuthenticationFailed" in text, text[-3000:]
    assert "Kafka answers again" in text, text[-3000:]


def test_every_connection_reopened_after_a_rotation_logs_in_with_the_new_password(tmp_path: Path) -> None:
    """The password is rotated and the new Secret mounted; then the broker restarts (a rolling
    update), so every client the worker holds opens its connections again: faust's consumer, the
    outbox's transactional producer, the ownership check's admin client. Each must log in with the
    new password, not the one it was built with. Before, they were refused for as long as the
    process lived while new readers got through, and the worker stayed ready, consuming nothing.
    On a broker of its own (it is restarted)."""
    try:
        secured = sk.start(tmp_path / "kafka", log_path=tmp_path / "kafka.log")
    except sk.ToolMissing as exc:  # as the secure_kafka fixture (tests/conftest.py)
        tools.unavailable(str(exc))
    try:
        r = _rotated(secured, tmp_path)
        log = log_of(r.cluster, NODES)
        first, _ = _cuts(log)
        r.worker.start().wait_ready()
        try:
            _fold(r, log[:first], expected(log[:first]))
            sk.set_scram_password(r.kafka, r.user, r.new)
            _mount(r.secret_dir, r.new)
            restarted_at = len(r.worker.log_text())
            secured.broker.kill()
            time.sleep(2.0)
            secured.broker.restart()
            _fold(r, log[first:], expected(log))
            _until(r.worker, "ready", READY_AGAIN_WITHIN_S, r.worker.ready)
            assert r.worker.alive() and r.worker.starts == 1, r.worker.tail()
        finally:
            r.worker.stop()
        _compare_with_replay(r, tmp_path, expected(log))
        # Every connection after the restart logged in (one refused would be logged by aiokafka).
        assert "SaslAuthenticationFailed" not in _clean_log(r)[restarted_at:]
    finally:
        secured.broker.stop()

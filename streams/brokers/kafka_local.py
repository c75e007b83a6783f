"""A real single-node Apache Kafka (KRaft) on loopback, for tests and `make kafka`.

This module owns the recipe of docs/architecture.md §6: the broker's jars are assembled once
from Maven Central by `mvn dependency:copy-dependencies` over deploy/kafka/pom.xml
into a cache dir, and each `LocalKafka` formats a fresh temp log dir with
`kafka.tools.StorageTool` and runs `kafka.Kafka` on it. Unlike the embedded tansu,
this broker has transactions, read_committed, compaction and exact end offsets.

With `security=Security(...)` it is a secured Kafka as production runs one: a
SASL_SSL listener (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN users), an SSL
listener that requires a client certificate (mTLS; also the inter-broker
listener), a controller listener over mTLS, and the StandardAuthorizer with no
access unless an ACL grants it. The certificates and users come from the caller
(the tests generate them with openssl and keytool: tests/support/secure_kafka.py).

    python -m streams.brokers.kafka_local [--port 9092] [--create-topics]

prints the bootstrap address on stdout and serves until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import IO

from streams.brokers import process
from streams.kafka import topics as kafka_topics
from streams.kafka.connection import BrokerUnavailable

# Keep in step with <kafka.version> in deploy/kafka/pom.xml (a test checks it):
# the version names the cache dir, so a bump never reuses stale jars.
KAFKA_VERSION = "3.9.2"
POM = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "pom.xml"
CACHE_ENV = "PREEMPTCTL_KAFKA_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "preemptctl" / f"kafka-{KAFKA_VERSION}"
# The jar whose presence says the assembly is there (libs/ only appears once complete).
_BROKER_JAR = f"kafka_2.13-{KAFKA_VERSION}.jar"

# The first assembly downloads ~46 MB from Maven Central; a hung download must not
# hang the test session forever.
MVN_TIMEOUT_S = 600.0
# StorageTool format takes ~0.5 s here; the bound only catches a wedged JVM.
FORMAT_TIMEOUT_S = 60.0
# The JVM is ready in ~2 s on this 2-core machine; a loaded CI runner can be 10x slower.
KAFKA_READY_TIMEOUT_S = 60.0
# A single-node KRaft broker shuts down in ~0.4 s here; after this it is killed (its data
# dir is a temp dir that is deleted anyway, so an unclean stop loses nothing).
KAFKA_STOP_TIMEOUT_S = 20.0
# Small enough for a laptop or a CI runner next to the test process, big enough for
# the test and benchmark loads; KAFKA_HEAP_OPTS overrides it, as in kafka-server-start.sh.
DEFAULT_HEAP_OPTS = "-Xms128m -Xmx512m"
# Kafka's own production choice (kafka-run-class.sh), minus -server (a no-op on 64-bit).
_JVM_OPTS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)

# How often the CLI checks that the broker is still alive while it serves.
_SERVE_POLL_S = 0.5

_LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


@dataclasses.dataclass(frozen=True)
class Security:
    """What a secured LocalKafka is given: its TLS stores, its users, who may bypass ACLs.

    The broker's certificate must name 127.0.0.1 (an IP SAN): clients, and the broker
    itself on its inter-broker listener, check the host name. Principals of client
    certificates are their CN (`ssl.principal.mapping.rules`).
    """

    keystore: Path  # PKCS12: the broker's key and certificate chain
    truststore: Path  # PKCS12: the CA that signs the brokers' and the clients' certificates
    store_password: str
    ca_file: Path  # PEM of that CA, for the readiness probe
    # A client certificate and key (PEM) of a super user, for the readiness probe on the mTLS listener.
    probe_cert: Path
    probe_key: Path
    # SCRAM users created when the log dir is formatted: name -> password (both SHA-256 and -512).
    scram_users: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # PLAIN users (the broker's JAAS file): name -> password.
    plain_users: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Principals (`User:NAME`) that bypass ACLs: the broker's own certificate CN at least.
    super_users: tuple[str, ...] = ()

    def probe_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.probe_cert), str(self.probe_key))
        return context


# The JAAS option values are quoted in the broker's config; keep test passwords to what needs no escaping.
_JAAS_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


def _secured_listeners(security: Security, *, port: int, tls_port: int, controller_port: int) -> list[str]:
    plain = " ".join(f'user_{name}="{password}"' for name, password in sorted(security.plain_users.items()))
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    return [
        f"listeners=SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{tls_port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{tls_port}",
        "listener.security.protocol.map=SASL_SSL:SASL_SSL,SSL:SSL,CONTROLLER:SSL",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=SSL",
        "ssl.keystore.type=PKCS12",
        f"ssl.keystore.location={security.keystore}",
        f"ssl.keystore.password={security.store_password}",
        "ssl.truststore.type=PKCS12",
        f"ssl.truststore.location={security.truststore}",
        f"ssl.truststore.password={security.store_password}",
        # mTLS on the SSL and controller listeners; SASL_SSL clients authenticate by SASL.
        "listener.name.ssl.ssl.client.auth=required",
        "listener.name.controller.ssl.client.auth=required",
        "ssl.principal.mapping.rules=RULE:^(.*,)?CN=([^,]+)(,.*)?$/$2/,DEFAULT",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256"
        + (",PLAIN" if security.plain_users else ""),
        f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}",
        f"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram}",
        *(
            [
                f"listener.name.sasl_ssl.plain.sasl.jaas.config="
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};"
            ]
            if security.plain_users
            else []
        ),
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found=false",
        f"super.users={';'.join(security.super_users)}",
    ]


def server_properties(
    *,
    port: int,
    controller_port: int,
    log_dir: Path,
    security: Security | None = None,
    tls_port: int | None = None,
) -> str:
    """The KRaft single-node config: one process is broker and controller."""
    if security is None:
        listeners = [
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
        ]
    else:
        assert tls_port is not None, "a secured broker has a second (mTLS) listener"
        listeners = _secured_listeners(
            security, port=port, tls_port=tls_port, controller_port=controller_port
        )
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            *listeners,
            f"log.dirs={log_dir}",
            # One node: every internal topic must be satisfiable by one replica, or
            # consumer groups and transactions never get a coordinator.
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "min.insync.replicas=1",
            # The defaults (50 partitions each) cost seconds of coordinator loading on
            # the first group join and the first transaction.
            "offsets.topic.num.partitions=1",
            "transaction.state.log.num.partitions=1",
            # Tests join groups constantly; the default 3 s delay would dominate them.
            "group.initial.rebalance.delay.ms=0",
            # Topics come from ensure_topics with their configs, never from a typo.
            "auto.create.topics.enable=false",
            "",
        ]
    )


def cache_dir() -> Path:
    """Where the assembled jars live: $PREEMPTCTL_KAFKA_CACHE or ~/.cache/preemptctl/kafka-VERSION."""
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_CACHE


def find_java() -> Path:
    """$JAVA_HOME/bin/java if set (as kafka-run-class.sh does), else java on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return Path(java_home) / "bin" / "java"
    found = shutil.which("java")
    if found is None:
        raise BrokerUnavailable(
            "java not found: install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless)"
        )
    return Path(found)


def assemble(cache: Path | None = None, *, pom: Path = POM) -> Path:
    """The libs/ folder with Kafka's runtime jars; runs Maven only if it is not there yet."""
    libs = (cache or cache_dir()) / "libs"
    if (libs / _BROKER_JAR).is_file():
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerUnavailable(
            f"mvn not found: install Maven (e.g. apt-get install maven) or set {CACHE_ENV} "
            "to a dir with assembled libs/"
        )
    if not pom.is_file():
        raise BrokerUnavailable(f"{pom} not found: assemble Kafka from a source checkout")
    libs.parent.mkdir(parents=True, exist_ok=True)
    # Maven writes into a private dir that is renamed into place only when complete,
    # so an interrupted download or a concurrent test run never sees half a classpath.
    partial = Path(tempfile.mkdtemp(prefix="libs.partial-", dir=libs.parent))
    try:
        try:
            done = subprocess.run(
                [
                    mvn,
                    "-q",
                    "-B",
                    "-f",
                    str(pom),
                    "dependency:copy-dependencies",
                    f"-DoutputDirectory={partial}",
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=MVN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            raise BrokerUnavailable(f"mvn did not finish within {MVN_TIMEOUT_S:g} s") from e
        if done.returncode != 0 or not (partial / _BROKER_JAR).is_file():
            last = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-1:]
            raise BrokerUnavailable(
                f"mvn could not assemble Kafka {KAFKA_VERSION} (exit {done.returncode}): {' '.join(last)}"
            )
        with contextlib.suppress(OSError):  # another process renamed its copy first: use that
            partial.rename(libs)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return libs


def pom_kafka_version(pom: Path = POM) -> str:
    """The <kafka.version> the pom assembles."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom.read_text())
    if match is None:
        raise ValueError(f"{pom} has no <kafka.version>")
    return match.group(1)


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (22 chars)."""
    while True:
        # A leading "-" would be read as an option by kafka-storage (Kafka's own
        # Uuid.randomUuid avoids it the same way).
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


class LocalKafka(process.BrokerProcess):
    """Apache Kafka KRaft single node on loopback, with a temp log dir deleted on stop.

    >>> with LocalKafka() as kafka:
    ...     run(bootstrap=kafka.bootstrap)
    """

    name = "kafka"

    def __init__(
        self,
        *,
        port: int | None = None,
        cache: Path | None = None,
        log_path: Path | None = None,
        ready_timeout_s: float = KAFKA_READY_TIMEOUT_S,
        stop_timeout_s: float = KAFKA_STOP_TIMEOUT_S,
        security: Security | None = None,
    ) -> None:
        super().__init__(port=port, log_path=log_path)
        self._cache = cache
        self.security = security
        self._tls_port: int | None = None
        if security is not None:
            for name, password in (*security.scram_users.items(), *security.plain_users.items()):
                if not (_JAAS_SAFE.match(name) and _JAAS_SAFE.match(password)):
                    raise ValueError(f"user {name!r}: names and passwords of [A-Za-z0-9_.-] only")
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._java: Path | None = None
        self._libs: Path | None = None
        self._workdir: Path | None = None

    def _prepare(self) -> None:
        self._java = find_java()
        self._libs = assemble(self._cache)
        self._workdir = Path(tempfile.mkdtemp(prefix="preemptctl-kafka-"))
        (self._workdir / "log4j.properties").write_text(_LOG4J_PROPERTIES)

    def _java_command(self, *args: str) -> list[str]:
        assert self._java is not None and self._libs is not None and self._workdir is not None
        heap = os.environ.get("KAFKA_HEAP_OPTS", DEFAULT_HEAP_OPTS).split()
        return [
            str(self._java),
            *heap,
            *_JVM_OPTS,
            f"-Dlog4j.configuration=file:{self._workdir / 'log4j.properties'}",
            "-cp",
            str(self._libs / "*"),  # expanded by the JVM, not a shell
            *args,
        ]

    @property
    def tls_bootstrap(self) -> str:
        """`127.0.0.1:PORT` of the mTLS listener of a secured broker (the SASL_SSL one is `bootstrap`)."""
        if self._tls_port is None or self.security is None:
            raise BrokerUnavailable("kafka is not running secured")
        return f"127.0.0.1:{self._tls_port}"

    def _probe(self, port: int) -> bool:
        if self.security is None or self._tls_port is None:
            return super()._probe(port)
        return process.probe_metadata("127.0.0.1", self._tls_port, tls=self.security.probe_context())

    def _launch(self, port: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
        assert self._workdir is not None
        # A retry after a port clash starts over with fresh ports and an empty log dir.
        data = self._workdir / "data"
        shutil.rmtree(data, ignore_errors=True)
        config = self._workdir / "server.properties"
        self._tls_port = process.free_loopback_port() if self.security is not None else None
        config.write_text(
            server_properties(
                port=port,
                controller_port=process.free_loopback_port(),
                log_dir=data,
                security=self.security,
                tls_port=self._tls_port,
            )
        )
        # SCRAM credentials live in the cluster metadata: a secured broker's users are written
        # at format time (KIP-900), so they exist before the first client connects.
        scram = [
            arg
            for name, password in sorted(self.security.scram_users.items() if self.security else ())
            for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256")
            for arg in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
        ]
        try:
            formatted = subprocess.run(
                self._java_command(
                    "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(config), *scram
                ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=FORMAT_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as e:
            raise BrokerUnavailable(f"kafka StorageTool format hung (log: {self.log_path})") from e
        if formatted.returncode != 0:
            why = process.log_summary(self.log_path)
            raise BrokerUnavailable(f"kafka StorageTool format failed: {why} (log: {self.log_path})")
        return subprocess.Popen(
            self._java_command("kafka.Kafka", str(config)),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """SIGKILL the broker as a crash would, keeping its data dir and port for `restart`."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    def restart(self) -> None:
        """Start the killed broker again on the same data dir and port (no format: its data stays)."""
        assert self._workdir is not None and self._port is not None, "restart() needs a started broker"
        with open(self.log_path, "ab") as log:
            broker = subprocess.Popen(
                self._java_command("kafka.Kafka", str(self._workdir / "server.properties")),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._process = broker
        if not self._wait_ready(broker, self._port):
            raise BrokerUnavailable(f"kafka did not restart: {process.log_summary(self.log_path)}")

    def _cleanup(self) -> None:
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Serve a local Kafka until Ctrl-C; the bootstrap address is the only stdout line."""
    parser = argparse.ArgumentParser(
        prog="python -m streams.brokers.kafka_local",
        description="Run a single-node Apache Kafka (KRaft) on loopback until Ctrl-C.",
    )
    parser.add_argument("--port", type=int, help="listener port (default: a free one)")
    parser.add_argument("--create-topics", action="store_true", help="create the preemption.* topics")
    parser.add_argument(
        "--partitions",
        type=int,
        default=kafka_topics.DEFAULT_PARTITIONS,
        help="partitions per topic with --create-topics",
    )
    args = parser.parse_args(argv)
    # `kill PID` (e.g. from make or CI) stops the broker as cleanly as Ctrl-C does, and
    # Ctrl-C works even when a non-interactive shell started us with SIGINT ignored (`cmd &`).
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
    started = time.monotonic()
    try:
        with LocalKafka(port=args.port) as kafka:
            if args.create_topics:
                topics = kafka_topics.topic_specs(partitions=args.partitions)
                asyncio.run(kafka_topics.ensure_topics(kafka.bootstrap, topics))
            print(kafka.bootstrap, flush=True)
            print(
                f"kafka {KAFKA_VERSION} ready at {kafka.url} in {time.monotonic() - started:.1f} s "
                f"(log: {kafka.log_path}); Ctrl-C to stop",
                file=sys.stderr,
            )
            while kafka.running():
                time.sleep(_SERVE_POLL_S)
            print(f"kafka exited on its own (log: {kafka.log_path})", file=sys.stderr)
            return 1
    except BrokerUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kafka stopped", file=sys.stderr)
        return 0


if __name__ == "__main__":
    sys.exit(main())

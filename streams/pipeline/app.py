"""`preemptctl worker`: the faust-streaming app around the worker's partitions.

faust provides the consumer group: which cluster-events partitions this process
owns, their records, and the rebalance signals. Everything else is
streams.pipeline.partitions and streams.pipeline.worker: a newly assigned
partition is opened in the background (its store or latest snapshot, the
decisions published after it, the log after it folded to its end) and the
process reports ready once all are; records at or below a partition's position
are skipped, a gap before a record is read from the log first. The group's
committed offsets are only where faust starts reading; the state's position is
what counts (docs/architecture.md §2).

Publishing does not go through faust's producer. With `--processing-guarantee
exactly_once` (real Kafka only: the embedded broker has no transactions) each
partition has its own transactional producer (streams.pipeline.outbox), and a
partition's decisions, dead letters and snapshots become visible together when
its commit succeeds, before its store moves. faust's own exactly_once is not
used: its transaction manager picks the transactional producer by the
*destination* partition, through the consumer's metadata, which knows only the
topics it consumes, so decisions would leave through its plain producer,
outside any transaction; and its commits follow its own timer, not the store.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import faust
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from engine import config as config_mod
from fold.fleet import tune_gc
from schemas import records
from streams.common import health as health_mod
from streams.common import logs, options, signing
from streams.common.backoff import Backoff
from streams.common.errors import UsageError
from streams.kafka import connection, ownership
from streams.kafka import topics as kafka_topics
from streams.kafka.reading import PartitionReader
from streams.pipeline import metrics, tables, transport
from streams.pipeline import outbox as outbox_mod
from streams.pipeline import partitions as partitions_mod
from streams.pipeline.checkpoint import CHECKPOINT_INTERVAL_S, Stalled
from streams.pipeline.faults import NONE, Faults
from streams.pipeline.outbox import KafkaOutbox, Outbox
from streams.pipeline.partitions import KAFKA_FAILURES, Partitions
from streams.pipeline.pauses import Pauses
from streams.pipeline.recovery import StoreUnavailable
from streams.pipeline.setup import Setup, SnapshotPolicy

log = logging.getLogger("preemptctl.worker")

# Group membership. A member silent for the session timeout loses its partitions to
# the others: low means a crashed worker's partitions move quickly, too low means a
# busy or briefly paused one is thrown out. The embedded broker makes a join wait
# about half of it (docs/architecture.md §6), hence the low default; production may raise it.
SESSION_TIMEOUT_S = 6.0
# Heartbeats at most this far apart, and at least three per session timeout.
HEARTBEAT_S = 1.0
# faust commits the offsets it has handed out this often; they are only where it
# starts reading after a restart, the state's position is the real resume point.
COMMIT_INTERVAL_S = 1.0
# faust's data directory, inside --store-dir (the partitions' stores are cluster-events-N beside it).
FAUST_DATADIR = "faust"
# How often the worker asks the broker which cluster-events partitions its group owns
# (streams.kafka.ownership): two small requests; an orphaned partition is noticed this late.
OWNERSHIP_CHECK_INTERVAL_S = 10.0
# How long a partition that failed to open asks Kafka whether it answers at all, before
# counting the failure as its own (streams.pipeline.partitions): one probe of each broker.
UNREACHABLE_CHECK_S = 10.0
# Exit codes (docs/topics.md, "Exit codes of preemptctl worker"): 0 stopped by SIGTERM or SIGINT
# (at start-up too), 2 bad usage or configuration (streams.cli), and:
# The process exits with this code when it must stop publishing (fenced by another
# worker) or cannot open a partition: its supervisor restarts it.
EXIT_FATAL = 3
# ... and with this one when a partition cannot make progress (docs/topics.md, "Progress"):
# a record that can be neither folded nor dead-lettered, a store that cannot be written.
# A restart may not help: the chart's alert PreemptctlWorkerStalled looks for this code.
EXIT_STALLED = 4
# ... and with this one when a partition's local store cannot be opened through every try
# (a volume full or read-only, a broken RocksDB directory): a restart finds the same disk.
# The chart's alert PreemptctlWorkerStoreUnavailable looks for this code.
EXIT_STORE = 5


def exit_code(exc: BaseException) -> int:
    """The exit code for what stops the process (`on_fatal`)."""
    if isinstance(exc, Stalled):
        return EXIT_STALLED
    if isinstance(exc, StoreUnavailable):
        return EXIT_STORE
    return EXIT_FATAL


def transactional_id(
    group: str, partition: int, names: kafka_topics.Names = kafka_topics.DEFAULT_NAMES
) -> str:
    """One per cluster-events partition: whoever owns the partition owns this id (and fences the rest).

    `<group>-` begins every one: the worker's ACL is a prefix ACL on it (streams.kafka.acls).
    """
    return f"{group}-{names.cluster_events}-{partition}"


def faust_credentials(kafka: connection.KafkaConfig) -> faust.types.auth.CredentialsT | None:
    """What faust's own consumer and producer need to reach `kafka` (its broker_credentials)."""
    if kafka.sasl:
        assert kafka.sasl_password is not None
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password.reveal(),
            ssl_context=kafka.ssl_context,
            mechanism=kafka.sasl_mechanism,
        )
    if kafka.tls:
        return faust.SSLCredentials(kafka.ssl_context)
    return None


def follow_password(app: faust.App, kafka: connection.KafkaConfig) -> None:
    """faust's own consumer and producer log in with the SASL password `kafka` reads now, at each
    connection they open from here on (connection.follow), as every client of the worker does.

    faust builds them with the password read at start (faust_credentials). After a rotation they
    kept trying that one at each reconnection (a broker restart, a coordinator that moves), for
    as long as the process lived, while the worker's own clients, built anew, got through and
    kept it ready: it consumed nothing and said nothing. Called when partitions are assigned and
    by the ownership check (both run once faust has built its clients); does nothing twice.
    """
    thread = getattr(app.consumer, "_thread", None)
    consumer = getattr(thread, "_consumer", None)
    producer = getattr(app.producer, "_producer", None)
    for client in (getattr(consumer, "_client", None), getattr(producer, "client", None)):
        if client is not None:
            connection.follow(client, kafka)


def build_app(
    *,
    kafka: connection.Connect,
    store_dir: Path,
    config: config_mod.Config,
    key: bytes | None,
    guarantee: str,
    key_id: str | None = None,
    layout: kafka_topics.Layout = kafka_topics.DEFAULT_LAYOUT,
    install: str | None = None,
    app_id: str = "preemptctl-worker",
    health_host: str = health_mod.DEFAULT_HOST,
    health_port: int | None = None,
    tables_host: str = health_mod.LOCALHOST,
    tables_port: int | None = None,
    session_timeout: float = SESSION_TIMEOUT_S,
    faults: Faults = NONE,
    snapshots: SnapshotPolicy | None = None,
    unowned_grace_s: float = partitions_mod.UNOWNED_GRACE_S,
) -> faust.App:
    transport.register()
    kafka = connection.of(kafka)
    app = faust.App(
        app_id,
        broker=f"{transport.SCHEME}://{kafka.bootstrap}",
        broker_credentials=faust_credentials(kafka),
        store="memory://",
        # faust's own directory (its default is APPID-data in the working directory, which
        # `preemptctl run` and a worker started anywhere would leave behind): beside the store.
        datadir=str(store_dir / FAUST_DATADIR),
        # faust only consumes; publishing and its guarantee are the worker's (above).
        processing_guarantee="at_least_once",
        broker_session_timeout=session_timeout,
        broker_heartbeat_interval=min(HEARTBEAT_S, session_timeout / 3),
        broker_commit_interval=COMMIT_INTERVAL_S,
        # Without a committed offset start at the end: opening a partition reads the
        # log after its state itself, never the whole log through faust.
        consumer_auto_offset_reset="latest",
        topic_allow_declare=False,
        topic_disable_leader=True,
        web_enabled=False,
        producer_acks=-1,
        producer_max_request_size=records.RECORD_MAX_BYTES,
    )
    names = layout.names
    events_topic = app.topic(names.cluster_events, key_serializer="raw", value_serializer="raw")
    exactly_once = guarantee == "exactly_once"
    shared: list[Any] = []  # at_least_once: one producer for every partition, started on first use

    async def new_outbox(partition: int) -> Outbox:
        if exactly_once:
            producer = await start_producer(kafka, transactional_id(app_id, partition, names))
            return KafkaOutbox(producer, transactional=True, owns_producer=True, faults=faults)
        if not shared:
            shared.append(await start_producer(kafka, None))
        return KafkaOutbox(shared[0], transactional=False, owns_producer=False, faults=faults)

    async def unreachable() -> str | None:
        try:
            await connection.reach(kafka, timeout_s=UNREACHABLE_CHECK_S)
        except connection.BrokerUnreachable as exc:
            return str(exc)
        return None

    setup = Setup(
        config=config,
        key=key,
        key_id=key_id,
        names=names,
        # What the signatures bind: the install's actuators verify for it (default: the prefix).
        install=install or names.prefix,
        unreachable=unreachable,
        store_dir=store_dir,
        reader=lambda: PartitionReader(kafka, read_committed=exactly_once),
        outbox=new_outbox,
        faults=faults,
        snapshots=snapshots or SnapshotPolicy(),
    )
    health = health_mod.Health("worker")

    def fatal(exc: BaseException) -> None:
        # Nothing is lost by stopping here: the store never reflects unpublished output.
        code = exit_code(exc)
        log.critical("exiting (code %d) for the supervisor to restart the worker: %s", code, exc)
        logging.shutdown()
        os._exit(code)

    partitions = Partitions(
        setup,
        health=health,
        on_fatal=fatal,
        session_timeout_s=session_timeout,
        pauses=Pauses(),
        unowned_grace_s=unowned_grace_s,
    )

    if health_port is not None:

        async def serve_health() -> None:
            await health_mod.HealthServer(health, host=health_host, port=health_port).start()

        app.task(serve_health)

    if tables_port is not None:

        async def serve_tables() -> None:
            await health_mod.RouteServer(
                tables.routes(partitions), host=tables_host, port=tables_port
            ).start()

        app.task(serve_tables)

    async def commit_due() -> None:
        await partitions.tick()

    app.timer(interval=CHECKPOINT_INTERVAL_S)(guarded("commit", commit_due, partitions, fatal))

    admin: list[AIOKafkaAdminClient] = []  # started on first use, stopped at shutdown

    async def check_ownership() -> None:
        follow_password(app, kafka)
        await ownership_check(kafka, admin, partitions, group=app_id, topic=names.cluster_events)

    app.timer(interval=OWNERSHIP_CHECK_INTERVAL_S)(
        guarded("ownership check", check_ownership, partitions, fatal)
    )

    @app.agent(events_topic)
    async def fold(stream: Any) -> None:
        async for event in stream.events():
            msg = event.message
            await partitions.handle(msg.partition, msg.offset, msg.key, msg.value, _headers(msg.headers))
            # The worker's own lag, against the log end its consumer last fetched (no request).
            metrics.positioned(
                msg.partition,
                functools.partial(app.consumer.highwater, msg.tp),
                partitions.position(msg.partition),
            )

    def _ours(tps: Any) -> list[int]:
        return sorted(tp.partition for tp in tps if tp.topic == names.cluster_events)

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, /, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        follow_password(app, kafka)
        await partitions.assign(_ours(kwargs.get("assigned") or (args[0] if args else set())))

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, /, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        await partitions.revoke(_ours(kwargs.get("revoked") or (args[0] if args else set())))

    @app.on_before_shutdown.connect
    async def on_shutdown(sender: Any, /, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        await partitions.close()
        for producer in shared:
            await producer.stop()
        for client in admin:
            await client.close()

    return app


def _headers(headers: Any) -> tuple[tuple[str, bytes], ...]:
    """A consumed record's headers as (name, value) pairs (faust passes aiokafka's, or a mapping)."""
    if not headers:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    return tuple((str(k), bytes(v or b"")) for k, v in items)


async def start_producer(kafka: connection.KafkaConfig, transactional_id: str | None) -> Any:
    """A started producer for the outboxes (transactional with an id); stopped if it does not start.

    A transactional producer that does not initialise in time is a broker without transactions
    (TransactionsUnavailable: the process exits) only while Kafka answers: when it refuses new
    connections (a rotated password, a quota) it is BrokerUnreachable, and the partition waits,
    unready, like every other Kafka failure.
    """
    if transactional_id is None:
        producer = outbox_mod.new_producer(kafka)
        try:
            await connection.start(kafka, producer)
        except BaseException:
            await producer.stop()
            raise
        return producer
    try:
        return await outbox_mod.start_transactional(kafka, transactional_id)
    except outbox_mod.TransactionsUnavailable:
        await connection.reach(kafka, timeout_s=UNREACHABLE_CHECK_S)  # BrokerUnreachable: waited for
        raise


def guarded(
    name: str,
    body: Callable[[], Awaitable[None]],
    partitions: Partitions,
    fatal: Callable[[BaseException], None],
) -> Callable[[], Awaitable[None]]:
    """A timer's body that nothing escapes: faust crashes the whole app (exit 1, tracebacks) on a
    timer's exception. A Kafka failure (KAFKA_FAILURES) makes the process unready until the
    timer's next run gets through (the timer's interval is the backoff); anything else is a bug,
    and the process exits with EXIT_FATAL for its supervisor to restart it.
    """

    async def run() -> None:
        try:
            await body()
        except KAFKA_FAILURES as exc:
            partitions.kafka_unanswered(f"{name}: {type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("%s failed", name)
            fatal(partitions_mod.Fatal(f"{name} failed: {type(exc).__name__}: {exc}"))

    run.__name__ = run.__qualname__ = getattr(body, "__name__", name)  # faust names timers by it
    return run


async def ownership_check(
    kafka: connection.KafkaConfig,
    admin: list[Any],
    partitions: Partitions,
    *,
    group: str,
    topic: str,
) -> None:
    """Which cluster-events partitions the group owns, and whether each open partition's log is
    still the one it folded: every OWNERSHIP_CHECK_INTERVAL_S.

    Kafka refusing a new connection (BrokerUnavailable: a rotated SASL password, a connection
    quota, a certificate that no longer verifies, DNS), whether to the admin client or to a
    partition's reader, makes the process unready until a later check gets through; a request
    that fails is tried again at the next check. Neither ends the process.
    """
    try:
        if not admin:
            client = kafka.admin()  # with the worker's client security settings
            try:
                await connection.start(kafka, client)
            except BaseException:
                await client.close()
                raise
            admin.append(client)
        unowned = await ownership.unowned(admin[0], group=group, topic=topic)
    except connection.BrokerUnavailable as exc:
        partitions.kafka_unanswered(str(exc))  # not ready until it answers again
        return
    except KAFKA_FAILURES as exc:
        log.warning("could not check which partitions the group owns (%s); again later", exc)
        return
    partitions.owners_seen(unowned, now=time.monotonic())
    if await partitions.check_logs():  # False: a reader was refused, and it said so
        partitions.kafka_unanswered(None)


async def wait_for_kafka(
    kafka: connection.KafkaConfig,
    layout: kafka_topics.Layout,
    *,
    create: bool,
    health_host: str,
    health_port: int | None,
    backoff: Backoff | None = None,
) -> int:
    """Until Kafka answers and the worker's topics are there: cluster-events' partition count.

    Kafka often starts after its clients, or is restarting when they start, and an operator's
    (or Strimzi's) topics may appear moments after: the worker waits for them, with backoff,
    saying why at each try, live and unready on its health port, instead of exiting for its
    supervisor to restart it again and again. Topics it cannot use as they are (too few
    partitions) are a mistake to fix: BrokerUnavailable, one line, exit 2.
    """
    backoff = backoff or Backoff()
    state = health_mod.Health("worker")  # not ready: faust's app serves readiness once it runs
    server = (
        await health_mod.HealthServer(state, host=health_host, port=health_port).start()
        if health_port is not None
        else None
    )
    try:
        while True:
            try:
                return await kafka_topics.ensure_worker_topics(kafka, layout, create=create)
            except (connection.BrokerUnreachable, kafka_topics.TopicsMissing, KafkaError, OSError) as exc:
                delay = backoff.delay()
                log.warning("%s; trying again in %.1fs", exc, delay)
                await asyncio.sleep(delay)
    finally:
        if server is not None:
            await server.stop()  # faust's app serves the port from now on


T = TypeVar("T")


async def until_stopped(work: Coroutine[Any, Any, T]) -> T | None:
    """`work`'s result, or None when SIGTERM or SIGINT came first (the process then exits 0).

    Before faust runs, nothing handles SIGTERM: a worker told to stop while it waited for Kafka
    ended with -15 (SIGTERM's default), not the documented 0.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    stops = (signal.SIGTERM, signal.SIGINT)
    for sig in stops:
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise  # this coroutine itself is cancelled, not the work by a signal
        return None
    finally:
        for sig in stops:
            loop.remove_signal_handler(sig)


def cmd(args: argparse.Namespace) -> int:
    kafka = connection.from_args(args)
    layout = kafka_topics.from_args(args)
    tune_gc()
    config = options.load_config(args.config)
    signing_key = signing.load_signing_key(args.hmac_key_file, args.hmac_key_id)
    try:
        faults = Faults.parse(args.inject_fault or ())
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.session_timeout <= 0:
        raise UsageError(f"--session-timeout must be positive, got {args.session_timeout}")
    # Before waiting for Kafka: what the wait says must reach the log in the chosen format.
    logs.configure(component="worker", level=args.log_level, fmt=args.log_format)
    try:
        waited = asyncio.run(
            until_stopped(
                wait_for_kafka(
                    kafka,
                    layout,
                    create=not args.no_create_topics,
                    health_host=args.health_host,
                    health_port=args.health_port,
                )
            )
        )
    except connection.BrokerUnavailable as exc:
        raise UsageError(str(exc)) from exc
    if waited is None:
        log.info("stopped while waiting for Kafka")
        return 0
    store_dir = Path(args.store_dir)
    try:
        store_dir.mkdir(parents=True, exist_ok=True)  # faust creates its directory inside, not parents
    except OSError as exc:
        raise UsageError(f"--store-dir {store_dir}: {exc.strerror or exc}") from exc
    app = build_app(
        kafka=kafka,
        layout=layout,
        store_dir=store_dir,
        config=config,
        key=signing_key.secret if signing_key else None,
        key_id=signing_key.key_id if signing_key else None,
        install=args.install_id or layout.names.prefix,
        guarantee=args.processing_guarantee,
        app_id=args.group,
        health_host=args.health_host,
        health_port=args.health_port,
        tables_host=args.tables_host,
        tables_port=args.tables_port,
        session_timeout=args.session_timeout,
        faults=faults,
        snapshots=SnapshotPolicy(min_events=args.snapshot_every, events_per_object=0)
        if args.snapshot_every
        else None,
        unowned_grace_s=args.unowned_grace,
    )
    logs.configure(component="worker", level=args.log_level, fmt=args.log_format)
    # Logging is ours (streams.common.logs): faust's would replace it with coloured handlers on
    # stdout, and its spinner writes terminal escape codes between the lines.
    worker = faust.Worker(
        app, loglevel=args.log_level, quiet=True, override_logging=False, redirect_stdouts=False
    )
    worker.spinner = None
    worker.execute_from_commandline()
    return 0

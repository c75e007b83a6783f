"""What every partition of one worker process shares: its configuration, key, store
directory, readers and outboxes (`Setup`), and when it writes snapshots (`SnapshotPolicy`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

from engine import flows
from engine.config import Config
from fold.controller import Decide
from schemas import chain
from streams.kafka import topics
from streams.pipeline.faults import Faults
from streams.pipeline.outbox import Outbox
from streams.pipeline.snapshot import Reader


@dataclass(frozen=True)
class SnapshotPolicy:
    """When a snapshot is written: recovery replays at most the events folded since the last one."""

    # Small clusters: at most this many events between snapshots (~4 s of replay).
    min_events: int = 100_000
    # Large clusters: a snapshot per this many events per object held, so replaying the
    # log after a snapshot costs about as much as loading the snapshot itself.
    events_per_object: float = 1.0


@dataclass(frozen=True)
class Setup:
    """What every partition of one worker process shares."""

    config: Config
    key: bytes | None
    store_dir: Path
    # A fresh reader of single partitions (read_committed under exactly_once).
    reader: Callable[[], AbstractAsyncContextManager[Reader]]
    # The outbox for a partition; under exactly_once creating it fences the previous owner.
    outbox: Callable[[int], Awaitable[Outbox]]
    faults: Faults = field(default_factory=Faults)
    decide: Decide = flows.decide
    snapshots: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    # The id of `key`, sent with each decision (streams.common.signing.KEY_ID_HEADER).
    key_id: str | None = None
    # The topics' names (--topic-prefix).
    names: topics.Names = topics.DEFAULT_NAMES
    # The install `key` signs for (--install-id, default the topic prefix: schemas.chain), as the
    # actuators of this install verify (streams.common.signing.Keyring).
    install: str = chain.DEFAULT_INSTALL
    # Why Kafka does not answer, or None when it does (None here: always). A partition that
    # cannot open while Kafka is away waits for it instead of using up its reopen attempts.
    unreachable: Callable[[], Awaitable[str | None]] | None = None

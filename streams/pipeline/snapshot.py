"""Snapshots of a partition's state in Kafka: written in chunks, found from the end, never torn.

Why snapshots at all: docs/architecture.md §2.

A snapshot is the worker's local store at one cluster-events position, made
portable: the store's state record (every cluster's controller state, the
position it reflects, the fingerprint of the record at that position and the
decisions offset after its last published decision) followed by every object,
one `key<TAB>value` line each, cut into chunks of CHUNK_BYTES and zlib-compressed.

In the compacted topic preemption.snapshots, partition p holds partition p's:
- chunks under `p/<p>/chunk/<position>/<n>`: a key per position, so a chunk is
  never overwritten by another snapshot's (two writers snapshotting the same
  position write the same bytes: the fold is deterministic);
- the manifest under `p/<p>/manifest`, written after every chunk is
  acknowledged (or in the same transaction): the position, the offset and
  SHA-256 of every chunk, and the same for the snapshot before it.
A reader finds the latest manifest by reading back from the partition's end (a
few records: only tombstones and an unfinished snapshot's chunks can follow it),
reads exactly the chunks it names and checks their digests, so a crash in the
middle of a snapshot can only leave chunks no manifest names: the previous
snapshot is still whole. A manifest record that is not a valid manifest (written
by anything but a worker) is passed over for the one before it, and a snapshot
whose chunks or state do not decode raises Unreadable, never anything else: a
garbage record in this topic once kept its partition from opening for good.
Chunks of the snapshot before the previous one are tombstoned once the new
manifest is acknowledged; the log cleaner removes them.

A manifest says with which allow-list its objects are projected (`projection`,
engine.projection.VERSION; absent from a snapshot written before the worker
projected what it folds, which may hold whole objects). A new snapshot does not
keep such a one as its `previous`: the new manifest names none, and the chunks of
both older snapshots are tombstoned once it is acknowledged, so whole objects do
not outlive the first snapshot written after an upgrade.
"""

from __future__ import annotations

import hashlib
import logging
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from engine import projection
from streams.kafka import topics
from streams.kafka.reading import Message
from streams.pipeline.outbox import Outbox, Outgoing

log = logging.getLogger("preemptctl.worker")

VERSION = 1
# Bytes of the state stream per chunk before compression: compressed, a chunk is
# at most this plus zlib's framing, within records.VALUE_MAX_BYTES.
CHUNK_BYTES = 1024 * 1024
# zlib level 1: the state stream is JSON and compresses ~5x at the fastest level;
# higher levels cost several times the CPU for a few percent.
COMPRESSION_LEVEL = 1


class Unreadable(RuntimeError):
    """A manifest's chunks are missing or do not match their digests."""


class Reader(Protocol):
    """What opening a partition reads (streams.kafka.reading.PartitionReader, or a MemoryBroker)."""

    async def bounds(self, topic: str, partition: int) -> tuple[int, int]: ...

    def read(
        self, topic: str, partition: int, start: int, end: int | None = None
    ) -> AsyncIterator[Message]: ...

    async def at(self, topic: str, partition: int, offset: int) -> Message | None: ...

    async def last(
        self, topic: str, partition: int, match: Callable[[Message], bool], *, start: int, end: int
    ) -> Message | None: ...


def manifest_key(partition: int) -> bytes:
    return f"p/{partition}/manifest".encode()


def chunk_key(partition: int, position: int, n: int) -> bytes:
    return f"p/{partition}/chunk/{position}/{n}".encode()


@dataclass(frozen=True, slots=True)
class Chunk:
    offset: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    partition: int
    position: int  # the cluster-events offset the state reflects
    chunks: tuple[Chunk, ...]
    previous: Manifest | None = None  # the snapshot before, still whole (its own `previous` dropped)
    # engine.projection.VERSION of its objects; None: written before the worker projected.
    projection: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "v": VERSION,
            "partition": self.partition,
            "position": self.position,
            "chunks": [{"offset": c.offset, "sha256": c.sha256} for c in self.chunks],
            "previous": None if self.previous is None else self.previous.to_json(),
        }
        if self.projection is not None:
            out["projection"] = self.projection
        return out

    @classmethod
    def from_json(cls, value: Any, *, nested: bool = False) -> Manifest:
        """The manifest a record holds; Unreadable when it is not one."""
        if not isinstance(value, dict) or value.get("v") != VERSION:
            raise Unreadable("not a version 1 manifest")
        partition, position, chunks = value.get("partition"), value.get("position"), value.get("chunks")
        if not (_offset(partition) and _offset(position) and isinstance(chunks, list)):
            raise Unreadable("a manifest needs partition, position (offsets) and chunks (a list)")
        if not all(
            isinstance(c, dict) and _offset(c.get("offset")) and _digest(c.get("sha256")) for c in chunks
        ):
            raise Unreadable("a manifest's chunks need offset and sha256")
        previous = value.get("previous")
        if previous is not None and nested:
            raise Unreadable("a previous manifest has no previous of its own")
        kept = value.get("projection")
        return cls(
            int(partition),  # type: ignore[arg-type]  # checked by _offset above
            int(position),  # type: ignore[arg-type]
            tuple(Chunk(c["offset"], c["sha256"]) for c in chunks),
            None if previous is None else cls.from_json(previous, nested=True),
            kept if isinstance(kept, int) and not isinstance(kept, bool) else None,
        )

    def alone(self) -> Manifest:
        return Manifest(self.partition, self.position, self.chunks, projection=self.projection)

    @property
    def projected(self) -> bool:
        """Are its objects projections with this code's allow-list (no whole objects)?"""
        return self.projection == projection.VERSION


def _offset(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _digest(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


# ---- the state stream ------------------------------------------------------------------------


def encode(state: Mapping[str, Any], entries: Iterable[tuple[bytes, bytes]]) -> Iterator[bytes]:
    """The compressed chunks of a state record and its store entries."""
    buffer = bytearray(orjson.dumps(state))
    buffer += b"\n"
    for key, value in entries:
        buffer += key
        buffer += b"\t"
        buffer += value
        buffer += b"\n"
        while len(buffer) >= CHUNK_BYTES:
            yield zlib.compress(bytes(buffer[:CHUNK_BYTES]), COMPRESSION_LEVEL)
            del buffer[:CHUNK_BYTES]
    if buffer:
        yield zlib.compress(bytes(buffer), COMPRESSION_LEVEL)


def decode(chunks: Iterable[bytes]) -> tuple[dict[str, Any], Iterator[tuple[bytes, bytes]]]:
    """The state record and an iterator over the entries, decompressed as they are read.

    Unreadable (from the call or from the iterator) when the chunks do not decode.
    """
    stream = iter(chunks)
    buffer = b""
    try:
        while b"\n" not in buffer:
            buffer += zlib.decompress(next(stream))
        head, buffer = buffer.split(b"\n", 1)
        state = orjson.loads(head)
    except (StopIteration, zlib.error, orjson.JSONDecodeError) as exc:
        raise Unreadable(f"the snapshot's state does not decode ({type(exc).__name__})") from exc
    if not isinstance(state, dict) or not _offset(state.get("position")):
        raise Unreadable("the snapshot's state has no position")

    def entries(rest: bytes) -> Iterator[tuple[bytes, bytes]]:
        for chunk in stream:
            try:
                rest += zlib.decompress(chunk)
            except zlib.error as exc:
                raise Unreadable(f"a chunk of the snapshot does not decompress ({exc})") from exc
            lines = rest.split(b"\n")
            rest = lines.pop()
            for line in lines:
                key, _, value = line.partition(b"\t")
                yield key, value
        for line in rest.split(b"\n"):
            if line:
                key, _, value = line.partition(b"\t")
                yield key, value

    return state, entries(buffer)


# ---- in Kafka ----------------------------------------------------------------------------------


async def latest(reader: Reader, partition: int, *, topic: str = topics.SNAPSHOTS) -> Manifest | None:
    """The newest valid manifest of a partition, read back from the end of its snapshots partition.

    Records under the manifest key that are not a manifest of this partition are passed over.
    """
    start, end = await reader.bounds(topic, partition)
    key = manifest_key(partition)
    found: list[Manifest] = []

    def valid(m: Message) -> bool:
        if m.key != key or not m.value:
            return False
        manifest = parse_manifest(m.value)
        if manifest is None or manifest.partition != partition:
            log.warning(
                "partition %d: passing over an invalid snapshot manifest at offset %d", partition, m.offset
            )
            return False
        found.append(manifest)
        return True

    record = await reader.last(topic, partition, valid, start=start, end=end)
    return None if record is None else found[-1]


def parse_manifest(value: bytes) -> Manifest | None:
    """The manifest in a record's value, or None when it holds none."""
    try:
        return Manifest.from_json(orjson.loads(value))
    except (orjson.JSONDecodeError, Unreadable, RecursionError):
        return None


async def load(
    reader: Reader, manifest: Manifest, *, topic: str = topics.SNAPSHOTS
) -> tuple[dict[str, Any], Iterator[tuple[bytes, bytes]]]:
    """The state and entries a manifest names; Unreadable if a chunk is missing or altered."""
    if not manifest.chunks:
        raise Unreadable(f"snapshot at {manifest.position} names no chunks")
    wanted = {c.offset: (n, c.sha256) for n, c in enumerate(manifest.chunks)}
    got: dict[int, bytes] = {}
    first, last = min(wanted), max(wanted)
    async for m in reader.read(topic, manifest.partition, first, last + 1):
        if m.offset in wanted:
            n, digest = wanted[m.offset]
            if m.key != chunk_key(manifest.partition, manifest.position, n):
                raise Unreadable(f"offset {m.offset} holds {m.key!r}, not chunk {n} of {manifest.position}")
            if hashlib.sha256(m.value).hexdigest() != digest:
                raise Unreadable(
                    f"chunk {n} of the snapshot at {manifest.position} does not match its digest"
                )
            got[m.offset] = m.value
    missing = sorted(set(wanted) - set(got))
    if missing:
        raise Unreadable(f"{len(missing)} chunk(s) of the snapshot at {manifest.position} are gone")
    return decode(got[c.offset] for c in manifest.chunks)


async def write(
    outbox: Outbox,
    *,
    partition: int,
    state: Mapping[str, Any],
    entries: Iterable[tuple[bytes, bytes]],
    previous: Manifest | None,
    topic: str = topics.SNAPSHOTS,
) -> Manifest:
    """Publish a snapshot of `state` (whose `position` it reflects) and commit; the new manifest."""
    position = int(state["position"])
    kept = state.get("projection")
    # A previous snapshot that may hold whole objects is no fallback: it goes with this one.
    dropped = previous if previous is not None and not previous.projected else None
    if dropped is not None:
        previous = None
    sent: list[str] = []
    for n, chunk in enumerate(encode(state, entries)):
        await outbox.send(Outgoing(topic, partition, chunk_key(partition, position, n), chunk))
        sent.append(hashlib.sha256(chunk).hexdigest())
    offsets = await outbox.flush()
    manifest = Manifest(
        partition,
        position,
        tuple(Chunk(o, d) for o, d in zip(offsets, sent, strict=True)),
        None if previous is None else previous.alone(),
        kept if isinstance(kept, int) and not isinstance(kept, bool) else None,
    )
    await outbox.send(Outgoing(topic, partition, manifest_key(partition), orjson.dumps(manifest.to_json())))
    await outbox.flush()  # the new manifest is in place before anything it replaces goes
    gone = [previous.previous] if previous is not None else []
    if dropped is not None:
        gone = [dropped, dropped.previous]
    kept_positions = (position, manifest.previous and manifest.previous.position)
    for old in gone:
        if old is not None and old.position not in kept_positions:
            for n in range(len(old.chunks)):
                await outbox.send(Outgoing(topic, partition, chunk_key(partition, old.position, n), None))
    await outbox.commit()
    return manifest

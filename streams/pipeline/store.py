"""The worker's local state store (rocksdict on disk), written in batches with its log position.

One store per cluster-events partition. Keys: `obj/<cluster>/<Kind>/<key>` →
the raw object (orjson), the cluster name escaped (`%` → `%25`, `/` → `%2F`) so
that no cluster's prefix is another's (`obj/a/` once matched cluster `a/b`'s
objects too, and `a` decided on `a/b`'s nodes after a restart); `meta/state` →
the controllers' own state (sequence numbers, hash-chain heads, nominations,
...) together with `position`, the cluster-events offset the whole store
reflects, what tells that position's topic incarnation (the record's
fingerprint; streams.pipeline.recovery) and `layout`, the key layout. Each write
is one RocksDB WriteBatch, so objects, controller state and position change
atomically: after a crash the store is exactly the state after some record,
and the worker resumes its input right after that record (docs/architecture.md §2).
A snapshot (streams.pipeline.snapshot) is these same entries; `replace` loads
one into a fresh directory, writing the state record last, and only then puts
it in the store's place, so a crash or a bad snapshot while loading leaves the
store as it was.

Values are objects as engine.projection keeps them: `projection` in the state
says with which allow-list (its VERSION). A store or snapshot without it, or of
another version, may hold whole objects (a writer that did not project, before
the worker projected what it folds): it is re-projected as it is opened or
loaded (`reproject`), every value rewritten in the same batch as the marker, so
the decisions do not change (the projection folds to the same ones) and nothing
is rebuilt from the log.

A store or snapshot of the old layout (no `layout`: cluster names unescaped) is
migrated as it is opened or loaded: each key is given to the one cluster of its
state whose name it starts with. When two cluster names share such a prefix
(`a` and `a/b`), which objects were whose cannot be told (that store was already
wrong): `migrate` gives up and the worker discards it, rebuilding from an older
snapshot or the log (streams.pipeline.recovery).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from rocksdict import Options, Rdict, WriteBatch

from engine import projection
from streams.pipeline.faults import NONE, Faults

_OBJ = b"obj/"
_STATE = b"meta/state"
# The key layout this code writes; states without `layout` are of the old, unescaped one.
LAYOUT = 2


class Unmigratable(RuntimeError):
    """An old-layout store or snapshot whose keys cannot be told apart by cluster."""


def cluster_prefix(cluster: str) -> bytes:
    """The key prefix of one cluster's objects: prefix-free, since the escaped name has no `/`."""
    return _OBJ + cluster.replace("%", "%25").replace("/", "%2F").encode() + b"/"


def migrate_key(key: bytes, clusters: Iterable[str]) -> bytes:
    """An old-layout object key in the current layout; Unmigratable when its cluster is ambiguous."""
    owners = [c for c in clusters if key.startswith(_OBJ + c.encode() + b"/")]
    if len(owners) != 1:
        raise Unmigratable(f"store key {key[:200]!r} belongs to {len(owners)} clusters")
    old = _OBJ + owners[0].encode() + b"/"
    return cluster_prefix(owners[0]) + key[len(old) :]


def migrate(
    state: Mapping[str, Any], entries: Iterable[tuple[bytes, bytes]]
) -> Iterator[tuple[bytes, bytes]]:
    """Entries of a state in the current layout and projection (unchanged when they already are)."""
    if not projected(state):
        entries = ((key, reproject(value)) for key, value in entries)
    if state.get("layout") == LAYOUT:
        yield from entries
        return
    clusters = _separable(state)
    for key, value in entries:
        yield migrate_key(key, clusters), value


def projected(state: Mapping[str, Any]) -> bool:
    """Are a state's objects projections with this allow-list (engine.projection.VERSION)?"""
    return state.get("projection") == projection.VERSION


def reproject(value: bytes) -> bytes:
    """A stored object as its projection (the same bytes when it is one already)."""
    obj = orjson.loads(value)
    return orjson.dumps(projection.project(obj)) if isinstance(obj, dict) else value


def _marked(state: Mapping[str, Any]) -> bytes:
    """The state record as written: with this code's key layout and projection."""
    return orjson.dumps({**state, "layout": LAYOUT, "projection": projection.VERSION})


def _separable(state: Mapping[str, Any]) -> list[str]:
    """The clusters of an old-layout state; Unmigratable when one's keys could be another's."""
    clusters = sorted(state.get("clusters", {}))
    for a in clusters:
        for b in clusters:
            if a != b and b.startswith(a + "/"):
                raise Unmigratable(f"clusters {a!r} and {b!r} shared keys in the old store layout")
    return clusters


# Entries per WriteBatch when a snapshot is loaded: bounds the batch's memory.
REPLACE_BATCH_ENTRIES = 20_000


class Store:
    def __init__(self, path: Path, *, faults: Faults = NONE) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._faults = faults
        self._db = Rdict(str(path), Options(raw_mode=True))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state(self) -> dict[str, Any] | None:
        raw = self._db.get(_STATE)
        return None if raw is None else dict(orjson.loads(bytes(raw)))

    def objects(self, cluster: str) -> Iterator[dict[str, Any]]:
        prefix = cluster_prefix(cluster)
        for key, value in self._db.items(from_key=prefix):
            assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode stores bytes only
            if not key.startswith(prefix):
                break
            yield orjson.loads(value)

    def write(
        self,
        dirty: Mapping[str, Mapping[str, bytes | Mapping[str, Any] | None]],
        state: Mapping[str, Any],
    ) -> None:
        """`dirty`: cluster -> {Kind/key -> the raw object (encoded, or to encode), None for deleted}."""
        batch = WriteBatch(raw_mode=True)
        for cluster, changes in dirty.items():
            prefix = cluster_prefix(cluster)
            for key, obj in changes.items():
                k = prefix + key.encode()
                if obj is None:
                    batch.delete(k)
                else:
                    batch.put(k, obj if isinstance(obj, bytes) else orjson.dumps(obj))
        batch.put(_STATE, _marked(state))
        self._faults.check("fail-store")  # as the write itself failing (a full disk)
        self._db.write(batch)

    def entries(self) -> Iterator[tuple[bytes, bytes]]:
        """Every object entry (store key, raw value), in key order: what a snapshot holds."""
        for key, value in self._db.items(from_key=_OBJ):
            assert isinstance(key, bytes) and isinstance(value, bytes)
            if not key.startswith(_OBJ):
                break
            yield key, value

    def migrated(self) -> Store:
        """This store in the current key layout and projection (rewritten in one batch if not).

        Unmigratable (the store unchanged) when its clusters' old keys cannot be told apart.
        """
        state = self.state()
        if state is None or (state.get("layout") == LAYOUT and projected(state)):
            return self
        clusters = None if state.get("layout") == LAYOUT else _separable(state)
        again = not projected(state)
        # Only the keys of clusters whose names hold `%` or `/` change; the rest stay as they are.
        batch = WriteBatch(raw_mode=True)
        for key, value in self.entries():
            new = key if clusters is None else migrate_key(key, clusters)
            kept = reproject(value) if again else value
            if new != key:
                batch.delete(key)
            if new != key or kept != value:
                batch.put(new, kept)
        batch.put(_STATE, _marked(state))
        self._db.write(batch)
        return self

    @classmethod
    def replace(cls, path: Path, state: Mapping[str, Any], entries: Iterable[tuple[bytes, bytes]]) -> Store:
        """A store at `path` holding exactly `entries` and `state` (a loaded snapshot), in the current layout.

        Built beside `path` and moved into its place when whole: an exception while reading
        the entries (a snapshot that does not decode, Unmigratable) leaves `path` as it was.
        """
        loading = path.with_name(path.name + ".loading")
        cls.destroy(loading)
        store = cls(loading)
        try:
            batch = WriteBatch(raw_mode=True)
            for n, (key, value) in enumerate(migrate(state, entries), 1):
                batch.put(key, value)
                if n % REPLACE_BATCH_ENTRIES == 0:
                    store._db.write(batch)
                    batch = WriteBatch(raw_mode=True)
            # Last: without it the store is empty.
            batch.put(_STATE, _marked(state))
            store._db.write(batch)
        finally:
            store.close()
        cls.destroy(path)
        loading.rename(path)
        return cls(path)

    @staticmethod
    def destroy(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

"""The worker's local state store (rocksdict on disk), written in batches with its log position.

One store per cluster-events partition. Keys: `obj/<cluster>/<Kind>/<key>` →
the raw object (orjson); `meta/state` → the controllers' own state (sequence
numbers, hash-chain heads, nominations, ...) together with `position`, the
cluster-events offset the whole store reflects, and what tells that position's
topic incarnation (the record's fingerprint; streams.pipeline.worker). Each
write is one RocksDB WriteBatch, so objects, controller state and position
change atomically: after a crash the store is exactly the state after some
record, and the worker resumes its input right after that record (DESIGN §3).
A snapshot (streams.pipeline.snapshot) is these same entries; `replace` loads
one, writing the state record last, so a crash while loading leaves a store
with no state, which opens as empty.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from rocksdict import Options, Rdict, WriteBatch

from streams.pipeline.faults import NONE, Faults

_OBJ = b"obj/"
_STATE = b"meta/state"
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
        prefix = _OBJ + cluster.encode() + b"/"
        for key, value in self._db.items(from_key=prefix):
            assert isinstance(key, bytes) and isinstance(value, bytes)  # raw mode stores bytes only
            if not key.startswith(prefix):
                break
            yield orjson.loads(value)

    def write(
        self, dirty: Mapping[str, Mapping[str, Mapping[str, Any] | None]], state: Mapping[str, Any]
    ) -> None:
        """`dirty`: cluster -> {Kind/key -> raw object, or None for deleted}."""
        batch = WriteBatch(raw_mode=True)
        for cluster, changes in dirty.items():
            for key, obj in changes.items():
                k = _OBJ + f"{cluster}/{key}".encode()
                if obj is None:
                    batch.delete(k)
                else:
                    batch.put(k, orjson.dumps(obj))
        batch.put(_STATE, orjson.dumps(state))
        self._faults.check("fail-store")  # as the write itself failing (a full disk)
        self._db.write(batch)

    def entries(self) -> Iterator[tuple[bytes, bytes]]:
        """Every object entry (store key, raw value), in key order: what a snapshot holds."""
        for key, value in self._db.items(from_key=_OBJ):
            assert isinstance(key, bytes) and isinstance(value, bytes)
            if not key.startswith(_OBJ):
                break
            yield key, value

    @classmethod
    def replace(cls, path: Path, state: Mapping[str, Any], entries: Iterable[tuple[bytes, bytes]]) -> Store:
        """A store at `path` holding exactly `entries` and `state` (a loaded snapshot)."""
        cls.destroy(path)
        store = cls(path)
        batch = WriteBatch(raw_mode=True)
        for n, (key, value) in enumerate(entries, 1):
            batch.put(key, value)
            if n % REPLACE_BATCH_ENTRIES == 0:
                store._db.write(batch)
                batch = WriteBatch(raw_mode=True)
        batch.put(_STATE, orjson.dumps(state))  # last: without it the store is empty
        store._db.write(batch)
        return store

    @staticmethod
    def destroy(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

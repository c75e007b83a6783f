"""The worker's local state store (rocksdict on disk), written in batches with its log position.

Keys: `obj/<Kind>/<key>` → the raw object (orjson), `meta/state` → the
controller's own state (sequence number, hash-chain head, nominations, ...)
together with `position`, the cluster-events (offset, index) the whole store
reflects. Each write is one RocksDB WriteBatch, so objects, controller state and
position change atomically: after a crash the store is exactly the state after
some event, and the worker resumes its input right after that event.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
from rocksdict import Options, Rdict, WriteBatch

_OBJ = b"obj/"
_STATE = b"meta/state"


class Store:
    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = Rdict(str(path), Options(raw_mode=True))

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state(self) -> dict[str, Any] | None:
        raw = self._db.get(_STATE)
        return None if raw is None else dict(orjson.loads(raw))

    def objects(self) -> Iterator[dict[str, Any]]:
        for key, value in self._db.items(from_key=_OBJ):
            if not key.startswith(_OBJ):
                break
            yield orjson.loads(value)

    def write(self, dirty: Mapping[str, Mapping[str, Any] | None], state: Mapping[str, Any]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, obj in dirty.items():
            k = _OBJ + key.encode()
            if obj is None:
                batch.delete(k)
            else:
                batch.put(k, orjson.dumps(obj))
        batch.put(_STATE, orjson.dumps(state))
        self._db.write(batch)

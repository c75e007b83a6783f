"""The actuator's ledger: which (decision id, subject) pairs it has started and recorded.

A subject is a victim uid, or `nominate/<namespace>/<name>` for a nomination.
- `pending`: a write to the cluster is about to happen (written before the
  first write call), so a restart after a crash knows its own earlier action
  may have taken effect, and reports the victim as done rather than as found
  already terminating;
- `recorded`: the outcome is in preemption.evictions; never act again.

On disk as JSON lines, appended as they happen (written to the OS at once: a
crash of the process loses nothing) and made durable by `sync`, a group commit:
one fsync, in a thread, for every line appended before it. The actuator syncs
once per decision, after its outcomes are written and before its offset is
committed, never between reading a victim and writing to it: an fsync there
(2-20 ms on a loaded machine) would sit on every preemptor's critical path, and
all it would protect is the *label* of an outcome after a crash of the whole
machine in that window (a victim our delete removed reported as already-gone
instead of done). Exactly-once never depended on it: a victim found gone,
terminating or replaced is never acted on again, every write carries its uid
as a precondition, and the evictions topic is read back at start. Compacted to
the last state per key when loaded. The evictions topic is the other half of
recovery: on start the actuator reads it back and marks every outcome found
there as recorded, so a lost ledger file (a rescheduled pod without a volume)
duplicates nothing.

It also keeps each cluster's chain head (schemas.chain): the `seq` and `hash` of the last
decision record the actuator accepted, a line `{"cluster", "seq", "hash"}` written before
the record is acted on, so a redelivery of that record after a crash is known as such and
a record that goes back is refused (streams.kube.actuator, freshness). A head line lost
with the machine (lines are synced with a decision's outcomes, not each) leaves an older
head: the actuator then accepts the first record after a start that does not go back
below it, so losing a line never refuses a real decision.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import IO, NamedTuple

import orjson

PENDING = "pending"
RECORDED = "recorded"

LedgerKey = tuple[str, str]


class Head(NamedTuple):
    """A cluster's chain head: the last decision record accepted."""

    seq: int
    hash: str


def nomination_subject(member: str) -> str:
    return f"nominate/{member}"


class Ledger:
    """States by (decision id, subject), optionally persisted to a JSON-lines file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._states: dict[LedgerKey, str] = {}
        self._heads: dict[str, Head] = {}
        self._file: IO[bytes] | None = None
        self._appended = 0  # lines appended since opened
        self._synced = 0  # of which this many are known durable
        self._syncing: asyncio.Future[None] | None = None
        if path is not None:
            self._load(path)

    def _load(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            for line in path.read_bytes().splitlines():
                try:
                    entry = orjson.loads(line)
                    if "cluster" in entry:
                        seq, digest = entry["seq"], entry["hash"]
                        if isinstance(seq, int) and isinstance(digest, str):
                            self._heads[str(entry["cluster"])] = Head(seq, digest)
                        continue
                    key = (str(entry["decisionId"]), str(entry["subject"]))
                    state = str(entry["state"])
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn last line from a crash mid-append: the entry never counted
                if state == RECORDED or self._states.get(key) != RECORDED:
                    self._states[key] = state
        # Rewrite compacted, then append: the file holds one line per key after a restart.
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "wb") as out:
            for (decision_id, subject), state in self._states.items():
                out.write(self._line(decision_id, subject, state))
            for cluster, head in self._heads.items():
                out.write(self._head_line(cluster, head))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        self._file = open(path, "ab")  # noqa: SIM115 - kept open for the process's lifetime

    @staticmethod
    def _line(decision_id: str, subject: str, state: str) -> bytes:
        return orjson.dumps({"decisionId": decision_id, "subject": subject, "state": state}) + b"\n"

    @staticmethod
    def _head_line(cluster: str, head: Head) -> bytes:
        return orjson.dumps({"cluster": cluster, "seq": head.seq, "hash": head.hash}) + b"\n"

    def _write(self, key: LedgerKey, state: str) -> None:
        self._states[key] = state
        self._append(self._line(key[0], key[1], state))

    def _append(self, line: bytes) -> None:
        if self._file is not None:
            self._file.write(line)
            self._file.flush()  # in the OS now: a crash of the process loses nothing, a machine's may
            self._appended += 1

    def head(self, cluster: str) -> Head | None:
        """The cluster's chain head: the last decision record accepted (None: none yet)."""
        return self._heads.get(cluster)

    def set_head(self, cluster: str, seq: int, digest: str) -> None:
        head = Head(seq, digest)
        if self._heads.get(cluster) != head:
            self._heads[cluster] = head
            self._append(self._head_line(cluster, head))

    async def sync(self) -> None:
        """Return once every line appended before the call is on disk (one fsync for all waiting)."""
        target = self._appended
        while self._synced < target:
            if self._syncing is None or self._syncing.done():
                self._syncing = asyncio.ensure_future(self._fsync())
            # Shielded: a waiter cancelled (its decision failed) leaves the shared fsync running.
            await asyncio.shield(self._syncing)

    async def _fsync(self) -> None:
        upto = self._appended
        if self._file is not None:
            await asyncio.to_thread(os.fsync, self._file.fileno())
        self._synced = max(self._synced, upto)

    def state(self, key: LedgerKey) -> str | None:
        return self._states.get(key)

    def recorded(self, key: LedgerKey) -> bool:
        return self._states.get(key) == RECORDED

    def pending(self, key: LedgerKey) -> bool:
        return self._states.get(key) == PENDING

    def mark_pending(self, key: LedgerKey) -> None:
        if self._states.get(key) is None:
            self._write(key, PENDING)

    def mark_recorded(self, key: LedgerKey) -> None:
        if self._states.get(key) != RECORDED:
            self._write(key, RECORDED)

    def note_recorded(self, key: LedgerKey) -> None:
        """Recorded elsewhere (read back from the evictions topic): remember without writing."""
        self._states[key] = RECORDED

    def __len__(self) -> int:
        return len(self._states)

    def close(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

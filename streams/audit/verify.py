"""`preemptctl audit verify|head`: can the decision log be trusted as read?

This module owns the verification of a decision log (docs/topics.md, docs/audit.md,
docs/architecture.md §4): reading records with their position (a JSONL line, or a
topic partition and offset), checking each cluster's hash chain, ids, sequence
numbers and, with keys, signatures (Ed25519 public keys, or HMAC keys in the
compatibility mode; bound to the install, `--install-id`, default the default topic
prefix: schemas.chain), naming the first bad record and why, and the chain head ("anchor")
that catches a truncated tail once it is published somewhere the log's writer
cannot reach. `streams.audit.explain` reads decision logs through `scan` too.

What each check catches (schemas.chain):
- a record's `hash` does not recompute from its content: it was edited;
- a record's `prevHash` is not the hash of the record before it in its cluster:
  one was removed, the records were reordered, or a foreign record was inserted;
- with a key, a missing or wrong `sig`: a forged or unsigned record (a forger
  without the key can re-hash a record, but not sign it);
- a repeated `id`: a duplicated record;
- the tail cut off: invisible to the chain itself (what remains is a valid
  chain), so `verify --anchor` checks that the log still reaches a head
  recorded earlier with `audit head`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from schemas import chain, decisions
from streams.common import signing
from streams.common.errors import UsageError
from streams.kafka import connection, logio

EXIT_INTACT = 0
EXIT_TAMPERED = 1

# Kinds of problem, as printed; docs/audit.md explains each.
EDITED = "edited"
REMOVED = "removed"
REORDERED = "reordered"
INSERTED = "inserted"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad signature"
DUPLICATE = "duplicate"
MALFORMED = "malformed"
SEQ = "sequence"
TRUNCATED = "truncated"
# No record at all (of the cluster asked about): nothing was verified, and a log deleted whole
# looks exactly like this, so it is never reported intact.
EMPTY = "empty"

_HEX64 = re.compile(r"^[0-9a-f]{64}$")

# (where, key, value) of one record as read; `where` is "line N" or "partition P offset O".
Sink = Callable[[str, bytes | None, bytes], None]


# ---- reading ---------------------------------------------------------------------------


def quiet_client_logs() -> None:
    """Keep aiokafka's and asyncio's own complaints off a command's stderr.

    A failure to read a topic is reported as one line (exit 2); without a handler
    configured, Python would also print the client's internal warnings (connection
    retries, an unclosed consumer) around it. Records still propagate to any
    handler that is configured (a test's log capture, an operator's logging setup).
    """
    for name in ("aiokafka", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())


def scan(
    location: str,
    sink: Sink,
    *,
    kafka: connection.KafkaConfig | None = None,
    since_ms: int | None = None,
) -> None:
    """Feed every record of a decision log to `sink`, in log order, without holding them all.

    `since_ms` (epoch milliseconds) skips a topic's records the broker stamped earlier,
    through its time index; a file is read whole (its records carry no broker time).

    A JSONL file is read line by line (blank lines skipped); a topic through a
    plain consumer from its beginning. Unreadable input raises UsageError.
    """
    if logio.is_kafka(location):
        # The Kafka client only for a topic: `audit verify FILE` starts without it.
        from aiokafka.errors import KafkaError

        from streams.kafka import reading

        config, topic = reading.topic_config(location, kafka)
        quiet_client_logs()

        async def read() -> None:
            # read_committed: records of aborted transactions (real Kafka) never happened.
            async for m in reading.read_all(config, topic, read_committed=True, since_ms=since_ms):
                sink(f"partition {m.partition} offset {m.offset}", m.key, m.value)

        try:
            asyncio.run(read())
        except (KafkaError, OSError) as exc:
            raise UsageError(f"cannot read {location}: {exc}") from exc
        return
    path = Path(location)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    with handle:
        try:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    sink(f"line {number}", None, line)
        except OSError as exc:  # a directory opens on some systems but does not read
            raise UsageError(f"{path}: {exc.strerror or exc}") from exc


# ---- verification ----------------------------------------------------------------------


@dataclass(slots=True)
class Head:
    """The end of one cluster's chain as verified so far."""

    cluster: str
    hash: str = chain.GENESIS
    records: int = 0
    seq: int = -1
    id: str | None = None
    ts: str | None = None
    where: str | None = None
    start: str = chain.GENESIS  # what the first record continues from (not genesis: a pruned log)

    def to_json(self) -> dict[str, Any]:
        return {
            "head": self.hash,
            "records": self.records,
            "lastSeq": self.seq,
            "lastId": self.id,
            "lastTs": self.ts,
            "start": self.start,
        }


@dataclass(slots=True)
class Problem:
    """The first bad record (or the unreached anchor), and why."""

    where: str
    kind: str
    detail: str
    id: str | None = None
    cluster: str | None = None

    def line(self) -> str:
        who = ", ".join(
            x
            for x in (f"id {self.id}" if self.id else "", f"cluster {self.cluster}" if self.cluster else "")
            if x
        )
        return f"FAILED at {self.where}{f' ({who})' if who else ''}: {self.kind}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {
            "where": self.where,
            "kind": self.kind,
            "detail": self.detail,
            "id": self.id,
            "cluster": self.cluster,
        }


@dataclass(frozen=True, slots=True)
class Anchor:
    """A chain head recorded earlier: the log must still contain it (in `cluster`, when given)."""

    hash: str
    cluster: str | None = None


@dataclass(slots=True)
class Verifier:
    """Checks records one at a time, in log order; stops checking at the first problem.

    Memory is one (hash -> position) entry per record, which is what lets a broken
    link say where the record's real predecessor is.
    """

    key: bytes | None = None
    # Accepted signing keys (rotation: a log holds records of several); `key` is one of any id.
    keys: signing.Keyring | None = None
    cluster: str | None = None  # only this cluster's records; the others are skipped
    allow_duplicates: bool = False
    pruned: bool = False  # the oldest records may be gone (retention): a chain may start mid-way
    heads: dict[str, Head] = field(default_factory=dict)
    records: int = 0  # records verified
    skipped: int = 0  # records of other clusters
    duplicates: int = 0  # identical re-deliveries skipped (allow_duplicates)
    unchecked: int = 0  # records after the first problem
    problem: Problem | None = None
    _seen: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # hash -> (cluster, number, where)
    _ids: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (where, hash)
    _want: str | None = None  # after a broken link: the missing predecessor's hash, looked for later
    _want_cluster: str | None = None

    def feed(self, where: str, key: bytes | None, value: bytes) -> None:
        if self.problem is not None:
            self.unchecked += 1
            self._look_ahead(where, value)
            return
        if self.cluster is not None and key is not None and key != self.cluster.encode():
            # Topics are keyed by cluster: another cluster's record, whatever its content.
            self.skipped += 1
            return
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            self._fail(where, MALFORMED, f"not JSON ({exc})", None)
            return
        if not isinstance(record, dict):
            self._fail(where, MALFORMED, "not a JSON object", None)
            return
        cluster = record.get("cluster")
        if self.cluster is not None and cluster != self.cluster:
            self.skipped += 1
            return
        # What the chain reads, no more: any other damage is named as the chain sees it (edited).
        problem = decisions.chain_problem(record)
        if problem:
            self._fail(where, MALFORMED, f"not a decision record: {problem}", record)
            return
        self._check(where, record)

    def _check(self, where: str, record: dict[str, Any]) -> None:
        rid, cluster, prev, own = record["id"], record["cluster"], record["prevHash"], record["hash"]
        earlier = self._ids.get(rid)
        if earlier is not None:
            if self.allow_duplicates and earlier[1] == own and chain.digest(prev, record) == own:
                # A byte-for-byte re-delivery (an at-least-once retry): harmless, consumers dedupe by id.
                self.duplicates += 1
                return
            self._fail(where, DUPLICATE, f"id already used by the record at {earlier[0]}", record)
            return
        if chain.digest(prev, record) != own:
            self._fail(where, EDITED, "hash does not match the record's content", record)
            return
        keys = self.keys
        if keys is None and self.key is not None:
            keys = self.keys = signing.Keyring({signing.ANY_KEY_ID: self.key})
        if keys is not None:
            sig = record.get("sig")
            if not isinstance(sig, str):
                self._fail(
                    where, UNSIGNED, "no sig, and a key was given: every record must be signed", record
                )
                return
            if signing.verify_with(keys, None, own, sig) is None:
                self._fail(
                    where, BAD_SIGNATURE, "sig does not verify with the key (forged, or another key)", record
                )
                return
        head = self.heads.get(cluster)
        if head is None:
            head = Head(cluster)
            if self.pruned and prev != chain.GENESIS:
                # Retention deleted the chain's start: accept where it resumes, and report it, so it can
                # be found in an archived export of the part that expired (verify ARCHIVE --anchor HASH).
                head.hash = head.start = prev
        if prev != head.hash:
            self._broken_link(where, record, head)
            return
        if record["seq"] < head.seq:
            self._fail(where, SEQ, f"seq {record['seq']} after seq {head.seq} at {head.where}", record)
            return
        # Equal seq is legitimate: one TICK event can decide for several waiting pods.
        head.hash, head.seq, head.id, head.where = own, record["seq"], rid, where
        head.ts = record.get("ts") if isinstance(record.get("ts"), str) else None
        head.records += 1
        self.heads[cluster] = head
        self.records += 1
        self._ids[rid] = (where, own)
        self._seen[own] = (cluster, head.records, where)

    def _broken_link(self, where: str, record: dict[str, Any], head: Head) -> None:
        prev = record["prevHash"]
        if prev == chain.GENESIS:
            self._fail(
                where,
                INSERTED,
                f"a second chain starts here (prevHash is the genesis hash, but "
                f"{head.records} record(s) of cluster {head.cluster} come before it): records "
                "were inserted, or two logs were concatenated",
                record,
            )
            return
        seen = self._seen.get(prev)
        if seen is not None and seen[0] == head.cluster:
            self._fail(
                where,
                INSERTED,
                f"its predecessor is the record at {seen[2]}, so the "
                f"{head.records - seen[1]} record(s) after that one, up to {head.where}, were inserted "
                "or moved here",
                record,
            )
            return
        # Unknown so far: either it comes later (reordered, found by _look_ahead) or it is gone (removed).
        if head.where is None:
            detail = (
                "it is its cluster's first record here, but its prevHash is not the genesis hash: "
                "the records before it were removed"
            )
        else:
            detail = (
                f"prevHash is not the hash of the record before it ({head.where}): a record between them "
                f"was removed, or the one at {head.where} was replaced and re-hashed"
            )
        self._fail(where, REMOVED, detail, record)
        self._want, self._want_cluster = prev, record["cluster"]

    def _look_ahead(self, where: str, value: bytes) -> None:
        if self._want is None or self.problem is None or self._want.encode() not in value:
            return  # cheap filter before parsing: the wanted hash must appear in the bytes
        try:
            record = orjson.loads(value)
        except orjson.JSONDecodeError:
            return
        if (
            isinstance(record, dict)
            and record.get("hash") == self._want
            and record.get("cluster") == self._want_cluster
        ):
            self.problem.kind = REORDERED
            self.problem.detail = (
                f"its predecessor is the record at {where}, later in the log: records were reordered"
            )
            self._want = None

    def _fail(self, where: str, kind: str, detail: str, record: Mapping[str, Any] | None) -> None:
        rid = record.get("id") if record is not None else None
        cluster = record.get("cluster") if record is not None else None
        self.problem = Problem(
            where,
            kind,
            detail,
            rid if isinstance(rid, str) else None,
            cluster if isinstance(cluster, str) else None,
        )

    def check_anchor(self, anchor: Anchor) -> Problem | None:
        """None when the verified log reaches `anchor`; otherwise a TRUNCATED problem."""
        seen = self._seen.get(anchor.hash)
        heads = (
            "; ".join(
                f"{h.cluster} ends at record {h.records} ({h.hash[:12]}…)"
                for h in sorted(self.heads.values(), key=lambda h: h.cluster)
            )
            or "the log is empty"
        )
        label = f"anchor {anchor.hash[:12]}…" + (f" of cluster {anchor.cluster}" if anchor.cluster else "")
        if seen is None or (anchor.cluster is not None and seen[0] != anchor.cluster):
            if anchor.cluster is not None and anchor.cluster not in self.heads:
                detail = f"{label}: no record of cluster {anchor.cluster} is left"
            else:
                detail = (
                    f"{label} is not in the log ({heads}): its tail was cut off, or the anchor is "
                    "from another log"
                )
            return Problem("end of log", TRUNCATED, detail, cluster=anchor.cluster)
        # Its position needs no check: a record's hash fixes everything before it in the chain.
        return None

    def anchor_note(self, anchor: Anchor) -> str:
        cluster, number, _ = self._seen[anchor.hash]
        later = self.heads[cluster].records - number
        return f"anchor {anchor.hash[:12]}… reached ({cluster} record {number}, {later} since)"


# ---- anchors ---------------------------------------------------------------------------


def parse_anchor(text: str, cluster: str | None) -> Anchor:
    value = text.strip().lower()
    if not _HEX64.match(value):
        raise UsageError(f"--anchor must be a chain head: 64 hex digits, got {text!r}")
    return Anchor(value, cluster)


def load_anchor_file(path: str, cluster: str | None) -> list[Anchor]:
    """Anchors from `audit head --output json` (one per cluster; only `cluster`'s when given)."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON: {exc}") from exc
    clusters = data.get("clusters") if isinstance(data, dict) else None
    if not isinstance(clusters, dict):
        raise UsageError(f"{path}: expected the JSON of `preemptctl audit head --output json`")
    anchors = []
    for name, entry in sorted(clusters.items()):
        if cluster is not None and name != cluster:
            continue
        head = entry.get("head") if isinstance(entry, dict) else None
        records = entry.get("records") if isinstance(entry, dict) else None
        if not isinstance(head, str) or not _HEX64.match(head) or not isinstance(records, int):
            raise UsageError(f"{path}: cluster {name}: expected head (64 hex digits) and records (integer)")
        anchors.append(Anchor(head, name))
    if not anchors:
        raise UsageError(f"{path}: no anchor{f' for cluster {cluster}' if cluster else ''}")
    return anchors


# ---- commands --------------------------------------------------------------------------


def run_verifier(
    location: str, verifier: Verifier, *, kafka: connection.KafkaConfig | None = None
) -> Verifier:
    """Scan the whole log through `verifier`; UsageError when the input is not a decision log at all."""
    first: list[str] = []

    def sink(where: str, key: bytes | None, value: bytes) -> None:
        verifier.feed(where, key, value)
        if not first:
            first.append(where)
            if verifier.problem is not None and verifier.problem.kind == MALFORMED:
                # The very first record is not a decision: the wrong file, not a damaged log.
                raise UsageError(f"{location}: not a decision log ({first[0]}: {verifier.problem.detail})")

    scan(location, sink, kafka=kafka)
    return verifier


def _summary(v: Verifier) -> str:
    heads = sorted(v.heads.values(), key=lambda h: h.cluster)
    parts = [f"intact: {v.records} record(s), {len(heads)} cluster(s)"]
    parts += [
        f"{h.cluster} head {h.hash} ({h.records} records, last seq {h.seq}"
        + (f", continuing from {h.start}" if h.start != chain.GENESIS else "")
        + ")"
        for h in heads
    ]
    extra = []
    if v.skipped:
        extra.append(f"{v.skipped} of other clusters skipped")
    if v.duplicates:
        extra.append(f"{v.duplicates} identical duplicate(s) skipped")
    if v.keys is not None:
        extra.append("all signed")
    return "; ".join(parts) + (f" ({', '.join(extra)})" if extra else "")


def _verify(args: argparse.Namespace) -> Verifier:
    """Run the chain check that `verify` and `head` share, as their common flags say."""
    verifier = Verifier(
        keys=signing.keyring_from_args(args),
        cluster=args.cluster,
        allow_duplicates=args.allow_duplicates,
        pruned=args.pruned,
    )
    return run_verifier(args.decisions, verifier, kafka=connection.for_locations(args))


def cmd_verify(args: argparse.Namespace) -> int:
    anchors = [parse_anchor(a, args.cluster) for a in args.anchor or []]
    if args.anchor_file:
        anchors += load_anchor_file(args.anchor_file, args.cluster)
    v = _verify(args)
    problem = v.problem
    notes: list[str] = []
    if problem is None and not v.records:
        scope = f" of cluster {args.cluster}" if args.cluster else ""
        problem = Problem(args.decisions, EMPTY, f"no decision record{scope}: nothing was verified")
    if problem is None:
        for anchor in anchors:
            problem = v.check_anchor(anchor)
            if problem is not None:
                break
            notes.append(v.anchor_note(anchor))
    if args.output == "json":
        out = {
            "ok": problem is None,
            "records": v.records,
            "skipped": v.skipped,
            "duplicates": v.duplicates,
            "clusters": {h.cluster: h.to_json() for h in sorted(v.heads.values(), key=lambda h: h.cluster)},
            "problem": None if problem is None else problem.to_json(),
            "anchors": notes,
        }
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
    elif problem is None:
        print(_summary(v) + "".join(f"; {n}" for n in notes))
    else:
        print(problem.line())
        if v.problem is not None:
            print(
                f"({v.records} record(s) before it verified; {v.unchecked} after it not checked)",
                file=sys.stderr,
            )
    return EXIT_INTACT if problem is None else EXIT_TAMPERED


def cmd_head(args: argparse.Namespace) -> int:
    v = _verify(args)
    if v.problem is not None:
        # An anchor of a broken chain would vouch for the tampering: refuse to print one.
        print(v.problem.line())
        print("no head printed: the log does not verify", file=sys.stderr)
        return EXIT_TAMPERED
    heads = sorted(v.heads.values(), key=lambda h: h.cluster)
    if args.output == "json":
        out = {"records": v.records, "clusters": {h.cluster: h.to_json() for h in heads}}
        sys.stdout.write(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        for h in heads:
            print(f"{h.cluster}\t{h.hash}\t{h.records} records\tlast {h.id} at {h.ts}")
        if not heads:
            print("(no records)", file=sys.stderr)
    return EXIT_INTACT

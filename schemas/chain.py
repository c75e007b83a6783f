"""The decision log's hash chain and optional HMAC signature.

`hash` = sha256(prevHash || canonical(record without hash and sig)), where the
canonical encoding is orjson with sorted keys. The first record's prevHash is
GENESIS. Editing, removing or reordering any record breaks the chain at that
record; truncation of the tail is caught by comparing the last hash with an
anchor (the chain head) published elsewhere.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import orjson

GENESIS = "0" * 64
_UNHASHED = ("hash", "sig")


def canonical(record: Mapping[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in record.items() if k not in _UNHASHED}, option=orjson.OPT_SORT_KEYS)


def digest(prev_hash: str, record: Mapping[str, Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(record)).hexdigest()


def sign(key: bytes, record_hash: str) -> str:
    return hmac.new(key, record_hash.encode(), hashlib.sha256).hexdigest()


def verify_signature(key: bytes, record: Mapping[str, Any]) -> bool:
    sig = record.get("sig")
    return isinstance(sig, str) and hmac.compare_digest(sig, sign(key, str(record.get("hash", ""))))


def seal(record: dict[str, Any], prev_hash: str, key: bytes | None = None) -> dict[str, Any]:
    """Set prevHash, hash (and sig when a key is given) on a record, in place; returns it."""
    record["prevHash"] = prev_hash
    record["hash"] = digest(prev_hash, record)
    if key is not None:
        record["sig"] = sign(key, record["hash"])
    return record

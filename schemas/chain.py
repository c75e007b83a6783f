"""The decision log's hash chain and its signature.

`hash` = sha256(prevHash || canonical(record without hash and sig)), where the
canonical encoding is orjson with sorted keys. The first record's prevHash is
GENESIS. Editing, removing or reordering any record breaks the chain at that
record; truncation of the tail is caught by comparing the last hash with an
anchor (the chain head) published elsewhere.

`sig` signs the hash and the install the record belongs to (the topic prefix, or an
install id), so a record of one install never verifies in another, whatever keys they
share. The cluster is inside the hash. Three forms, told apart by their prefix:
- `ed25519:<hex>`: Ed25519 (the default): the worker holds the private key (a PEM
  PKCS#8 file), actuators and auditors the public keys; none of them can sign;
- `hmac-sha256:<hex>`: HMAC-SHA256 with a shared key (compatibility mode), install bound;
- `<64 hex>`: HMAC-SHA256 of the hash alone, as written before installs were bound:
  verifiable in the HMAC compatibility mode only, and bound to no install.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

GENESIS = "0" * 64
_UNHASHED = ("hash", "sig")
# The install a signature binds when none is named: the default topic prefix.
DEFAULT_INSTALL = "preemption."
ED25519 = "ed25519:"
HMAC_BOUND = "hmac-sha256:"
_PEM = b"-----BEGIN "
_PRIVATE_PEM = b"-----BEGIN PRIVATE KEY-----"
_PUBLIC_PEM = b"-----BEGIN PUBLIC KEY-----"


class InvalidKey(ValueError):
    """A key file that is not a key of the kind it must be."""


def is_private_key(key: bytes) -> bool:
    return key.startswith(_PRIVATE_PEM)


def is_public_key(key: bytes) -> bool:
    return key.startswith(_PUBLIC_PEM)


def is_pem(key: bytes) -> bool:
    return key.startswith(_PEM)


@functools.lru_cache(maxsize=16)
def private_key(pem: bytes) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidKey(f"not a PEM private key without a password: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidKey(f"not an Ed25519 key ({type(key).__name__})")
    return key


@functools.lru_cache(maxsize=64)
def public_key(pem: bytes) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise InvalidKey(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise InvalidKey(f"not an Ed25519 key ({type(key).__name__})")
    return key


def public_pem(private_pem: bytes) -> bytes:
    """The public key (PEM) of an Ed25519 private key (PEM): what actuators and auditors get."""
    return (
        private_key(private_pem)
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def new_private_pem() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def message(install: str, record_hash: str) -> bytes:
    """What a signature signs: the install and the record's hash (which covers its cluster)."""
    return b"preemptctl-decision\0" + install.encode() + b"\0" + record_hash.encode()


def canonical(record: Mapping[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in record.items() if k not in _UNHASHED}, option=orjson.OPT_SORT_KEYS)


def digest(prev_hash: str, record: Mapping[str, Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(record)).hexdigest()


def sign(key: bytes, record_hash: str, install: str | None = None) -> str:
    """`key`: an Ed25519 private key (PEM) signs `ed25519:`, bound to `install` (default
    DEFAULT_INSTALL); an HMAC key signs `hmac-sha256:` with an install, the legacy form without."""
    if is_pem(key):
        signature = private_key(key).sign(message(install or DEFAULT_INSTALL, record_hash))
        return ED25519 + signature.hex()
    if install is None:
        return hmac.new(key, record_hash.encode(), hashlib.sha256).hexdigest()
    return HMAC_BOUND + hmac.new(key, message(install, record_hash), hashlib.sha256).hexdigest()


def verify(key: bytes, record_hash: str, sig: str, install: str = DEFAULT_INSTALL) -> bool:
    """Does `sig` sign `record_hash` for `install` with `key` (an Ed25519 public key in PEM, or
    an HMAC key)? The legacy unbound HMAC form verifies with an HMAC key only."""
    if is_pem(key):
        if not sig.startswith(ED25519):
            return False
        try:
            public_key(key).verify(bytes.fromhex(sig[len(ED25519) :]), message(install, record_hash))
        except (InvalidSignature, ValueError):
            return False
        return True
    if sig.startswith(HMAC_BOUND):
        return hmac.compare_digest(sig, sign(key, record_hash, install))
    return hmac.compare_digest(sig, sign(key, record_hash))


def verify_signature(key: bytes, record: Mapping[str, Any], install: str = DEFAULT_INSTALL) -> bool:
    sig = record.get("sig")
    return isinstance(sig, str) and verify(key, str(record.get("hash", "")), sig, install)


def seal(
    record: dict[str, Any], prev_hash: str, key: bytes | None = None, install: str | None = None
) -> dict[str, Any]:
    """Set prevHash, hash (and sig when a key is given) on a record, in place; returns it."""
    record["prevHash"] = prev_hash
    record["hash"] = digest(prev_hash, record)
    if key is not None:
        record["sig"] = sign(key, record["hash"], install)
    return record

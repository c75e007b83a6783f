"""Decision signing keys: the worker's one signing key and the actuator's set of accepted keys, by key id.

A decision record is HMAC-signed (schemas.chain) by the worker with its signing
key; the key's id travels in the record's KEY_ID_HEADER (Kafka header), never
in the value, so the hash chain and a replay do not depend on which key signed.
The actuator accepts a record only when its signature verifies with the key the
header names and that key is in its `Keyring`. Several keys may be accepted at
once, which is how a key is rotated without downtime (docs/topics.md): add the
new key to every actuator, switch the worker to it, then remove the old one; a
record signed with a removed (retired) key is refused and dead-lettered from then on.

Key files: a key is the file's bytes, surrounding whitespace removed; its id is
`--hmac-key-id`, else the file's name. `--hmac-keys-dir DIR` accepts every file
in DIR (a mounted Kubernetes Secret: one file per key, named by key id) and is
read again when it changes, so a key added to or removed from the Secret takes
effect without a restart.
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client import Gauge

from schemas import chain
from streams.common import logs
from streams.common.errors import UsageError

log = logging.getLogger(__name__)

KEY_ID_HEADER = "preemptctl-key-id"
# The id of a key given without one (the Python API's single `hmac_key`): it verifies a record
# whatever key id its header names. Never a valid file-given id (see _KEY_ID).
ANY_KEY_ID = "*"
# A key id is a Secret data key (and a header value): letters, digits, '-', '_', '.'.
_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,253}$")
# How often a keys dir is looked at for a change: a Kubernetes Secret volume is updated
# within about a minute of the Secret, so this adds little to a rotation's first step.
RELOAD_INTERVAL_S = 10.0

ACCEPTED = Gauge(
    "preemptctl_actuator_signing_keys",
    "Signing keys the actuator accepts decisions from, by key id (1 while accepted).",
    ["key_id"],
)


@dataclasses.dataclass(frozen=True)
class SigningKey:
    key_id: str
    secret: bytes = dataclasses.field(repr=False)


def _check_id(key_id: str, where: str) -> str:
    if not _KEY_ID.match(key_id):
        raise UsageError(f"{where}: key id {key_id!r} must be letters, digits, '.', '_' or '-'")
    return key_id


def _read(path: Path, where: str) -> bytes:
    try:
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise UsageError(f"cannot read {where} {path}: {exc.strerror or exc}") from exc
    if not secret:
        # An empty key would sign every record with a key anyone can reproduce.
        raise UsageError(f"{where} {path} is empty")
    logs.secret(secret)  # whatever logs it by mistake (a record's repr, a library's debug line) masks it
    return secret


def load_signing_key(path: str | None, key_id: str | None = None) -> SigningKey | None:
    """The worker's key (`--hmac-key-file`, `--hmac-key-id`), or None without a file."""
    if not path:
        if key_id:
            raise UsageError("--hmac-key-id needs --hmac-key-file")
        return None
    kid = _check_id(key_id or Path(path).name, "--hmac-key-id")
    return SigningKey(kid, _read(Path(path), "--hmac-key-file"))


def _dir_keys(directory: Path) -> dict[str, bytes]:
    """Every key file in a dir: regular files, not hidden (a Secret volume's `..data` links are)."""
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"cannot read --hmac-keys-dir {directory}: {exc.strerror or exc}") from exc
    keys = {}
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file():
            continue
        keys[_check_id(entry.name, f"--hmac-keys-dir {directory}")] = _read(Path(entry.path), "key file")
    return keys


def _fingerprint(directory: Path) -> tuple[tuple[str, float, int], ...]:
    """What changes when a key is added, removed or replaced (mtimes and sizes, through the links)."""
    out = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if not entry.name.startswith("."):
                stat = entry.stat()
                out.append((entry.name, stat.st_mtime, stat.st_size))
    return tuple(sorted(out))


class Keyring:
    """The keys the actuator accepts, by id: fixed ones and a dir read again when it changes."""

    def __init__(
        self,
        keys: Mapping[str, bytes],
        *,
        directory: Path | None = None,
        reload_interval_s: float = RELOAD_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fixed = dict(keys)
        self._directory = directory
        self._interval = reload_interval_s
        self._clock = clock
        self._checked = clock()
        self._seen: tuple[tuple[str, float, int], ...] = ()
        self._keys = dict(self._fixed)
        if directory is not None:
            self._seen = _fingerprint(directory)
            self._keys.update(_dir_keys(directory))
        if not self._keys:
            raise UsageError(f"--hmac-keys-dir {directory} holds no key")
        self._export()

    def key_ids(self) -> list[str]:
        self._maybe_reload()
        return sorted(self._keys)

    def get(self, key_id: str) -> bytes | None:
        self._maybe_reload()
        return self._keys.get(key_id)

    def items(self) -> list[tuple[str, bytes]]:
        self._maybe_reload()
        return sorted(self._keys.items())

    def _maybe_reload(self) -> None:
        if self._directory is None or self._clock() - self._checked < self._interval:
            return
        self._checked = self._clock()
        try:
            seen = _fingerprint(self._directory)
            if seen == self._seen:
                return
            keys = {**self._fixed, **_dir_keys(self._directory)}
        except (OSError, UsageError) as exc:
            # A Secret volume mid-update, or a bad key file: keep the keys in hand, say so.
            log.warning("signing keys not reloaded from %s: %s", self._directory, exc)
            return
        if not keys:
            log.warning(
                "signing keys dir %s is empty: keeping %s", self._directory, ", ".join(sorted(self._keys))
            )
            return
        added, removed = sorted(set(keys) - set(self._keys)), sorted(set(self._keys) - set(keys))
        self._seen, self._keys = seen, keys
        log.info(
            "signing keys reloaded from %s: accepting %s (added %s, retired %s)",
            self._directory,
            ", ".join(sorted(keys)),
            ", ".join(added) or "none",
            ", ".join(removed) or "none",
        )
        self._export(removed)

    def _export(self, removed: list[str] | None = None) -> None:
        for key_id in removed or ():
            ACCEPTED.remove(key_id)
        for key_id in self._keys:
            ACCEPTED.labels(key_id).set(1)


def verify_with(keyring: Keyring, key_id: str | None, record_hash: str, sig: str) -> str | None:
    """The id of the accepted key that made `sig` over `record_hash`, or None.

    With a key id (the header) only that key is tried; without one (a record from
    before key ids, or an export without headers) every accepted key is.
    """
    candidates = [(key_id, keyring.get(key_id))] if key_id is not None else keyring.items()
    for kid, secret in candidates:
        if secret is not None and hmac.compare_digest(sig, chain.sign(secret, record_hash)):
            return kid
    return None


def add_verification_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    parser.add_argument(
        "--hmac-key-file",
        metavar="F",
        action="append",
        help=f"{what}: accept records signed with this key (repeatable; its id is the file name)",
    )
    parser.add_argument(
        "--hmac-keys-dir",
        metavar="DIR",
        help=f"{what}: accept records signed with any key in DIR (one file per key, named by key id; "
        "a mounted Secret; changes are picked up without a restart)",
    )


def keyring_from_args(args: argparse.Namespace) -> Keyring | None:
    files: list[str] = args.hmac_key_file or []
    keys: dict[str, bytes] = {}
    for path in files:
        key_id = _check_id(Path(path).name, "--hmac-key-file")
        if key_id in keys:
            raise UsageError(f"--hmac-key-file: two keys named {key_id}")
        keys[key_id] = _read(Path(path), "--hmac-key-file")
    directory = Path(args.hmac_keys_dir) if args.hmac_keys_dir else None
    if not keys and directory is None:
        return None
    return Keyring(keys, directory=directory)

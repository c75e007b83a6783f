"""Decision signing keys: the worker's one signing key and the actuator's set of accepted keys, by key id.

Two modes (schemas.chain):
- Ed25519, the default: the worker signs with its private key (a PEM PKCS#8 file,
  `--hmac-key-file` of the worker until it grows a flag of its own: the file's content
  says which kind it is); actuators and auditors accept public keys (`--signing-keys-dir`,
  `--signing-key-file`: PEM files) and cannot sign. A signature binds the install
  (`--install-id`, default the topic prefix) as well as the cluster.
- HMAC, for compatibility (`--hmac-key-file`, `--hmac-keys-dir`): one shared key signs and
  verifies, so whoever verifies can sign too. It accepts records signed before installs
  were bound.

A decision record is signed (schemas.chain) by the worker with its signing
key; the key's id travels in the record's KEY_ID_HEADER (Kafka header), never
in the value, so the hash chain and a replay do not depend on which key signed.
The actuator accepts a record only when its signature verifies with the key the
header names and that key is in its `Keyring`. Several keys may be accepted at
once, which is how a key is rotated without downtime (docs/topics.md): add the
new key to every actuator, switch the worker to it, then remove the old one; a
record signed with a removed (retired) key is refused and dead-lettered from then on.

Key files: a key is the file's bytes, surrounding whitespace removed; its id is
`--hmac-key-id`, else the file's name. A keys dir accepts every file in it (a
mounted Kubernetes Secret: one file per key, named by key id) and is read again
when it changes, so a key added to or removed from the Secret takes effect without
a restart. A dir with no key accepts nothing (the actuator is unready meanwhile):
emptying the Secret revokes every key at once, without a restart.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    if not chain.is_public_key(secret):
        logs.secret(secret)  # whatever logs it by mistake (a record's repr, a library's debug line) masks it
    return secret


def _accepted_key(path: Path, where: str, *, public: bool) -> bytes:
    """A key to verify with: an Ed25519 public key (PEM) when `public`, else an HMAC key."""
    key = _read(path, where)
    if public:
        try:
            chain.public_key(key)
        except chain.InvalidKey as exc:
            raise UsageError(f"{where} {path}: {exc}") from exc
    elif chain.is_pem(key):
        # A public key used as an HMAC key would let anyone who has it sign.
        raise UsageError(f"{where} {path} holds a PEM key: Ed25519 keys go to --signing-keys-dir")
    return key


def load_signing_key(path: str | None, key_id: str | None = None) -> SigningKey | None:
    """The worker's key (`--hmac-key-file`, `--hmac-key-id`), or None without a file."""
    if not path:
        if key_id:
            raise UsageError("--hmac-key-id needs --hmac-key-file")
        return None
    kid = _check_id(key_id or Path(path).name, "--hmac-key-id")
    secret = _read(Path(path), "--hmac-key-file")
    if chain.is_pem(secret):
        try:
            chain.private_key(secret)  # an Ed25519 private key: the worker signs `ed25519:`
        except chain.InvalidKey as exc:
            raise UsageError(f"--hmac-key-file {path}: {exc}") from exc
    return SigningKey(kid, secret)


def _dir_keys(directory: Path, *, public: bool = False) -> dict[str, bytes]:
    """Every key file in a dir: regular files, not hidden (a Secret volume's `..data` links are)."""
    flag = "--signing-keys-dir" if public else "--hmac-keys-dir"
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"cannot read {flag} {directory}: {exc.strerror or exc}") from exc
    keys = {}
    for entry in entries:
        if entry.name.startswith(".") or not entry.is_file():
            continue
        keys[_check_id(entry.name, f"{flag} {directory}")] = _accepted_key(
            Path(entry.path), "key file", public=public
        )
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
        public: bool = False,
        install: str = chain.DEFAULT_INSTALL,
    ) -> None:
        self._fixed = dict(keys)
        self._public = public  # the dir holds Ed25519 public keys (else HMAC keys)
        self.install = install  # what a signature must bind (schemas.chain)
        self._directory = directory
        self._interval = reload_interval_s
        self._clock = clock
        self._checked = clock()
        self._seen: tuple[tuple[str, float, int], ...] = ()
        self._keys = dict(self._fixed)
        if directory is not None:
            self._seen = _fingerprint(directory)
            self._keys.update(_dir_keys(directory, public=public))
        if not self._keys:
            log.warning("signing keys dir %s holds no key: accepting no decision", directory)
        self._export()

    @property
    def mode(self) -> str:
        return "ed25519" if self._public else "hmac"

    def empty(self) -> bool:
        """No key accepted: every signed record is refused (the actuator is unready)."""
        return not self.key_ids()

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
            keys = {**self._fixed, **_dir_keys(self._directory, public=self._public)}
        except (OSError, UsageError) as exc:
            # A Secret volume mid-update, or a bad key file: keep the keys in hand, say so.
            log.warning("signing keys not reloaded from %s: %s", self._directory, exc)
            return
        if not keys:
            # Every key revoked: accept nothing from now on (failing open would keep a revoked key).
            log.warning(
                "signing keys dir %s is empty: retiring %s, accepting no decision",
                self._directory,
                ", ".join(sorted(self._keys)) or "nothing",
            )
        added, removed = sorted(set(keys) - set(self._keys)), sorted(set(self._keys) - set(keys))
        self._seen, self._keys = seen, keys
        log.info(
            "signing keys reloaded from %s: accepting %s (added %s, retired %s)",
            self._directory,
            ", ".join(sorted(keys)) or "nothing",
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
    """The id of the accepted key that made `sig` over `record_hash` for the keyring's install, or None.

    With a key id (the header) only that key is tried; without one (a record from
    before key ids, or an export without headers) every accepted key is.
    """
    candidates = [(key_id, keyring.get(key_id))] if key_id is not None else keyring.items()
    for kid, secret in candidates:
        if secret is not None and chain.verify(secret, record_hash, sig, keyring.install):
            return kid
    return None


def add_verification_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    parser.add_argument(
        "--signing-key-file",
        metavar="F",
        action="append",
        help=f"{what}: accept records signed by the Ed25519 private key whose public key (PEM) is "
        "in F (repeatable; its id is the file name)",
    )
    parser.add_argument(
        "--signing-keys-dir",
        metavar="DIR",
        help=f"{what}: accept records signed by any Ed25519 key whose public key (PEM) is in DIR (one "
        "file per key, named by key id; a mounted Secret; changes are picked up without a restart; "
        "no key: accept nothing)",
    )
    parser.add_argument(
        "--hmac-key-file",
        metavar="F",
        action="append",
        help=f"HMAC compatibility mode, {what}: accept records signed with this shared key (repeatable; "
        "its id is the file name)",
    )
    parser.add_argument(
        "--hmac-keys-dir",
        metavar="DIR",
        help=f"HMAC compatibility mode, {what}: accept records signed with any shared key in DIR",
    )
    parser.add_argument(
        "--install-id",
        metavar="ID",
        help="the install signatures must be bound to (default: the topic prefix, "
        f"{chain.DEFAULT_INSTALL} unless --topic-prefix says otherwise)",
    )


def keyring_from_args(args: argparse.Namespace) -> Keyring | None:
    """The accepted keys the flags name (None: none named); UsageError when both modes are named."""
    ed_files: list[str] = getattr(args, "signing_key_file", None) or []
    ed_dir: str | None = getattr(args, "signing_keys_dir", None)
    hmac_files: list[str] = args.hmac_key_file or []
    hmac_dir: str | None = args.hmac_keys_dir
    public = bool(ed_files or ed_dir)
    if public and (hmac_files or hmac_dir):
        raise UsageError("name Ed25519 keys (--signing-key*) or HMAC keys (--hmac-key*), not both")
    files, dir_arg = (ed_files, ed_dir) if public else (hmac_files, hmac_dir)
    flag = "--signing-key-file" if public else "--hmac-key-file"
    keys: dict[str, bytes] = {}
    for path in files:
        key_id = _check_id(Path(path).name, flag)
        if key_id in keys:
            raise UsageError(f"{flag}: two keys named {key_id}")
        keys[key_id] = _accepted_key(Path(path), flag, public=public)
    directory = Path(dir_arg) if dir_arg else None
    if not keys and directory is None:
        return None
    install = getattr(args, "install_id", None) or getattr(args, "topic_prefix", None)
    install = install or chain.DEFAULT_INSTALL
    return Keyring(keys, directory=directory, public=public, install=install)

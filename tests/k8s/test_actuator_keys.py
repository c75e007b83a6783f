"""Issue 29, deliverable 4: Ed25519 keys by default, HMAC for compatibility, installs bound,
revocation by emptying the keys Secret, no unsigned decision without --accept-unsigned."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import pytest
from kubernetes_asyncio import client

from schemas import chain
from streams.audit import verify as audit
from streams.cli import actuator as actuator_cli
from streams.cli import audit as audit_cli
from streams.common import signing
from streams.common.errors import UsageError
from streams.kafka.sink import MemorySink
from streams.kube import actuator, eviction
from streams.kube.actuator import Actuator
from streams.kube.ledger import Ledger
from tests.k8s.decisions import FAST, KEY, ORIGIN, decision, outcomes, victim, world
from tests.k8s.fakeapi import FakeApi

PRIVATE = chain.new_private_pem()
PUBLIC = chain.public_pem(PRIVATE)


def signed(pods: dict[str, dict[str, object]], key: bytes | None, install: str | None = None) -> bytes:
    record = decision(pods["high"], [victim(pods["v-evict"], "evict")], key=None)
    return orjson.dumps(chain.seal(record, chain.GENESIS, key, install))


def public_dir(tmp_path: Path, *keys: bytes) -> Path:
    directory = tmp_path / "public"
    directory.mkdir(exist_ok=True)
    for i, key in enumerate(keys):
        (directory / f"k{i + 1}").write_bytes(key)
    return directory


def test_ed25519_signs_binds_the_install_and_cannot_be_forged_by_a_verifier() -> None:
    record = chain.seal({"cluster": "c", "seq": 1}, chain.GENESIS, PRIVATE)
    assert record["sig"].startswith(chain.ED25519)
    assert chain.verify(PUBLIC, record["hash"], record["sig"], chain.DEFAULT_INSTALL)
    assert not chain.verify(PUBLIC, record["hash"], record["sig"], "preemption.staging.")
    other = chain.public_pem(chain.new_private_pem())
    assert not chain.verify(other, record["hash"], record["sig"])
    # Deterministic (RFC 8032): `replay` with the private key re-derives the same bytes.
    assert chain.seal({"cluster": "c", "seq": 1}, chain.GENESIS, PRIVATE)["sig"] == record["sig"]
    # The legacy HMAC form binds no install: an Ed25519 key never accepts it.
    legacy = chain.seal({"cluster": "c", "seq": 1}, chain.GENESIS, KEY)
    assert not chain.verify(PUBLIC, legacy["hash"], legacy["sig"])
    assert chain.verify(KEY, legacy["hash"], legacy["sig"], "any.install.")
    bound = chain.seal({"cluster": "c", "seq": 1}, chain.GENESIS, KEY, "preemption.staging.")
    assert bound["sig"].startswith(chain.HMAC_BOUND)
    assert not chain.verify(KEY, bound["hash"], bound["sig"], chain.DEFAULT_INSTALL)


async def test_the_actuator_accepts_ed25519_decisions_of_its_own_install_only(
    served: tuple[FakeApi, client.ApiClient], tmp_path: Path
) -> None:
    """Issue 29, 6 and 10: a decision signed for another install (same key, same cluster name) is
    forged here; an HMAC-signed one is refused by an actuator holding public keys."""
    fake, api = served
    pods = world(fake)
    ring = signing.Keyring({}, directory=public_dir(tmp_path, PUBLIC), public=True)
    sink = MemorySink()
    act = Actuator(eviction.Actions(api, identity="t", retry=FAST), sink, Ledger(), keys=ring)
    for value in (signed(pods, PRIVATE, "preemption.staging."), signed(pods, KEY)):
        assert await act.handle(value, key=b"default", origin=ORIGIN) == []
    assert [dict(r.headers)["error-class"] for r in sink.on("preemption.dead-letter")] == [
        b"ForgedDecision",
        b"ForgedDecision",
    ]
    assert fake.writes() == []
    await act.handle(signed(pods, PRIVATE), key=b"default", origin=ORIGIN)
    assert outcomes(sink)["v-evict"]["result"] == "done"


async def test_an_emptied_keys_dir_accepts_nothing_and_the_actuator_is_unready(
    served: tuple[FakeApi, client.ApiClient], tmp_path: Path
) -> None:
    """Issue 29, 5: revoking every key by emptying the Secret fails closed while running."""
    fake, api = served
    pods = world(fake)
    directory = public_dir(tmp_path, PUBLIC)
    now = [0.0]
    ring = signing.Keyring({}, directory=directory, public=True, reload_interval_s=1, clock=lambda: now[0])
    sink = MemorySink()
    act = Actuator(eviction.Actions(api, identity="t", retry=FAST), sink, Ledger(), keys=ring)
    assert act.accepting()
    (directory / "k1").unlink()
    now[0] += 2
    assert not act.accepting() and ring.key_ids() == []
    assert await act.handle(signed(pods, PRIVATE), key=b"default", origin=ORIGIN) == []
    assert fake.writes() == [] and len(sink.on("preemption.dead-letter")) == 1
    # Empty from the start: no error, nothing accepted.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert signing.Keyring({}, directory=empty, public=True).empty()


def test_key_files_must_be_of_their_mode(tmp_path: Path) -> None:
    (tmp_path / "pub").write_bytes(PUBLIC)
    (tmp_path / "secret").write_bytes(b"shared")
    parser = argparse.ArgumentParser()
    signing.add_verification_arguments(parser, what="test")
    with pytest.raises(UsageError, match="PEM key"):
        signing.keyring_from_args(parser.parse_args(["--hmac-key-file", str(tmp_path / "pub")]))
    with pytest.raises(UsageError, match="not a PEM public key"):
        signing.keyring_from_args(parser.parse_args(["--signing-key-file", str(tmp_path / "secret")]))
    with pytest.raises(UsageError, match="not both"):
        signing.keyring_from_args(
            parser.parse_args(["--signing-key-file", str(tmp_path / "pub"), "--hmac-key-file", "x"])
        )
    ring = signing.keyring_from_args(
        parser.parse_args(["--signing-key-file", str(tmp_path / "pub"), "--install-id", "prod."])
    )
    assert ring is not None and ring.mode == "ed25519" and ring.install == "prod."
    # The worker's key file: an Ed25519 private key is told by its content.
    (tmp_path / "private").write_bytes(PRIVATE)
    key = signing.load_signing_key(str(tmp_path / "private"))
    assert key is not None and chain.sign(key.secret, "0" * 64).startswith(chain.ED25519)


def test_the_command_refuses_to_run_without_keys_unless_told() -> None:
    parser = argparse.ArgumentParser()
    actuator_cli.register(parser.add_subparsers())
    with pytest.raises(UsageError, match="--accept-unsigned"):
        actuator_cli.cmd_actuator(parser.parse_args(["actuator", "--bootstrap-server", "k:1"]))
    assert parser.parse_args(["actuator", "--accept-unsigned"]).accept_unsigned


def test_nested_topic_prefixes_are_found() -> None:
    names = ["preemption.decisions", "preemption.staging.decisions", "other.decisions", "x"]
    assert actuator.nested_prefixes("preemption.", names) == ["preemption.staging."]
    assert actuator.nested_prefixes("preemption.staging.", names) == ["preemption."]
    assert actuator.nested_prefixes("other.", names) == []


def test_audit_verifies_ed25519_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = chain.seal({"id": "c/0/a", "cluster": "c", "seq": 0}, chain.GENESIS, PRIVATE)
    second = chain.seal({"id": "c/1/b", "cluster": "c", "seq": 1}, first["hash"], PRIVATE)
    log = tmp_path / "d.jsonl"
    log.write_bytes(b"\n".join(orjson.dumps(r) for r in (first, second)) + b"\n")
    (tmp_path / "k1").write_bytes(PUBLIC)
    parser = argparse.ArgumentParser()
    audit_cli.register(parser.add_subparsers())
    ok = parser.parse_args(["audit", "verify", str(log), "--signing-key-file", str(tmp_path / "k1")])
    assert ok.func(ok) == audit.EXIT_INTACT
    other = parser.parse_args(
        ["audit", "verify", str(log), "--signing-key-file", str(tmp_path / "k1"), "--install-id", "staging."]
    )
    assert other.func(other) == audit.EXIT_TAMPERED
    assert "bad signature" in capsys.readouterr().out

"""Issue 29, 6: the worker signs for its own install, and replay reproduces its bytes.

The actuator's Keyring verifies for its install (--install-id, default the topic prefix:
streams.common.signing); the worker must sign for the same one, or an Ed25519 worker with
any prefix but the default is refused by its own actuators, while another install's accept
it. `replay` with the worker's key and install re-derives its records byte for byte; in the
HMAC compatibility mode it also reproduces the bare signatures of workers from before installs
were bound (--unbound-hmac), and the actuator still accepts those.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest

from engine.config import Config
from fold import fleet
from schemas import chain
from streams.cli import actuator as actuator_cli
from streams.cli import main
from streams.cli import worker as worker_cli
from streams.common import signing
from streams.kafka import logio
from streams.kafka import topics as kafka_topics
from streams.kube import actuator
from streams.pipeline import app
from streams.sim import simulator, traces
from tests.support.memory_pipeline import Pipeline, batches

PRIVATE = chain.new_private_pem()
PUBLIC = chain.public_pem(PRIVATE)
HMAC_KEY = b"a-shared-hmac-key-of-the-compatibility-mode"
INSTALL = "team-a.preemption."
OTHER = "team-b.preemption."  # another install, holding the same public key
KEY_ID = "k1"


def _log() -> list[dict[str, Any]]:
    return simulator.simulate(traces.basic(40), Config()).log


def _published(tmp_path: Path, log: list[dict[str, Any]], key: bytes, install: str) -> list[bytes]:
    """The worker's decisions (as published) for `log`, signed with `key` for `install`: half the log
    folded, the worker stopped, the rest folded by a worker restored from its store."""
    p = Pipeline(tmp_path / "store")
    p.setup = dataclasses.replace(p.setup, key=key, key_id=KEY_ID, install=install)
    cut = len(log) // 2
    p.produce(batches(log[:cut], per_record=7))
    asyncio.run(p.run())
    before = len(p.decisions())
    p.produce(batches(log[cut:], per_record=7))
    asyncio.run(p.run())  # Controller.restore: the restored controllers sign for the install too
    sent = [m.value for m in p.broker.messages("preemption.decisions", 0)]
    assert 0 < before < len(sent) and not p.fatal
    return sent


def _actuator_keys(tmp_path: Path, *flags: str) -> signing.Keyring:
    """The keys `preemptctl actuator` accepts with these flags (its public keys in a keys dir)."""
    keys = tmp_path / "public"
    keys.mkdir(exist_ok=True)
    (keys / KEY_ID).write_bytes(PUBLIC)
    parser = argparse.ArgumentParser()
    actuator_cli.register(parser.add_subparsers())
    ring = signing.keyring_from_args(parser.parse_args(["actuator", "--signing-keys-dir", str(keys), *flags]))
    assert ring is not None and ring.mode == "ed25519"
    return ring


def test_an_ed25519_worker_signs_for_its_install_and_replay_reproduces_it(tmp_path: Path) -> None:
    log = _log()
    sent = _published(tmp_path, log, PRIVATE, INSTALL)
    ours = _actuator_keys(tmp_path, "--topic-prefix", INSTALL)
    theirs = _actuator_keys(tmp_path, "--topic-prefix", OTHER)
    default = _actuator_keys(tmp_path)
    for value in sent:
        assert orjson.loads(value)["sig"].startswith(chain.ED25519)
        actuator.verify(value, keys=ours, key_id=KEY_ID)
        for other in (theirs, default):
            with pytest.raises(actuator.ForgedDecision):
                actuator.verify(value, keys=other, key_id=KEY_ID)
    # --install-id names the install whatever the prefix: the actuator of that install accepts.
    assert _actuator_keys(tmp_path, "--topic-prefix", OTHER, "--install-id", INSTALL).install == INSTALL
    # Replay with the worker's key and install: the same bytes, record for record.
    replayed = fleet.fold(log, Config(), key=PRIVATE, install=INSTALL).decisions
    assert [orjson.dumps(d) for d in replayed] == sent


def _replay(tmp_path: Path, log: list[dict[str, Any]], sent: list[bytes], key: bytes, *flags: str) -> int:
    (tmp_path / "events.jsonl").unlink(missing_ok=True)
    logio.write_jsonl(tmp_path / "events.jsonl", log)
    (tmp_path / "recorded.jsonl").write_bytes(b"\n".join(sent) + b"\n")
    (tmp_path / "worker.key").write_bytes(key)
    return main.main(
        [
            "replay", str(tmp_path / "events.jsonl"), "--compare", str(tmp_path / "recorded.jsonl"),
            "--hmac-key-file", str(tmp_path / "worker.key"), *flags,
        ]
    )  # fmt: skip


def test_replay_takes_the_workers_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _log()
    sent = _published(tmp_path, log, PRIVATE, INSTALL)
    assert _replay(tmp_path, log, sent, PRIVATE, "--install-id", INSTALL) == 0
    # Another install's signatures are other bytes: the comparison says so.
    assert _replay(tmp_path, log, sent, PRIVATE) == 1
    assert "bytes differ (sig)" in capsys.readouterr().out


def test_hmac_signatures_bind_the_install_and_legacy_ones_still_verify(tmp_path: Path) -> None:
    log = _log()
    sent = _published(tmp_path, log, HMAC_KEY, INSTALL)
    ours = signing.Keyring({KEY_ID: HMAC_KEY}, install=INSTALL)
    theirs = signing.Keyring({KEY_ID: HMAC_KEY}, install=OTHER)
    for value in sent:
        assert orjson.loads(value)["sig"].startswith(chain.HMAC_BOUND)
        actuator.verify(value, keys=ours, key_id=KEY_ID)
        with pytest.raises(actuator.ForgedDecision):
            actuator.verify(value, keys=theirs, key_id=KEY_ID)
    assert _replay(tmp_path, log, sent, HMAC_KEY, "--install-id", INSTALL) == 0
    # A log of a worker from before installs were bound: bare HMACs of the hash. Replay reproduces
    # it with --unbound-hmac, and the actuator's HMAC compatibility mode accepts it, in any install.
    legacy = [orjson.dumps(d) for d in fleet.fold(log, Config(), key=HMAC_KEY, install=None).decisions]
    for value in legacy:
        sig = orjson.loads(value)["sig"]
        assert len(sig) == 64 and not sig.startswith(chain.HMAC_BOUND)
        actuator.verify(value, keys=ours, key_id=KEY_ID)
    assert _replay(tmp_path, log, legacy, HMAC_KEY, "--unbound-hmac") == 0
    assert _replay(tmp_path, log, legacy, HMAC_KEY, "--install-id", INSTALL) == 1


def test_replay_simulate_signs_for_the_install(tmp_path: Path) -> None:
    trace = traces.basic(20)
    logio.write_jsonl(tmp_path / "trace.jsonl", trace)
    (tmp_path / "worker.key").write_bytes(PRIVATE)
    out = tmp_path / "d.jsonl"
    argv = [
        "replay",
        str(tmp_path / "trace.jsonl"),
        "--simulate",
        "--hmac-key-file",
        str(tmp_path / "worker.key"),
    ]
    assert main.main([*argv, "--install-id", INSTALL, "--decisions-out", str(out)]) == 0
    derived = out.read_bytes().splitlines()
    expected = simulator.simulate(trace, Config()).log
    assert derived == [
        orjson.dumps(d) for d in fleet.fold(expected, Config(), key=PRIVATE, install=INSTALL).decisions
    ]
    assert derived


def test_the_worker_command_passes_its_install_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`preemptctl worker`: --install-id, else --topic-prefix, reaches the partitions' Setup."""
    built: list[str] = []
    real_setup = app.Setup

    def setup(**kwargs: Any) -> Any:
        made = real_setup(**kwargs)
        built.append(made.install)
        return made

    class Built(Exception):
        pass

    def build_app(**kwargs: Any) -> Any:
        app.build_app_unpatched(**kwargs)  # type: ignore[attr-defined]
        raise Built

    async def topics_there(*args: Any, **kwargs: Any) -> int:
        return 1

    monkeypatch.setattr(app, "Setup", setup)
    monkeypatch.setattr(app, "build_app_unpatched", app.build_app, raising=False)
    monkeypatch.setattr(app, "build_app", build_app)
    monkeypatch.setattr(app, "wait_for_kafka", topics_there)
    (tmp_path / "k1").write_bytes(PRIVATE)
    common = ["worker", "--bootstrap-server", "127.0.0.1:1", "--store-dir", str(tmp_path / "s"),
              "--hmac-key-file", str(tmp_path / "k1")]  # fmt: skip
    for flags, install in (
        ([], kafka_topics.DEFAULT_PREFIX),
        (["--topic-prefix", INSTALL], INSTALL),
        (["--topic-prefix", INSTALL, "--install-id", OTHER], OTHER),
    ):
        parser = argparse.ArgumentParser()
        worker_cli.register(parser.add_subparsers())
        args = parser.parse_args([*common, *flags])
        with pytest.raises(Built):
            app.cmd(args)
        assert built.pop() == install

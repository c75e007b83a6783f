"""A SASL password rotated while a component runs (issue 33 #2), without a broker.

`connection.load` reads --kafka-config once at start, but the SASL password it gives
is read again, from the file or from the mounted Secret it names, whenever a client
is built: the worker's readers, producers and admin client (and `reach`'s probe)
built after the kubelet swapped in the new Secret log in with the new password, so
a worker left unready by the rotation becomes ready again without a restart.
Before, the password was resolved once at start: every new connection kept trying
the old one (tests/chaos/test_credential_rotation.py shows it on the secured
Apache Kafka). Anything else of the file (the user, TLS, the brokers) is read at
start only; a file that cannot be read keeps the password read before.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from streams.common import logs
from streams.kafka import connection

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def _mount(secret_dir: Path, password: str) -> None:
    """As the kubelet updates a mounted Secret: the new file replaces the old one at once."""
    staged = secret_dir / ".staged"
    staged.write_text(password + "\n")
    os.replace(staged, secret_dir / "password")


async def _built_with(config: connection.KafkaConfig) -> list[str]:
    """The password each kind of client built now would log in with (aiokafka needs a loop)."""
    clients = [config.consumer()._client, config.producer().client, config.admin()._client]
    return [c._sasl_plain_password for c in clients]


def _load(path: Path) -> connection.KafkaConfig:
    return connection.load(bootstrap="k:9093", config_file=str(path))


@pytest.fixture
def mounted(tmp_path: Path) -> tuple[Path, Path]:
    """A properties file whose password is the file `password` of a mounted Secret."""
    secret_dir = tmp_path / "kafka-user"
    secret_dir.mkdir()
    _mount(secret_dir, "old-password-1234")
    path = tmp_path / "client.properties"
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.username=worker\n"
        f"sasl.password=${{directory:{secret_dir}:password}}\n"
    )
    return path, secret_dir


def test_a_client_built_after_the_secret_changed_logs_in_with_the_new_password(
    mounted: tuple[Path, Path],
) -> None:
    path, secret_dir = mounted
    config = _load(path)
    assert config.client_kwargs()["sasl_plain_password"] == "old-password-1234"
    _mount(secret_dir, "new-password-5678")
    assert config.sasl_password is not None and config.sasl_password.reveal() == "new-password-5678"
    assert config.client_kwargs()["sasl_plain_password"] == "new-password-5678"
    # What the worker's readers, outboxes and admin client are built with.
    assert asyncio.run(_built_with(config)) == ["new-password-5678"] * 3
    # The new password is masked in every log line from the moment it is read.
    assert "new-password-5678" not in logs.redact("password new-password-5678")
    # Everything else is as at start.
    assert (config.sasl_username, config.sasl_mechanism, config.describe()) == (
        "worker",
        "SCRAM-SHA-512",
        "k:9093 over SASL_PLAINTEXT (SCRAM-SHA-512 as worker)",
    )


@pytest.mark.parametrize("how", ["sasl.password", "sasl.jaas.config"])
def test_a_password_held_in_the_properties_file_itself_is_read_again_too(tmp_path: Path, how: str) -> None:
    """The properties file is itself the mounted Secret (the chart's kafka.properties, say)."""

    def write(password: str) -> None:
        line = (
            f"sasl.username=worker\nsasl.password={password}\n"
            if how == "sasl.password"
            else f'sasl.jaas.config={SCRAM} required username="worker" password="{password}";\n'
        )
        staged = tmp_path / ".staged"
        staged.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n" + line)
        os.replace(staged, tmp_path / "client.properties")

    write("old-password-1234")
    config = _load(tmp_path / "client.properties")
    write("new-password-5678")
    assert config.client_kwargs()["sasl_plain_password"] == "new-password-5678"


def test_what_cannot_be_read_again_keeps_the_last_password_and_says_why_once(
    mounted: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    path, secret_dir = mounted
    config = _load(path)
    assert config.sasl_password is not None
    caplog.set_level(logging.INFO, logger="preemptctl.kafka")
    (secret_dir / "password").unlink()  # between two versions of the Secret
    assert config.sasl_password.reveal() == "old-password-1234"
    assert config.sasl_password.reveal() == "old-password-1234"
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "cannot read" in warned[0].getMessage(), caplog.text
    _mount(secret_dir, "new-password-5678")
    assert config.sasl_password.reveal() == "new-password-5678"
    assert "the SASL password changed" in caplog.text
    # Another user in the file is not taken up: only a restart logs in as someone else.
    path.write_text(path.read_text().replace("sasl.username=worker", "sasl.username=other"))
    _mount(secret_dir, "third-password-9012")
    assert config.sasl_password.reveal() == "new-password-5678"
    assert "the SASL user changed" in caplog.text
    for secret in ("old-password-1234", "new-password-5678", "third-password-9012"):
        assert secret not in caplog.text


def test_a_password_given_without_a_file_is_fixed(tmp_path: Path) -> None:
    """parse() of properties in hand (no file to read again): the password is the one given."""
    config = connection.parse(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "svc",
            "sasl.password": "given-password-1234",
        },
        bootstrap="k:1",
    )
    assert config.client_kwargs()["sasl_plain_password"] == "given-password-1234"
    assert config.sasl_password == connection.Secret("given-password-1234")


async def _clients(config: connection.KafkaConfig) -> list[object]:
    return [config.consumer()._client, config.producer().client, config.admin()._client]


def test_a_client_built_before_the_secret_changed_logs_in_with_the_new_password_when_it_reconnects(
    mounted: tuple[Path, Path],
) -> None:
    """aiokafka logs in with its client's `_sasl_plain_password` at each connection it opens (a
    broker restart, an idle connection closed, a coordinator that moves): a client built before
    the rotation reads the Secret's new value there, not the one it was built with."""
    path, secret_dir = mounted
    config = _load(path)
    clients = asyncio.run(_clients(config))
    _mount(secret_dir, "new-password-5678")
    assert [c._sasl_plain_password for c in clients] == ["new-password-5678"] * 3  # type: ignore[attr-defined]
    # The clients are what they were otherwise (their type's name, their other settings).
    assert [type(c).__name__ for c in clients] == ["AIOKafkaClient"] * 3
    assert [c._sasl_plain_username for c in clients] == ["worker"] * 3  # type: ignore[attr-defined]


def test_faust_s_own_clients_follow_the_secret_too(mounted: tuple[Path, Path]) -> None:
    """streams.pipeline.app.follow_password: faust builds its consumer and producer with the password
    read at start (its broker_credentials); they follow the Secret once the worker has run it."""
    from types import SimpleNamespace

    from streams.pipeline import app as app_mod

    path, secret_dir = mounted
    config = _load(path)

    async def faust_clients() -> list[object]:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        kwargs = config.client_kwargs()  # what faust_credentials hands faust: the value, once
        return [AIOKafkaConsumer(**kwargs)._client, AIOKafkaProducer(**kwargs).client]

    consumer_client, producer_client = asyncio.run(faust_clients())
    faust_app = SimpleNamespace(
        consumer=SimpleNamespace(_thread=SimpleNamespace(_consumer=SimpleNamespace(_client=consumer_client))),
        producer=SimpleNamespace(_producer=SimpleNamespace(client=producer_client)),
    )
    _mount(secret_dir, "new-password-5678")
    assert consumer_client._sasl_plain_password == "old-password-1234"  # type: ignore[attr-defined]
    app_mod.follow_password(faust_app, config)  # type: ignore[arg-type]
    app_mod.follow_password(faust_app, config)  # type: ignore[arg-type]  # twice: nothing more
    assert consumer_client._sasl_plain_password == "new-password-5678"  # type: ignore[attr-defined]
    assert producer_client._sasl_plain_password == "new-password-5678"  # type: ignore[attr-defined]
    _mount(secret_dir, "third-password-9012")
    assert consumer_client._sasl_plain_password == "third-password-9012"  # type: ignore[attr-defined]


def test_a_password_given_without_a_file_is_not_followed() -> None:
    """Only a password read from a file changes: given in hand (parse), clients keep it."""
    config = connection.parse(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "svc",
            "sasl.password": "given-password-1234",
        },
        bootstrap="k:1",
    )
    (client,) = asyncio.run(_clients(config))[:1]
    assert not isinstance(client, connection._Following)
    assert client._sasl_plain_password == "given-password-1234"  # type: ignore[attr-defined]

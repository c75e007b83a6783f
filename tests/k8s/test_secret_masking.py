"""Issue 29, 8: Kafka passwords are masked once parsed, and a usage error prints none.

streams.common.logs masks the values registered with `logs.secret()` in every log line, and
anything shaped like a credential. A Kafka password resolved from a config is registered as it
becomes a `connection.Secret`; the command line's one-line usage error goes through the same
masking as the logs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import uuid

import pytest

from streams.cli import decide
from streams.cli.main import EXIT_USAGE, main
from streams.common import logs
from streams.common.errors import UsageError
from streams.kafka import connection


def password() -> str:
    """A password nothing else registered, and not shaped like a credential (`password=...`)."""
    return f"pw-{uuid.uuid4().hex}"


def test_a_parsed_kafka_password_is_masked_in_every_log_line() -> None:
    sasl, key = password(), password()
    assert logs.redact(f"login with {sasl}") == f"login with {sasl}"  # not masked before it is parsed
    config = connection.parse(
        {
            "bootstrap.servers": "kafka:9092",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "worker",
            "sasl.password": sasl,
        }
    )
    assert config.sasl_password is not None and config.sasl_password.reveal() == sasl
    connection.Secret(key)  # as ssl.key.password becomes one
    for value in (sasl, key):
        assert logs.redact(f"a library's debug line: login with {value} now") == (
            f"a library's debug line: login with {logs.MASK} now"
        )
    # Through a real log line, whoever logs it.
    formatter = logs.TextFormatter()
    record = logging.LogRecord("aiokafka", logging.DEBUG, "x", 1, "sending %s", (sasl,), None)
    assert sasl not in formatter.format(record) and logs.MASK in formatter.format(record)


def test_a_usage_error_prints_no_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parsed = password()
    connection.Secret(parsed)  # a password read from --kafka-config

    def quoting(args: argparse.Namespace) -> int:
        raise UsageError(f"--kafka-config: cannot use {parsed}; nor sasl.password=hunter2-{parsed[:8]}")

    monkeypatch.setattr(decide, "cmd_decide", quoting)
    assert main(["decide", "case.yaml"]) == EXIT_USAGE
    printed = capsys.readouterr().err
    said = f"--kafka-config: cannot use {logs.MASK}; nor sasl.password={logs.MASK}"
    assert printed == f"preemptctl: error: {said}\n"


@pytest.mark.parametrize(
    "text",
    [
        # A broken continuation leaves the password on a line of its own: read as a key.
        "sasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required\n"
        "hunter2-s3cret\n",
        "sasl.mechanism=PLAIN\nHunter2.S3cret\n",
    ],
)
def test_a_value_on_a_line_of_its_own_is_not_echoed(text: str) -> None:
    """issue 29, 8: `unknown key <password>` printed the password of a broken properties file."""
    with pytest.raises(UsageError) as error:
        connection.parse(
            connection.read_properties(text, where="kafka.properties"),
            where="kafka.properties",
            bootstrap="b:1",
        )
    assert "hunter2" not in str(error.value).lower() and "s3cret" not in str(error.value).lower()
    assert "line of its own" in str(error.value)


def test_a_misspelt_property_is_still_named() -> None:
    with pytest.raises(UsageError, match=r"unknown key sasl\.mechanismz"):
        connection.parse(
            connection.read_properties("sasl.mechanismz=PLAIN\n", where="f"), where="f", bootstrap="b:1"
        )


@pytest.mark.parametrize("key", connection.PASSWORD_KEYS)
def test_every_password_property_is_masked_once_resolved(key: str) -> None:
    """The store passwords too (issue 29, 8): no Secret holds a truststore password."""
    value = f"pw-{uuid.uuid4().hex}"
    # A password alone is not a whole configuration: only the masking matters here.
    with contextlib.suppress(UsageError):
        connection.parse({key: value}, where="f", bootstrap="b:1")
    assert value not in logs.redact(f"a line with {value} in it")

"""The Kafka connection flags and client properties (streams.kafka.connection), without a broker.

What a platform team writes in a client.properties file is read the way the Java
client and librdkafka read it, refused in one line when it is wrong, and never
shown back with its secrets.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.cli import main
from streams.common.errors import UsageError
from streams.kafka import connection
from tests.support import secure_kafka, tools

PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
DIRECTORY = "org.apache.kafka.common.config.provider.DirectoryConfigProvider"


def props(text: str) -> dict[str, str]:
    return connection.read_properties(text, where="test.properties")


def parse(values: dict[str, str], **kwargs: object) -> connection.KafkaConfig:
    return connection.parse(values, bootstrap="k:9093", where="client.properties", **kwargs)  # type: ignore[arg-type]


# ---- the properties file ------------------------------------------------------------------


def test_properties_are_read_as_java_reads_them() -> None:
    text = (
        "# a comment\n"
        "! another\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism : SCRAM-SHA-512\n"
        "ssl.ca.location /etc/ca.crt\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="svc" \\\n'
        '    password="p=a:s s";\n'
        "escaped\\ key=tab\\there\\u0041\n"
        "empty=\n"
    )
    assert props(text) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.ca.location": "/etc/ca.crt",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="svc" '
        'password="p=a:s s";',
        "escaped key": "tab\thereA",
        "empty": "",
    }


def test_a_key_set_twice_is_refused() -> None:
    with pytest.raises(UsageError, match=r"security\.protocol is set twice"):
        props("security.protocol=SSL\nsecurity.protocol=SASL_SSL\n")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"acks": "all"}, "unknown key acks"),
        ({"security.protocol": "TLS"}, "security.protocol must be one of"),
        (
            {"security.protocol": "SASL_SSL", "sasl.username": "u", "sasl.password": "p"},
            "needs sasl.mechanism",
        ),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "GSSAPI is not supported"),
        (
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u"},
            "needs sasl.username",
        ),
        (
            {"security.protocol": "SSL", "sasl.mechanism": "PLAIN"},
            "sasl.mechanism is set but security.protocol",
        ),
        ({"ssl.ca.location": "/x"}, "ssl.ca.location is set but security.protocol is PLAINTEXT"),
        ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.crt"}, "is not a readable file"),
        ({"security.protocol": "SSL", "ssl.key.location": "/etc/hostname"}, "needs ssl.certificate.location"),
        ({"security.protocol": "SSL", "ssl.truststore.type": "PKCS12"}, "without ssl.truststore.location"),
        (
            {
                "security.protocol": "SSL",
                "ssl.truststore.location": "/etc/hostname",
                "ssl.truststore.type": "JKS",
            },
            "JKS is not supported: convert it with `keytool -importkeystore",
        ),
        (
            {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "dns"},
            "must be https or none",
        ),
        (
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN",
                "sasl.jaas.config": f"{OAUTH} required;",
            },
            "OAuthBearerLoginModule is not supported",
        ),
        (
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-512",
                "sasl.jaas.config": f'{PLAIN} required username="u" password="p";',
            },
            "does not do SCRAM-SHA-512",
        ),
        (
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "u",
                "sasl.jaas.config": f'{PLAIN} required username="u" password="p";',
            },
            "not both",
        ),
        ({"config.providers.vault.class": "com.example.Vault"}, "only org.apache.kafka"),
        ({"security.protocol": "${env:PREEMPTCTL_TEST_UNSET_VARIABLE}"}, "is not set"),
        ({"security.protocol": "${secrets:x}"}, "cannot resolve"),
    ],
)
def test_what_is_wrong_is_said_in_one_line(values: dict[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as raised:
        parse(values)
    assert "\n" not in str(raised.value)
    assert str(raised.value).startswith("client.properties: ")


def test_bootstrap_servers_come_from_the_flag_or_the_file() -> None:
    assert connection.parse({"bootstrap.servers": "a:1, b:2"}).bootstrap == "a:1,b:2"
    assert connection.parse({"bootstrap.servers": "a:1"}, bootstrap="c:3").bootstrap == "c:3"
    with pytest.raises(UsageError, match="no Kafka brokers"):
        connection.parse({})
    for bad in ("a", "a:0", "a:b", "kafka://a:1", "a:1,", "[::1]"):
        with pytest.raises(UsageError, match="expected host:port"):
            connection.parse_bootstrap(bad)
    assert connection.parse_bootstrap("[::1]:9092,b:1") == "[::1]:9092,b:1"
    assert connection.parse_broker_url("kafka://a:1,b:2/") == "a:1,b:2"
    with pytest.raises(UsageError, match="expected kafka://host:port"):
        connection.parse_broker_url("a:1")


def test_sasl_settings_from_the_jaas_line_or_user_and_password() -> None:
    jaas = parse(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "scram-sha-256",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="svc" password="s\\"ecret";',
        }
    )
    assert (jaas.sasl_mechanism, jaas.sasl_username) == ("SCRAM-SHA-256", "svc")
    assert jaas.sasl_password == connection.Secret('s"ecret')
    kwargs = jaas.client_kwargs()
    assert kwargs["sasl_plain_password"] == 's"ecret'
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"
    assert "ssl_context" not in kwargs


def test_config_providers_read_mounted_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "password").write_text("from-a-secret\n")
    (tmp_path / "more.properties").write_text("name=svc\n")
    monkeypatch.setenv("PREEMPTCTL_TEST_MECHANISM", "PLAIN")
    config = parse(
        {
            "config.providers": "directory,file,env",
            "config.providers.directory.class": DIRECTORY,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "${env:PREEMPTCTL_TEST_MECHANISM}",
            "sasl.username": f"${{file:{tmp_path}/more.properties:name}}",
            "sasl.password": f"${{directory:{tmp_path}/user:password}}",
        }
    )
    assert (config.sasl_mechanism, config.sasl_username) == ("PLAIN", "svc")
    assert config.sasl_password == connection.Secret("from-a-secret")
    with pytest.raises(UsageError, match="cannot read"):
        parse({"security.protocol": f"${{directory:{tmp_path}:missing}}"})
    with pytest.raises(UsageError, match="names a file, not a path"):
        parse({"security.protocol": f"${{directory:{tmp_path}:user/password}}"})


@given(tail=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",))))
def test_no_secret_is_ever_shown(tail: str) -> None:
    """repr, str and describe never carry the password, raw or escaped (property over any password)."""
    password = "zq9Secret-" + tail  # a head no fixed text contains: any occurrence is a leak
    config = connection.parse(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "svc",
            "sasl.password": password,
        },
        bootstrap="k:1",
    )
    assert config.sasl_password is not None and config.sasl_password.reveal() == password
    for shown in (
        repr(config),
        str(config),
        config.describe(),
        f"{config.sasl_password}",
        repr(vars(config)),
    ):
        assert password not in shown and repr(password)[1:-1] not in shown
    assert "Secret('***')" in repr(config)


def test_what_a_connection_is_called_names_brokers_and_protocol() -> None:
    plain = connection.of("a:1,b:2")
    assert plain.describe() == "a:1,b:2 over PLAINTEXT"
    assert plain.hosts() == [("a", 1), ("b", 2)]
    sasl = parse(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
        }
    )
    assert sasl.describe() == "k:9093 over SASL_PLAINTEXT (PLAIN as u)"


# ---- TLS files ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> secure_kafka.Pki:
    try:
        return secure_kafka.make_pki(tmp_path_factory.mktemp("pki"))
    except secure_kafka.ToolMissing as exc:
        tools.unavailable(str(exc))


def test_truststores_and_keystores_pem_and_pkcs12(pki: secure_kafka.Pki) -> None:
    crt, key = pki.client_pem("worker")
    p12 = pki.client_p12("actuator", "keystore-pass")
    pem = parse({"security.protocol": "SSL", "ssl.ca.location": str(pki.ca_crt)})
    assert pem.ssl_cafile == str(pki.ca_crt) and pem.ssl_context is not None
    store = parse(
        {
            "security.protocol": "SSL",
            "ssl.truststore.location": str(pki.truststore),
            "ssl.truststore.password": pki.password,
            "ssl.keystore.location": str(p12),
            "ssl.keystore.password": "keystore-pass",
        }
    )
    assert store.ssl_cadata is not None and "BEGIN CERTIFICATE" in store.ssl_cadata
    assert store.ssl_keystore_pem is not None and "PRIVATE KEY" in store.ssl_keystore_pem.reveal()
    assert "PRIVATE KEY" not in repr(store)
    mtls = parse(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": str(pki.ca_crt),
            "ssl.certificate.location": str(crt),
            "ssl.key.location": str(key),
        }
    )
    assert mtls.describe() == "k:9093 over SSL (client certificate)"
    with pytest.raises(UsageError, match="wrong password or not PKCS12"):
        parse({"security.protocol": "SSL", "ssl.truststore.location": str(pki.truststore),
               "ssl.truststore.password": "wrong"})  # fmt: skip
    with pytest.raises(UsageError, match="cannot use the TLS files"):
        parse(
            {
                "security.protocol": "SSL",
                "ssl.certificate.location": str(crt),
                "ssl.key.location": str(pki.ca_key),
            }
        )
    with pytest.raises(UsageError, match="cannot use the TLS files"):
        parse({"security.protocol": "SSL", "ssl.ca.location": str(key)})


# ---- the command line -------------------------------------------------------------------------


def test_every_kafka_command_takes_the_connection_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """source, worker, actuator, run, replay, export, audit verify/head, explain, bench pipeline: an
    unknown key in --kafka-config exits 2 with one line, before anything else happens."""
    bad = tmp_path / "client.properties"
    bad.write_text("security.protocol=SASL_SSL\nsasl.kerberos.service.name=kafka\n")
    commands = [
        ["source", "--bootstrap-server", "k:1"],
        ["worker", "--bootstrap-server", "k:1"],
        ["actuator", "--bootstrap-server", "k:1"],
        ["run", "--bootstrap-server", "k:1"],
        ["replay", "kafka://k:1/t"],
        ["export", "kafka://k:1/t"],
        ["audit", "verify", "kafka://k:1/t"],
        ["audit", "head", "kafka:///t", "--bootstrap-server", "k:1"],
        ["explain", "ns/pod", "--decisions", "kafka://k:1/t"],
        ["bench", "pipeline", "--bootstrap-server", "k:1"],
    ]
    for argv in commands:
        code = main.main([*argv, "--kafka-config", str(bad)])
        err = capsys.readouterr().err
        assert code == 2, argv
        assert err.count("\n") == 1 and "unknown key sasl.kerberos.service.name" in err, (argv, err)


def test_a_location_without_brokers_takes_them_from_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main.main(["audit", "verify", "kafka:///preemption.decisions"]) == 2
    assert "names no broker" in capsys.readouterr().err


# ---- reaching Kafka ---------------------------------------------------------------------------


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A port that accepts connections and never answers (a black-holed broker)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        server.close()


def test_an_unreachable_broker_is_named_in_one_line_within_the_timeout(silent_listener: int) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = closed.getsockname()[1]
    config = connection.KafkaConfig(
        bootstrap=f"127.0.0.1:{refused},127.0.0.1:{silent_listener}", bootstrap_timeout_s=1.5
    )
    started = time.monotonic()
    with pytest.raises(connection.BrokerUnreachable) as raised:
        asyncio.run(connection.reach(config))
    # Within the configured 1.5 s, not aiokafka's own ~45 s: a deadline with room for a loaded
    # machine, not a timing (reach ignoring the setting took 47 s here).
    assert time.monotonic() - started < 1.5 + 15.0
    message = str(raised.value)
    assert " within 1.5 s " in message
    assert "\n" not in message
    assert message.startswith(
        f"cannot reach Kafka at 127.0.0.1:{refused},127.0.0.1:{silent_listener} over PLAINTEXT"
    )
    assert f"127.0.0.1:{refused}: connection refused" in message
    assert f"127.0.0.1:{silent_listener}: no answer" in message
    assert not raised.value.auth


def test_a_command_reports_an_unreachable_broker_and_exits_2(
    silent_listener: int, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main.main(
        ["export", f"kafka://127.0.0.1:{silent_listener}/preemption.decisions", "--bootstrap-timeout", "1"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith(
        f"preemptctl: error: cannot reach Kafka at 127.0.0.1:{silent_listener} over PLAINTEXT"
    )


def test_flags_need_one_broker_spelling() -> None:
    parser = argparse.ArgumentParser()
    connection.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--bootstrap-server", "a:1", "--broker", "kafka://a:1"])
    args = parser.parse_args(["--broker", "kafka://a:1,b:2"])
    assert connection.from_args(args).bootstrap == "a:1,b:2"
    with pytest.raises(UsageError, match="--bootstrap-timeout must be positive"):
        connection.from_args(parser.parse_args(["--bootstrap-server", "a:1", "--bootstrap-timeout", "0"]))
    for endless in ("nan", "inf"):  # comparisons with nan are all false: `<= 0` let it through
        with pytest.raises(UsageError, match="--bootstrap-timeout must be positive"):
            connection.from_args(
                parser.parse_args(["--bootstrap-server", "a:1", "--bootstrap-timeout", endless])
            )

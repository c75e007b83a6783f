"""preemptctl against a secured Apache Kafka: SASL_SSL (SCRAM, PLAIN), mTLS, ACLs.

The secured broker is started by tests/support/secure_kafka.py.

Every way a platform team hands out credentials reaches the broker through the
same --kafka-config file; every refusal is one line naming the brokers and the
security protocol (exit 2); the ACLs of streams.kafka.acls are what each
principal can do, and no more; the worker, faust's own consumer included, folds
and publishes (exactly_once) over mTLS. Each test uses fresh topic names on the
shared broker (`--topic-prefix`).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import orjson
import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from engine.config import Config
from streams.cli import main
from streams.kafka import acls, connection, topics
from streams.sim import simulator, traces
from tests.integration import pipeline
from tests.support import secure_kafka as sk

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


def fresh_names() -> topics.Names:
    return topics.Names(f"t{uuid.uuid4().hex[:8]}.preemption.")


async def prepare(kafka: sk.SecureKafka, names: topics.Names) -> None:
    await topics.ensure_topics(kafka.admin_config(), topics.Layout(names=names).specs())


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def client_properties(kafka: sk.SecureKafka, case: str, tmp_path: Path) -> tuple[str, str]:
    """(bootstrap, --kafka-config path) of one way to be the auditor principal."""
    pki, password = kafka.pki, kafka.passwords["auditor"]
    if case == "scram-sha-512":
        return kafka.sasl_bootstrap, write(tmp_path / "c.properties", kafka.properties("auditor"))
    if case == "scram-sha-256":
        text = kafka.properties("auditor", mechanism="SCRAM-SHA-256")
        return kafka.sasl_bootstrap, write(tmp_path / "c.properties", text)
    if case == "plain-jaas-pkcs12-truststore":
        text = (
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
            f'sasl.jaas.config={PLAIN_MODULE} required username="auditor" password="{password}";\n'
            f"ssl.truststore.location={pki.truststore}\nssl.truststore.password={pki.password}\n"
        )
        return kafka.sasl_bootstrap, write(tmp_path / "c.properties", text)
    if case == "mtls-pem":
        crt, key = pki.client_pem("auditor")
        text = (
            f"security.protocol=SSL\nssl.ca.location={pki.ca_crt}\n"
            f"ssl.certificate.location={crt}\nssl.key.location={key}\n"
        )
        return kafka.tls_bootstrap, write(tmp_path / "c.properties", text)
    if case == "mtls-pkcs12-keystore":
        (tmp_path / "secret").mkdir()
        (tmp_path / "secret" / "keystore-password").write_text("p12-" + password)
        store = pki.client_p12("auditor", "p12-" + password)
        text = (
            "config.providers=directory\n"
            "security.protocol=SSL\n"
            f"ssl.truststore.location={pki.truststore}\nssl.truststore.password={pki.password}\n"
            f"ssl.keystore.location={store}\nssl.keystore.type=PKCS12\n"
            f"ssl.keystore.password=${{directory:{tmp_path}/secret:keystore-password}}\n"
        )
        return kafka.tls_bootstrap, write(tmp_path / "c.properties", text)
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    ["scram-sha-512", "scram-sha-256", "plain-jaas-pkcs12-truststore", "mtls-pem", "mtls-pkcs12-keystore"],
)
def test_every_credential_kind_reads_a_topic_through_the_cli(
    secure_kafka: sk.SecureKafka, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    names = fresh_names()
    asyncio.run(prepare(secure_kafka, names))
    asyncio.run(sk.grant(secure_kafka.admin_config(), "auditor", acls.required("auditor", names=names)))
    records = [{"id": f"d{i}", "cluster": "c"} for i in range(3)]

    async def produce() -> None:
        admin = secure_kafka.admin_config()
        producer = admin.producer()
        await connection.start(admin, producer)
        try:
            for record in records:
                await producer.send_and_wait(names.decisions, orjson.dumps(record), key=b"c")
        finally:
            await producer.stop()

    asyncio.run(produce())
    bootstrap, config = client_properties(secure_kafka, case, tmp_path)
    out = tmp_path / "decisions.jsonl"
    code = main.main(
        ["export", f"kafka:///{names.decisions}", "--bootstrap-server", bootstrap, "--kafka-config", config,
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert [orjson.loads(line) for line in out.read_bytes().splitlines()] == records


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("wrong-password", "SaslAuthenticationFailed: Authentication failed"),
        ("untrusted-broker", "TLS: the broker's certificate does not verify"),
        ("client-certificate-of-another-ca", "cannot connect to Kafka at"),
        ("no-client-certificate", "cannot connect to Kafka at"),
        ("plaintext-to-a-tls-listener", "cannot reach Kafka at"),
    ],
)
def test_refusals_say_why_in_one_line_and_exit_2(
    secure_kafka: sk.SecureKafka,
    tmp_path: Path,
    case: str,
    expected: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pki = secure_kafka.pki
    bootstrap, protocol = secure_kafka.sasl_bootstrap, "SASL_SSL"
    if case == "wrong-password":
        text = secure_kafka.properties("auditor").replace(
            secure_kafka.passwords["auditor"], "not-the-password"
        )
    elif case == "untrusted-broker":
        other_ca, _ = pki.other_ca()
        text = secure_kafka.properties("auditor").replace(str(pki.ca_crt), str(other_ca))
    elif case == "client-certificate-of-another-ca":
        crt, key = pki.client_pem("intruder", ca=pki.other_ca())
        bootstrap, protocol = secure_kafka.tls_bootstrap, "SSL"
        text = f"security.protocol=SSL\nssl.ca.location={pki.ca_crt}\n"
        text += f"ssl.certificate.location={crt}\nssl.key.location={key}\n"
    elif case == "no-client-certificate":
        bootstrap, protocol = secure_kafka.tls_bootstrap, "SSL"
        text = f"security.protocol=SSL\nssl.ca.location={pki.ca_crt}\n"
    else:
        bootstrap, protocol, text = secure_kafka.tls_bootstrap, "PLAINTEXT", ""
    config = write(tmp_path / "c.properties", text)
    code = main.main(
        ["audit", "verify", "kafka:///preemption.decisions", "--bootstrap-server", bootstrap,
         "--kafka-config", config, "--bootstrap-timeout", "5"]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    (line,) = [e for e in err if e.startswith("preemptctl: error:")]
    assert f"{bootstrap} over {protocol}" in line, line
    assert expected in line, line
    for secret in (*secure_kafka.passwords.values(), pki.password):
        assert secret not in "\n".join(err)


@pytest.mark.parametrize("component", ["source", "worker", "actuator", "auditor", "rogue"])
def test_each_principal_writes_exactly_where_its_acls_say(
    secure_kafka: sk.SecureKafka, component: str
) -> None:
    """For every topic: a write succeeds iff streams.kafka.acls grants the principal Write on it."""
    names = fresh_names()
    worker_group, actuator_group = f"w-{names.prefix}", f"a-{names.prefix}"
    granted = (
        ()
        if component == "rogue"
        else acls.required(component, names=names, worker_group=worker_group, actuator_group=actuator_group)
    )

    async def attempt() -> dict[str, bool]:
        await prepare(secure_kafka, names)
        if granted:
            await sk.grant(secure_kafka.admin_config(), component, granted)
        config = secure_kafka.config(component)
        wrote: dict[str, bool] = {}
        for topic in names.all():
            producer = config.producer(request_timeout_ms=10_000)
            await connection.start(config, producer)
            try:
                await producer.send_and_wait(topic, b"{}", key=b"c")
                wrote[topic] = True
            except TopicAuthorizationFailedError:
                wrote[topic] = False
            finally:
                await producer.stop()
        return wrote

    allowed = {a.name for a in granted if a.resource == acls.TOPIC and "Write" in a.operations}
    assert asyncio.run(attempt()) == {t: t in allowed for t in names.all()}
    if component != "worker":
        assert not asyncio.run(attempt())[names.decisions], "only the worker may write decisions"


def test_the_worker_folds_and_publishes_over_mtls_with_only_its_acls(
    secure_kafka: sk.SecureKafka, tmp_path: Path
) -> None:
    """faust's consumer and the worker's transactional producers over mTLS (CN=worker), exactly_once,
    with the worker's ACLs and nothing else: the decisions the log calls for, once each, byte for byte."""
    group = f"worker-{uuid.uuid4().hex[:6]}"
    admin = secure_kafka.admin_config()
    asyncio.run(prepare(secure_kafka, topics.DEFAULT_NAMES))
    asyncio.run(sk.grant(admin, "worker", acls.required("worker", worker_group=group)))
    crt, key = secure_kafka.pki.client_pem("worker")
    config = write(
        tmp_path / "worker.properties",
        f"security.protocol=SSL\nssl.ca.location={secure_kafka.pki.ca_crt}\n"
        f"ssl.certificate.location={crt}\nssl.key.location={key}\n",
    )
    cluster = f"c-{uuid.uuid4().hex[:6]}"
    expected = simulator.simulate(pipeline.with_cluster(traces.basic(20), cluster), Config())
    asyncio.run(pipeline.produce(admin, cluster, expected.log, per_record=10, create=False))
    worker = pipeline.start_worker(
        secure_kafka.tls_bootstrap,
        tmp_path / "store",
        group,
        guarantee="exactly_once",
        extra=["--kafka-config", config, "--no-create-topics"],
    )
    try:
        got = asyncio.run(
            pipeline.wait_for_decisions(admin, cluster, len(expected.decisions), read_committed=True)
        )
    finally:
        pipeline.stop(worker)
    log = (tmp_path / "store.log").read_text(errors="replace")
    assert got == expected.decisions, log[-3000:]
    assert "AuthorizationFailed" not in log, log[-3000:]


def test_reading_as_a_principal_without_read_acl_fails_in_one_line(
    secure_kafka: sk.SecureKafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = fresh_names()
    asyncio.run(prepare(secure_kafka, names))
    config = write(tmp_path / "rogue.properties", secure_kafka.properties("rogue"))
    code = main.main(
        ["audit", "verify", f"kafka:///{names.decisions}", "--bootstrap-server", secure_kafka.sasl_bootstrap,
         "--kafka-config", config, "--bootstrap-timeout", "5"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert f"topic {names.decisions} not found" in err or "not authorized" in err.lower(), err

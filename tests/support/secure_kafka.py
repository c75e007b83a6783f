"""A secured Apache Kafka for tests, set up as a platform team would: TLS, SCRAM, mTLS, ACLs.

`make_pki` generates the certificates with the tools an operator uses: openssl for
the CA and the client certificates, keytool for the broker's PKCS12 keystore
(key pair, signing request, the CA's signature imported back) and the truststore.
`SecureKafka` starts streams.brokers.kafka_local.LocalKafka with them, SCRAM and
PLAIN users, and the StandardAuthorizer; `grant` creates ACLs with the Kafka
protocol (CreateAcls) as the admin super user. Nothing is granted by default: a
principal can do exactly what streams.kafka.acls says it may.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from aiokafka.protocol.admin import CreateAclsRequest, DescribeAclsRequest

from streams.brokers import kafka_local
from streams.kafka import acls, connection

# A granted ACL reaches the broker's authorizer through the metadata log: polled until it does.
ACL_VISIBLE_TIMEOUT_S = 30.0
_ANY = 1  # the ANY filter value of DescribeAcls' resource type, pattern, operation and permission
# openssl and keytool each take well under a second here; a wedged tool must not hang the session.
TOOL_TIMEOUT_S = 60.0
# Test certificates live as long as a test session could.
DAYS = "2"
BROKER_CN = "kafka-broker"
ADMIN = "admin"
# Every identity that gets SCRAM credentials (and, for some, a client certificate).
USERS = ("source", "worker", "actuator", "auditor", "rogue")
# PLAIN users (over TLS only): the auditor's principal again, so a test reads with sasl.jaas.config.
PLAIN_USERS = ("auditor",)


class ToolMissing(Exception):
    pass


def _run(*argv: str, cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])}... failed: {(done.stderr or done.stdout).strip()[-500:]}")


def tools() -> tuple[str, str]:
    openssl, keytool = shutil.which("openssl"), shutil.which("keytool")
    if openssl is None or keytool is None:
        raise ToolMissing("openssl and keytool (a JDK) are needed for the secured Kafka")
    return openssl, keytool


@dataclasses.dataclass(frozen=True)
class Pki:
    """The test CA, the broker's stores, and client certificates on demand."""

    root: Path
    password: str
    ca_crt: Path
    ca_key: Path
    keystore: Path
    truststore: Path

    def client_pem(self, cn: str, *, ca: tuple[Path, Path] | None = None) -> tuple[Path, Path]:
        """A client certificate and its unencrypted PEM key for CN=`cn` (signed by `ca`, default ours)."""
        openssl, _ = tools()
        ca_crt, ca_key = ca or (self.ca_crt, self.ca_key)
        crt, key, csr = (self.root / f"{cn}.crt", self.root / f"{cn}.key", self.root / f"{cn}.csr")
        ext = self.root / f"{cn}.ext"
        ext.write_text("extendedKeyUsage=clientAuth\n")
        _run(
            openssl,
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            f"/CN={cn}/O=preemptctl-tests",
            cwd=self.root,
        )
        _run(
            openssl,
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca_crt),
            "-CAkey",
            str(ca_key),
            "-CAcreateserial",
            "-out",
            str(crt),
            "-days",
            DAYS,
            "-extfile",
            str(ext),
            cwd=self.root,
        )
        return crt, key

    def client_p12(self, cn: str, password: str) -> Path:
        """CN=`cn`'s certificate, key and the CA chain in a PKCS12 keystore (openssl pkcs12 -export)."""
        openssl, _ = tools()
        crt, key = self.client_pem(cn)
        p12 = self.root / f"{cn}.p12"
        _run(
            openssl,
            "pkcs12",
            "-export",
            "-in",
            str(crt),
            "-inkey",
            str(key),
            "-certfile",
            str(self.ca_crt),
            "-out",
            str(p12),
            "-passout",
            f"pass:{password}",
            "-name",
            cn,
            cwd=self.root,
        )
        return p12

    def other_ca(self) -> tuple[Path, Path]:
        """A CA nobody trusts: its certificates must be refused."""
        return _ca(self.root, "rogue-ca")


def _ca(root: Path, name: str) -> tuple[Path, Path]:
    openssl, _ = tools()
    crt, key = root / f"{name}.crt", root / f"{name}.key"
    _run(
        openssl,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(crt),
        "-days",
        DAYS,
        "-subj",
        f"/CN={name}/O=preemptctl-tests",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=root,
    )
    return crt, key


def make_pki(root: Path) -> Pki:
    """CA (openssl); broker keystore and truststore (keytool, PKCS12), the broker's cert signed by the CA."""
    openssl, keytool = tools()
    root.mkdir(parents=True, exist_ok=True)
    password = secrets.token_hex(12)
    ca_crt, ca_key = _ca(root, "ca")
    keystore, truststore = root / "broker.p12", root / "truststore.p12"
    store = ("-storetype", "PKCS12", "-storepass", password)
    san = "SAN=IP:127.0.0.1,DNS:localhost"
    _run(
        keytool,
        "-genkeypair",
        "-keystore",
        str(keystore),
        *store,
        "-keypass",
        password,
        "-alias",
        "broker",
        "-keyalg",
        "RSA",
        "-keysize",
        "2048",
        "-validity",
        DAYS,
        "-dname",
        f"CN={BROKER_CN},O=preemptctl-tests",
        "-ext",
        san,
        cwd=root,
    )
    _run(
        keytool,
        "-certreq",
        "-keystore",
        str(keystore),
        *store,
        "-alias",
        "broker",
        "-ext",
        san,
        "-file",
        "broker.csr",
        cwd=root,
    )
    (root / "broker.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _run(
        openssl,
        "x509",
        "-req",
        "-in",
        "broker.csr",
        "-CA",
        str(ca_crt),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        "broker.crt",
        "-days",
        DAYS,
        "-extfile",
        "broker.ext",
        cwd=root,
    )
    _run(
        keytool,
        "-importcert",
        "-keystore",
        str(keystore),
        *store,
        "-alias",
        "ca",
        "-file",
        str(ca_crt),
        "-noprompt",
        cwd=root,
    )
    _run(
        keytool,
        "-importcert",
        "-keystore",
        str(keystore),
        *store,
        "-alias",
        "broker",
        "-file",
        "broker.crt",
        cwd=root,
    )
    _run(
        keytool,
        "-importcert",
        "-keystore",
        str(truststore),
        *store,
        "-alias",
        "ca",
        "-file",
        str(ca_crt),
        "-noprompt",
        cwd=root,
    )
    return Pki(root, password, ca_crt, ca_key, keystore, truststore)


@dataclasses.dataclass
class SecureKafka:
    """A running secured broker and what a test needs to talk to it."""

    broker: kafka_local.LocalKafka
    pki: Pki
    passwords: dict[str, str]  # SCRAM (and PLAIN) user -> password

    @property
    def sasl_bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def tls_bootstrap(self) -> str:
        return self.broker.tls_bootstrap

    def properties(self, user: str, *, mechanism: str = "SCRAM-SHA-512") -> str:
        """A --kafka-config for `user` over SASL_SSL, trusting the test CA (a PEM ssl.ca.location)."""
        return (
            "security.protocol=SASL_SSL\n"
            f"sasl.mechanism={mechanism}\n"
            f"sasl.username={user}\n"
            f"sasl.password={self.passwords[user]}\n"
            f"ssl.ca.location={self.pki.ca_crt}\n"
        )

    def config(self, user: str, *, mechanism: str = "SCRAM-SHA-512") -> connection.KafkaConfig:
        return connection.parse(
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": mechanism,
                "sasl.username": user,
                "sasl.password": self.passwords[user],
                "ssl.ca.location": str(self.pki.ca_crt),
            },
            bootstrap=self.sasl_bootstrap,
        )

    def admin_config(self) -> connection.KafkaConfig:
        return self.config(ADMIN)


def start(root: Path, *, log_path: Path) -> SecureKafka:
    pki = make_pki(root / "pki")
    passwords = {name: secrets.token_hex(16) for name in (ADMIN, *USERS)}
    probe_crt, probe_key = pki.client_pem(BROKER_CN)  # the readiness probe speaks as the broker (super)
    security = kafka_local.Security(
        keystore=pki.keystore,
        truststore=pki.truststore,
        store_password=pki.password,
        ca_file=pki.ca_crt,
        probe_cert=probe_crt,
        probe_key=probe_key,
        scram_users=passwords,
        plain_users={name: passwords[name] for name in PLAIN_USERS},
        super_users=(f"User:{BROKER_CN}", f"User:{ADMIN}"),
    )
    broker = kafka_local.LocalKafka(log_path=log_path, security=security).start()
    return SecureKafka(broker, pki, passwords)


async def grant(kafka: connection.KafkaConfig, principal: str, granted: Iterable[acls.Acl]) -> None:
    """Create `granted` for `User:principal` with CreateAcls, as `kafka`'s (super) user."""
    admin = kafka.admin()
    await connection.start(kafka, admin)
    granted = list(granted)
    try:
        for acl in granted:
            for operation in acl.operations:
                request = CreateAclsRequest(
                    acls.RESOURCE_CODES[acl.resource],
                    acl.name,
                    acls.PATTERN_CODES[acl.pattern],
                    f"User:{principal}",
                    "*",
                    acls.OPERATION_CODES[operation],
                    acls.ALLOW,
                )
                response = await admin._send_to_controller(request)
                for code, message in response.creation_responses:
                    if code:
                        raise RuntimeError(f"CreateAcls {acl} {operation} for {principal}: {code} {message}")
        for acl in granted:
            await _until_visible(admin, principal, acl)
    finally:
        await admin.close()


async def _until_visible(admin: object, principal: str, acl: acls.Acl) -> None:
    """Until the broker itself (DescribeAcls answers from its authorizer) shows `acl` granted."""
    request = DescribeAclsRequest(
        acls.RESOURCE_CODES[acl.resource],
        acl.name,
        acls.PATTERN_CODES[acl.pattern],
        f"User:{principal}",
        None,  # type: ignore[arg-type]
        _ANY,
        _ANY,
    )
    wanted = {acls.OPERATION_CODES[op] for op in acl.operations}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ACL_VISIBLE_TIMEOUT_S
    while True:
        response = await admin._send_request(request)  # type: ignore[attr-defined]
        seen = {entry[2] for resource in response.resources for entry in resource[-1]}
        if wanted <= seen:
            return
        if loop.time() > deadline:
            raise TimeoutError(f"ACLs of {principal} not visible after {ACL_VISIBLE_TIMEOUT_S:g} s")
        await asyncio.sleep(0.1)


# kafka-configs (ConfigCommand) starts a JVM: seconds, more on a loaded machine.
CONFIG_COMMAND_TIMEOUT_S = 120.0
# A changed SCRAM credential reaches the broker through the metadata log: polled until it does.
SCRAM_VISIBLE_TIMEOUT_S = 30.0


def set_scram_password(kafka: SecureKafka, user: str, password: str) -> None:
    """Create `user`'s SCRAM-SHA-512 credential, or rotate its password, on the running broker, as
    an operator does: `kafka-configs --bootstrap-server ... --alter --add-config
    'SCRAM-SHA-512=[password=...]' --entity-type users --entity-name USER`
    (kafka.admin.ConfigCommand), as the admin super user over SASL_SSL. (One mechanism per
    request: the broker refuses to alter one user's credentials twice in one request.) Returns
    once a client can log in with `password`; `kafka.passwords[user]` is then `password`."""
    root = kafka.pki.root
    admin = root / f"admin-{secrets.token_hex(4)}.properties"
    admin.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN}" password="{kafka.passwords[ADMIN]}";\n'
        f"ssl.truststore.location={kafka.pki.truststore}\n"
        f"ssl.truststore.password={kafka.pki.password}\n"
        "ssl.truststore.type=PKCS12\n"
    )
    argv = [
        "kafka.admin.ConfigCommand",
        "--bootstrap-server", kafka.sasl_bootstrap,
        "--command-config", str(admin),
        "--alter",
        "--add-config", f"SCRAM-SHA-512=[password={password}]",
        "--entity-type", "users",
        "--entity-name", user,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            kafka.broker._java_command(*argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CONFIG_COMMAND_TIMEOUT_S,
        )
    finally:
        admin.unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(f"kafka-configs --alter for {user} failed: {(done.stderr or done.stdout)[-500:]}")
    kafka.passwords[user] = password
    asyncio.run(_until_login(kafka.config(user)))


async def _until_login(kafka: connection.KafkaConfig) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SCRAM_VISIBLE_TIMEOUT_S
    while True:
        try:
            await connection.reach(kafka, timeout_s=connection.PROBE_ATTEMPT_TIMEOUT_S, once=True)
            return
        except connection.BrokerUnreachable:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)

"""Kafka client configuration: where the brokers are, how to reach them, and every client built on it.

This module owns the one reading of the Kafka connection flags every command
takes (`--bootstrap-server host:port[,host:port...]`, the older `--broker
kafka://...`, `--kafka-config FILE`, `--bootstrap-timeout`) and of a client
properties file with the keys librdkafka and the Java client share
(`security.protocol`, `sasl.mechanism`, `sasl.username`/`sasl.password` or
`sasl.jaas.config`, `ssl.ca.location` or a truststore, a client certificate and
key or a keystore, `ssl.endpoint.identification.algorithm`), plus the Java
client's config providers (`${directory:DIR:FILE}`, `${file:PATH:KEY}`,
`${env:NAME}`) so a properties file can point at mounted Secrets instead of
holding them. An unknown key or a contradiction is a one-line error (exit 2).

`KafkaConfig` builds every producer, consumer and admin client of preemptctl
(`producer`, `consumer`, `admin`) and hands faust what it needs
(streams.pipeline.app), so security settings are applied in one place. A plain
`str` stands for a PLAINTEXT bootstrap (`of`): the embedded broker and tests.

Secrets (SASL password, key and store passwords) live in `Secret`, whose repr
and str are masked: no log line, error or exception can carry them.
`reach` checks that Kafka answers within the bootstrap timeout and says in one
line what is wrong (refused, TLS verification, authentication), naming the
brokers and the security protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import os
import re
import ssl
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streams.common import logs
from streams.common.errors import BadBrokerUrl, UsageError

if TYPE_CHECKING:  # the client itself is imported where it is used: reading a file needs none of it
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient

_log = logging.getLogger("preemptctl.kafka")

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
# What aiokafka speaks without extra libraries. GSSAPI needs Kerberos bindings and
# OAUTHBEARER a token provider: refused with a one-line error rather than half-supported.
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# How long a command waits for Kafka to answer at start before it says why not: long
# enough for a broker restart or a slow TLS handshake on a loaded node, short enough that
# a wrong address is reported in seconds, not after aiokafka's 40 s request timeout.
DEFAULT_BOOTSTRAP_TIMEOUT_S = 30.0
# One connection attempt of `reach` (TCP + TLS + SASL + one metadata request) at most this
# long, so one dead host of several cannot use up the whole bootstrap timeout.
PROBE_ATTEMPT_TIMEOUT_S = 10.0
# Between probe rounds while waiting for a broker that is not up yet.
PROBE_RETRY_S = 1.0

# The keys a --kafka-config file may hold, with what each means (also the error's list).
KEYS: Mapping[str, str] = {
    "bootstrap.servers": "host:port[,host:port...] (the command line's --bootstrap-server wins)",
    "security.protocol": "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    "sasl.mechanism": "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
    "sasl.mechanisms": "librdkafka's spelling of sasl.mechanism",
    "sasl.username": "SASL user name",
    "sasl.password": "SASL password",
    "sasl.jaas.config": "a PlainLoginModule or ScramLoginModule line with username and password",
    "ssl.ca.location": "PEM file of the CA certificates that sign the brokers' certificates",
    "ssl.truststore.location": "truststore file (PKCS12 or PEM) of the brokers' CA",
    "ssl.truststore.password": "the truststore's password",
    "ssl.truststore.type": "PKCS12 or PEM",
    "ssl.certificate.location": "PEM client certificate (mTLS)",
    "ssl.key.location": "PEM private key of the client certificate",
    "ssl.key.password": "password of the private key (PEM or keystore)",
    "ssl.keystore.location": "keystore file (PKCS12 or PEM) with the client certificate and key",
    "ssl.keystore.password": "the keystore's password",
    "ssl.keystore.type": "PKCS12 or PEM",
    "ssl.endpoint.identification.algorithm": "https (check the broker's host name, default) or none",
    "config.providers": "config providers named in values (directory, file, env)",
}
_PROVIDER_CLASSES = {
    "directory": "org.apache.kafka.common.config.provider.DirectoryConfigProvider",
    "file": "org.apache.kafka.common.config.provider.FileConfigProvider",
    "env": "org.apache.kafka.common.config.provider.EnvVarConfigProvider",
}
_PROVIDER_CLASS_KEY = re.compile(r"^config\.providers\.([A-Za-z0-9_-]+)\.class$")
_REFERENCE = re.compile(r"\$\{([A-Za-z0-9_-]+):([^}]*)\}")
_JAAS = re.compile(r"^\s*([A-Za-z0-9_.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?)\s*;?\s*$", re.S)
_JAAS_OPTION = re.compile(r'([A-Za-z0-9_.-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;]+)')
_JAAS_MECHANISMS = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": ("PLAIN",),
    "org.apache.kafka.common.security.scram.ScramLoginModule": ("SCRAM-SHA-256", "SCRAM-SHA-512"),
}


class Secret:
    """A secret value; printing, repr or formatting it shows only that it is there.

    With `source`, the value is read again from where it came from each time it is revealed
    (a mounted Secret that the kubelet updates: a rotated SASL password), so every client
    built after a rotation logs in with the new value; when the source cannot be read, the
    last value read is kept (and the reason logged once).
    """

    __slots__ = ("_failed", "_source", "_value")

    def __init__(self, value: str, *, source: Callable[[], str] | None = None) -> None:
        self._value = value
        self._source = source
        self._failed: str | None = None
        # Every password resolved from a config is masked from here on, in every log line and
        # printed error, whoever writes it (streams.common.logs: a library's debug line, say).
        logs.secret(value)

    def reveal(self) -> str:
        if self._source is not None:
            self._reread(self._source)
        return self._value

    def _reread(self, source: Callable[[], str]) -> None:
        try:
            value = source()
        except (UsageError, OSError, ValueError) as exc:
            if str(exc) != self._failed:
                _log.warning("%s; the password read before is used", exc)
            self._failed = str(exc)
            return
        self._failed = None
        if value != self._value:
            logs.secret(value)  # masked before anything can log it
            self._value = value
            _log.info("the SASL password changed where it is read from: new connections use the new one")

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(Secret)  # constant: a followed value changes, and equal ones hash alike


class BrokerUnavailable(RuntimeError):
    """A broker could not be found, started, or reached; the message is one line."""


class BrokerUnreachable(BrokerUnavailable):
    """Kafka did not answer within the bootstrap timeout; the message is one line naming brokers and protocol.

    `auth` is True when a broker answered but refused the credentials or the TLS handshake
    (a configuration to fix rather than a broker to wait for).
    """

    def __init__(self, message: str, *, auth: bool = False) -> None:
        super().__init__(message)
        self.auth = auth


@dataclasses.dataclass(frozen=True)
class KafkaConfig:
    """How to reach Kafka: the brokers, the security protocol and its credentials."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    # PEM text of the trusted CAs (from ssl.ca.location or a truststore); None: the system's.
    ssl_cadata: str | None = dataclasses.field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: Secret | None = None
    # A PKCS12 keystore's certificate chain and key, as PEM (held in memory, masked).
    ssl_keystore_pem: Secret | None = None
    check_hostname: bool = True
    bootstrap_timeout_s: float = DEFAULT_BOOTSTRAP_TIMEOUT_S
    # Where the settings came from (the --kafka-config path), for messages.
    origin: str = ""

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def describe(self) -> str:
        """`HOSTS over PROTOCOL[ (MECHANISM as USER)]`: for messages; never a secret."""
        how = self.security_protocol
        if self.sasl:
            how += f" ({self.sasl_mechanism} as {self.sasl_username})"
        elif self.tls and (self.ssl_certfile or self.ssl_keystore_pem):
            how += " (client certificate)"
        return f"{self.bootstrap} over {how}"

    def hosts(self) -> list[tuple[str, int]]:
        out = []
        for address in self.bootstrap.split(","):
            host, _, port = address.strip().rpartition(":")
            out.append((host.strip("[]"), int(port)))
        return out

    @functools.cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (built once): verification on, TLS 1.2 at least."""
        if not self.tls:
            return None
        return _ssl_context(self)

    def client_kwargs(self) -> dict[str, Any]:
        """The security keyword arguments every aiokafka client takes."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
        }
        if self.tls:
            kwargs["ssl_context"] = self.ssl_context
        if self.sasl:
            assert self.sasl_password is not None  # parse() refuses SASL without one
            kwargs.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password.reveal(),
            )
        return kwargs

    def producer(self, **kwargs: Any) -> AIOKafkaProducer:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(**self.client_kwargs(), **kwargs)
        follow(producer.client, self)
        return producer

    def consumer(self, *topics: str, **kwargs: Any) -> AIOKafkaConsumer:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(*topics, **self.client_kwargs(), **kwargs)
        follow(consumer._client, self)
        return consumer

    def admin(self, **kwargs: Any) -> AIOKafkaAdminClient:
        from aiokafka.admin import AIOKafkaAdminClient

        admin = AIOKafkaAdminClient(**self.client_kwargs(), **kwargs)
        follow(admin._client, self)
        return admin


class _Following:
    """Marks an aiokafka client whose SASL password is read again at each connection (`follow`)."""


def _current_password(client: Any) -> str:
    secret: Secret = client.__dict__["_preemptctl_password"]
    return secret.reveal()


def _set_password(client: Any, value: str) -> None:
    pass  # aiokafka sets it once, in __init__ (before `follow`); the Secret is the source


_FOLLOWING: dict[type, type] = {}  # aiokafka's client class -> its following subclass


def _following(cls: type) -> type:
    if cls not in _FOLLOWING:
        attrs = {"_sasl_plain_password": property(_current_password, _set_password)}
        _FOLLOWING[cls] = type(cls.__name__, (cls, _Following), attrs)
    return _FOLLOWING[cls]


def follow(client: Any, kafka: KafkaConfig) -> None:
    """Make `client` (an aiokafka AIOKafkaClient: a producer's `client`, a consumer's or admin
    client's `_client`) log in with the SASL password `kafka` reads *now* on every connection it
    opens from here on, not the one it was built with.

    aiokafka keeps the password it was given and logs in with it at each new connection (a
    broker restart, an idle connection closed after 9 minutes, a coordinator that moves):
    after a rotation such a client would be refused for as long as it lives, even once the new
    Secret is mounted. Only a password read from a file (`load` with --kafka-config) is followed.
    """
    secret = kafka.sasl_password
    if secret is None or secret._source is None or isinstance(client, _Following):
        return
    client.__dict__["_preemptctl_password"] = secret
    client.__class__ = _following(type(client))


Connect = KafkaConfig | str


def of(kafka: Connect) -> KafkaConfig:
    """A KafkaConfig; a str is a PLAINTEXT bootstrap (`host:port[,host:port]`)."""
    return kafka if isinstance(kafka, KafkaConfig) else KafkaConfig(bootstrap=kafka)


# ---- reading the flags and the properties file ------------------------------------------


def parse_bootstrap(text: str, *, what: str = "--bootstrap-server") -> str:
    """`host:port[,host:port...]` checked and normalised (no spaces); BadBrokerUrl otherwise."""
    addresses = [a.strip() for a in text.split(",")]
    for address in addresses:
        host, colon, port = address.rpartition(":")
        if (
            not colon
            or not host
            or any(c in host for c in "/?#@ ")
            or not port.isdigit()
            or not 0 < int(port) < 65536
        ):
            raise BadBrokerUrl(f"bad {what} {text!r}: expected host:port[,host:port...], got {address!r}")
    return ",".join(addresses)


def parse_broker_url(url: str) -> str:
    """`kafka://host:port[,host:port...]` -> the bootstrap string; BadBrokerUrl otherwise."""
    scheme, sep, rest = url.partition("://")
    rest = rest.removesuffix("/")
    if scheme != "kafka" or not sep or not rest or any(c in rest for c in "/?#@"):
        raise BadBrokerUrl(f"bad broker url {url!r}: expected kafka://host:port")
    try:
        return parse_bootstrap(rest, what="broker url")
    except BadBrokerUrl as exc:
        raise BadBrokerUrl(f"bad broker url {url!r}: expected kafka://host:port[,host:port]") from exc


# Every property that holds a password, registered with the log masker as it is resolved.
PASSWORD_KEYS = ("sasl.password", "ssl.key.password", "ssl.truststore.password", "ssl.keystore.password")
# What a Kafka client property name looks like: lowercase words joined by dots (`acks`,
# `sasl.jaas.config`). Anything else is not echoed: it may be a value (a password) that a
# broken continuation left on a line of its own.
_PROPERTY_NAME = re.compile(r"^[a-z]+(\.[a-z]+)*$")


def read_properties(text: str, *, where: str) -> dict[str, str]:
    """A Java .properties file: `key=value`, `key: value` or `key value`; `#`/`!` comments;
    a trailing backslash continues a line; `\\t`, `\\n`, `\\uXXXX` and `\\x` escapes."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()  # a continuation line's indent is not part of the value either
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: a continuation
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    out: dict[str, str] = {}
    for line in logical:
        key, value = _split_property(line)
        key = _unescape(key, where=where)
        if key in out:
            raise UsageError(f"{where}: {key} is set twice")
        out[key] = _unescape(value, where=where)
    return out


def _split_property(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t":
            # The key ends at the first unescaped separator; whitespace, then one = or :, may follow.
            key, rest = line[:i], line[i:].lstrip(" \t\f")
            if rest[:1] in ("=", ":"):
                rest = rest[1:].lstrip(" \t\f")
            return key, rest
        i += 1
    return line, ""


def _unescape(text: str, *, where: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "\\" or i + 1 == len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            code = text[i + 2 : i + 6]
            if len(code) != 4 or any(ch not in "0123456789abcdefABCDEF" for ch in code):
                raise UsageError(f"{where}: bad \\u escape {text[i : i + 6]!r}")
            out.append(chr(int(code, 16)))
            i += 6
            continue
        out.append({"t": "\t", "n": "\n", "r": "\r", "f": "\f"}.get(nxt, nxt))
        i += 2
    return "".join(out)


def _resolve(value: str, *, key: str, where: str) -> str:
    """Expand ${provider:...} references the way the Java client's config providers do."""

    def expand(match: re.Match[str]) -> str:
        provider, argument = match.group(1), match.group(2)
        if provider == "env":
            if argument not in os.environ:
                raise UsageError(f"{where}: {key} refers to ${{env:{argument}}}, which is not set")
            return os.environ[argument]
        path, colon, name = argument.rpartition(":")
        if provider not in ("directory", "file") or not colon or not path or not name:
            raise UsageError(
                f"{where}: {key}: cannot resolve ${{{provider}:{argument}}} "
                "(expected ${directory:DIR:FILE}, ${file:PATH:KEY} or ${env:NAME})"
            )
        try:
            if provider == "directory":
                if "/" in name or name in (".", ".."):
                    raise UsageError(f"{where}: {key}: ${{directory:...}} names a file, not a path: {name!r}")
                return (Path(path) / name).read_text().rstrip("\r\n")
            props = read_properties(Path(path).read_text(), where=path)
        except OSError as exc:
            raise UsageError(
                f"{where}: {key}: cannot read {exc.filename or path}: {exc.strerror or exc}"
            ) from exc
        if name not in props:
            raise UsageError(f"{where}: {key}: {path} has no key {name}")
        return props[name]

    return _REFERENCE.sub(expand, value)


def _jaas(value: str, *, where: str) -> tuple[tuple[str, ...], str, str]:
    """(mechanisms the login module serves, username, password) of a sasl.jaas.config line."""
    match = _JAAS.match(value)
    if match is None:
        raise UsageError(f'{where}: sasl.jaas.config is not `LoginModule required key="value" ...;`')
    module, _, body = match.groups()
    mechanisms = _JAAS_MECHANISMS.get(module)
    if mechanisms is None:
        raise UsageError(
            f"{where}: sasl.jaas.config: {module} is not supported "
            "(PlainLoginModule or ScramLoginModule with username and password)"
        )
    options = {}
    for name, raw in _JAAS_OPTION.findall(body):
        options[name] = re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith('"') else raw
    if not options.get("username") or "password" not in options:
        raise UsageError(f"{where}: sasl.jaas.config needs username and password")
    return mechanisms, options["username"], options["password"]


def _file(props: Mapping[str, str], key: str, *, where: str) -> str | None:
    path = props.get(key)
    if path is None:
        return None
    if not path or not os.access(path, os.R_OK) or not Path(path).is_file():
        raise UsageError(f"{where}: {key} {path!r} is not a readable file")
    return path


def _store_type(props: Mapping[str, str], key: str, path: str, *, where: str) -> str:
    declared = props.get(key)
    kind = (declared or ("PEM" if path.endswith((".pem", ".crt")) else "PKCS12")).upper()
    if kind == "JKS":
        raise UsageError(
            f"{where}: {key} JKS is not supported: convert it with `keytool -importkeystore "
            f"-srckeystore {path} -destkeystore store.p12 -deststoretype PKCS12` and use PKCS12"
        )
    if kind not in ("PKCS12", "PEM"):
        raise UsageError(f"{where}: {key} must be PKCS12 or PEM, got {declared!r}")
    return kind


def _pkcs12(path: str, password: str | None, *, key: str, where: str) -> Any:
    try:
        from cryptography.hazmat.primitives.serialization import pkcs12
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise UsageError(f"{where}: {key}: reading PKCS12 needs the cryptography package") from exc
    try:
        return pkcs12.load_pkcs12(Path(path).read_bytes(), password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{where}: {key} {path}: cannot open (wrong password or not PKCS12)") from exc


def _pem_certificates(certs: list[Any]) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding

    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certs)


def parse(
    props: Mapping[str, str],
    *,
    bootstrap: str | None = None,
    where: str = "--kafka-config",
    bootstrap_timeout_s: float = DEFAULT_BOOTSTRAP_TIMEOUT_S,
    require_bootstrap: bool = True,
) -> KafkaConfig:
    """A KafkaConfig from client properties (already read); UsageError (one line) on anything wrong.

    Without `require_bootstrap`, no brokers leaves `bootstrap` empty, for a location
    (kafka://host:port/topic) to fill in.
    """
    unknown = sorted(k for k in props if k not in KEYS and not (_PROVIDER_CLASS_KEY.match(k)))
    if unknown:
        key = unknown[0]
        if not _PROPERTY_NAME.match(key):
            # Not a property name: most likely a value on a line of its own (a password after
            # a broken continuation), which must not reach a log or a terminal.
            raise UsageError(
                f"{where}: a line that is not `key=value` with a property name (a value on a "
                "line of its own? check the line continuations)"
            )
        raise UsageError(f"{where}: unknown key {key} (supported: {', '.join(KEYS)})")
    for k, cls in props.items():
        matched = _PROVIDER_CLASS_KEY.match(k)
        if matched and _PROVIDER_CLASSES.get(matched.group(1)) != cls:
            raise UsageError(f"{where}: {k}: only {', '.join(_PROVIDER_CLASSES.values())} are supported")
    values = {k: _resolve(v, key=k, where=where) for k, v in props.items() if not k.startswith("config.")}
    for k in PASSWORD_KEYS:
        if values.get(k):
            logs.secret(values[k])  # masked from here on, even where no Secret ever holds it

    servers = bootstrap or values.get("bootstrap.servers") or ""
    if servers:
        servers = parse_bootstrap(
            servers, what="bootstrap.servers" if bootstrap is None else "--bootstrap-server"
        )
    elif require_bootstrap:
        raise UsageError(
            "no Kafka brokers: give --bootstrap-server HOST:PORT (or bootstrap.servers in --kafka-config)"
        )

    protocol = values.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise UsageError(
            f"{where}: security.protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}"
        )
    tls, sasl = protocol in ("SSL", "SASL_SSL"), protocol.startswith("SASL_")

    if "sasl.mechanism" in values and "sasl.mechanisms" in values:
        raise UsageError(f"{where}: give sasl.mechanism or sasl.mechanisms, not both")
    sasl_keys = sorted(k for k in values if k.startswith("sasl."))
    if sasl_keys and not sasl:
        raise UsageError(f"{where}: {sasl_keys[0]} is set but security.protocol is {protocol} (SASL_SSL?)")
    ssl_keys = sorted(k for k in values if k.startswith("ssl."))
    if ssl_keys and not tls:
        raise UsageError(
            f"{where}: {ssl_keys[0]} is set but security.protocol is {protocol} (SSL or SASL_SSL?)"
        )

    mechanism = username = password = None
    if sasl:
        mechanism = (values.get("sasl.mechanism") or values.get("sasl.mechanisms") or "").upper()
        if not mechanism:
            raise UsageError(
                f"{where}: security.protocol {protocol} needs sasl.mechanism ({', '.join(MECHANISMS)})"
            )
        if mechanism not in MECHANISMS:
            raise UsageError(
                f"{where}: sasl.mechanism {mechanism} is not supported ({', '.join(MECHANISMS)})"
            )
        username, password = values.get("sasl.username"), values.get("sasl.password")
        if "sasl.jaas.config" in values:
            if username is not None or password is not None:
                raise UsageError(f"{where}: give sasl.jaas.config or sasl.username/sasl.password, not both")
            served, username, password = _jaas(values["sasl.jaas.config"], where=where)
            if mechanism not in served:
                raise UsageError(f"{where}: sasl.jaas.config's login module does not do {mechanism}")
        if not username or password is None:
            raise UsageError(
                f"{where}: {mechanism} needs sasl.username and sasl.password (or sasl.jaas.config)"
            )
        if protocol == "SASL_PLAINTEXT" and mechanism == "PLAIN":
            pass  # allowed (a trusted network), as every client allows it; docs/deploy.md warns

    cadata = cafile = certfile = keyfile = None
    keystore_pem: Secret | None = None
    key_password = values.get("ssl.key.password")
    check_hostname = True
    if tls:
        algorithm = values.get("ssl.endpoint.identification.algorithm", "https").lower()
        if algorithm not in ("https", "", "none"):
            raise UsageError(f"{where}: ssl.endpoint.identification.algorithm must be https or none")
        check_hostname = algorithm == "https"
        if "ssl.ca.location" in values and "ssl.truststore.location" in values:
            raise UsageError(f"{where}: give ssl.ca.location or ssl.truststore.location, not both")
        cafile = _file(values, "ssl.ca.location", where=where)
        truststore = _file(values, "ssl.truststore.location", where=where)
        if truststore is not None:
            if _store_type(values, "ssl.truststore.type", truststore, where=where) == "PEM":
                cafile = truststore
            else:
                store = _pkcs12(
                    truststore,
                    values.get("ssl.truststore.password"),
                    key="ssl.truststore.location",
                    where=where,
                )
                certs = [c.certificate for c in store.additional_certs]
                if store.cert is not None:
                    certs.insert(0, store.cert.certificate)
                if not certs:
                    raise UsageError(f"{where}: ssl.truststore.location {truststore} holds no certificate")
                cadata = _pem_certificates(certs)
        elif "ssl.truststore.password" in values or "ssl.truststore.type" in values:
            raise UsageError(f"{where}: ssl.truststore.* is set without ssl.truststore.location")
        if "ssl.certificate.location" in values and "ssl.keystore.location" in values:
            raise UsageError(f"{where}: give ssl.certificate.location or ssl.keystore.location, not both")
        certfile = _file(values, "ssl.certificate.location", where=where)
        keyfile = _file(values, "ssl.key.location", where=where)
        if keyfile is not None and certfile is None:
            raise UsageError(f"{where}: ssl.key.location needs ssl.certificate.location")
        keystore = _file(values, "ssl.keystore.location", where=where)
        if keystore is not None:
            if _store_type(values, "ssl.keystore.type", keystore, where=where) == "PEM":
                certfile = keystore  # the chain and the key in one PEM file
            else:
                store = _pkcs12(
                    keystore, values.get("ssl.keystore.password"), key="ssl.keystore.location", where=where
                )
                keystore_pem = _keystore_pem(store, where=where)
                key_password = None  # the key comes out of the store decrypted, held masked
        elif "ssl.keystore.password" in values or "ssl.keystore.type" in values:
            raise UsageError(f"{where}: ssl.keystore.* is set without ssl.keystore.location")
    config = KafkaConfig(
        bootstrap=servers,
        security_protocol=protocol,
        sasl_mechanism=mechanism,
        sasl_username=username,
        sasl_password=Secret(password) if password is not None else None,
        ssl_cadata=cadata,
        ssl_cafile=cafile,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        ssl_key_password=Secret(key_password) if key_password else None,
        ssl_keystore_pem=keystore_pem,
        check_hostname=check_hostname,
        bootstrap_timeout_s=bootstrap_timeout_s,
        origin=where,
    )
    if tls:
        _ssl_context(config)  # a bad certificate, key or password is a start-up error, not a retry loop
    return config


def _keystore_pem(store: Any, *, where: str) -> Secret:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    if store.key is None or store.cert is None:
        raise UsageError(f"{where}: ssl.keystore.location holds no private key with its certificate")
    key = store.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    chain = _pem_certificates([store.cert.certificate, *(c.certificate for c in store.additional_certs)])
    return Secret(chain + key)


def _ssl_context(config: KafkaConfig) -> ssl.SSLContext:
    where = config.origin or "--kafka-config"
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if config.ssl_cafile or config.ssl_cadata:
            # Only the configured CAs: a private cluster CA must not be widened by the system's.
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_verify_locations(cafile=config.ssl_cafile, cadata=config.ssl_cadata)
        context.check_hostname = config.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
        password = config.ssl_key_password.reveal() if config.ssl_key_password else None
        if config.ssl_keystore_pem is not None:
            _load_chain_from_memory(context, config.ssl_keystore_pem.reveal())
        elif config.ssl_certfile:
            context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile, password=password)
    except ssl.SSLError as exc:
        raise UsageError(f"{where}: cannot use the TLS files: {exc.reason or exc}") from exc
    except OSError as exc:
        raise UsageError(f"{where}: cannot read a TLS file: {exc.strerror or exc}") from exc
    return context


def _load_chain_from_memory(context: ssl.SSLContext, pem: str) -> None:
    # ssl loads a certificate chain only from a file: a private (0600) temp file that is
    # removed as soon as it is read, so the key never stays on disk.
    fd, path = tempfile.mkstemp(prefix="preemptctl-keystore-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(pem)
        context.load_cert_chain(path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def load(
    *,
    bootstrap: str | None,
    config_file: str | None,
    bootstrap_timeout_s: float = DEFAULT_BOOTSTRAP_TIMEOUT_S,
    require_bootstrap: bool = True,
) -> KafkaConfig:
    """What the connection flags say: the brokers (the flag, else bootstrap.servers) and the file."""
    props: dict[str, str] = {}
    where = "--kafka-config"
    if config_file:
        where = config_file
        try:
            text = Path(config_file).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read --kafka-config {config_file}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise UsageError(f"--kafka-config {config_file} is not a text file") from exc
        props = read_properties(text, where=config_file)
    if not 0 < bootstrap_timeout_s < math.inf:  # nan and inf too: every wait would be endless
        raise UsageError(f"--bootstrap-timeout must be positive, got {bootstrap_timeout_s:g}")
    config = parse(
        props,
        bootstrap=bootstrap,
        where=where,
        bootstrap_timeout_s=bootstrap_timeout_s,
        require_bootstrap=require_bootstrap,
    )
    if config_file and config.sasl_password is not None:
        # A rotated password reaches the file (or the mounted Secret it names) while the process
        # runs: each new connection reads it again (connections already open stay logged in).
        source = functools.partial(sasl_password_in, config_file, username=config.sasl_username)
        followed = Secret(config.sasl_password.reveal(), source=source)
        config = dataclasses.replace(config, sasl_password=followed)
    return config


def sasl_password_in(config_file: str, *, username: str | None) -> str:
    """The SASL password `config_file` gives now: its sasl.password or sasl.jaas.config, with
    ${directory:...}, ${file:...} and ${env:...} resolved again. UsageError (no secret in it) when
    it cannot be read, holds none, or names another user than `username` (a restart reads that)."""
    try:
        text = Path(config_file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --kafka-config {config_file} again: {exc}") from exc
    props = read_properties(text, where=config_file)
    keys = ("sasl.username", "sasl.password", "sasl.jaas.config")
    values = {k: _resolve(props[k], key=k, where=config_file) for k in keys if k in props}
    user, password = values.get("sasl.username"), values.get("sasl.password")
    if "sasl.jaas.config" in values:
        _, user, password = _jaas(values["sasl.jaas.config"], where=config_file)
    if password is None:
        raise UsageError(f"{config_file}: no SASL password any more")
    if user != username:
        raise UsageError(f"{config_file}: the SASL user changed: only a restart logs in as another user")
    logs.secret(password)
    return password


def add_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """--bootstrap-server / --broker, --kafka-config and --bootstrap-timeout (`from_args` reads them)."""
    group = parser.add_argument_group("Kafka connection")
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,HOST:PORT]",
        help="Kafka brokers to bootstrap from"
        + (" (or bootstrap.servers in --kafka-config)" if required else ""),
    )
    where.add_argument("--broker", metavar="kafka://HOST:PORT", help="the same, as a URL (older spelling)")
    group.add_argument(
        "--kafka-config",
        metavar="FILE",
        help="client properties (librdkafka/Java keys): security.protocol, sasl.mechanism, "
        "sasl.username/sasl.password or sasl.jaas.config, ssl.ca.location or ssl.truststore.*, "
        "ssl.certificate.location/ssl.key.location or ssl.keystore.*; docs/deploy.md",
    )
    group.add_argument(
        "--bootstrap-timeout",
        type=float,
        default=DEFAULT_BOOTSTRAP_TIMEOUT_S,
        metavar="SECONDS",
        help="how long to wait for Kafka to answer before saying why not "
        f"(default {DEFAULT_BOOTSTRAP_TIMEOUT_S:g})",
    )


def from_args(args: argparse.Namespace, *, require_bootstrap: bool = True) -> KafkaConfig:
    """The KafkaConfig of add_arguments' flags; UsageError (exit 2, one line) when they are wrong."""
    bootstrap = args.bootstrap_server
    if bootstrap is not None:
        bootstrap = parse_bootstrap(bootstrap)
    elif args.broker is not None:
        bootstrap = parse_broker_url(args.broker)
    return load(
        bootstrap=bootstrap,
        config_file=args.kafka_config,
        bootstrap_timeout_s=args.bootstrap_timeout,
        require_bootstrap=require_bootstrap,
    )


def given(args: argparse.Namespace) -> bool:
    """Did the command line name a Kafka at all (flags or a config file)?"""
    return bool(args.bootstrap_server or args.broker or args.kafka_config)


def for_locations(args: argparse.Namespace) -> KafkaConfig | None:
    """The connection flags of a command that reads kafka://[host:port]/topic locations: None when
    none was given (the URL alone, PLAINTEXT); else their settings, brokers optional (the URL's win)."""
    if not given(args) and args.bootstrap_timeout == DEFAULT_BOOTSTRAP_TIMEOUT_S:
        return None
    return from_args(args, require_bootstrap=False)


# ---- reaching Kafka ----------------------------------------------------------------------


def _reason(exc: BaseException) -> tuple[str, bool]:
    """(one-line reason, is it the credentials or TLS rather than the network?)."""
    from aiokafka.errors import KafkaError

    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: the broker's certificate does not verify ({exc.verify_message})", True
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}", True
    if isinstance(exc, TimeoutError):
        return "no answer", False
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused", False
    if isinstance(exc, KafkaError):
        name = type(exc).__name__
        # aiokafka's str() is "[Error 58] SaslAuthenticationFailed: what the broker said".
        text = re.sub(r"^\[Error -?\d+\] \w+(: )?", "", str(exc).split("\n")[0]).strip()
        name = name.removesuffix("Error") if name.endswith("FailedError") else name
        auth = "Sasl" in name or "Authentication" in name or "Authorization" in name
        if auth or "Unsupported" in name:
            return f"{name}: {text}" if text and text != name else name, True
        # A TLS listener spoken to in plain text (or the reverse) closes the connection at once.
        return f"{name}: {text}" if text and text != name else name, False
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__, False
    return f"{type(exc).__name__}: {exc}", False


# ApiVersions v0, correlation id 1, client id "preemptctl-probe": the first request of every client.
_API_VERSIONS = b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x10preemptctl-probe"


async def _tls_refusal(config: KafkaConfig, host: str, port: int) -> str | None:
    """Why a TLS broker closed the connection right after the handshake, if it said so.

    With TLS 1.3 a broker that refuses the client's certificate (none, or one of a CA it
    does not trust) sends its alert after the handshake; aiokafka only sees a closed
    connection. Asked again directly, the alert comes back as an SSLError naming it.
    """
    try:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=config.ssl_context, server_hostname=host if config.check_hostname else None
        )
    except (OSError, ssl.SSLError):
        return None
    try:
        writer.write(len(_API_VERSIONS).to_bytes(4, "big") + _API_VERSIONS)
        await writer.drain()
        await reader.readexactly(4)
    except ssl.SSLError as exc:
        return f"TLS: the broker refused the connection ({exc.reason or exc}): is the client certificate "
        "one the broker trusts?"
    except (OSError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    return None


async def _probe(config: KafkaConfig, host: str, port: int) -> None:
    from aiokafka.conn import create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    conn = await create_conn(
        host,
        port,
        client_id="preemptctl-probe",
        request_timeout_ms=int(PROBE_ATTEMPT_TIMEOUT_S * 1000),
        ssl_context=config.ssl_context,
        security_protocol=config.security_protocol,
        sasl_mechanism=config.sasl_mechanism,
        sasl_plain_username=config.sasl_username,
        sasl_plain_password=config.sasl_password.reveal() if config.sasl_password else None,
    )
    try:
        await conn.send(MetadataRequest([]))
    finally:
        conn.close()


async def start(kafka: KafkaConfig, started: Any) -> None:
    """`await started.start()` (a producer, consumer or admin client) within the bootstrap timeout.

    aiokafka only says "Unable to bootstrap" after its request timeout; here the wait is
    bounded and the failure says why, in one line (BrokerUnreachable). The caller still
    stops the client.
    """
    from aiokafka.errors import KafkaError

    try:
        async with asyncio.timeout(kafka.bootstrap_timeout_s):
            await started.start()
    except (KafkaError, OSError, TimeoutError, ssl.SSLError) as exc:
        # Ask each broker once more, directly, for the reason (refused, TLS, credentials).
        await reach(kafka, timeout_s=min(PROBE_ATTEMPT_TIMEOUT_S, kafka.bootstrap_timeout_s), once=True)
        reason, auth = _reason(exc)
        message = f"cannot connect to Kafka at {kafka.describe()}: {reason}"
        raise BrokerUnreachable(message, auth=auth) from exc


async def reach(kafka: Connect, *, timeout_s: float | None = None, once: bool = False) -> None:
    """Return once a broker answers (TCP, TLS, SASL and a metadata request); else BrokerUnreachable.

    Tries every bootstrap address, round after round, until one answers or `timeout_s`
    (default: the config's bootstrap timeout) is spent; `once`: one round only. A refused
    credential or TLS handshake ends the wait at once: waiting would not change the answer.
    """
    from aiokafka.errors import KafkaError

    config = of(kafka)
    budget = config.bootstrap_timeout_s if timeout_s is None else timeout_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    last: dict[str, str] = {}
    while True:
        for host, port in config.hosts():
            remaining = deadline - loop.time()
            try:
                async with asyncio.timeout(max(0.05, min(PROBE_ATTEMPT_TIMEOUT_S, remaining))):
                    await _probe(config, host, port)
                return
            except (OSError, KafkaError, TimeoutError, ssl.SSLError) as exc:
                reason, auth = _reason(exc)
                if config.tls and not auth and isinstance(exc, KafkaError):
                    refused = await _tls_refusal(config, host, port)
                    reason, auth = (refused, True) if refused else (reason, auth)
                last[f"{host}:{port}"] = reason
                if auth:
                    raise BrokerUnreachable(
                        f"cannot connect to Kafka at {config.describe()}: {host}:{port}: {reason}", auth=True
                    ) from exc
        if once or loop.time() >= deadline:
            detail = "; ".join(f"{address}: {why}" for address, why in last.items())
            within = "" if once else f" within {budget:g} s"
            raise BrokerUnreachable(f"cannot reach Kafka at {config.describe()}{within} ({detail})")
        await asyncio.sleep(min(PROBE_RETRY_S, max(0.0, deadline - loop.time())))

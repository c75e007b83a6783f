"""Logging for every component: `--log-format json|text`, `--log-level`, and never a secret.

This module owns how a long-running component (source, worker, actuator) logs:
- everything goes to stderr (stdout is for data, docs/architecture.md §5), one line per record;
- `text` is `TIME LEVEL LOGGER: message key=value ...`, `json` one JSON object
  per line with `ts`, `level`, `logger`, `component`, `msg` and the same keys,
  for a log pipeline (Loki, Elasticsearch, Cloud Logging) to index;
- the keys come from `extra=`: a line about a decision carries `decision`,
  `cluster` and `pod` (`decision_fields`), so one query finds every line about
  a decision or a pod across all three components;
- no terminal escape codes: neither format colours anything, and the worker
  keeps faust's spinner and log setup off (streams.pipeline.app);
- one record is one line whatever it quotes: `text` escapes control characters in
  the message and the keys (`\n`, `\x1b`), so a name read from a record cannot
  start a forged line or move the terminal's cursor (`json` escapes them anyway);
  only a traceback, after the line, spans lines;
- secrets are masked on the way out: values registered with `secret()` (the
  HMAC key, Kafka passwords) and anything shaped like a credential (an
  Authorization header, `password=`, `token:`) become `***` in the message, the
  keys and the traceback, whichever logger wrote them (faust, aiokafka and the
  Kubernetes client included).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections.abc import Iterable, Mapping
from typing import IO, Any

import orjson

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_LEVEL = "INFO"
DEFAULT_FORMAT = "text"
MASK = "***"
# Keys a decision line carries (DecisionRecord id, cluster, the pod the line is about).
DECISION, CLUSTER, POD = "decision", "cluster", "pod"

# Attributes every LogRecord has; whatever else a record carries came from `extra=`.
_STANDARD = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "", None, None)).keys() | {"message", "asctime"}
)
# Credentials in free text: a header, a URL's userinfo, key=value and key: value pairs.
_CREDENTIAL = re.compile(
    r"(?i)(\b(?:authorization|proxy-authorization)\b['\"]?\s*[:=]\s*['\"]?(?:bearer|basic)?\s*)[^\s'\",}]+"
    r"|(\b(?:password|passwd|secret|token|api[_-]?key|sasl[._]password)\b['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]+"
    r"|(://[^/\s:@]+:)[^/\s@]+(@)"
)
_secrets: set[str] = set()
# Marks the handler `configure` installs, so a second call replaces it rather than doubling lines.
_OURS = "_preemptctl_handler"
# Shorter values are not masked: they would mask ordinary words and numbers all over the log.
MIN_SECRET_LENGTH = 6


def secret(value: str | bytes | None) -> None:
    """Register a value that must never appear in a log line (the HMAC key, a Kafka password)."""
    if value is None:
        return
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    text = text.strip()
    if len(text) >= MIN_SECRET_LENGTH:
        _secrets.add(text)


def redact(text: str) -> str:
    """`text` with every registered secret and credential-shaped value masked."""
    for value in _secrets:
        if value in text:
            text = text.replace(value, MASK)
    return _CREDENTIAL.sub(_mask_credential, text)


def _mask_credential(match: re.Match[str]) -> str:
    if match.group(1) is not None:
        return match.group(1) + MASK
    if match.group(2) is not None:
        return match.group(2) + MASK
    return f"{match.group(3)}{MASK}{match.group(4)}"


def decision_fields(decision: Mapping[str, Any], *, pod: str | None = None) -> dict[str, str]:
    """The `extra=` of a line about `decision`: its id, its cluster, and the pod the line is about
    (the preemptor unless another pod, e.g. a victim, is named)."""
    return {
        DECISION: str(decision.get("id", "")),
        CLUSTER: str(decision.get("cluster", "")),
        POD: pod if pod is not None else str(decision.get("preemptor", "")),
    }


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _timestamp(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    millis = int((record.created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


# Characters that end a line or drive a terminal: C0 and C1 controls, DEL, the Unicode line and
# paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape_control(text: str) -> str:
    """`text` with every control character written as its escape (`\n`, `\x1b`, `\u2028`)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class TextFormatter(logging.Formatter):
    """`2026-01-01T00:00:00.000Z INFO logger: message key=value ...`: plain text, no colour, one
    line per record (control characters escaped; a traceback follows on lines of its own)."""

    def format(self, record: logging.LogRecord) -> str:
        message = escape_control(record.getMessage())
        fields = " ".join(f"{k}={_text(v)}" for k, v in sorted(_fields(record).items()))
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {message}"
        if fields:
            line += " " + fields
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return redact(line)


def _text(value: Any) -> str:
    text = str(value)
    quoted = not text or any(c.isspace() or c == '"' for c in text) or _CONTROL.search(text) is not None
    return escape_control(orjson.dumps(text).decode()) if quoted else text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, component, msg, the `extra=` keys, exc."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "component": self.component,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record).items():
            entry.setdefault(key, value if isinstance(value, str | int | float | bool) else str(value))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        # Redacted as the encoded line, so a secret inside any value (or a key) is caught.
        return redact(orjson.dumps(entry).decode())


def add_arguments(parser: argparse.ArgumentParser, *, default_level: str = DEFAULT_LEVEL) -> None:
    """`--log-level` and `--log-format`, the same on every component."""
    parser.add_argument(
        "--log-level",
        default=default_level,
        type=str.upper,
        choices=LEVELS,
        help=f"the least severe level logged (default {default_level})",
    )
    parser.add_argument(
        "--log-format",
        default=DEFAULT_FORMAT,
        choices=FORMATS,
        help="text: one readable line per record; json: one JSON object per line "
        f"(ts, level, logger, component, msg, decision, cluster, pod) (default {DEFAULT_FORMAT})",
    )


def configure(
    *, component: str, level: str = DEFAULT_LEVEL, fmt: str = DEFAULT_FORMAT, stream: IO[str] | None = None
) -> None:
    """Send every logger's records to stderr in `fmt`, at `level` and above (called again, it
    replaces its own handler; handlers others installed, e.g. a test's capture, stay)."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter(component) if fmt == "json" else TextFormatter())
    setattr(handler, _OURS, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # The clients' DEBUG output is request by request (and aiokafka's every fetch): useful only
    # when asked for by name; --log-level DEBUG means preemptctl's own.
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.INFO if level == "DEBUG" else logging.NOTSET)
    # faust's and mode's INFO is a line per service started and stopped (dozens at each start and
    # stop); their warnings and errors stay, and DEBUG shows everything.
    for name in _SERVICES:
        logging.getLogger(name).setLevel(logging.NOTSET if level == "DEBUG" else logging.WARNING)


_CHATTY: Iterable[str] = ("aiokafka", "kafka", "kubernetes_asyncio", "aiohttp", "asyncio")
_SERVICES: Iterable[str] = ("faust", "mode")

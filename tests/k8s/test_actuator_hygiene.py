"""Issue 29, 6 and 7: what a record carries cannot forge log lines, nor reach another URL.

A newline in a forged pod name wrote forged lines into the text log; a victim named `..` made
the HTTP client request another URL. Names are refused unless DNS-1123 (verify(), before any
API call: tests/k8s/test_actuator_trust.py), and the text log escapes control characters
whatever reaches it (another component's message, a library's).
"""

from __future__ import annotations

import io
import logging
import sys

import orjson
import pytest

from schemas import chain
from streams.common import logs
from streams.kube import actuator
from tests.k8s.decisions import decision


def _line(formatter: logging.Formatter, message: str, *args: object, **extra: object) -> str:
    record = logging.LogRecord("streams.kube.actuator", logging.INFO, "x", 0, message, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return formatter.format(record)


@pytest.mark.parametrize(
    "forged",
    ["v\n2026-01-01T00:00:00.000Z ERROR streams.kube.actuator: forged", "v\r\x1b[2Kforged", "v\u2028forged"],
)
def test_a_text_log_line_stays_one_line_whatever_it_quotes(forged: str) -> None:
    text = logs.TextFormatter()
    line = _line(text, "delete %s (%s): done", f"default/{forged}", "d1", pod=f"default/{forged}")
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\u2028" not in line
    assert line.splitlines() == [line]
    assert "forged" in line  # escaped, not dropped: the line still says what was there
    as_json = orjson.loads(_line(logs.JsonFormatter("actuator"), "delete %s", forged, pod=forged))
    assert as_json["msg"] == f"delete {forged}" and as_json["pod"] == forged


def test_a_traceback_still_follows_on_lines_of_its_own() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "x", 0, "failed\nforged", (), sys.exc_info())
    out = logs.TextFormatter().format(record)
    first, *rest = out.split("\n")
    assert first.endswith("failed\\nforged") and rest[0] == "Traceback (most recent call last):"


def test_the_actuators_own_lines_escape_a_forged_name() -> None:
    """End to end through the configured handler: a refused record names the offending value."""
    stream = io.StringIO()
    logs.configure(component="actuator", stream=stream)
    try:
        record = decision({"metadata": {"namespace": "default", "name": "high", "uid": "u"}}, [], key=None)
        record["preemptor"] = "default/high\n2026-01-01T00:00:00.000Z ERROR forged"
        chain.seal(record, chain.GENESIS, None)
        with pytest.raises(actuator.MalformedDecision) as refused:
            actuator.verify(orjson.dumps(record))
        logging.getLogger("streams.kube.actuator").warning("refused: %s", refused.value)
    finally:
        logging.getLogger().handlers = [
            h for h in logging.getLogger().handlers if not getattr(h, "_preemptctl_handler", False)
        ]
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "is not namespace/name" in lines[0]

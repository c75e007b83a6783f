"""Structured logging (streams.common.logs): both formats, decision fields, no escape codes, no secrets.

The components' real output is checked by tests/k8s/test_prometheus.py, which
runs the source, the worker and the actuator with `--log-format json`.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.common import logs

DECISION = {"id": "prod/7/uid-1", "cluster": "prod", "preemptor": "team-a/web-0"}


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logging.Logger]]:
    logger = logging.getLogger("preemptctl.test-logs")
    stream = io.StringIO()
    yield stream, logger
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, logs._OURS, False)]:
        root.removeHandler(handler)


def test_json_lines_carry_the_decision_cluster_and_pod(captured: tuple[io.StringIO, logging.Logger]) -> None:
    stream, logger = captured
    logs.configure(stream=stream, component="worker", level="INFO", fmt="json")
    logger.info("preempt %s", "team-a/web-0", extra=logs.decision_fields(DECISION))
    logger.debug("not at INFO")
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed", extra=logs.decision_fields(DECISION, pod="team-b/batch-3"))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["msg"] == "preempt team-a/web-0" and first["level"] == "INFO"
    assert first["component"] == "worker" and first["logger"] == "preemptctl.test-logs"
    assert (first["decision"], first["cluster"], first["pod"]) == ("prod/7/uid-1", "prod", "team-a/web-0")
    assert first["ts"].endswith("Z")
    assert second["pod"] == "team-b/batch-3" and "ValueError: boom" in second["exc"]


def test_text_lines_are_plain_and_name_the_fields(captured: tuple[io.StringIO, logging.Logger]) -> None:
    stream, logger = captured
    logs.configure(stream=stream, component="actuator", level="WARNING", fmt="text")
    logger.info("quiet")
    logger.warning("blocked", extra=logs.decision_fields(DECISION))
    (line,) = stream.getvalue().splitlines()
    assert " WARNING preemptctl.test-logs: blocked " in line
    assert "cluster=prod decision=prod/7/uid-1 pod=team-a/web-0" in line
    assert "\x1b" not in line


def test_configuring_twice_keeps_one_handler(captured: tuple[io.StringIO, logging.Logger]) -> None:
    stream, logger = captured
    logs.configure(stream=stream, component="source", fmt="text")
    logs.configure(stream=stream, component="source", fmt="json")
    logger.info("once")
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line)["msg"] == "once"


@pytest.mark.parametrize("fmt", logs.FORMATS)
def test_secrets_never_reach_the_log(captured: tuple[io.StringIO, logging.Logger], fmt: str) -> None:
    stream, logger = captured
    logs.configure(stream=stream, component="worker", level="DEBUG", fmt=fmt)
    key = "s3cr3t-hmac-key-value"
    logs.secret(key.encode())
    logger.debug("loaded key %r", key.encode())
    logger.info("record %s", {"sig": "x", "note": key})
    logger.info("GET /api/v1/pods headers={'Authorization': 'Bearer abc.def.ghi'}")
    logger.info("connecting with sasl.password=hunter2-long and token: tok-123456")
    logger.info("broker kafka://user:pa55word@kafka:9092")
    logger.info("fields", extra={"detail": f"key is {key}"})
    out = stream.getvalue()
    for leaked in (key, "abc.def.ghi", "hunter2-long", "tok-123456", "pa55word"):
        assert leaked not in out, (leaked, out)
    assert out.count(logs.MASK) >= 6


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=6, max_size=40))
def test_a_registered_secret_is_masked_wherever_it_appears(value: str) -> None:
    if not value.strip() or len(value.strip()) < logs.MIN_SECRET_LENGTH:
        return
    logs.secret(value)
    try:
        assert value.strip() not in logs.redact(f"before {value} after")
    finally:
        logs._secrets.discard(value.strip())


def test_short_values_are_not_treated_as_secrets() -> None:
    logs.secret("abc")
    assert logs.redact("abc def") == "abc def"


def test_every_component_takes_the_same_log_flags() -> None:
    from streams.cli import main

    for name in ("source", "worker", "actuator"):
        parser = main.build_parser([name])
        args = parser.parse_args(
            [name, "--broker", "kafka://x:1", "--log-format", "json", "--log-level", "debug"]
        )
        assert (args.log_format, args.log_level) == ("json", "DEBUG"), name
        with pytest.raises(SystemExit):
            parser.parse_args([name, "--broker", "kafka://x:1", "--log-format", "xml"])


def test_log_flags_default_to_text_at_info() -> None:
    parser = argparse.ArgumentParser()
    logs.add_arguments(parser)
    args = parser.parse_args([])
    assert (args.log_format, args.log_level) == ("text", "INFO")

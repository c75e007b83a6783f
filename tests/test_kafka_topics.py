"""docs/deploy.md's topic and ACL tables are the code's (streams.kafka.topics, streams.kafka.acls).

An operator who creates topics or grants ACLs by hand follows these tables; a
config the code changes without the table (or the table without the code) fails
here. Also the topic flags: prefix, replication factor, min.insync.replicas.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from streams.common.errors import UsageError
from streams.kafka import acls, topics

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
CONFIG_COLUMNS = ("cleanup.policy", "retention.ms", "max.message.bytes", "segment.ms")


def _table(heading: str) -> list[list[str]]:
    text = DEPLOY.read_text().split(heading, 1)[1]
    rows = []
    for line in text.splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue
        rows.append(cells)
    return rows


def _code(cell: str) -> str:
    """The `value` of a cell, or '' when it states none."""
    found = re.match(r"^`([^`]*)`", cell)
    return found.group(1) if found else ""


def test_the_topic_table_is_the_code() -> None:
    header, *rows = _table("### Topics")
    assert header[0] == "topic" and tuple(_code(h) for h in header[2:6]) == CONFIG_COLUMNS
    documented = {
        _code(row[0]): {
            name: _code(cell) for name, cell in zip(CONFIG_COLUMNS, row[2:6], strict=True) if _code(cell)
        }
        for row in rows
    }
    coded = {spec.name: dict(spec.configs) for spec in topics.topic_specs()}
    assert documented == coded


def test_created_topics_take_replication_and_min_insync_replicas() -> None:
    layout = topics.Layout(
        names=topics.Names("team-a.preemption."), replication_factor=3, min_insync_replicas=2
    )
    specs = layout.specs(partitions=4)
    kinds = ("cluster-events", "decisions", "evictions", "dead-letter", "snapshots")
    assert [s.name for s in specs] == [f"team-a.preemption.{t}" for t in kinds]
    for spec in specs:
        assert (spec.partitions, spec.replication_factor) == (4, 3)
        assert dict(spec.configs)["min.insync.replicas"] == "2"
    assert "min.insync.replicas" not in dict(topics.topic_specs()[0].configs)
    with pytest.raises(UsageError, match="--replication-factor"):
        topics.Layout(replication_factor=0)
    with pytest.raises(UsageError, match="--min-insync-replicas"):
        topics.Layout(replication_factor=3, min_insync_replicas=4)
    with pytest.raises(UsageError, match="--topic-prefix"):
        topics.Names("bad prefix/")


def test_the_topic_flags() -> None:
    parser = argparse.ArgumentParser()
    topics.add_arguments(parser)
    layout = topics.from_args(
        parser.parse_args(["--topic-prefix", "b.", "--replication-factor", "3", "--min-insync-replicas", "2"])
    )
    assert layout.names.decisions == "b.decisions" and layout.min_insync_replicas == 2
    assert topics.from_args(parser.parse_args([])) == topics.DEFAULT_LAYOUT


def test_the_acl_table_is_the_code() -> None:
    header, *rows = _table("### ACLs")
    assert header == ["principal", "resource", "name", "operations"]
    documented: set[tuple[str, str, str, str, tuple[str, ...]]] = set()
    for principal, resource, name, operations in rows:
        pattern = acls.PREFIX if name.startswith("prefix ") else acls.LITERAL
        name = _code(name.removeprefix("prefix ")).replace("<cluster>", "default")
        ops = tuple(sorted(o.strip() for o in operations.split("(")[0].split(",")))
        documented.add((principal, resource, name, pattern, ops))
    coded = {
        (component, a.resource, a.name, a.pattern, a.operations)
        for component in acls.COMPONENTS
        for a in acls.required(component, actuator_group=acls.default_actuator_group("default"))
    }
    assert documented == coded


def _commands(marker: str) -> list[list[str]]:
    """The command lines of the sh block after `marker`, with the $K / $A prefix expanded."""
    block = DEPLOY.read_text().split(marker, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    variables: dict[str, list[str]] = {}
    out = []
    for line in block.splitlines():
        if "=" in line.split(" ", 1)[0]:
            name, _, value = line.partition("=")
            variables[name] = shlex.split(value)[0].split()
            continue
        words = shlex.split(line)
        out.append(variables[words[0][1:]] + words[1:] if words[0].startswith("$") else words)
    return out


def _options(words: list[str], name: str) -> list[str]:
    return [words[i + 1] for i, w in enumerate(words) if w == name]


def test_the_documented_topic_commands_create_the_code_topics() -> None:
    made = {}
    for words in _commands("<!-- topic-commands -->"):
        assert words[0] == "kafka-topics.sh" and "--create" in words
        configs = dict(c.split("=", 1) for c in _options(words, "--config"))
        (name,) = _options(words, "--topic")
        made[name] = (configs, _options(words, "--replication-factor"))
    coded = topics.Layout(replication_factor=3, min_insync_replicas=2).specs()
    assert made == {spec.name: (dict(spec.configs), ["3"]) for spec in coded}


def test_the_documented_acl_commands_grant_the_code_acls() -> None:
    granted: dict[str, set[tuple[str, str, str, tuple[str, ...]]]] = {}
    kinds = {"--topic": acls.TOPIC, "--group": acls.GROUP, "--transactional-id": acls.TRANSACTIONAL_ID}
    for words in _commands("<!-- acl-commands -->"):
        assert words[0] == "kafka-acls.sh" and "--add" in words
        (principal,) = _options(words, "--allow-principal")
        ((flag, name),) = [(w, words[i + 1]) for i, w in enumerate(words) if w in kinds]
        pattern = acls.PREFIX if _options(words, "--resource-pattern-type") == ["prefixed"] else acls.LITERAL
        ops = tuple(sorted(_options(words, "--operation")))
        granted.setdefault(principal.removeprefix("User:preemptctl-"), set()).add(
            (kinds[flag], name, pattern, ops)
        )
    for component in ("source", "worker", "actuator"):
        coded = acls.required(component, actuator_group=acls.default_actuator_group("default"))
        assert granted[component] == {(a.resource, a.name, a.pattern, a.operations) for a in coded}, component

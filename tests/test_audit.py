"""`preemptctl audit verify|head` and the replay audit path, through the command line.

Every tampering docs/architecture.md §4 names is made to a real decision log (the bundled
example, replayed offline) and must be caught at the first bad record, named by
its line, id and kind; an intact log (also a signed one, several clusters, and
several records decided on one TICK) must pass.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from engine.config import Config, parse
from fold import fleet
from schemas import chain
from streams.audit import verify
from streams.cli import main
from streams.kafka import logio
from streams.sim import traces
from tests.support import audit_traces

KEY = b"audit-test-key"


def _decisions(
    trace: list[dict[str, Any]], *, key: bytes | None = None, config: Config | None = None
) -> list[dict[str, Any]]:
    return audit_traces.decisions(trace, config, key=key)


def _write(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def example() -> list[dict[str, Any]]:
    return _decisions(traces.example())


@pytest.fixture(scope="module")
def signed() -> list[dict[str, Any]]:
    return _decisions(traces.example(), key=KEY)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key"
    path.write_bytes(KEY + b"\n")  # a trailing newline, as editors write it, is not part of the key
    return path


def test_intact_log_passes_with_a_one_line_summary(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "audit", "verify", str(_write(tmp_path / "d.jsonl", example)))
    assert code == 0
    assert out.count("\n") == 1
    assert out.startswith("intact: 8 record(s), 1 cluster(s); default head " + example[-1]["hash"])


def test_several_clusters_interleaved_and_one_tick_deciding_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = parse({"daemonset": {"preemptionStartDelaySeconds": 60}})
    ticks = [dict(d) for d in fleet.fold(audit_traces.ticks("c1"), config).decisions]
    # One TICK decides for both waiting DaemonSet pods: two records share a seq, legitimately.
    assert [d["seq"] for d in ticks][-2:] == [ticks[-1]["seq"]] * 2
    other = _decisions(traces.example())
    other = [dict(d, cluster="c2") for d in other]  # re-chained below under cluster c2
    prev = chain.GENESIS
    for d in other:
        chain.seal(d, prev)
        prev = d["hash"]
    mixed = [r for pair in zip(ticks, other, strict=False) for r in pair] + other[len(ticks) :]
    code, out, _ = _run(capsys, "audit", "verify", str(_write(tmp_path / "d.jsonl", mixed)))
    assert code == 0, out
    assert "2 cluster(s)" in out and f"c1 head {ticks[-1]['hash']}" in out and f"c2 head {prev}" in out
    code, out, _ = _run(capsys, "audit", "verify", str(tmp_path / "d.jsonl"), "--cluster", "c1")
    assert code == 0 and "1 cluster(s)" in out and "8 of other clusters skipped" in out


def _verify_fails(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> dict[str, Any]:
    code, out, _ = _run(capsys, "audit", "verify", str(path), "--output", "json", *extra)
    assert code == 1, out
    result = orjson.loads(out)
    assert result["ok"] is False
    problem: dict[str, Any] = result["problem"]
    return problem


def test_edited_record_is_named(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edited = [dict(d) for d in example]
    edited[2] = dict(edited[2], node="ex1-node")
    path = _write(tmp_path / "d.jsonl", edited)
    problem = _verify_fails(capsys, path)
    assert problem == {
        "where": "line 3",
        "kind": verify.EDITED,
        "detail": "hash does not match the record's content",
        "id": example[2]["id"],
        "cluster": "default",
    }
    code, out, _ = _run(capsys, "audit", "verify", str(path))
    assert code == 1
    assert (
        out == f"FAILED at line 3 (id {example[2]['id']}, cluster default): edited: hash does not match the "
        "record's content\n"
    )


def test_removed_record_is_caught_at_the_next_one(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    problem = _verify_fails(capsys, _write(tmp_path / "d.jsonl", example[:3] + example[4:]))
    assert (problem["where"], problem["kind"], problem["id"]) == ("line 4", verify.REMOVED, example[4]["id"])
    assert problem["detail"].startswith("prevHash is not the hash of the record before it (line 3)")
    # The head of the log cut off: the first record left does not start from the genesis hash.
    problem = _verify_fails(capsys, _write(tmp_path / "head.jsonl", example[2:]))
    assert (problem["where"], problem["kind"], problem["id"]) == ("line 1", verify.REMOVED, example[2]["id"])
    assert "not the genesis hash" in problem["detail"]
    # Unless the log is known to be pruned by retention: then where the chain resumes is reported.
    code, out, _ = _run(capsys, "audit", "verify", str(tmp_path / "head.jsonl"), "--pruned")
    assert code == 0 and f"(6 records, last seq 88, continuing from {example[1]['hash']})" in out


def test_swapped_records_are_reordered(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    swapped = [*example[:2], example[3], example[2], *example[4:]]
    problem = _verify_fails(capsys, _write(tmp_path / "d.jsonl", swapped))
    assert (problem["where"], problem["kind"], problem["id"]) == (
        "line 3",
        verify.REORDERED,
        example[3]["id"],
    )
    assert "line 4, later in the log" in problem["detail"]


def test_inserted_forgery_and_duplicates(
    example: list[dict[str, Any]],
    signed: list[dict[str, Any]],
    key_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A forger without the key chains a made-up record after record 2: the chain breaks at record 3.
    forged = chain.seal(
        dict(example[1], id="default/11/evil-uid", preemptor="default/evil"), example[1]["hash"]
    )
    problem = _verify_fails(capsys, _write(tmp_path / "d.jsonl", [*example[:2], forged, *example[2:]]))
    assert (problem["where"], problem["kind"], problem["id"]) == ("line 4", verify.INSERTED, example[2]["id"])
    assert "record at line 2" in problem["detail"]
    # With a key the forgery itself is named: it carries no valid signature.
    forged_signed = dict(forged, sig=signed[1]["sig"])
    chain.seal(forged_signed, signed[1]["hash"])
    forged_signed["sig"] = signed[1]["sig"]  # a copied sig does not match the new hash
    path = _write(tmp_path / "s.jsonl", [*signed[:2], forged_signed, *signed[2:]])
    problem = _verify_fails(capsys, path, "--hmac-key-file", str(key_file))
    assert (problem["where"], problem["kind"]) == ("line 3", verify.BAD_SIGNATURE)
    # A duplicated record: named as such, or skipped when identical re-deliveries are allowed.
    dup = _write(tmp_path / "dup.jsonl", [*example[:3], example[2], *example[3:]])
    problem = _verify_fails(capsys, dup)
    assert (problem["where"], problem["kind"]) == ("line 4", verify.DUPLICATE)
    assert "line 3" in problem["detail"]
    code, out, _ = _run(capsys, "audit", "verify", str(dup), "--allow-duplicates")
    assert code == 0 and "1 identical duplicate(s) skipped" in out


def test_signatures(
    signed: list[dict[str, Any]],
    example: list[dict[str, Any]],
    key_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = _write(tmp_path / "signed.jsonl", signed)
    code, out, _ = _run(capsys, "audit", "verify", str(path), "--hmac-key-file", str(key_file))
    assert code == 0 and "(all signed)" in out
    wrong = tmp_path / "wrong"
    wrong.write_bytes(b"another-key")
    problem = _verify_fails(capsys, path, "--hmac-key-file", str(wrong))
    assert (problem["where"], problem["kind"], problem["id"]) == (
        "line 1",
        verify.BAD_SIGNATURE,
        signed[0]["id"],
    )
    stripped = [dict(d) for d in signed]
    del stripped[4]["sig"]
    problem = _verify_fails(
        capsys, _write(tmp_path / "stripped.jsonl", stripped), "--hmac-key-file", str(key_file)
    )
    assert (problem["where"], problem["kind"], problem["id"]) == ("line 5", verify.UNSIGNED, signed[4]["id"])
    problem = _verify_fails(
        capsys, _write(tmp_path / "plain.jsonl", example), "--hmac-key-file", str(key_file)
    )
    assert (problem["where"], problem["kind"]) == ("line 1", verify.UNSIGNED)


def test_edited_and_rehashed_record(
    example: list[dict[str, Any]],
    signed: list[dict[str, Any]],
    key_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Without a key a re-hashed edit is only visible at the next link; with a key, at the record itself.
    rehashed = [dict(d) for d in example]
    rehashed[1] = chain.seal(dict(rehashed[1], outcome="fits"), rehashed[1]["prevHash"])
    problem = _verify_fails(capsys, _write(tmp_path / "d.jsonl", rehashed))
    assert (problem["where"], problem["kind"]) == ("line 3", verify.REMOVED)
    assert "replaced and re-hashed" in problem["detail"]
    resigned = [dict(d) for d in signed]
    resigned[1] = chain.seal(dict(resigned[1], outcome="fits"), resigned[1]["prevHash"], b"forger-key")
    problem = _verify_fails(capsys, _write(tmp_path / "s.jsonl", resigned), "--hmac-key-file", str(key_file))
    assert (problem["where"], problem["kind"]) == ("line 2", verify.BAD_SIGNATURE)


def test_seq_going_back_is_caught(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [dict(d) for d in example[:4]]
    records[3] = chain.seal(dict(records[3], seq=1), records[2]["hash"])  # well chained, but out of order
    problem = _verify_fails(capsys, _write(tmp_path / "d.jsonl", records))
    assert (problem["where"], problem["kind"]) == ("line 4", verify.SEQ)


def test_truncation_is_caught_with_an_anchor(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = _write(tmp_path / "full.jsonl", example)
    code, out, _ = _run(capsys, "audit", "head", str(full), "--output", "json")
    assert code == 0
    anchor = orjson.loads(out)
    assert anchor["clusters"]["default"]["head"] == example[-1]["hash"]
    assert anchor["clusters"]["default"]["records"] == 8
    anchor_file = tmp_path / "anchor.json"
    anchor_file.write_text(out)
    code, out, _ = _run(capsys, "audit", "head", str(full))
    assert out.split("\t")[:3] == ["default", example[-1]["hash"], "8 records"]

    truncated = _write(tmp_path / "truncated.jsonl", example[:6])
    code, _, _ = _run(capsys, "audit", "verify", str(truncated))
    assert code == 0  # what is left is a valid chain: only an anchor can tell
    problem = _verify_fails(capsys, truncated, "--anchor", example[-1]["hash"])
    assert problem["kind"] == verify.TRUNCATED and "default ends at record 6" in problem["detail"]
    problem = _verify_fails(capsys, truncated, "--anchor-file", str(anchor_file))
    assert problem["kind"] == verify.TRUNCATED and problem["cluster"] == "default"
    # A log that grew after the anchor was taken still reaches it.
    code, out, _ = _run(capsys, "audit", "verify", str(full), "--anchor", example[5]["hash"])
    assert code == 0 and "reached (default record 6, 2 since)" in out
    code, out, _ = _run(capsys, "audit", "verify", str(full), "--anchor-file", str(anchor_file))
    assert code == 0


def test_head_refuses_a_broken_log(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys, "audit", "head", str(_write(tmp_path / "d.jsonl", example[:2] + example[3:]))
    )
    assert code == 1 and out.startswith("FAILED at line 3") and "no head printed" in err


def test_bad_input_exits_2_with_one_line(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _write(tmp_path / "d.jsonl", example)
    events = tmp_path / "events.jsonl"
    logio.write_jsonl(events, traces.example())
    empty_key = tmp_path / "empty"
    empty_key.write_bytes(b"\n")
    bad_anchor = tmp_path / "anchor.json"
    bad_anchor.write_text('{"hello": 1}')
    cases = [
        (["audit", "verify", str(tmp_path / "missing.jsonl")], "No such file"),
        (["audit", "verify", str(events)], "not a decision log"),
        (["audit", "verify", str(good), "--anchor", "abc"], "64 hex digits"),
        (["audit", "verify", str(good), "--anchor-file", str(bad_anchor)], "audit head --output json"),
        (["audit", "verify", str(good), "--hmac-key-file", str(empty_key)], "is empty"),
        (["audit", "verify", "kafka://nowhere"], "expected kafka://host:port/topic"),
        (["audit"], "verify or head"),
    ]
    for argv, message in cases:
        code, out, err = _run(capsys, *argv)
        assert code == 2, argv
        assert out == ""
        assert message in err.strip().splitlines()[-1], (argv, err)


# ---- replay as an audit: recorded run vs re-derived ---------------------------------------


@pytest.fixture
def recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """A recorded run of the reprieve story: its full event log and its decision log."""
    trace = tmp_path / "trace.jsonl"
    logio.write_jsonl(trace, audit_traces.reprieve() + traces.example())
    log, decisions = tmp_path / "log.jsonl", tmp_path / "decisions.jsonl"
    code, _, _ = _run(
        capsys, "replay", str(trace), "--simulate", "--log-out", str(log), "--decisions-out", str(decisions)
    )
    assert code == 0
    return log, decisions


def test_replay_of_a_recorded_run_reports_no_difference(
    recorded: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log, decisions = recorded
    code, out, err = _run(capsys, "replay", str(log), "--compare", str(decisions))
    assert (code, out) == (0, "")
    assert "0 decision(s) differ" in err
    code, _, _ = _run(capsys, "audit", "verify", str(decisions))
    assert code == 0


@pytest.mark.parametrize(
    ("config", "changed"),
    [
        ("victimAction: evict\n", 6),  # every preempt decision: the victims' action differs
        ("victimSelection: minimal\n", 1),  # only the reprieve story's node: one pod instead of two
    ],
)
def test_replay_with_another_config_reports_the_differing_decisions(
    recorded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, changed: int
) -> None:
    log, decisions = recorded
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config)
    code, out, err = _run(
        capsys, "replay", str(log), "--compare", str(decisions), "--config", str(config_file)
    )
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == changed and f"{changed} decision(s) differ" in err
    recorded_ids = {orjson.loads(line)["id"] for line in decisions.read_bytes().splitlines()}
    assert all(line.split(":", 1)[0] in recorded_ids for line in lines)
    if "minimal" in config:
        (line,) = lines  # minimal evicts the one big pod, a, instead of c and d
        assert line.startswith("default/9/p-uid: victims [c") and " -> [a" in line


def test_an_empty_log_is_not_intact(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing verified is not 'intact': a log deleted whole looks exactly like an empty one."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    problem = _verify_fails(capsys, empty)
    assert problem["kind"] == verify.EMPTY
    code, out, _ = _run(capsys, "audit", "verify", str(empty))
    assert code == 1 and out.startswith("FAILED") and "nothing was verified" in out
    # Records, but none of the cluster asked about: the same.
    problem = _verify_fails(capsys, _write(tmp_path / "d.jsonl", example), "--cluster", "elsewhere")
    assert problem["kind"] == verify.EMPTY and "cluster elsewhere" in problem["detail"]


# ---- replay --compare sees every difference (issue 19 #10) -------------------------------


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def test_replay_compare_reports_a_doubled_and_an_edited_record(
    recorded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 19 #10: one record doubled and one with hash, reason and explanation edited: 0 differ."""
    log, decisions = recorded
    lines = _lines(decisions)
    edited = orjson.loads(lines[2])
    edited["hash"] = "0" * 64
    edited["reason"] += " (edited)"
    edited["explanation"] = {}
    altered = tmp_path / "altered.jsonl"
    altered.write_bytes(b"\n".join([lines[0], lines[1], lines[1], orjson.dumps(edited), *lines[3:]]) + b"\n")
    code, out, err = _run(capsys, "replay", str(log), "--compare", str(altered))
    assert code == 1
    doubled, changed = orjson.loads(lines[1])["id"], edited["id"]
    assert out.splitlines() == [
        f"{doubled}: recorded 2 times",
        f"{changed}: bytes differ (reason, explanation, hash)",
    ]
    assert "2 decision(s) differ" in err


def test_replay_compare_reports_missing_and_extra_records(
    recorded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, decisions = recorded
    lines = _lines(decisions)
    foreign = orjson.loads(lines[0])
    foreign["id"] = "elsewhere/1/x-uid"
    altered = tmp_path / "altered.jsonl"
    altered.write_bytes(b"\n".join([orjson.dumps(foreign), *lines[1:]]) + b"\n")
    code, out, _ = _run(capsys, "replay", str(log), "--compare", str(altered))
    assert code == 1
    assert out.splitlines() == [
        f"elsewhere/1/x-uid: recorded but not re-derived ({foreign['outcome']})",
        f"{orjson.loads(lines[0])['id']}: re-derived but not recorded ({foreign['outcome']})",
    ]


def test_replay_compare_ignores_whitespace(
    recorded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, decisions = recorded
    spaced = tmp_path / "spaced.jsonl"
    spaced.write_text(
        "\n".join(json.dumps(json.loads(line), indent=None) for line in decisions.read_text().splitlines())
    )
    code, out, _ = _run(capsys, "replay", str(log), "--compare", str(spaced))
    assert (code, out) == (0, "")


@pytest.mark.parametrize("which", ["events", "not-json"])
def test_replay_compare_with_something_else_than_a_decision_log_exits_2(
    recorded: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    """Issue 19 #10: an event log given as decisions crashed with KeyError: 'id', exit 1."""
    log, _ = recorded
    other = log if which == "events" else tmp_path / "x.jsonl"
    if which == "not-json":
        other.write_text("hello\n")
    code, out, err = _run(capsys, "replay", str(log), "--compare", str(other))
    assert (code, out) == (2, "")
    (line,) = err.strip().splitlines()
    assert line.startswith(f"preemptctl: error: {other}:1: ")

"""`preemptctl explain`: its answers must match the decision records they are drawn from.

Decision logs come from real runs of small stories (the bundled example and
tests.support.audit_traces) through the offline replay; the answers are checked against
the records themselves: the same decision ids, preemptors, nodes and victims.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from engine import default
from engine.config import Config, parse
from fold import fleet
from streams.audit import explain
from streams.cli import main
from streams.kafka import logio
from streams.sim import traces
from tests.support import audit_traces


def _decisions(trace: list[dict[str, Any]], config: Config | None = None) -> list[dict[str, Any]]:
    return [dict(d) for d in fleet.fold(trace, config or Config()).decisions]


@pytest.fixture(scope="module")
def example() -> list[dict[str, Any]]:
    return audit_traces.decisions(traces.example())


@pytest.fixture(scope="module")
def reprieve() -> list[dict[str, Any]]:
    return _decisions(audit_traces.reprieve())


def _key(v: dict[str, Any]) -> str:
    return f"{v['namespace']}/{v['name']}"


def test_every_victim_and_preemptor_of_the_example_matches_its_records(example: list[dict[str, Any]]) -> None:
    victims = {_key(v) for d in example for v in d["victims"]}
    for pod in sorted(victims):
        report = explain.explain(pod, example)
        want = [
            (d["id"], d["preemptor"], d["node"]) for d in example if any(_key(v) == pod for v in d["victims"])
        ]
        got = [
            (f.decision, f.facts["preemptor"], f.facts["node"]) for f in report.findings if f.role == "victim"
        ]
        assert got == want, pod
    for pod in sorted({d["preemptor"] for d in example}):
        report = explain.explain(pod, example)
        want = [(d["id"], d["outcome"], d.get("node")) for d in example if d["preemptor"] == pod]
        got = [
            (f.decision, f.facts["outcome"], f.facts["node"])
            for f in report.findings
            if f.role == "preemptor"
        ]
        assert got == want, pod


def test_victim_answer(example: list[dict[str, Any]]) -> None:
    report = explain.explain("default/ex2-a", example)
    first, second = report.findings
    assert (first.decision, first.facts["terminating"], first.facts["coVictims"]) == (
        "default/28/ex2-c-uid",
        False,
        ["default/ex2-b"],
    )
    assert first.facts["preemptorPriority"] == 1000 and first.facts["priority"] == 100
    assert any("ex2-node was the only node" in line for line in first.details)
    # Example 2: E takes the node over; A is listed again, already terminating.
    assert (second.decision, second.facts["preemptor"], second.facts["terminating"]) == (
        "default/35/ex2-e-uid",
        "default/ex2-e",
        True,
    )
    assert "already terminating" in second.summary
    assert report.verdict.startswith("default/ex2-a: victim of 2 decision(s)")


def test_preemptor_that_stayed_pending(example: list[dict[str, Any]]) -> None:
    report = explain.explain("default/ex4-f", example)
    (finding,) = report.findings
    record = next(d for d in example if d["preemptor"] == "default/ex4-f")
    assert finding.facts["outcome"] == "unschedulable" and finding.facts["reason"] == record["reason"]
    assert finding.facts["rejectedReasons"] == record["explanation"]["rejectedReasons"]
    assert any("node(s) rejected" in line for line in finding.details)


def test_preemptor_taking_over_a_node_whose_victims_are_leaving(example: list[dict[str, Any]]) -> None:
    (finding,) = explain.explain("default/ex2-e", example).findings  # seed 004, Example 2
    assert finding.facts["alreadyLeaving"] == ["default/ex2-a", "default/ex2-b"]
    assert any("already terminating" in line for line in finding.details)


def test_preemptor_landing_and_runner_up(reprieve: list[dict[str, Any]]) -> None:
    (record,) = reprieve
    (finding,) = explain.explain("default/p", reprieve).findings
    assert finding.role == "preemptor"
    assert (finding.facts["node"], finding.facts["runnerUp"], finding.facts["decidedBy"]) == (
        record["node"],
        "n2",
        "highestVictimPriority",
    )
    assert finding.facts["victims"] == ["default/c", "default/d"]
    assert any("lower highest victim priority (10 vs 50 on n2)" in line for line in finding.details)


def test_survivor_on_a_node_that_ranked_worse(reprieve: list[dict[str, Any]]) -> None:
    (finding,) = explain.explain("default/y", reprieve).findings
    assert finding.role == "survivor"
    assert finding.facts == {
        "node": "n2",
        "as": "other-candidate-node",
        "rank": 2,
        "chosenNode": "n1",
        "decidedBy": "highestVictimPriority",
    }


def test_pod_never_mentioned(
    reprieve: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    report = explain.explain("default/x", reprieve)
    assert not report.findings
    assert report.verdict.startswith("default/x is not mentioned in any of the 1 decision record(s)")
    # When the records do not list the pods given back on the chosen node, the answer must say so.
    detailed = "potentialVictims" in reprieve[0]["explanation"]["chosen"]
    assert bool(report.notes) != detailed
    assert all("potentialVictims" in note for note in report.notes)
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in reprieve))
    assert main.main(["explain", "default/x", "--decisions", str(path)]) == explain.EXIT_NOT_MENTIONED
    assert "is not mentioned" in capsys.readouterr().out


def test_since_keeps_the_decisions_made_from_then_on(
    example: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in example))
    victim = example[0]["victims"][0]
    pod = f"{victim['namespace']}/{victim['name']}"
    first, last = example[0]["ts"], example[-1]["ts"]
    assert main.main(["explain", pod, "--decisions", str(path), "--since", first]) == 0
    assert example[0]["id"] in capsys.readouterr().out
    later = example[1]["ts"]
    assert later > first
    code = main.main(["explain", pod, "--decisions", str(path), "--since", later, "--output", "json"])
    answer = orjson.loads(capsys.readouterr().out)
    assert code == explain.EXIT_NOT_MENTIONED
    assert answer["decisionsScanned"] == len([d for d in example if d["ts"] >= later]) > 0
    # A duration counts back from now: the example's decisions are years old.
    assert main.main(["explain", pod, "--decisions", str(path), "--since", "2h"]) == 1
    assert "0 decision record(s)" in capsys.readouterr().out
    assert main.main(["explain", pod, "--decisions", str(path), "--since", "yesterday"]) == 2
    assert "--since" in capsys.readouterr().err
    assert last >= later


def _with_potential_victims(reprieve: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reprieve record as the proposed engine change writes it (chosen.potentialVictims)."""
    record = copy.deepcopy(reprieve[0])
    starts = {"a": "20", "b": "21", "c": "22", "d": "23"}
    record["explanation"]["chosen"]["potentialVictims"] = [
        {
            "pod": f"default/{name}",
            "priority": 10,
            "qos": "Burstable",
            "start": f"2025-12-31T{hour}:00:00Z",
            "pdbViolating": False,
            "victim": name in ("c", "d"),
        }
        for name, hour in starts.items()
    ]
    return [record]


def test_victim_versus_the_neighbours_given_back(reprieve: list[dict[str, Any]]) -> None:
    records = _with_potential_victims(reprieve)
    (victim,) = explain.explain("default/c", records).findings
    assert victim.facts["reprieved"] == ["default/a", "default/b"]
    assert any(
        "default/a was given back: same priority and QoS, started earlier" in x for x in victim.details
    )
    (spared,) = explain.explain("default/b", records).findings
    assert spared.role == "survivor" and spared.facts["as"] == "reprieved"
    assert spared.facts["victims"] == ["default/c", "default/d"]
    assert "it outranks every victim" in spared.details[0]
    assert not explain.explain("default/b", records).notes


def test_minimal_mode(reprieve: list[dict[str, Any]]) -> None:
    records = _decisions(audit_traces.reprieve(), parse({"victimSelection": "minimal"}))
    (victim,) = explain.explain("default/a", records).findings
    assert victim.facts["victimSelection"] == "minimal"
    assert any("victimSelection minimal" in line for line in victim.details)


def test_job_flow() -> None:
    records = _decisions(audit_traces.gang())
    (record,) = records
    (member,) = explain.explain("team-a/job1-0", records).findings
    assert (member.role, member.facts["node"], member.facts["placements"]) == (
        "member",
        "n1",
        record["placements"],
    )
    (job,) = explain.explain("team-a/job1", records).findings
    assert job.role == "preemptor" and job.facts["victims"] == ["team-b/b-1", "team-b/b-2"]
    (victim,) = explain.explain("team-b/b-1", records).findings
    assert (victim.facts["action"], victim.facts["membersOnNode"]) == (
        "label",
        ["team-a/job1-0", "team-a/job1-1"],
    )
    assert any("soft eviction" in line for line in victim.details)


def test_daemonset_flow() -> None:
    records = _decisions(audit_traces.daemonset())
    (victim,) = explain.explain("default/r-a", records).findings
    assert (victim.facts["position"], victim.facts["strategy"]) == (1, "multiple")
    (spared,) = explain.explain("default/r-b", records).findings
    assert (spared.role, spared.facts["position"]) == ("survivor", 2)
    (pre,) = explain.explain("default/agent-w1", records).findings
    assert pre.facts["outcome"] == "preempt" and pre.facts["victims"] == ["default/r-a"]


def test_rank_reason_follows_the_engine_order() -> None:
    def cand(node: str, **kw: Any) -> dict[str, Any]:
        base = {
            "node": node,
            "pdbViolations": 0,
            "highestVictimPriority": 10,
            "prioritySum": 20,
            "victims": 2,
            "earliestStartOfHighest": "2026-01-01T00:00:00Z",
        }
        return base | kw

    assert default.rank_reason(cand("a"), cand("b", pdbViolations=1), "kubernetes")[0] == "pdbViolations"
    assert default.rank_reason(cand("a"), cand("b", highestVictimPriority=11), "kubernetes")[0] == (
        "highestVictimPriority"
    )
    fewer = cand("a", victims=1, prioritySum=10)
    assert default.rank_reason(fewer, cand("b"), "kubernetes")[0] == "shiftedSum"
    assert default.rank_reason(fewer, cand("b"), "minimal")[0] == "victims"
    later = cand("a", earliestStartOfHighest="2026-01-02T00:00:00Z")
    assert default.rank_reason(later, cand("b"), "kubernetes")[0] == "earliestStartOfHighest"
    assert default.rank_reason(later, cand("b"), "minimal")[0] == "earliestStartOfHighest"
    assert default.rank_reason(cand("a"), cand("b"), "kubernetes")[0] == "node"


def test_command_line(
    example: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in example))
    assert main.main(["explain", "default/ex1-a", "--decisions", str(path), "--output", "json"]) == 0
    answer = orjson.loads(capsys.readouterr().out)
    assert answer["mentioned"] and answer["findings"][0]["decision"] == "default/4/ex1-c-uid"
    assert main.main(["explain", "default/ex1-a", "--decisions", str(path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("default/ex1-a: victim of 1 decision(s)")
    assert "\ndefault/4/ex1-c-uid  2026-01-01T00:00:10Z  cluster default  flow default\n" in text
    events = tmp_path / "events.jsonl"
    logio.write_jsonl(events, traces.example())
    for argv, message in [
        (["explain", "ex1-a", "--decisions", str(path)], "expected NAMESPACE/POD"),
        (["explain", "default/ex1-a", "--decisions", str(tmp_path / "none")], "No such file"),
        (["explain", "default/ex1-a", "--decisions", str(events)], "not a decision record"),
    ]:
        assert main.main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and message in err, (argv, err)

"""Property tests of the job flow on generated clusters (hypothesis).

Every fact is recomputed here from the case's records with plain loops, so the
properties do not lean on the engine's own quota or placement code.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import job, resources, victims
from engine.cluster import Cluster
from engine.decision import DELETE, FITS, LABEL, PREEMPT, Decision
from engine.objects import ElasticQuota, Pod
from tests.support import flowgen

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Half the examples under pressure (quota gate passed, may trigger), so victim
# selection and placement are exercised, not only the early refusals.
JOBS = st.one_of(flowgen.job_clusters(), flowgen.job_clusters(pressure=True))


def _decide(raw: dict[str, Any]) -> tuple[case_mod.Case, Decision]:
    c = case_mod.load(raw, where="generated")
    return c, case_mod.answer(c)


def _quota(cluster: Cluster, pod: Pod) -> ElasticQuota | None:
    """The generator's quotas: one per team namespace, named q-<namespace>."""
    for q in cluster.quotas.values():
        if q.namespace == pod.namespace:
            return q
    return None


def _preemptible(pod: Pod, c: case_mod.Case) -> bool:
    label = pod.labels.get(job.PREEMPTIBLE)
    return not c.config.quota.disable_default_preemptible if label is None else label == "true"


def _free(c: case_mod.Case, name: str, gone: set[str]) -> dict[str, int]:
    """Free on `name` with `gone` evicted and the gang's own nominations not counted."""
    member_uids = {m.uid for m in c.preemptors}
    prio = min(c.cluster.priority(m) for m in c.preemptors)
    free = dict(c.cluster.nodes[name].node.allocatable)
    for p in c.cluster.pods.values():
        if p.terminal or p.uid in gone or p.uid in member_uids:
            continue
        if p.node == name or (p.node is None and p.nominated == name and c.cluster.priority(p) >= prio):
            resources.sub(free, p.requests)
    return free


def _placements(c: case_mod.Case, d: Decision) -> dict[str, str]:
    """Where every member goes: `node` for a single-pod preemptor, `placements` for a gang of several."""
    members = job.gang(c.cluster, c.preemptors)
    if d.node is not None:
        assert d.placements is None and len(members) == 1
        return {members[0].key: d.node}
    return dict(d.placements or {})


def _need(c: case_mod.Case, d: Decision, name: str) -> dict[str, int]:
    where = _placements(c, d)
    return resources.total(m.requests for m in c.preemptors if where.get(m.key) == name)


@SETTINGS
@given(JOBS)
def test_gang_is_fully_placed_or_has_no_victims(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    members = job.gang(c.cluster, c.preemptors)
    if d.outcome not in (PREEMPT, FITS):
        assert d.victims == () and not d.placements and d.node is None
        return
    # The contract: a single-pod preemptor gets `node`, only a gang of several `placements`.
    assert (d.node is not None) == (len(members) == 1)
    where = _placements(c, d)
    assert sorted(where) == sorted(m.key for m in members)
    assert (d.outcome == PREEMPT) == bool(d.victims)
    # Every member fits on its node once the victims are gone, all members counted together.
    gone = {v.uid for v in d.victims}
    for name in set(where.values()):
        assert resources.fits(_need(c, d, name), _free(c, name, gone)), name


@SETTINGS
@given(JOBS)
def test_no_victim_could_be_given_back(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    gone = {v.uid for v in d.victims}
    for v in d.victims:
        assert not resources.fits(_need(c, d, v.node), _free(c, v.node, gone - {v.uid}))


@SETTINGS
@given(JOBS)
def test_victims_are_preemptible_lower_priority_outsiders(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    members = c.preemptors
    prio = min(c.cluster.priority(m) for m in members)
    for v in d.victims:
        pod = c.cluster.pods[v.uid]
        assert v.priority < prio
        assert _preemptible(pod, c)
        assert pod.labels.get(job.POD_GROUP) != "job1" or pod.namespace != "team-a"
        assert v.node in _placements(c, d).values()


@SETTINGS
@given(JOBS)
def test_quota_limits_hold_after_every_job_decision(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    if d.outcome not in (PREEMPT, FITS):
        return
    members = c.preemptors
    gone = {v.uid for v in d.victims}
    for q in c.cluster.quotas.values():
        charged = [m for m in members if _quota(c.cluster, m) is q]
        if not charged:
            continue
        used = np_used = 0
        for p in c.cluster.pods.values():
            if p.node is None or p.terminal or p.uid in gone or _quota(c.cluster, p) is not q:
                continue
            used += p.requests.get("cpu", 0)
            if not _preemptible(p, c):
                np_used += p.requests.get("cpu", 0)
        np_req = sum(m.requests.get("cpu", 0) for m in charged if not _preemptible(m, c))
        p_req = sum(m.requests.get("cpu", 0) for m in charged if _preemptible(m, c))
        lo, hi = q.min.get("cpu", 0), q.max.get("cpu", 0)
        if np_req:
            assert np_used + np_req <= lo
            assert used + np_req + p_req <= hi
        if p_req:
            assert min(lo, np_used + np_req) + (used - np_used) + p_req <= hi


@SETTINGS
@given(JOBS)
def test_label_action_exactly_when_pods_are_not_deleted(raw: dict[str, Any]) -> None:
    c, d = _decide(raw)
    want = DELETE if c.config.quota.pod_should_be_deleted_when_preempted else LABEL
    assert all(v.action == want for v in d.victims)
    for v in d.victims:
        pod = c.cluster.pods[v.uid]
        assert v.terminating == victims.leaving(pod)


@SETTINGS
@given(JOBS, st.randoms(use_true_random=False))
def test_answer_does_not_depend_on_object_order(raw: dict[str, Any], rnd: random.Random) -> None:
    _, d1 = _decide(raw)
    shuffled = dict(
        raw,
        objects=rnd.sample(raw["objects"], len(raw["objects"])),
        preemptor=rnd.sample(raw["preemptor"], len(raw["preemptor"])),
    )
    _, d2 = _decide(shuffled)
    assert d1.answer() == d2.answer()

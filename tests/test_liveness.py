"""The controller's scope, outcomes and re-decisions (issue 22), one scenario per rule, then properties.

Scenarios fold hand-written logs through a Controller: a RESYNC's scope limits
whom it decides for; an OUTCOME event folds back what the actuator did; a
pending preemptor is decided again when a change could alter its answer, after
kube-scheduler's backoff on log time. The properties check the queue's cached
bookkeeping against a naive reference that scans every queued pod at every
event, and that folding stays deterministic across a restore.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import timeutil, toleration
from engine.config import Config
from fold import controller as controller_mod
from fold.controller import Controller, Decided, backoff
from schemas.records import DecisionRecord
from tests.support import flowgen, gen
from tests.support.busy_logs import BASE_SECONDS, bound, busy_logs, fold, pending, ts

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Log:
    """Feeds events to a controller, resourceVersions rising, and keeps its decisions."""

    def __init__(self, ctl: Controller | None = None) -> None:
        self.ctl = ctl or Controller("c", Config())
        self.rv = 0
        self.decisions: list[DecisionRecord] = []

    def event(
        self, at: float, kind: str, obj: dict[str, Any] | None = None, **extra: Any
    ) -> list[DecisionRecord]:
        event: dict[str, Any] = {"ts": ts(at), "type": kind, **extra}
        if obj is not None:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            event["object"] = obj
        got = self.ctl.step(event).records
        self.decisions += got
        return got

    def outcome(
        self, at: float, decision: DecisionRecord, nomination: str, results: dict[str, str]
    ) -> list[DecisionRecord]:
        body = {
            "decisionId": decision["id"],
            "preemptorUid": decision["preemptorUid"],
            "nomination": nomination,
            "victims": results,
        }
        return self.event(at, "OUTCOME", outcome=body)


def outcomes(decisions: list[DecisionRecord]) -> list[tuple[str, str, str | None]]:
    return [(d["preemptor"].split("/")[1], d["outcome"], d.get("node")) for d in decisions]


# ---- scope ------------------------------------------------------------------------------------


def test_only_pods_of_the_recorded_schedulers_are_decided_for() -> None:
    log = Log()
    log.event(0, "RESYNC", scope={"schedulerNames": ["preemptctl-scheduler"]})
    log.event(0, "ADDED", gen.node("n1", 2, 8, 110))
    log.event(0, "ADDED", bound("low", "n1"))
    # kube-scheduler's own preemptor, even once it nominated it: capacity, not ours to decide.
    theirs = pending("theirs", scheduler=None)
    theirs["status"]["nominatedNodeName"] = "n1"
    assert log.event(1, "ADDED", theirs) == []
    assert log.event(2, "TICK") == [] and "theirs-uid" not in log.ctl.retry
    ours = pending("ours", priority=2000, scheduler="preemptctl-scheduler")
    assert outcomes(log.event(3, "ADDED", ours)) == [("ours", "preempt", "n1")]
    # No scope recorded (an older log, or a source without --scheduler-name): every pod.
    log.event(4, "RESYNC")
    log.event(4, "ADDED", gen.node("n1", 2, 8, 110))
    for name in ("low", "theirs", "ours"):
        obj = {"low": bound("low", "n1"), "theirs": theirs, "ours": ours}[name]
        log.event(4, "ADDED", obj)
    assert log.ctl.scope is None


def test_a_malformed_scope_is_rejected() -> None:
    ctl = Controller("c", Config())
    for scope in ({"schedulerNames": []}, {"schedulerNames": [""]}, ["x"], {"names": ["x"]}):
        try:
            ctl.step({"ts": ts(0), "type": "RESYNC", "scope": scope})
        except controller_mod.BadEvent as exc:
            assert "scope" in str(exc)
        else:
            raise AssertionError(f"accepted {scope!r}")
    assert ctl.seq == 0


# ---- outcomes -----------------------------------------------------------------------------------


def _refused_world() -> tuple[Log, DecisionRecord]:
    log = Log()
    log.event(0, "ADDED", gen.node("n1", 2, 8, 110))
    log.event(0, "ADDED", bound("low", "n1"))
    (first,) = log.event(1, "ADDED", pending("p1"))
    assert outcomes([first]) == [("p1", "preempt", "n1")] and "low-uid" in log.ctl.leaving
    return log, first


def test_a_refused_decision_unmarks_its_victims_and_the_next_preemptor_gets_them() -> None:
    """Issue 22, 3: the actuator refused p1's decision (p1 already bound elsewhere); p2
    must then preempt `low` itself, not wait on a victim nobody is evicting."""
    log, first = _refused_world()
    # p1 found room elsewhere before the actuator got to its decision.
    log.event(2, "ADDED", gen.node("n2", 2, 8, 110))
    log.event(2, "MODIFIED", bound("p1", "n2", priority=1000))
    (second,) = [
        d for d in log.event(3, "ADDED", pending("p2", priority=900)) if d["preemptor"] == "default/p2"
    ]
    # p2's decision counts on `low` leaving: it is listed terminating, nothing to do.
    assert outcomes([second]) == [("p2", "preempt", "n1")]
    assert [v.get("terminating") for v in second["victims"]] == [True]
    decided = log.outcome(4, first, "bound", {"low-uid": "error"})
    # `low` is no longer leaving for p1; p2 is decided again at once, and evicts it itself.
    assert [
        (d["preemptor"], [(v["name"], v.get("terminating", False)) for v in d["victims"]]) for d in decided
    ] == [("default/p2", [("low", False)])]
    assert log.ctl.nominations["p2-uid"].decision_id == decided[0]["id"]


def test_a_victim_blocked_by_a_pdb_is_not_leaving_and_its_nomination_ends() -> None:
    log, first = _refused_world()
    decided = log.outcome(2, first, "done", {"low-uid": "blocked-by-pdb"})
    # p1 is decided again (its backoff has passed) and chooses `low` again, the only way, as
    # a fresh victim: a new record the actuator acts on (kube-scheduler retries the same way).
    assert outcomes(decided) == [("p1", "preempt", "n1")] and decided[0]["id"] != first["id"]
    assert [v.get("terminating", False) for v in decided[0]["victims"]] == [False]
    assert log.ctl.nominations["p1-uid"].decision_id == decided[0]["id"]


def test_an_ended_nomination_waits_out_the_backoff() -> None:
    log, first = _refused_world()
    assert log.outcome(1.5, first, "done", {"low-uid": "error"}) == []
    assert "low-uid" not in log.ctl.leaving and not log.ctl.cluster.pods["low-uid"].deleting
    assert outcomes(log.event(2, "TICK")) == [("p1", "preempt", "n1")]


def test_outcomes_that_were_carried_out_change_nothing_and_fold_idempotently() -> None:
    log, first = _refused_world()
    before = log.ctl.state()
    assert log.outcome(2, first, "done", {"low-uid": "done"}) == []
    assert log.outcome(3, first, "done", {"low-uid": "done"}) == []
    after = log.ctl.state()
    for field in ("nominations", "leaving", "last"):
        assert after[field] == before[field]


def test_a_malformed_outcome_is_rejected() -> None:
    log, first = _refused_world()
    seq = log.ctl.seq
    for bad in ({}, {"decisionId": 1}, {**_body(first), "victims": ["low-uid"]}):
        try:
            log.event(2, "OUTCOME", outcome=bad)
        except controller_mod.BadEvent:
            pass
        else:
            raise AssertionError(f"accepted {bad!r}")
    assert log.ctl.seq == seq


def _body(d: DecisionRecord) -> dict[str, Any]:
    return {"decisionId": d["id"], "preemptorUid": d["preemptorUid"], "nomination": "done", "victims": {}}


# ---- liveness ----------------------------------------------------------------------------------


def test_backoff_is_kube_schedulers() -> None:
    assert [backoff(n) // timeutil.SECOND for n in range(1, 8)] == [1, 2, 4, 8, 10, 10, 10]


def _unschedulable_world(node: dict[str, Any] | None = None) -> Log:
    log = Log()
    log.event(0, "ADDED", node or gen.node("n1", 2, 8, 110))
    log.event(0, "ADDED", bound("big", "n1", priority=5000))
    assert outcomes(log.event(1, "ADDED", pending("p"))) == [("p", "unschedulable", None)]
    return log


def test_a_node_added_wakes_the_preemptor_after_its_backoff() -> None:
    log = _unschedulable_world()
    log.event(1.5, "ADDED", gen.node("n2", 4, 8, 110))  # before the 1 s backoff has passed
    assert log.decisions[-1]["outcome"] == "unschedulable"
    assert outcomes(log.event(2, "TICK")) == [("p", "fits", "n2")]


def test_nothing_changed_means_no_redecision() -> None:
    log = _unschedulable_world()
    for second in range(2, 60):
        assert log.event(second, "TICK") == []
    assert log.ctl.retry["p-uid"].attempts == 1
    # ... until kube-scheduler's flush interval has passed: then once more, same answer, no record.
    log.event(1 + controller_mod.RETRY_FLUSH_SECONDS, "TICK")
    assert log.ctl.retry["p-uid"].attempts == 2 and len(log.decisions) == 1


def test_a_taint_removed_wakes_the_preemptor() -> None:
    log = Log()
    log.event(0, "ADDED", gen.node("n1", 2, 8, 110, taint=True))
    log.event(0, "ADDED", bound("low", "n1", cpu_m=0))
    assert outcomes(log.event(1, "ADDED", pending("p"))) == [("p", "unschedulable", None)]
    assert outcomes(log.event(30, "MODIFIED", gen.node("n1", 2, 8, 110))) == [("p", "fits", "n1")]


def test_a_heartbeat_wakes_nobody() -> None:
    log = _unschedulable_world()
    beat = gen.node("n1", 2, 8, 110)
    beat["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": ts(5)}]
    gen_before = log.ctl.gen
    log.event(5, "MODIFIED", beat)
    assert log.ctl.gen == gen_before and len(log.decisions) == 1


def test_an_annotation_the_engine_does_not_read_wakes_nobody() -> None:
    """A bound pod's last-applied-configuration (which embeds its resourceVersion) changing is no
    change to any answer: waking on it made a whole object's log decide otherwise than its
    projection's (found by test_the_worker_folds_projections_to_the_same_decisions)."""
    log = _unschedulable_world()
    big = bound("big", "n1", priority=5000)
    big["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    gen_before = log.ctl.gen
    log.event(5, "MODIFIED", big)
    assert log.ctl.gen == gen_before and len(log.decisions) == 1


def test_a_pdb_loosened_wakes_the_preemptor() -> None:
    log = Log()
    log.event(0, "ADDED", gen.node("n1", 2, 8, 110))
    log.event(0, "ADDED", gen.pdb("web", "web", 0))
    log.event(0, "ADDED", bound("low", "n1", labels={"app": "web"}))
    first = log.event(1, "ADDED", pending("p"))
    assert outcomes(first) == [("p", "preempt", "n1")]
    assert first[0]["explanation"]["chosen"]["pdbViolations"] == 1
    # kube-scheduler's answer is the same with or without the budget here; what matters is
    # that the budget's change is seen: the preemptor is looked at again.
    attempts = log.ctl.retry["p-uid"].attempts
    log.event(20, "MODIFIED", gen.pdb("web", "web", 1))
    assert log.ctl.retry["p-uid"].attempts == attempts + 1


def _tolerated_world() -> Log:
    """The only possible victim's class tolerates preemptors below 1000 for 3600 s; p (500) waits."""
    log = Log()
    log.event(0, "ADDED", gen.tolerant_class())  # 3600 s for preemptors below 1000
    log.event(0, "ADDED", gen.node("n1", 2, 8, 110))
    scheduled = bound("low", "n1", priority_class="tolerant", start=ts(0))
    del scheduled["spec"]["priority"]
    log.event(0, "ADDED", scheduled)
    assert outcomes(log.event(1, "ADDED", pending("p", priority=500))) == [("p", "unschedulable", None)]
    return log


def test_a_toleration_window_closing_wakes_the_preemptor() -> None:
    log = _tolerated_world()
    for second in range(100, 3600, 100):
        assert log.event(second, "TICK") == []
    assert outcomes(log.event(3601, "TICK")) == [("p", "preempt", "n1")]


def test_a_window_ending_on_a_tick_wakes_the_preemptor_on_the_next_one() -> None:
    """Issue 28, 5: ticks every whole second, one exactly on the window's end. The victim still
    tolerates at that instant (the boundary is inclusive), so the wake-up belongs to the first
    tick after it: waking at the end decided the same answer and spent the wake-up, and only
    kube-scheduler's 300 s flush decided again."""
    log = Log()
    log.event(0, "ADDED", gen.tolerant_class())  # 3600 s for preemptors below 1000
    log.event(0, "ADDED", gen.node("n1", 2, 8, 110))
    scheduled = bound("low", "n1", priority_class="tolerant", start=ts(0))
    del scheduled["spec"]["priority"]
    log.event(0, "ADDED", scheduled)
    # Decided first at 7 s: its flushes fall at 307, 607, ... 3607 s, none on 3601.
    assert outcomes(log.event(7, "ADDED", pending("p", priority=500))) == [("p", "unschedulable", None)]
    for second in range(8, 3601):  # 3600 included: the last protected instant
        assert log.event(second, "TICK") == []
    assert outcomes(log.event(3601, "TICK")) == [("p", "preempt", "n1")]


def test_a_priority_class_changed_wakes_the_preemptor() -> None:
    """The class of the only possible victim stops tolerating preemption: the preemptor, refused
    by the toleration an hour long, is decided again at once and preempts."""
    log = _tolerated_world()
    assert log.event(20, "TICK") == []
    intolerant = gen.tolerant_class()
    del intolerant["metadata"]["annotations"]
    assert outcomes(log.event(30, "MODIFIED", intolerant)) == [("p", "preempt", "n1")]


def test_a_quota_changed_wakes_the_preemptor_and_its_resync_does_not() -> None:
    log = _unschedulable_world()
    quota = flowgen.quota("team", "default", min_cpu=2, max_cpu=4)
    log.event(2, "ADDED", quota)
    attempts = log.ctl.retry["p-uid"].attempts
    log.event(20, "MODIFIED", quota)  # a relist: only its resourceVersion moved
    assert log.ctl.retry["p-uid"].attempts == attempts
    log.event(30, "MODIFIED", flowgen.quota("team", "default", min_cpu=2, max_cpu=8))
    assert log.ctl.retry["p-uid"].attempts == attempts + 1


def test_wait_answers_are_retried_on_log_time() -> None:
    log = Log()
    log.event(0, "ADDED", gen.node("n1", 2, 8, 110))
    log.event(0, "ADDED", bound("low", "n1", deleting=True, disruption=True))
    waiting = pending("p")
    waiting["status"]["nominatedNodeName"] = "n1"
    assert outcomes(log.event(1, "ADDED", waiting)) == [("p", "wait", None)]
    log.event(1.5, "TICK")
    assert log.ctl.retry["p-uid"].attempts == 1  # not before its backoff
    log.event(2, "TICK")
    assert log.ctl.retry["p-uid"].attempts == 2


def test_a_preemptor_that_leaves_pending_leaves_the_queue() -> None:
    log = _unschedulable_world()
    assert log.ctl.waiting_summary() == (1, (BASE_SECONDS + 1) * timeutil.SECOND)
    log.event(3, "MODIFIED", bound("p", "n1", priority=1000))
    assert log.ctl.waiting_summary() == (0, None)


# ---- properties ---------------------------------------------------------------------------------


class NaiveQueue(Controller):
    """The rule of `_retry_due` without its caches: every queued pod looked at on every call;
    and a toleration window closed between two TICKs when a victim tolerated at the first and
    no longer at the second, asked of `toleration.tolerates` itself (no window arithmetic)."""

    def _tolerations_closed(self, now: int) -> None:
        since, self.toleration_checked = self.toleration_checked, now
        if not self.retry:
            return
        for pod in self.cluster.pods.values():
            policy = self.cluster.policy(pod.priority_class) if pod.priority_class else None
            if pod.node is None or policy is None:
                continue
            below = policy.minimum_preemptable_priority - 1  # a preemptor the class tolerates
            before, after = (
                toleration.tolerates(
                    policy,
                    victim_priority=below - 1,
                    preemptor_priority=below,
                    scheduled_at=pod.scheduled_at,
                    now=at,
                )
                for at in (since, now)
            )
            if before and not after:
                self.gen += 1
                return

    def _retry_due(self, seq: int, now: int) -> list[Decided]:
        ready = []
        for uid, entry in sorted(self.retry.items()):
            if entry.due > now:
                continue
            if entry.gen >= self.gen and uid not in self.waiting and now < entry.flush:
                continue
            pod = self.cluster.pods.get(uid)
            if pod is None or pod.node is not None or pod.terminal or pod.deleting or not self._in_scope(pod):
                self._pop(self.retry, uid)
                self._discard(self.waiting, uid)
                continue
            ready.append((-self.cluster.priority(pod), uid))
        out: list[Decided] = []
        for _, uid in sorted(ready):
            pod = self.cluster.pods.get(uid)
            if pod is not None and uid in self.retry:
                out.extend(self._decide(pod, seq, now))
        return out


@st.composite
def boundary_logs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """One full node whose pods' class tolerates preemptors below 1000 for a few seconds, pending
    preemptors it tolerates (100) or not (1000), and ticks on whole and half seconds, many
    exactly on a window's end (its last protected instant): the wake-up's boundary."""
    window = draw(st.sampled_from((1, 2, 5)))
    policy = gen.tolerant_class()
    annotations = policy["metadata"]["annotations"]
    annotations["preemption-toleration.scheduling.x-k8s.io/toleration-seconds"] = str(window)
    objects = [policy, gen.node("n1", 2, 8, 110)]
    events: list[dict[str, Any]] = [{"ts": ts(0), "type": "ADDED", "object": o} for o in objects]
    at = 0.0
    ends: list[float] = []
    for _ in range(draw(st.integers(3, 40))):
        at += draw(st.sampled_from((0, 0.5, 1, 1, 2)))
        choice = draw(st.sampled_from(("tolerant", "pending", "delete", "tick", "tick", "end", "end")))
        if choice == "end":
            later = sorted(e for e in ends if e >= at)
            if later:
                at = draw(st.sampled_from(later))
            choice = "tick"
        if choice == "tick":
            events.append({"ts": ts(at), "type": "TICK"})
            continue
        name = f"t{draw(st.integers(0, 1))}"
        if choice == "tolerant":
            obj = bound(
                name, "n1", cpu_m=draw(st.sampled_from((1000, 2000))), priority_class="tolerant", start=ts(at)
            )
            del obj["spec"]["priority"]  # the class's value, 10
            ends.append(at + window)
            kind = "ADDED"
        elif choice == "delete":
            obj, kind = bound(name, "n1"), "DELETED"
        else:
            obj = pending(f"p{draw(st.integers(0, 1))}", priority=draw(st.sampled_from((100, 100, 1000))))
            kind = "ADDED"
        events.append({"ts": ts(at), "type": kind, "object": obj})
    for rv, e in enumerate(events, 1):
        if "object" in e:
            e["object"]["metadata"]["resourceVersion"] = str(rv)
    return events


@SETTINGS
@given(busy_logs())
def test_the_queue_decides_as_the_naive_rule(events: list[dict[str, Any]]) -> None:
    assert fold(Controller("c", Config()), events) == fold(NaiveQueue("c", Config()), events)


@SETTINGS
@given(boundary_logs())
def test_toleration_windows_wake_as_the_naive_rule_on_their_boundaries(events: list[dict[str, Any]]) -> None:
    """Issue 28, 5: ticks exactly on a window's end (still protected) and just after it."""
    assert fold(Controller("c", Config()), events) == fold(NaiveQueue("c", Config()), events)


@SETTINGS
@given(st.one_of(busy_logs(), boundary_logs()), st.integers(0, 60))
def test_a_restored_controller_decides_the_same(events: list[dict[str, Any]], cut: int) -> None:
    whole = Controller("c", Config())
    want = fold(whole, events)
    first, dirty = Controller("c", Config()), {}
    got = fold(first, events[:cut], dirty)
    restored = Controller.restore(
        config=Config(),
        key=None,
        state=copy.deepcopy(first.state()),
        objects_raw=[orjson.loads(o) for o in dirty.values() if o is not None],  # every object held
    )
    got += fold(restored, events[cut:])
    assert got == want

import dataclasses
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import objects
from engine.errors import InvalidObject
from engine.objects import BEST_EFFORT, BURSTABLE, GUARANTEED
from tests.support import flowgen, gen


def _pod(spec: dict, **meta: object) -> dict:
    return {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "uid": "u", **meta}, "spec": spec}


def test_requests_sum_containers_max_init_plus_overhead() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"resources": {"requests": {"cpu": "500m"}}},
        ],
        "initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "512Mi"}}}],
        "overhead": {"cpu": "100m"},
    }
    p = objects.pod(_pod(spec))
    assert p.requests == {"cpu": 2100, "memory": 2**30, "pods": 1}


def test_sidecar_init_containers_add_to_the_running_pod() -> None:
    spec = {
        "containers": [{"resources": {"requests": {"cpu": "1"}}}],
        "initContainers": [
            {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"resources": {"requests": {"cpu": "1"}}},
        ],
    }
    # running: 1 + 0.5 sidecar; init peak: 1 + 0.5 sidecar started before it
    assert objects.pod(_pod(spec)).requests["cpu"] == 1500


def test_every_pod_takes_a_pods_slot_even_best_effort() -> None:
    p = objects.pod(_pod({"containers": [{"name": "c"}]}))
    assert p.requests == {"pods": 1}
    assert p.qos == BEST_EFFORT


def test_qos_classes() -> None:
    g = {
        "containers": [
            {
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "limits": {"cpu": "1", "memory": "1Gi"},
                }
            }
        ]
    }
    only_limits = {"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]}
    b = {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}
    assert objects.pod(_pod(g)).qos == GUARANTEED
    assert objects.pod(_pod(only_limits)).qos == GUARANTEED  # requests default to limits
    assert objects.pod(_pod(b)).qos == BURSTABLE


def test_pod_states() -> None:
    raw = _pod({"nodeName": "n1", "containers": []}, deletionTimestamp="2026-01-01T00:00:00Z")
    raw["status"] = {
        "phase": "Running",
        "startTime": "2026-01-01T00:00:00Z",
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
    }
    p = objects.pod(raw)
    assert p.node == "n1" and p.deleting and p.disruption_target and p.preempted and not p.terminal
    raw["status"]["phase"] = "Succeeded"
    assert objects.pod(raw).terminal


def test_only_a_preemption_marks_a_pod_preempted() -> None:
    """kube-scheduler's podTerminatingByPreemption: DisruptionTarget=True with reason
    PreemptionByScheduler, read from the first such condition; a drain or an eviction by
    someone else (other reasons) is not a preemption under way."""
    raw = _pod({"nodeName": "n1", "containers": []}, deletionTimestamp="2026-01-01T00:00:00Z")
    for reason, want in (
        ("PreemptionByScheduler", True),
        ("EvictionByEvictionAPI", False),
        ("DeletionByTaintManager", False),
        ("TerminationByKubelet", False),
        (None, False),
    ):
        condition = {"type": "DisruptionTarget", "status": "True"}
        if reason is not None:
            condition["reason"] = reason
        raw["status"] = {"phase": "Running", "conditions": [condition]}
        assert objects.pod(raw).preempted is want, reason
        assert objects.pod(raw).disruption_target  # the DaemonSet flow waits on any reason
    raw["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "False", "reason": "PreemptionByScheduler"},
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"},
    ]
    assert not objects.pod(raw).preempted  # the first condition of the type is the one read


def test_unschedulable_condition_asks_for_preemption() -> None:
    raw = _pod({"containers": []})
    raw["status"] = {
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    p = objects.pod(raw)
    assert p.unschedulable and p.unschedulable_since is not None and p.scheduled_at is None


@pytest.mark.parametrize(
    "raw",
    [
        {"kind": "Pod", "metadata": {}},
        {"kind": "Pod"},
        {
            "kind": "Pod",
            "metadata": {"name": "x"},
            "spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]},
        },
        {"kind": "Service", "metadata": {"name": "x"}},
        {"kind": "PriorityClass", "metadata": {"name": "x"}},
        "not a mapping",
    ],
)
def test_invalid_objects_raise(raw: object) -> None:
    with pytest.raises(InvalidObject):
        objects.normalize(raw)


def test_node_without_pods_capacity_gets_kubelet_default() -> None:
    n = objects.node({"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "4"}}})
    assert n.allocatable == {"cpu": 4000, "pods": objects.DEFAULT_MAX_PODS}


@pytest.mark.parametrize(
    "obj",
    [
        _pod({"containers": [{"resources": {"requests": {"cpu": "-500m"}}}]}),
        _pod({"containers": [{"name": "c"}], "overhead": {"memory": "-1Gi"}}),
        {"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "-1"}}},
    ],
)
def test_negative_amounts_are_invalid_objects(obj: dict) -> None:
    """A negative request made a node's summary promise room that evicting could not free."""
    with pytest.raises(InvalidObject, match="negative"):
        objects.normalize(obj)


# ---- the fast paths equal the plain one ----------------------------------------------

AMOUNTS = st.sampled_from(["1", "1000m", "500m", "0.5", "2Gi", "512Mi", "0", 1, 2])


@st.composite
def _container(draw: st.DrawFn) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if draw(st.booleans()):
        res["requests"] = draw(
            st.dictionaries(st.sampled_from(["cpu", "memory", "gpu"]), AMOUNTS, max_size=3)
        )
    if draw(st.booleans()):
        res["limits"] = draw(st.dictionaries(st.sampled_from(["cpu", "memory"]), AMOUNTS, max_size=2))
    c: dict[str, Any] = {"name": "c"}
    if res or draw(st.booleans()):
        c["resources"] = res
    if draw(st.integers(0, 4)) == 0:
        c["restartPolicy"] = "Always"
    return c


@st.composite
def pod_objects(draw: st.DrawFn) -> dict[str, Any]:
    """Pods as the API writes them, in the variety the normaliser's shortcuts must not change."""
    spec: dict[str, Any] = {"containers": draw(st.lists(_container(), min_size=0, max_size=3))}
    if draw(st.integers(0, 3)) == 0:
        spec["initContainers"] = draw(st.lists(_container(), max_size=2))
    if draw(st.integers(0, 5)) == 0:
        spec["overhead"] = {"cpu": draw(AMOUNTS)}
    for key, values in (
        ("nodeName", ["n1", "n2", None]),
        ("priority", [0, 10, None, "7"]),
        ("priorityClassName", ["low", "", None, float("nan")]),  # NaN: written as null, like None
        ("preemptionPolicy", ["Never", None]),
        ("terminationGracePeriodSeconds", [0, 30, "5", None]),
        ("nodeSelector", [{"zone": "a"}, {}, None]),
        ("tolerations", [[{"key": "k", "operator": "Exists"}], [], None]),
        ("affinity", [None, {}, flowgen.ds_pod("d", required="n1", priority=0, cpu_m=1)["spec"]["affinity"]]),
    ):
        if draw(st.booleans()):
            spec[key] = draw(st.sampled_from(values))
    meta: dict[str, Any] = {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "1"}
    for key, values in (
        ("labels", [{"app": "web"}, {"app": "web", "tier": "front"}, {}, None]),
        ("annotations", [{"a": "b"}, None]),
        ("ownerReferences", [[{"kind": "ReplicaSet", "name": "rs", "uid": "rs-u"}], [], None]),
        ("creationTimestamp", [gen.TIMES[0], None]),
        ("deletionTimestamp", [gen.TIMES[1], None]),
    ):
        if draw(st.booleans()):
            meta[key] = draw(st.sampled_from(values))
    status: dict[str, Any] = {}
    if draw(st.booleans()):
        status["startTime"] = draw(st.sampled_from(gen.TIMES))
    if draw(st.booleans()):
        status["nominatedNodeName"] = "n2"
    if draw(st.booleans()):
        status["phase"] = draw(st.sampled_from(["Running", "Succeeded", "Pending"]))
    conditions = []
    if draw(st.booleans()):
        conditions.append(
            {
                "type": "PodScheduled",
                "status": draw(st.sampled_from(["True", "False"])),
                "reason": "Unschedulable",
                "lastTransitionTime": draw(st.sampled_from(gen.TIMES)),
            }
        )
    if draw(st.booleans()):
        conditions.append({"type": "DisruptionTarget", "status": "True"})
    if conditions:
        status["conditions"] = conditions
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _plain(obj: dict[str, Any]) -> objects.Pod:
    """The normaliser with every shortcut off: no memo, no previous record, the general requests path."""
    with (
        mock.patch.object(objects, "_key", lambda value: objects._NO_KEY),
        mock.patch.object(objects, "_plain_requests", lambda spec: None),
    ):
        return objects.pod(obj)


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        record = fn(*args)
    except InvalidObject as exc:
        return ("invalid", str(exc))
    return ("ok", {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "raw"})


@settings(max_examples=400, deadline=None)
@given(st.lists(pod_objects(), min_size=1, max_size=6), st.data())
def test_memoised_and_incremental_normalising_equal_the_plain_one(
    objs: list[dict[str, Any]], data: Any
) -> None:
    """Each pod through the memos, and again with the previous record lent, equals `_plain`.

    The previous record may be one the index or the controller replaced fields of
    (a stamped priority, a binding, a nomination, a terminating mark): those fields
    are never lent.
    """
    previous: objects.Pod | None = None
    for obj in objs:
        want = _outcome(_plain, obj)
        assert _outcome(objects.pod, obj) == want
        if previous is not None:
            lent = dataclasses.replace(
                previous,
                **data.draw(
                    st.sampled_from(
                        [{}, {"priority": 99}, {"node": "elsewhere"}, {"nominated": "n9", "deleting": True}]
                    )
                ),
            )
            assert _outcome(objects.pod, obj, lent) == want
        if want[0] == "ok":
            previous = objects.pod(obj)


def test_a_fast_built_pod_is_a_frozen_pod() -> None:
    p = objects.pod(_pod({"containers": []}))
    assert type(p) is objects.Pod and p == dataclasses.replace(p)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "other"  # type: ignore[misc]
    n = objects.node({"kind": "Node", "metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "1"}}})
    assert type(n) is objects.Node
    with pytest.raises(dataclasses.FrozenInstanceError):
        n.name = "other"  # type: ignore[misc]


def test_memo_keys_never_confuse_values_json_writes_alike() -> None:
    """orjson writes NaN as null and a datetime as its text: such parts are never memoised."""
    import datetime

    nan_class = objects.pod(_pod({"containers": [], "priorityClassName": float("nan")}))
    none_class = objects.pod(_pod({"containers": [], "priorityClassName": None}))
    assert (nan_class.priority_class, none_class.priority_class) == ("nan", "")
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    as_text = objects.pod(_pod({"containers": [], "nodeSelector": {"k": "2026-01-01T00:00:00+00:00"}}))
    as_time = objects.pod(_pod({"containers": [], "nodeSelector": {"k": when}}))
    assert as_text.node_selector != as_time.node_selector


def test_limits_equal_to_requests_in_other_words_are_guaranteed() -> None:
    res = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1024Mi"}}
    assert objects.pod(_pod({"containers": [{"resources": res}]})).qos == GUARANTEED


@pytest.mark.parametrize(
    "spec",
    [
        {"containers": ["x"]},
        {"containers": "x"},
        {"initContainers": [{"name": "i", "resources": [1]}]},
        {"containers": [{"name": "c", "ports": [{"hostPort": False}]}]},
        {"containers": [{"name": "c", "ports": [{"hostPort": 0.5}]}]},
        {"containers": [{"name": "c", "ports": [{"hostPort": 70000}]}]},
        {"containers": [{"name": "c", "ports": [{"hostPort": 80, "protocol": "ICMP"}]}]},
        {"containers": [{"name": "c", "ports": [{"hostPort": 80, "hostIP": "not-an-ip"}]}]},
        {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "k", "whenUnsatisfiable": "Bogus"}]},
        {
            "topologySpreadConstraints": [
                {"maxSkew": 0, "topologyKey": "k", "whenUnsatisfiable": "DoNotSchedule"}
            ]
        },
        {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]},
        {
            "affinity": {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}
            }
        },
        {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}}},
        {"volumes": "x"},
    ],
)
def test_a_spec_the_api_server_would_refuse_is_refused_with_its_reason(spec: dict[str, Any]) -> None:
    """Never another exception: the worker dead-letters InvalidObject with its reason, and
    `decide` exits 2 with one line."""
    with pytest.raises(InvalidObject):
        objects.pod({"metadata": {"name": "a"}, "spec": spec})

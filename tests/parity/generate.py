"""Random clusters under 100 nodes for the parity tests, one per seed.

Under 100 nodes kube-scheduler considers every node a preemption candidate (it
samples max(10%, 100) of them), so its answer is comparable with preemptctl's,
which always considers every node. A seed gives the same cluster every time.

What varies, so that every rule of both deciders is exercised against the real
scheduler: node shapes (a few kinds, so that candidates tie), taints, cordons,
extended resources, a node without a `pods` figure now and then; pods of 2-5
priority levels, QoS classes, init and sidecar containers, with and without
labels, some without PodScheduled, some terminal, some terminating (by a
preemption or by someone else); PDBs with matchLabels and every expression
operator, budgets of 0-2 and disruptedPods; pending pods nominated to nodes,
mostly of the deciding scheduler, now and then of another; the preemptor's
size, node selector, tolerations and an earlier nomination (with victims still
terminating there, and sometimes a node that has since shrunk). Clusters decided
by PreemptionToleration get PriorityClasses with toleration policies: protected
and expired windows far from their boundary (a wall clock decides upstream),
forever, zero seconds, and now and then the annotation alias.

Start times are distinct within a cluster except where a tie is wanted, so that
kube-scheduler's victim order is the one MoreImportantPod defines.

A share of the clusters (SHAPED_SHARE, chosen by a second random stream of the
seed, which also draws everything below, so that the other clusters are the
ones earlier versions generated) carry the shapes the other filters kube-scheduler
runs inside preemption read: nodes in topology.kubernetes.io/zone zones (now
and then without the label); host ports on pods and on the preemptor (TCP, UDP,
SCTP, on every address or one, in containers, sidecars and plain init
containers, which hold none), some taken where the preemptor wants them; the
preemptor's required pod anti-affinity and affinity by hostname and by zone
(across namespaces, by namespaceSelector on the name label or on a label of
the Namespace objects, with matchLabelKeys and
mismatchLabelKeys; some affinities that nothing satisfies, some only the
preemptor itself); existing pods' required anti-affinity against the preemptor;
and DoNotSchedule topology spread by hostname and zone, maxSkew 1-2, with
matching pods relabelled so that counts sit near the limit, now and then with
minDomains, node inclusion policies and matchLabelKeys. The preemptor's request
is often made small, so that only these filters keep it off a node.

A share of the PreemptionToleration clusters (TOLERATION_INPUTS_SHARE, on a third
stream of the seed, drawn after everything else, so that the other clusters stay
as they were) carry what the plugin reads strictly, each tagged: annotations with
leading or trailing whitespace, underscores, full-width digits or a trailing
newline (which Go's strconv.ParseInt refuses: the class protects nothing), and a
plus sign or leading zeros (which it takes); minimums at and beyond the int32
limits and seconds at and beyond the int64 limits; toleration-seconds 0 (or
none) with PodScheduled times in the future, as a skewed clock writes them; and
PodScheduled=True without a lastTransitionTime (Go's zero time upstream).
"""

from __future__ import annotations

import random
import re
from typing import Any

from tests.parity.scenario import DEFAULT, IMAGE, NAMESPACES, TOLERATION, Scenario, render_time

NOW = "2026-01-01T00:00:00Z"
REF = 1767225600.0  # NOW as epoch seconds
PRIORITIES = (-100, 0, 1, 5, 10, 50, 100, 500, 1000, 5000, 10000)
APPS = ("web", "db", "cache")
# A label of the parity namespaces (Scenario.namespace_labels) that namespaceSelectors pick by.
TEAM, TEAMS = "team", ("a", "b")
GPU = "example.com/gpu"
PREFIX = "preemption-toleration.scheduling.x-k8s.io/"
ALIAS = "preemption-toleration.scheduling.sigs.k8s.io/"
# Toleration windows are this far from their boundary at least: kube-scheduler reads the
# wall clock, a few seconds after the cluster is written on a loaded machine.
WINDOW_MARGIN_S = 600
# Shapes nodes are drawn from: (cpu, memory Gi, pods), so that several nodes tie.
SHAPES = ((2, 4, 110), (4, 8, 110), (8, 16, 110), (4, 8, 6), (2, 8, 4))
# Toleration policies: (minimum-preemptable-priority above the preemptor?, seconds).
SECONDS = (-1, 0, 900, 3600, None)
# The share of clusters with host ports, pod (anti-)affinity and topology spread.
SHAPED_SHARE = 0.4
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
HOST_PORTS = (8080, 8080, 8080, 9090)  # mostly one port, so that it is often taken
PROTOCOLS = ("TCP", "TCP", "TCP", "UDP", "SCTP")
HOST_IPS = ("", "", "", "0.0.0.0", "127.0.0.1", "10.0.0.1")
# The share of PreemptionToleration clusters with the annotations and times the plugin reads strictly.
TOLERATION_INPUTS_SHARE = 0.6
INT32_LIMITS = ("2147483647", "2147483648", "-2147483648", "-2147483649")
INT64_LIMITS = ("9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809")
FULL_WIDTH = str.maketrans("0123456789", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19")
MINIMUM, TOLERATION_SECONDS = "minimum-preemptable-priority", "toleration-seconds"


def _class_name(value: int, suffix: str = "") -> str:
    return f"pv-{'m' if value < 0 else ''}{abs(value)}{suffix}"


def scenario(seed: int) -> Scenario:
    rnd = random.Random(seed)
    profile = TOLERATION if rnd.random() < 0.3 else DEFAULT
    s = Scenario(
        name=f"generated-{seed}", profile=profile, now=NOW, origin=f"tests/parity/generate.py seed {seed}"
    )
    levels = sorted(rnd.sample(PRIORITIES, rnd.randint(2, 5)))
    top = levels[-1] if rnd.random() < 0.6 else rnd.choice(levels[1:])
    preemptor_priority = top + (1 if rnd.random() < 0.5 else 0)  # above every pod, or equal to the top level
    classes: dict[int, list[str]] = {}
    for value in sorted({*levels, preemptor_priority}):
        s.classes.append(_pc(_class_name(value), value))
        classes[value] = [_class_name(value)]
    tolerating = profile == TOLERATION or rnd.random() < 0.08
    if tolerating:
        for i, value in enumerate(v for v in levels if v < preemptor_priority):
            for j in range(rnd.randint(1, 2)):
                name = _class_name(value, f"-t{i}{j}")
                above = rnd.random() < 0.75
                minimum = preemptor_priority + (rnd.randint(1, 1000) if above else -rnd.randint(0, 1))
                seconds = rnd.choice(SECONDS)
                notes = {"minimum-preemptable-priority": str(minimum)}
                if seconds is not None:
                    notes["toleration-seconds"] = str(seconds)
                prefix = ALIAS if rnd.random() < 0.05 else PREFIX
                pc = _pc(name, value)
                pc["metadata"]["annotations"] = {prefix + k: v for k, v in notes.items()}
                s.classes.append(pc)
                classes[value].append(name)
    windows = {
        c["metadata"]["name"]: int(
            next(
                iter(
                    v
                    for k, v in c["metadata"].get("annotations", {}).items()
                    if k.endswith("toleration-seconds")
                ),
                "0",
            )
        )
        for c in s.classes
    }

    r = rnd.random()
    node_count = rnd.randint(1, 6) if r < 0.55 else rnd.randint(7, 25) if r < 0.92 else rnd.randint(26, 99)
    per_node = 6 if node_count <= 25 else 3
    gpus = rnd.random() < 0.2
    starts = iter(rnd.sample(range(600, 600 + 40 * 2000, 40), 2000))  # distinct, 40 s apart at least
    pod_names = iter(f"p{i}" for i in range(100_000))
    for n in range(node_count):
        cpu, mem, slots = rnd.choice(SHAPES)
        name = f"node-{n:02d}"
        alloc: dict[str, str] = {"cpu": str(cpu), "memory": f"{mem}Gi", "pods": str(slots)}
        if gpus and rnd.random() < 0.5:
            alloc[GPU] = str(rnd.choice((1, 2, 4)))
        if rnd.random() < 0.03:
            del alloc["pods"]  # a departure: no pods figure (preemptctl assumes kubelet's 110)
        spec: dict[str, Any] = {}
        if rnd.random() < 0.1:
            spec["taints"] = [
                {
                    "key": "dedicated",
                    "value": "x",
                    "effect": rnd.choice(("NoSchedule", "NoExecute", "PreferNoSchedule")),
                }
            ]
        if rnd.random() < 0.05:
            spec["unschedulable"] = True
        zone = rnd.choice("ab")
        s.nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "zone": zone}},
                "spec": spec,
                "status": {"allocatable": alloc, "capacity": dict(alloc)},
            }
        )
        fill = rnd.uniform(0.6, 1.1)
        used = 0.0
        for _ in range(rnd.randint(0, per_node)):
            if used >= fill * cpu:
                break
            value = rnd.choice(levels)
            klass = rnd.choice(classes[value])
            cpu_req = rnd.choice((0.25, 0.5, 1, 1.5, 2))
            used += cpu_req
            start = REF - next(starts)
            pod = _pod(
                rnd,
                next(pod_names),
                node=name,
                klass=klass,
                cpu=cpu_req,
                start=start,
                gpu=alloc.get(GPU) is not None and rnd.random() < 0.3,
            )
            window = windows.get(klass, 0)
            conditions = pod["status"]["conditions"]
            if window > 0 and conditions:
                # Scheduled well inside the window or well past it, never near its end.
                at = REF - (
                    window - WINDOW_MARGIN_S - rnd.randint(0, 60)
                    if rnd.random() < 0.5
                    else window + WINDOW_MARGIN_S + next(starts)
                )
                conditions[0]["lastTransitionTime"] = render_time(at)
                pod["status"]["startTime"] = render_time(at)
            s.pods.append(pod)
            roll = rnd.random()
            if roll < 0.03:
                pod["status"]["phase"] = rnd.choice(("Succeeded", "Failed"))
            elif roll < 0.09:
                _terminate(rnd, s, pod)
        if rnd.random() < 0.05 and len([p for p in s.pods if p["spec"].get("nodeName") == name]) >= 2:
            # Two equally important pods on one node (same priority and start): kube-scheduler
            # orders them as it likes; the model tries both orders.
            here = [p for p in s.pods if p["spec"].get("nodeName") == name]
            a, b = rnd.sample(here, 2)
            b["spec"]["priorityClassName"] = a["spec"]["priorityClassName"]
            b["status"] = {**b["status"], "startTime": a["status"]["startTime"]}
    _pdbs(rnd, s)
    _preemptor(rnd, s, preemptor_priority, levels, gpus)
    _nominated_others(rnd, s, levels, preemptor_priority)
    shapes = random.Random(f"shapes-{seed}")  # a stream of its own: the rest is drawn as before
    if shapes.random() < SHAPED_SHARE:
        _shape(shapes, s)
    odd = random.Random(f"toleration-{seed}")  # a third stream: drawn only for these clusters
    if profile == TOLERATION and odd.random() < TOLERATION_INPUTS_SHARE:
        _toleration_inputs(odd, s, preemptor_priority)
    # The parity namespaces' own labels, for namespaceSelectors (a fourth stream of its own).
    teams = random.Random(f"namespaces-{seed}")
    for ns in NAMESPACES:
        team = teams.choice((*TEAMS, None))
        if team is not None:
            s.namespace_labels[ns] = {TEAM: team}
    return s


def _pc(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def _pod(
    rnd: random.Random, name: str, *, node: str | None, klass: str, cpu: float, start: float, gpu: bool
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": f"{int(cpu * 1000)}m", "memory": rnd.choice(("256Mi", "512Mi", "1Gi"))}
    qos = rnd.random()
    resources: dict[str, Any] = {"requests": requests}
    if qos < 0.3:
        resources["limits"] = dict(requests)  # Guaranteed
    elif qos < 0.45:
        resources = {}  # BestEffort: only a pod slot (and a GPU, which QoS does not look at)
    if gpu:
        # Extended resources cannot be overcommitted: their limit must equal the request.
        resources.setdefault("requests", {})[GPU] = "1"
        resources.setdefault("limits", {})[GPU] = "1"
    container: dict[str, Any] = {"name": "c", "image": IMAGE, "resources": resources}
    spec: dict[str, Any] = {"priorityClassName": klass, "containers": [container]}
    extra = rnd.random()
    if extra < 0.08:
        spec["initContainers"] = [
            {"name": "init", "image": IMAGE, "resources": {"requests": {"cpu": f"{int(cpu * 1500)}m"}}}
        ]
    elif extra < 0.13:
        spec["initContainers"] = [
            {
                "name": "sidecar",
                "image": IMAGE,
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "100m"}},
            }
        ]
    labels: dict[str, str] = {}
    if rnd.random() < 0.8:
        labels["app"] = rnd.choice(APPS)
        if rnd.random() < 0.3:
            labels["tier"] = rnd.choice(("front", "back"))
    namespace = NAMESPACES[1] if rnd.random() < 0.2 else NAMESPACES[0]
    status: dict[str, Any] = {"phase": "Pending", "conditions": []}
    if node is not None:
        spec["nodeName"] = node
        status = {"phase": "Running", "startTime": render_time(start), "conditions": []}
        if rnd.random() < 0.9:
            status["conditions"].append(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": render_time(start)}
            )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": spec,
        "status": status,
    }


def _terminate(rnd: random.Random, s: Scenario, pod: dict[str, Any]) -> None:
    reason = rnd.choice(("PreemptionByScheduler", "PreemptionByScheduler", "EvictionByEvictionAPI", None))
    if reason is not None:
        pod["status"]["conditions"].append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": reason,
                "lastTransitionTime": render_time(REF - 5),
            }
        )
    s.terminating.add(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}")


def _pdbs(rnd: random.Random, s: Scenario) -> None:
    bound = [p for p in s.pods if p["spec"].get("nodeName")]
    for i in range(rnd.choice((0, 0, 1, 1, 2, 3))):
        namespace = NAMESPACES[1] if rnd.random() < 0.2 else NAMESPACES[0]
        app = rnd.choice(APPS)
        kind = rnd.random()
        if kind < 0.55:
            selector: dict[str, Any] = {"matchLabels": {"app": app}}
        elif kind < 0.7:
            selector = {
                "matchExpressions": [{"key": "app", "operator": "In", "values": sorted(rnd.sample(APPS, 2))}]
            }
        elif kind < 0.8:
            selector = {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": [app]}]}
        elif kind < 0.87:
            selector = {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}
        elif kind < 0.95:
            selector = {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}
        else:
            selector = {}  # matches nothing in preemption
        status: dict[str, Any] = {"disruptionsAllowed": rnd.choice((0, 0, 1, 2))}
        mates = [p for p in bound if p["metadata"]["namespace"] == namespace]
        if mates and rnd.random() < 0.2:
            status["disruptedPods"] = {rnd.choice(mates)["metadata"]["name"]: render_time(REF - 30)}
        s.pdbs.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": f"pdb-{i}", "namespace": namespace},
                "spec": {"selector": selector, "maxUnavailable": 1},
                "status": status,
            }
        )


def _preemptor(rnd: random.Random, s: Scenario, priority: int, levels: list[int], gpus: bool) -> None:
    # Mostly more than any node has free but no more than some node holds, so that most
    # clusters need a preemption somewhere; now and then anything.
    free = max(_free_cpu(s, n) for n in s.nodes)
    biggest = max(int(n["status"]["capacity"]["cpu"]) for n in s.nodes)
    if rnd.random() < 0.85 and free + 0.1 <= biggest:
        request = round(rnd.uniform(free + 0.1, biggest), 1)
    else:
        request = rnd.choice((0.5, 1, 2, 4, 6))
    klass = _class_name(priority)
    never = rnd.random() < 0.03
    if never:
        s.classes.append({**_pc(klass + "-never", priority), "preemptionPolicy": "Never"})
        klass += "-never"
    pod = _pod(
        rnd,
        "preemptor",
        node=None,
        klass=klass,
        cpu=max(request, 0.1),
        start=REF,
        gpu=gpus and rnd.random() < 0.3,
    )
    pod["metadata"]["namespace"] = NAMESPACES[0]
    spec = pod["spec"]
    spec.pop("initContainers", None)
    for container in spec["containers"]:  # never BestEffort: a preemptor asks for room
        requests = container.setdefault("resources", {}).setdefault("requests", {})
        requests.setdefault("cpu", f"{int(max(request, 0.1) * 1000)}m")
    if rnd.random() < 0.15:
        spec["nodeSelector"] = {"zone": rnd.choice("ab")}
    if rnd.random() < 0.15:
        spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    if rnd.random() < 0.05:
        spec["tolerations"] = [
            *spec.get("tolerations", []),
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        ]
    if rnd.random() < 0.2:
        # Nominated by an earlier round: victims may still be terminating there, and the node
        # may have shrunk below the request since.
        node = rnd.choice(s.nodes)
        name = node["metadata"]["name"]
        pod["status"]["nominatedNodeName"] = name
        here = [p for p in s.pods if p["spec"].get("nodeName") == name and p["status"]["phase"] == "Running"]
        lower = [p for p in here if _value(s, p) < priority]
        if lower and rnd.random() < 0.75:
            _terminate(rnd, s, rnd.choice(lower))
        if rnd.random() < 0.2:
            node["status"]["allocatable"]["cpu"] = f"{max(int(request * 1000) // 2, 1)}m"
    s.preemptor = pod


def _free_cpu(s: Scenario, node: dict[str, Any]) -> float:
    """CPU left on a node by its running pods (containers only: a rough figure for sizing)."""
    name = node["metadata"]["name"]
    used = 0.0
    for p in s.pods:
        if p["spec"].get("nodeName") == name and p["status"].get("phase") == "Running":
            for c in p["spec"]["containers"]:
                cpu = ((c.get("resources") or {}).get("requests") or {}).get("cpu", "0m")
                used += int(cpu.rstrip("m")) / 1000
    return int(node["status"]["capacity"]["cpu"]) - used


def _value(s: Scenario, pod: dict[str, Any]) -> int:
    klass = pod["spec"]["priorityClassName"]
    return int(next(c["value"] for c in s.classes if c["metadata"]["name"] == klass))


def _nominated_others(rnd: random.Random, s: Scenario, levels: list[int], priority: int) -> None:
    if rnd.random() > 0.2:
        return
    for _ in range(rnd.randint(1, 2)):
        value = rnd.choice([*levels, priority])
        pod = _pod(
            rnd,
            f"nominee-{rnd.randint(0, 999)}",
            node=None,
            klass=_class_name(value),
            cpu=rnd.choice((0.5, 1, 2)),
            start=REF,
            gpu=False,
        )
        pod["status"]["nominatedNodeName"] = rnd.choice(s.nodes)["metadata"]["name"]
        if rnd.random() < 0.15:
            pod["spec"]["schedulerName"] = "other-scheduler"  # counted by preemptctl only (a departure)
        if all(p["metadata"]["name"] != pod["metadata"]["name"] for p in s.pods):
            s.pods.append(pod)


# ---- host ports, pod (anti-)affinity, topology spread -------------------------------------


def _shape(x: random.Random, s: Scenario) -> None:
    zones = x.randint(1, 3)
    for node in s.nodes:
        if x.random() < 0.06:
            continue  # no zone label: unresolvable for a zone spread or affinity
        node["metadata"]["labels"][ZONE] = f"zone-{x.randrange(zones)}"
    kinds = [
        k
        for k, share in (("ports", 0.4), ("anti", 0.35), ("affinity", 0.2), ("existing", 0.3))
        if x.random() < share
    ]
    spread = x.random() < 0.35
    if not kinds and not spread:
        pick = x.choice(("ports", "anti", "affinity", "existing", "spread"))
        spread = pick == "spread"
        kinds = [] if spread else [pick]
    tags: set[str] = set()
    pre = s.preemptor
    labels = pre["metadata"]["labels"]
    if "app" not in labels and x.random() < 0.9:
        labels["app"] = x.choice(APPS)
    if x.random() < 0.5:
        _shrink(x, pre)
    if spread:
        _spread(x, s, tags)  # first: it relabels pods, which the terms below then read
    if "ports" in kinds:
        _ports(x, s, tags)
    if "anti" in kinds:
        for _ in range(1 if x.random() < 0.8 else 2):
            key = HOSTNAME if x.random() < 0.6 else ZONE
            target = labels.get("app") if x.random() < 0.6 else None
            app = target or x.choice(APPS)
            _terms(pre, "podAntiAffinity").append(_term(x, pre, key, app))
            if key == HOSTNAME and x.random() < 0.5:
                _replicas(x, s, app)
            tags.add("anti-affinity-" + ("hostname" if key == HOSTNAME else "zone"))
    if "affinity" in kinds:
        key = HOSTNAME if x.random() < 0.5 else ZONE
        ghost = x.random() < 0.25
        target = "ghost" if ghost else (labels.get("app") if x.random() < 0.3 else None) or x.choice(APPS)
        _terms(pre, "podAffinity").append(_term(x, pre, key, target))
        tags.add("affinity-unsatisfiable" if ghost else "affinity")
    if "existing" in kinds:
        _existing_anti(x, s)
        tags.add("existing-anti-affinity")
    s.tags = tuple(sorted(tags))


def _shrink(x: random.Random, pod: dict[str, Any]) -> None:
    """A preemptor small enough to fit by resources somewhere, so that the other filters decide."""
    cpu = f"{x.choice((100, 250, 500))}m"
    resources = pod["spec"]["containers"][0].setdefault("resources", {})
    resources.setdefault("requests", {})["cpu"] = cpu
    if "cpu" in (resources.get("limits") or {}):
        resources["limits"]["cpu"] = cpu


def _terms(pod: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    affinity = pod["spec"].setdefault("affinity", {}).setdefault(kind, {})
    terms: list[dict[str, Any]] = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
    return terms


def _term(x: random.Random, pod: dict[str, Any], key: str, app: str) -> dict[str, Any]:
    """A required pod (anti-)affinity term for pods labelled `app`, now and then across namespaces."""
    if x.random() < 0.7:
        selector: dict[str, Any] = {"matchLabels": {"app": app}}
    else:
        others = [a for a in APPS if a != app]
        selector = {
            "matchExpressions": [{"key": "app", "operator": "In", "values": sorted([app, x.choice(others)])}]
        }
    term: dict[str, Any] = {"labelSelector": selector, "topologyKey": key}
    roll = x.random()
    if roll < 0.1:
        term["namespaces"] = [NAMESPACES[1]]
    elif roll < 0.15:
        term["namespaces"] = list(NAMESPACES)
    elif roll < 0.25:
        term["namespaceSelector"] = {}  # every namespace
    elif roll < 0.275:
        term["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": x.choice(NAMESPACES)}}
    elif roll < 0.3:
        # A label only the Namespace object has (one draw, as the branch above: the stream is kept).
        term["namespaceSelector"] = {"matchLabels": {TEAM: x.choice(TEAMS)}}
    labels = pod["metadata"]["labels"]
    roll = x.random()
    if roll < 0.2:
        if "tier" not in labels and x.random() < 0.7:
            labels["tier"] = x.choice(("front", "back"))
        term["matchLabelKeys" if roll < 0.12 else "mismatchLabelKeys"] = ["tier"]
    return term


def _held(used: set[tuple[str, str, int]], want: tuple[str, str, int]) -> bool:
    """kube-scheduler's HostPortInfo.CheckConflict ("" is every address)."""
    ip, protocol, port = want
    if ip in ("", "0.0.0.0"):
        return any((p[1], p[2]) == (protocol, port) for p in used)
    return ("0.0.0.0", protocol, port) in used or want in used


def _port(x: random.Random, want: tuple[str, str, int]) -> dict[str, Any]:
    ip, protocol, port = want
    out: dict[str, Any] = {"containerPort": port if x.random() < 0.7 else port + 1, "hostPort": port}
    if protocol != "TCP" or x.random() < 0.5:
        out["protocol"] = protocol  # TCP is the default
    if ip:
        out["hostIP"] = ip
    return out


def _ports(x: random.Random, s: Scenario, tags: set[str]) -> None:
    """Host ports on existing pods (never two that conflict on one node, as no scheduler would place
    them) and on the preemptor, some where they are taken."""
    tags.add("ports")
    held: dict[str, set[tuple[str, str, int]]] = {}
    for pod in s.pods:
        node = pod["spec"].get("nodeName")
        if not node or x.random() >= 0.6:
            continue
        want = (x.choice(HOST_IPS), x.choice(PROTOCOLS), x.choice(HOST_PORTS))
        used = held.setdefault(node, set())
        if _held(used, want) or any(_held({want}, u) for u in used):
            continue
        spec = pod["spec"]
        inits = spec.get("initContainers") or []
        sidecars = [c for c in inits if c.get("restartPolicy") == "Always"]
        plain = [c for c in inits if c.get("restartPolicy") != "Always"]
        if sidecars and x.random() < 0.6:
            container = sidecars[0]
            tags.add("sidecar-ports")
        elif plain and x.random() < 0.5:
            container = plain[0]  # a plain init container holds no port while the pod runs
            tags.add("init-container-ports")
            want = ("", "", 0)
        else:
            container = spec["containers"][0]
        if want[2]:
            used.add((want[0] or "0.0.0.0", want[1], want[2]))
        else:
            want = (x.choice(HOST_IPS), x.choice(PROTOCOLS), x.choice(HOST_PORTS))
        container.setdefault("ports", []).append(_port(x, want))
    pre = s.preemptor
    wanted: list[tuple[str, str, int]] = []
    for _ in range(1 if x.random() < 0.7 else 2):
        want = (
            "" if x.random() < 0.75 else x.choice(HOST_IPS),
            "TCP" if x.random() < 0.8 else x.choice(PROTOCOLS),
            x.choice(HOST_PORTS),
        )
        if all((w[1], w[2]) != (want[1], want[2]) for w in wanted):
            wanted.append(want)
    sidecar = x.random() < 0.2
    container = pre["spec"]["containers"][0]
    if sidecar:
        container = {
            "name": "sidecar",
            "image": IMAGE,
            "restartPolicy": "Always",
            "resources": {"requests": {"cpu": "50m"}},
        }
        pre["spec"]["initContainers"] = [container]
        tags.add("sidecar-ports")
    container["ports"] = [_port(x, w) for w in wanted]
    if x.random() < 0.5:
        # The port a node agent holds on most nodes (one pod each, any priority): where the
        # preemptor goes depends on which of them it may evict.
        tags.add("ports-on-most-nodes")
        _, protocol, port = wanted[0]
        for node in s.nodes:
            name = node["metadata"]["name"]
            here = [
                p
                for p in s.pods
                if p["spec"].get("nodeName") == name and not p["spec"]["containers"][0].get("ports")
            ]
            used = held.setdefault(name, set())
            if not here or x.random() >= 0.75 or _held(used, ("", protocol, port)):
                continue
            used.add(("0.0.0.0", protocol, port))
            x.choice(here)["spec"]["containers"][0]["ports"] = [_port(x, ("", protocol, port))]


def _replicas(x: random.Random, s: Scenario, app: str) -> None:
    """One pod labelled `app` on most nodes, in the preemptor's namespace: replicas of a workload."""
    for node in s.nodes:
        name = node["metadata"]["name"]
        here = [
            p
            for p in s.pods
            if p["spec"].get("nodeName") == name
            and p["metadata"]["namespace"] == s.preemptor["metadata"]["namespace"]
        ]
        if here and x.random() < 0.75:
            x.choice(here)["metadata"]["labels"]["app"] = app


def _existing_anti(x: random.Random, s: Scenario) -> None:
    """Required anti-affinity on some bound pods, mostly against the preemptor's labels; now and then
    on one pod of most nodes (by hostname), as a workload that wants its nodes to itself."""
    app = s.preemptor["metadata"]["labels"].get("app")
    share = 0.2
    if x.random() < 0.4:
        share = 0.0
        for node in s.nodes:
            name = node["metadata"]["name"]
            here = [p for p in s.pods if p["spec"].get("nodeName") == name]
            if here and x.random() < 0.75:
                pod = x.choice(here)
                _terms(pod, "podAntiAffinity").append(_term(x, pod, HOSTNAME, app or x.choice(APPS)))
    for pod in s.pods:
        if not pod["spec"].get("nodeName") or x.random() >= share:
            continue
        key = HOSTNAME if x.random() < 0.65 else ZONE
        target = app if app and x.random() < 0.7 else x.choice(APPS)
        _terms(pod, "podAntiAffinity").append(_term(x, pod, key, target))


def _spread(x: random.Random, s: Scenario, tags: set[str]) -> None:
    """DoNotSchedule constraints on the preemptor, with matching pods placed near the skew limit."""
    pre = s.preemptor
    labels = pre["metadata"]["labels"]
    own = labels.get("app")
    target = own if own and x.random() < 0.85 else x.choice(APPS)
    keys = [HOSTNAME if x.random() < 0.55 else ZONE]
    if x.random() < 0.25:
        keys = [HOSTNAME, ZONE]
    constraints = []
    for key in keys:
        c: dict[str, Any] = {
            "maxSkew": x.choice((1, 1, 2)),
            "topologyKey": key,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": target}},
        }
        if x.random() < 0.25:
            c["minDomains"] = x.randint(2, 4)
            tags.add("min-domains")
        roll = x.random()
        if roll < 0.15:
            c["nodeAffinityPolicy"] = "Ignore"
        elif roll < 0.25:
            c["nodeAffinityPolicy"] = "Honor"
        roll = x.random()
        if roll < 0.2:
            c["nodeTaintsPolicy"] = "Honor"
        elif roll < 0.3:
            c["nodeTaintsPolicy"] = "Ignore"
        if x.random() < 0.15:
            if "tier" not in labels and x.random() < 0.7:
                labels["tier"] = x.choice(("front", "back"))
            c["matchLabelKeys"] = ["tier"]
        constraints.append(c)
        tags.add("spread-" + ("hostname" if key == HOSTNAME else "zone"))
    if x.random() < 0.15:
        other = ZONE if HOSTNAME in keys and ZONE not in keys else HOSTNAME
        if other not in keys:
            constraints.append(
                {
                    "maxSkew": 1,
                    "topologyKey": other,
                    "whenUnsatisfiable": "ScheduleAnyway",  # scoring's business: no filter reads it
                    "labelSelector": {"matchLabels": {"app": target}},
                }
            )
    pre["spec"]["topologySpreadConstraints"] = constraints
    # Matching pods per node: a base and a little more here and there, so that skews sit at the limit
    # (fewer per node when a zone adds several nodes up).
    base = x.choice((0, 0, 1)) if ZONE not in keys else 0
    extra = (0, 0, 1, 1, 2, 3) if ZONE not in keys else (0, 0, 0, 1, 1, 2)
    others = [a for a in APPS if a != target]
    for node in s.nodes:
        name = node["metadata"]["name"]
        here = [
            p
            for p in s.pods
            if p["spec"].get("nodeName") == name
            and p["metadata"]["namespace"] == pre["metadata"]["namespace"]
        ]
        want = base + x.choice(extra)
        for i, p in enumerate(here):
            if i < want:
                p["metadata"]["labels"]["app"] = target
            elif p["metadata"]["labels"].get("app") == target:
                p["metadata"]["labels"]["app"] = x.choice(others)


# ---- what PreemptionToleration reads strictly ---------------------------------------------


def _go_int(text: str | None) -> int | None:
    """The annotation as Go's ParseInt(text, 10, 64) reads it (None: absent or unparsable)."""
    return int(text) if text is not None and re.fullmatch(r"[+-]?[0-9]+", text) else None


def _notes(pc: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """A tolerating class's annotation prefix (the plugin's, or the alias) and its annotations."""
    notes: dict[str, str] = pc["metadata"].setdefault("annotations", {})
    prefix = ALIAS if any(k.startswith(ALIAS) for k in notes) else PREFIX
    return prefix, notes


def _toleration_inputs(x: random.Random, s: Scenario, preemptor_priority: int) -> None:
    """On distinct tolerating classes where there are enough: scheduled times in the future under 0
    seconds, PodScheduled without a time, limit values, and annotations Go's ParseInt refuses or
    takes in an unusual spelling. Each class is mostly made to protect its pods from the preemptor
    as written, and the preemptor mostly needs most of a node holding them, so that how the plugin
    reads the class and its pods' times decides where the preemptor goes."""
    tolerating = [c for c in s.classes if (c["metadata"].get("annotations") or {})]
    if not tolerating:
        return
    kinds = [
        k
        for k, share in (("future", 0.4), ("untimed", 0.4), ("limits", 0.4), ("syntax", 0.5))
        if x.random() < share
    ] or [x.choice(("future", "untimed", "limits", "syntax"))]
    by_class: dict[str, list[dict[str, Any]]] = {}
    for pod in s.pods:
        conditions = pod["status"].get("conditions") or []
        if pod["spec"].get("nodeName") and any(
            c["type"] == "PodScheduled" and c["status"] == "True" for c in conditions
        ):
            by_class.setdefault(pod["spec"]["priorityClassName"], []).append(pod)
    # Classes with the most scheduled pods first (ties in a random order); each kind takes the next.
    order = sorted(tolerating, key=lambda c: (-len(by_class.get(c["metadata"]["name"], [])), x.random()))
    tags = set(s.tags)
    touched: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        pc = order[i] if i < len(order) else x.choice(order)
        pods = by_class.get(pc["metadata"]["name"], [])
        touched.extend(pods)
        prefix, notes = _notes(pc)
        if kind != "future":
            _protecting(x, prefix, notes, preemptor_priority, untimed=kind == "untimed")
        if kind == "future":
            _future_scheduled(x, pods, prefix, notes, preemptor_priority)
            tags.add("toleration-zero-seconds-future")
        elif kind == "untimed":
            _untimed(x, pods)
            tags.add("toleration-no-transition-time")
        elif kind == "limits":
            name = MINIMUM if x.random() < 0.5 else TOLERATION_SECONDS
            notes[prefix + name] = x.choice(INT32_LIMITS if name == MINIMUM else INT64_LIMITS)
            tags.add("toleration-int32-limit" if name == MINIMUM else "toleration-int64-limit")
        else:
            key = x.choice(sorted(notes))
            notes[key], tag = _spelling(x, notes[key])
            tags.add(tag)
    if touched and x.random() < 0.7:
        _needs_room(x, s, touched)
    s.tags = tuple(sorted(tags))


def _protecting(
    x: random.Random, prefix: str, notes: dict[str, str], priority: int, *, untimed: bool
) -> None:
    """Mostly a minimum above the preemptor and a window that holds the class's pods (forever, or
    longer than any pod has run; for PodScheduled without a time, never forever)."""
    minimum = _go_int(notes.get(prefix + MINIMUM))
    if (minimum is None or minimum <= priority) and x.random() < 0.8:
        notes[prefix + MINIMUM] = str(priority + x.randint(1, 1000))
    seconds = _go_int(notes.get(prefix + TOLERATION_SECONDS))
    if (seconds is None or seconds == 0 or (untimed and seconds < 0)) and x.random() < 0.7:
        notes[prefix + TOLERATION_SECONDS] = "86400000" if untimed else x.choice(("-1", "86400000"))


def _needs_room(x: random.Random, s: Scenario, pods: list[dict[str, Any]]) -> None:
    """A preemptor asking for more CPU than any node has free (where it can) and at least half of,
    at most all of, the biggest node that holds some of these pods."""
    names = {p["spec"]["nodeName"] for p in pods}
    biggest = max(int(n["status"]["capacity"]["cpu"]) for n in s.nodes if n["metadata"]["name"] in names)
    low = min(max(max(_free_cpu(s, n) for n in s.nodes) + 0.1, biggest / 2), biggest)
    cpu = f"{int(x.uniform(low, biggest) * 1000) // 50 * 50}m"
    resources = s.preemptor["spec"]["containers"][0].setdefault("resources", {})
    resources.setdefault("requests", {})["cpu"] = cpu
    if "cpu" in (resources.get("limits") or {}):
        resources["limits"]["cpu"] = cpu


def _future_scheduled(
    x: random.Random, pods: list[dict[str, Any]], prefix: str, notes: dict[str, str], priority: int
) -> None:
    """0 toleration seconds (or none: the default 0), a minimum mostly above the preemptor, and
    PodScheduled times well ahead of now on some of the class's pods (a skewed clock)."""
    if x.random() < 0.8:
        notes[prefix + TOLERATION_SECONDS] = "0"
    else:
        notes.pop(prefix + TOLERATION_SECONDS, None)
    minimum = _go_int(notes.get(prefix + MINIMUM))
    if (minimum is None or minimum <= priority) and x.random() < 0.7:
        notes[prefix + MINIMUM] = str(priority + x.randint(1, 1000))
    chosen = [p for p in pods if x.random() < 0.75] or pods[:1]
    for pod in chosen:
        for c in pod["status"]["conditions"]:
            if c["type"] == "PodScheduled":
                # Far enough ahead that kube-scheduler's wall clock, a few seconds on, is still before it.
                c["lastTransitionTime"] = render_time(REF + WINDOW_MARGIN_S + x.randint(0, 3000))


def _untimed(x: random.Random, pods: list[dict[str, Any]]) -> None:
    """PodScheduled=True without a lastTransitionTime on some of the class's pods."""
    for pod in [p for p in pods if x.random() < 0.6] or pods[:1]:
        for c in pod["status"]["conditions"]:
            if c["type"] == "PodScheduled":
                c.pop("lastTransitionTime", None)


def _spelling(x: random.Random, text: str) -> tuple[str, str]:
    """An annotation value spelt as Go's ParseInt refuses it (Python's int() takes every one of
    these), or as it takes it (a plus sign, leading zeros); and the tag saying which."""
    sign, digits = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    roll = x.choice(("spaces", "spaces", "underscore", "full-width", "newline", "go-valid"))
    if roll == "spaces":
        return x.choice((f" {text}", f"{text} ", f"\t{text}", f" {text} ")), "toleration-annotation-spaces"
    if roll == "underscore":
        under = f"{digits[:1]}_{digits[1:]}" if len(digits) > 1 else f"0_{digits}"
        return sign + under, "toleration-annotation-underscore"
    if roll == "full-width":
        return sign + digits.translate(FULL_WIDTH), "toleration-annotation-full-width"
    if roll == "newline":
        return text + "\n", "toleration-annotation-newline"
    return (f"-00{digits}" if sign == "-" else f"+{digits}"), "toleration-annotation-sign-zeros"

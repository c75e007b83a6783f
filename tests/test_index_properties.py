"""The incremental index gives exactly the answers of a fresh, literal evaluation.

A cluster evolves through random changes (pods bound, deleted, nominated,
terminating; nodes cordoned; PDBs changed; time passing through toleration
windows) while one long-lived Index answers for several preemptors after every
change; engine.reference recomputes each answer from scratch.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import case as case_mod
from engine import flows, objects, reference, timeutil
from engine.config import Config
from engine.index import Index
from tests import gen

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def changes(draw: st.DrawFn, names: list[str]) -> list[tuple[str, dict[str, Any] | None, int]]:
    out: list[tuple[str, dict[str, Any] | None, int]] = []
    for i in range(draw(st.integers(1, 8))):
        kind = draw(
            st.sampled_from(("bind", "bind", "delete", "nominate", "terminate", "cordon", "pdb", "tick"))
        )
        node = draw(st.sampled_from(names))
        prio = draw(st.sampled_from(gen.PRIORITIES))
        cpu = draw(st.sampled_from((500, 1000)))
        advance = draw(st.sampled_from((0, 0, 1800, 4000)))
        if kind == "bind":
            obj = gen.pod(
                f"x{i}",
                node=node,
                priority=prio,
                cpu_m=cpu,
                labels={"app": "web"},
                priority_class="tolerant" if prio == 10 else None,
                start="2026-01-01T00:00:00Z",
            )
        elif kind == "nominate":
            obj = gen.pod(f"x{i}", node=None, priority=prio, cpu_m=cpu, nominated=node)
        elif kind == "terminate":
            obj = gen.pod(f"x{i}", node=node, priority=prio, cpu_m=cpu, deleting=True, disruption=True)
        elif kind == "cordon":
            obj = gen.node(node, 2, 8, 110, cordon=draw(st.booleans()))
        elif kind == "pdb":
            obj = gen.pdb("pdb-web", "web", draw(st.integers(0, 2)))
        else:
            obj = None
        out.append((kind, obj, advance))
    return out


@SETTINGS
@given(gen.clusters(), st.data())
def test_long_lived_index_matches_reference_after_every_change(
    raw: dict[str, Any], data: st.DataObject
) -> None:
    c = case_mod.load(raw, where="generated")
    cluster = c.cluster
    names = sorted(cluster.nodes)
    index = Index(cluster)
    preemptors = [c.preemptors[0]] + [
        objects.pod(gen.pod(f"q{p}", node=None, priority=p, cpu_m=1000)) for p in (100, 5000)
    ]
    now = c.now
    config = Config()
    bound_uids = [p.uid for p in cluster.pods.values()]
    for kind, obj, advance in data.draw(changes(names)):
        now += advance * timeutil.SECOND
        if kind == "delete" and bound_uids:
            cluster.remove("Pod", bound_uids.pop(0))
        elif obj is not None:
            cluster.upsert(objects.normalize(obj))
        for pre in preemptors:
            pre = cluster.pods.get(pre.uid, pre)
            d = flows.decide(cluster, [pre], now=now, config=config, index=index)
            want = reference.decide(cluster, pre, now)
            got = {"outcome": d.outcome, "node": d.node, "victims": sorted(v.key for v in d.victims)}
            if want["outcome"] in ("unschedulable", "wait"):
                got["node"] = None
            assert got == want, (kind, pre.name)
            fresh = flows.decide(cluster, [pre], now=now, config=config)
            assert d.answer() == fresh.answer()

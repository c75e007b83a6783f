"""A real control plane on loopback, for the tests and the benchmarks: never shipped, never product code.

Owns:
- `lifecycle`: the one start/stop lifecycle of every server here (start a process, wait until it is
  ready, stop it, clean up), `with` around it;
- `cluster`: kube-apiserver + etcd (`TestCluster`), the chart's identities and RBAC, the tools' cache;
- `scheduler`: a real kube-scheduler v1.34.2 (`KubeScheduler`) with the profiles of docs/deploy.md;
- `stack`: the whole loop, kube-scheduler and kwok on that API server (`ControlPlane`) and
  preemptctl's source, worker and actuator as processes (`Stack`);
- `objects`: the kwok nodes, pods, PDBs and PriorityClasses the loop is driven with.

May use: `engine`, `schemas`, `streams` (as any user of preemptctl would), the standard library,
PyYAML and orjson; never `tests` or `benchmarks`, which both import it (tests/test_layout.py).
It is a top-level package, not a part of `tests`, because benchmarks/e2e.py runs the same loop
at scale and a benchmark imports nothing from the tests.
"""

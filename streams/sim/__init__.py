"""The simulated cluster: a closed loop without Kubernetes, for `preemptctl run`, tests and benchmarks.

Owns: `simulator` (a discrete-event cluster that reacts to decisions, and
`simulate`, the same loop in-process), `traces` (the bundled example traces),
`workloads` (scheduler_perf-shaped synthetic clusters), `run` (`preemptctl run`:
embedded broker, worker process, simulated cluster), `mixed` (a real
cluster's mixed shape and churn for `bench engine`), `apiserver` (objects
dressed as a real API server holds them). May use: engine, schemas, fold,
`streams.brokers`, `streams.kafka`, `streams.common`; never `streams.pipeline`
(`run` starts the worker as a process of its own, and predicts its decisions
with the same fold).
"""

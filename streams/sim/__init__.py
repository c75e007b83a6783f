"""The simulated cluster: a closed loop without Kubernetes, for `preemptctl run`, tests and benchmarks.

Owns: `simulator` (a discrete-event cluster that reacts to decisions, and
`simulate`, the same loop in-process), `traces` (the bundled example traces),
`workloads` (scheduler_perf-shaped synthetic clusters), `run` (`preemptctl run`:
embedded broker, worker process, simulated cluster), `mixed` (a real
cluster's mixed shape and churn for `bench engine`), `apiserver` (objects
dressed as a real API server holds them). May use: engine, schemas,
`streams.pipeline`, `streams.brokers`, `streams.kafka`, `streams.common`.
"""

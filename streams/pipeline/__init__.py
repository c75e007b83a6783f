"""The driver: the faust worker that feeds cluster events to the fold and publishes what it decides.

Owns: `worker` (one partition's fold: its controllers, outbox and store, each
event dead-lettered or handed to the fold, whose `Ready` it publishes and
gathers for the store), `recovery` (a partition's worker opened from its store
or a snapshot, the published decisions read, the log caught up: the steps
numbered there), `checkpoint` (flush, commit, store, snapshot, in that order:
the steps numbered there), `setup` (what every partition of a process shares),
`partitions` (the partitions a process owns: opening, reopening after a
failure, readiness), `outbox` (every outgoing record built and sent in one
place, transactional or not), `snapshot` (snapshots in Kafka), `store`
(rocksdict with its log position), `tables` (the state over HTTP), `faults`
(injected faults for the chaos tests), `app` (the faust app and `preemptctl
worker`), `transport` (faust's consumer with a short fetch wait), `metrics`
(the worker's operator metrics), `pauses` (whether the whole process stopped
for a while). The fold itself (controller, undo log, offline folding) is the
top-level `fold` package. May use: engine, schemas, fold, `streams.kafka`,
`streams.common`; never the Kubernetes edge.
"""

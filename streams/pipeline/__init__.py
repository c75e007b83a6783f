"""The decider: cluster events folded into state, decisions out, the same online and offline.

Owns: `controller` (the deterministic core: fold one event atomically, decide,
chain the record), `undo` (the per-event undo log that makes folding atomic),
`fold` (a log folded offline through one controller per cluster), `worker`
(one partition's state, store, commits, snapshots and recovery), `partitions`
(the partitions a process owns: opening, reopening after a failure,
readiness), `outbox` (every outgoing record built and sent in one place,
transactional or not), `snapshot` (snapshots in Kafka), `store` (rocksdict
with its log position), `tables` (the state over HTTP), `faults` (injected
faults for the chaos tests), `app` (the faust app and `preemptctl worker`),
`transport` (faust's consumer with a short fetch wait), `metrics` (the
worker's operator metrics), `pauses` (whether the whole process stopped for a
while). May use: engine,
schemas, `streams.kafka`, `streams.common`; never the Kubernetes edge.
"""

"""The decider: cluster events folded into state, decisions out, the same online and offline.

Owns: `controller` (the deterministic core: fold one event, decide, chain the
record), `fold` (a log folded offline through one controller per cluster),
`worker` (one partition's state, store and resume rules), `app` (the faust app
and `preemptctl worker`), `store` (rocksdict with its log position),
`transport` (faust's consumer with a short fetch wait). May use: engine,
schemas, `streams.kafka`, `streams.common`; never the Kubernetes edge.
"""

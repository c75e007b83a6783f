"""The fold: a cluster's event log folded into state and decision records, one event at a time.

Owns: `controller` (the deterministic core: fold one event atomically, decide,
chain the record, and hand back one `Ready` per event: the decision records with
their published bytes and the store keys the event changed), `undo` (the
per-event undo log that makes folding atomic), `fleet` (one controller per
cluster, and a log folded offline through them: `replay`, the simulator,
`preemptctl run`'s prediction).
May use: engine, schemas. Pure like them (pyproject.toml's purity contract): no
asyncio, no Kafka client, no faust, no rocksdict, no clock; time is the events'
`ts`. The worker (streams.pipeline) drives it online, the audit and the
simulator offline, and every path folds the same inputs to the same bytes.
"""

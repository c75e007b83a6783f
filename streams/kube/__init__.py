"""The Kubernetes edge: what reads the cluster into the log and acts on decisions.

Owns: `api` (the API connection, timeouts, errors, backoff), `component` (what
the long-running edge commands share), `source` (list+watch into
preemption.cluster-events), `actuator` (decisions in, one outcome per victim
out), `eviction` (the API calls for one decision), `lease` (leader election),
`ledger` (what the actuator has done), `preemptor_events` (the Event on the
pending preemptor). May use: engine, schemas,
`streams.kafka`, `streams.common`, kubernetes-asyncio; never the worker.
"""

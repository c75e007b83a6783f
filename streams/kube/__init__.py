"""The Kubernetes edge: what reads the cluster into the log and acts on decisions.

Owns: `api` (the API connection, timeouts, errors, backoff), `component` (what
the long-running edge commands share), `watching` (a list+watch stream of one
resource: pages, resourceVersions, bookmarks, 410 Gone), `source` (what is
watched, in which scope, framed by RESYNC into preemption.cluster-events, by the
Lease's holder), `publisher` (the source's events batched into records and
written), `actuator` (decisions in, one outcome per victim out), `eviction` (the
API calls for one decision), `lease` (leader election), `ledger` (what the
actuator has done), `preemptor_events` (the Event on the pending preemptor).
May use: engine, schemas, `streams.kafka`, `streams.common`, kubernetes-asyncio;
never the worker.
"""

"""The audit tools: can the decision log be trusted, and why was a pod preempted?

Owns: `verify` (`audit verify|head`: the hash chain and HMAC), `explain`
(`preemptctl explain`), `export` (a topic to JSONL), `replay` (`preemptctl
replay`: re-derive decisions offline and compare). May use: engine, schemas,
fold (offline folding), `streams.sim`, `streams.kafka`, `streams.common`;
never `streams.pipeline` (the running worker), a broker process or the
Kubernetes edge: an audit reads records, it does not run components.
"""

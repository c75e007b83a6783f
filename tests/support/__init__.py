"""Helpers shared by the test suites: plain modules, no tests in them (pytest collects none here).

Owns:
- `gen`, `flowgen`, `churn`, `foldgen`: hypothesis generators of raw Kubernetes objects, clusters
  of every flow and watch-event histories;
- `mixed_logs`, `busy_logs`, `unknown_fields`: logs and objects the fold, projection and worker
  tests share;
- `minimal_oracle`: the exhaustive reference of the `minimal` victim selection;
- `audit_traces`: the bundled traces folded into decision logs, for the audit tests;
- `memory_pipeline`: the worker on the in-memory broker;
- `secure_kafka`: a secured Apache Kafka (SASL_SSL, mTLS, ACLs) for the session;
- `topics`: fresh topic names on a shared broker;
- `tools`: a missing tool skips a test under plain pytest and fails it under `make test`.

A test module imports from here (or from its suite's own helper modules), never from another
test module or a conftest (tests/test_layout.py).
"""

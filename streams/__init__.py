"""preemptctl's runtime: everything around the pure engine and fold that touches Kafka, Kubernetes or a clock.

Below it, and pure: `fold` (the controller, its undo log, offline folding), on
`engine` (the decisions), on `schemas` (the records). The subpackages follow
the data, and each may use only those listed after it (import-linter enforces
it; see pyproject.toml):

    cli       the `preemptctl` command line             may use everything
    bench     engine and pipeline benchmarks            sim, pipeline, brokers, kafka, common
    audit     verify, explain, export, replay           sim, kafka, common (never pipeline)
    sim       simulated cluster, traces, `run`          brokers, kafka, common (never pipeline)
    pipeline  worker, recovery, checkpoint, faust app   kafka, common
    kube      API client, source, actuator, lease       kafka, common
    brokers   embedded tansu, local Apache Kafka        kafka, common
    kafka     topics, reading, producing, JSONL logs    common
    common    errors, option files, health, progress    -

`pipeline`, `kube` and `brokers` are independent of each other: the worker
never imports the Kubernetes client, and the edge never imports the worker.
`sim` and `audit` fold through `fold`, as the worker does, never through
`pipeline`: replaying, simulating and auditing run no worker.
"""

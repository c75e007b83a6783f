"""preemptctl's runtime: everything around the pure engine that touches Kafka, Kubernetes or a clock.

The subpackages follow the data, and each may use only those listed after it
(import-linter enforces it; see pyproject.toml):

    cli       the `preemptctl` command line             may use everything
    bench     engine and pipeline benchmarks            sim, pipeline, brokers, kafka, common
    audit     verify, explain, export, replay           sim, pipeline (fold, controller), kafka, common
    sim       simulated cluster, traces, `run`          pipeline, brokers, kafka, common
    pipeline  controller, fold, faust worker, store     kafka, common
    kube      API client, source, actuator, lease       kafka, common
    brokers   embedded tansu, local Apache Kafka        kafka, common
    kafka     topics, reading, producing, JSONL logs    common
    common    errors, option files, health, progress    -

`pipeline`, `kube` and `brokers` are independent of each other: the worker
never imports the Kubernetes client, and the edge never imports the worker.
"""

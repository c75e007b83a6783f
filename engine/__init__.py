"""preemptctl's decision engine: pure preemption logic over a cluster index.

Nothing in this package performs I/O, reads the clock, draws random numbers or
imports an asynchronous runtime; every decision is a function of the objects
and the instant it is given. `streams` wraps it with Kafka and Kubernetes.
"""

ENGINE_VERSION = "0.1.0"

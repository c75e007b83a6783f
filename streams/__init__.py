"""preemptctl's runtime: CLI, faust worker, brokers, simulator, Kubernetes source and actuator.

Everything with a side effect lives here; decisions come from `engine`.
"""

"""Benchmarks: `preemptctl bench engine|pipeline`, with the machine they ran on.

Owns: `engine` (decisions per second against the reference), `pipeline` (fold
rate and end-to-end latency against the broker's raw speed), `machine`. May use
everything below `streams.cli`.
"""

"""Talking to Kafka: the topics, reading them, producing to them, and logs as JSONL files.

Owns: `topics` (names, configs, `ensure_topics`, `--broker` URLs), `reading`
(whole topics and offset ranges with a plain consumer), `sink` (the one
replaceable producing side effect), `logio` (event and decision logs from a
JSONL file or a kafka:// topic), `connection` (client configuration: brokers,
TLS, SASL, and every client built on it), `acls` (the ACLs each component
needs), `deadletter` (the headers and count of a dead letter), `lag` (a
consumer group's lag from outside it), `ownership` (partitions no group member
owns), `memory` (an in-memory stand-in for partitions, for tests and
benchmarks). May use: `streams.common`, schemas, aiokafka.
"""

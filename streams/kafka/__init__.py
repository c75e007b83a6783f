"""Talking to Kafka: the topics, reading them, producing to them, and logs as JSONL files.

Owns: `topics` (names, configs, `ensure_topics`, `--broker` URLs), `reading`
(whole topics and offset ranges with a plain consumer), `sink` (the one
replaceable producing side effect), `logio` (event and decision logs from a
JSONL file or a kafka:// topic). May use: `streams.common`, schemas, aiokafka.
"""

"""faust's aiokafka transport with a short consumer fetch wait, registered as `preemptctl://`.

faust hard-codes `fetch_max_wait_ms=1500` for its worker consumer. Apache Kafka
answers a fetch as soon as any data arrives, but the embedded tansu broker holds
every fetch for the full wait, which put up to 1.5 s between an event and its
decision. Only that one consumer setting differs from faust's own transport.
"""

from __future__ import annotations

from typing import Any

import aiokafka
from faust.transport import drivers
from faust.transport.drivers import aiokafka as driver

SCHEME = "preemptctl"
# How long a fetch may wait for data on a quiet partition: bounds the event-to-decision
# latency on brokers that do not answer early, at the cost of ~50 idle fetches/s.
FETCH_MAX_WAIT_MS = 20


class ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        # Read by AIOKafkaConsumer.start() when it builds its fetcher, so this takes effect.
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer


class Consumer(driver.Consumer):
    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(driver.Transport):
    Consumer = Consumer


def register() -> None:
    drivers.TRANSPORTS.aliases.setdefault(SCHEME, f"{__name__}:Transport")

"""Exponential backoff with jitter: how every component waits before trying again.

Used for the API server (streams.kube) and for Kafka (a component waiting for a
broker that is not up yet, or briefly gone).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Fast enough to ride out a server restart, slow enough not to hammer an overloaded one
# (client-go's informers back off from 0.8 s to 30 s for the same reason).
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0
BACKOFF_FACTOR = 2.0
# ±20%: many controllers restarted together must not retry in lockstep.
BACKOFF_JITTER = 0.2


@dataclass
class Backoff:
    """Exponential backoff with jitter; `reset()` after a success."""

    initial_s: float = BACKOFF_INITIAL_S
    max_s: float = BACKOFF_MAX_S
    factor: float = BACKOFF_FACTOR
    jitter: float = BACKOFF_JITTER
    _next: float = field(default=0.0, init=False)

    def delay(self) -> float:
        """The next delay to sleep, growing each call up to max_s."""
        base = self._next or self.initial_s
        self._next = min(base * self.factor, self.max_s)
        return base * (1 + random.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self._next = 0.0

"""Whether the whole process stopped running for a while (SIGSTOP, a frozen VM), not only its event loop.

A worker that was stopped for longer than its group session timeout has lost its
membership: the group gave its partitions to another worker. A worker whose event
loop was merely busy (a long synchronous restore) has not: faust heartbeats from its
consumer thread. Both look the same from the event loop, a long gap between two
runs; a thread tells them apart. `Pauses` runs a daemon thread that wakes every
TICK_S: it keeps running while the loop is busy, and it is stopped with the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# How often the watching thread wakes: a wake-up costs microseconds; a pause shorter
# than a session timeout (seconds) does not matter.
TICK_S = 0.5


class Pauses:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic, start: bool = True) -> None:
        self._clock = clock
        self._last = clock()  # the thread's last wake-up
        self._ended: list[tuple[float, float]] = []  # (start, end) of gaps seen by the thread
        self._lock = threading.Lock()
        if start:
            threading.Thread(target=self._run, name="preemptctl-pauses", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            self.tick()

    def tick(self) -> None:
        """One wake-up of the thread (called by it; tests call it with their own clock)."""
        now = self._clock()
        with self._lock:
            if now - self._last > 4 * TICK_S:
                self._ended = [*self._ended[-7:], (self._last, now)]
            self._last = now

    def stopped(self, since: float, *, at_least: float) -> bool:
        """Was the whole process stopped for `at_least` seconds at some time after `since`?

        True too when the thread itself has not run for that long (the loop got to ask first).
        """
        now = self._clock()
        with self._lock:
            if now - self._last >= at_least:
                return True
            return any(end > since and end - start >= at_least for start, end in self._ended)

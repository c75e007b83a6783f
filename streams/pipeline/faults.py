"""Injected faults for the fault-injection tests: a send, a commit or a store write that fails at the Nth try.

`preemptctl worker --inject-fault KIND=N` (a hidden flag) arms one: the Nth
call of that kind in the process fails, as the real failure would
(tests/chaos/ drives a worker process through them). Counting calls, not
time, makes each fault land at the same point of the log on every run.

- `fail-send=N`: the Nth record handed to the producer raises, as a send that
  times out or is refused;
- `abort-commit=N`: the Nth commit with decisions in it has them written, then
  fails (a transaction is aborted; without transactions the acknowledgement is
  lost), so the decisions are in the log but the worker must not count on them;
- `fail-store=N`: the Nth write of the local store raises (a full disk);
- `stop-before-commit=N`: at the Nth commit with decisions in it the process
  stops itself (SIGSTOP) with its records sent and its transaction open, as a
  worker paused by the machine (a zombie, once its partition has moved on).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

KINDS = ("fail-send", "abort-commit", "fail-store", "stop-before-commit")


class InjectedFault(RuntimeError):
    """The failure an armed fault produces."""


@dataclass
class Faults:
    armed: dict[str, int] = field(default_factory=dict)  # kind -> the call number that fails
    calls: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> Faults:
        """`KIND=N` strings; ValueError naming the bad one."""
        armed = {}
        for spec in specs:
            kind, _, n = spec.partition("=")
            if kind not in KINDS or not n.isdigit() or int(n) < 1:
                raise ValueError(f"bad fault {spec!r}: expected one of {', '.join(KINDS)} =N (N >= 1)")
            armed[kind] = int(n)
        return cls(armed)

    def hit(self, kind: str) -> bool:
        """Count one call of `kind`; True when it is the armed one."""
        if kind not in self.armed:
            return False
        n = self.calls[kind] = self.calls.get(kind, 0) + 1
        return n == self.armed[kind]

    def check(self, kind: str) -> None:
        if self.hit(kind):
            raise InjectedFault(f"injected {kind} (call {self.calls[kind]})")


NONE = Faults()

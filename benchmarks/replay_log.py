"""Write a large JSONL event log for timing `preemptctl replay` (docs/performance.md: 1M events in <= 60 s).

    .venv/bin/python benchmarks/replay_log.py /tmp/replay-1m.jsonl 1000000
    time .venv/bin/preemptctl replay /tmp/replay-1m.jsonl --decisions-out /dev/null

The log is a 37,500-node / 150,000-pod cluster listed (ADDED), then every pod
re-sent as MODIFIED with a newer resourceVersion until the count is reached,
as status updates would be.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from streams.sim import workloads


def main(path: Path, count: int) -> None:
    objs = workloads.cluster_objects(37_500)
    pods = [o for o in objs if o["kind"] == "Pod"]
    n = 0
    with path.open("wb") as f:
        for o in objs:
            f.write(orjson.dumps({"type": "ADDED", "ts": workloads.EPOCH, "object": o}) + b"\n")
            n += 1
        version = 2
        while n < count:
            for p in pods:
                if n >= count:
                    break
                p = dict(p, metadata=dict(p["metadata"], resourceVersion=str(version)))
                f.write(orjson.dumps({"type": "MODIFIED", "ts": "2026-01-01T00:01:00Z", "object": p}) + b"\n")
                n += 1
            version += 1
    print(f"wrote {n} events to {path}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000)

"""Fresh topic names on a broker the session shares: no test reads another test's records."""

from __future__ import annotations

import uuid


def fresh_topic(stem: str) -> str:
    return f"test.{stem}.{uuid.uuid4().hex[:8]}"

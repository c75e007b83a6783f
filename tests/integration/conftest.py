"""Integration tests run on both brokers: `broker` is each session broker in turn (tests/conftest.py).

Tests take `broker` to run on both, or `tansu_broker` / `kafka_broker` for what
only that broker does.
"""

from __future__ import annotations

import pytest


@pytest.fixture(
    params=[
        pytest.param("tansu", id="tansu"),
        pytest.param("kafka", id="kafka", marks=pytest.mark.kafka),
    ]
)
def broker(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs once per broker; the value is the bootstrap address."""
    bootstrap: str = request.getfixturevalue(f"{request.param}_broker")
    return bootstrap

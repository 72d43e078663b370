"""One Prefect test harness (a real ephemeral server) for the whole session."""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session", autouse=True)
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


async def wait_for(predicate, timeout_s: float = 20.0, interval_s: float = 0.2):
    """Poll the async ``predicate`` until it returns a truthy value (the server records runs
    from events, a moment after the client finishes them)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await predicate()
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(interval_s)

"""The in-runtime launcher (``harnesses/programs/launch.py``) against a real interception endpoint."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint
from tests.support.waiting import within

pytestmark = pytest.mark.unit


async def test_a_launch_with_an_unknown_secret_exits_naming_the_refusal():
    endpoint = InterceptionEndpoint()
    await endpoint.start()
    try:
        assert endpoint.directory is not None
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(endpoint.directory / "launch.py"), str(endpoint.socket_path), "100", "--", "true",
            env={**os.environ, "OPENAI_API_KEY": "sk-rollout-unknown"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await within(proc.communicate(), 5, "the refused launcher to exit")
    finally:
        await endpoint.stop()
    assert proc.returncode == 1
    assert out == b""
    text = err.decode()
    assert "launch: the interception endpoint refused this launch (HTTP 401)" in text
    assert "unknown or expired API key" in text

"""Shared fixtures: the scripted OpenAI-compatible server and agent configs pointing at it, the Docker
engine, moto's S3 server. The test tiers, the Prefect harness and the servers are plugins in tests/support/."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

import prefect_rollouts as vf
from tests.fakes.openai_server import ScriptedOpenAIServer
from tests.support.extras import unavailable

pytest_plugins = ["pytester", "tests.support.tiers", "tests.support.harness", "tests.support.servers"]

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
HOME_PREFIX = "prefect-rollouts-tests-home-"
if "PREFECT_HOME" not in os.environ or Path(os.environ["PREFECT_HOME"]).name.startswith(HOME_PREFIX):
    # Prefect's files of this session (a failed flow run's pickled exception in storage/, its memo store,
    # the temporary servers' SQLite database) go to a directory of its own, not ~/.prefect: one per test
    # process (each xdist worker makes its own instead of sharing the controller's); the processes it
    # starts (workers, CLI evals) inherit it.
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix=HOME_PREFIX)
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test gets the process environment back as it found it. The CLI run in-process
    (``CliRunner``) sets variables for its own process (``PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL``,
    ``PREFECT_CLIENT_MAX_RETRIES``, ``PREFECT_API_URL``); left behind, they reached the workers a
    later test started, whose INFO lines that test reads went missing."""
    saved = dict(os.environ)
    yield
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    os.environ.update(saved)


@pytest.fixture(scope="session")
def _openai_server_session():
    """One ScriptedOpenAIServer for the whole session (use `openai_server` in tests)."""
    with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture
def openai_server(_openai_server_session):
    """The session's ScriptedOpenAIServer, reset (empty script, no requests, no default)."""
    _openai_server_session.reset()
    yield _openai_server_session


@pytest.fixture(scope="session")
def _anthropic_server_session():
    """One ScriptedAnthropicServer for the whole session (use `anthropic_server` in tests)."""
    from tests.fakes.anthropic_server import ScriptedAnthropicServer

    with ScriptedAnthropicServer() as server:
        yield server


@pytest.fixture
def anthropic_server(_anthropic_server_session):
    """The session's ScriptedAnthropicServer (Anthropic Messages), reset."""
    _anthropic_server_session.reset()
    yield _anthropic_server_session


@pytest.fixture
def agent_config(openai_server):
    """Factory of inline ``AgentConfig`` aimed at the scripted server, with fast client and stage retries."""
    def make(**fields: Any) -> vf.AgentConfig:
        client = vf.ClientConfig(base_url=openai_server.base_url, api_key_env="TEST_OPENAI_KEY", timeout=10,
                                 retries=vf.RetryConfig(max_retries=2, backoff_s=0.01, max_backoff_s=0.05))
        fields.setdefault("orchestrator", "inline")
        fields.setdefault("retries", vf.StageRetryConfig(backoff_s=0.01))
        return vf.AgentConfig(model="scripted", client=fields.pop("client", client), **fields)
    return make


@pytest.fixture(scope="session")
def docker_engine():
    """The Docker engine and the sandbox image. Without them: a skip locally, a failure in CI."""
    from prefect_rollouts.errors import RuntimeUnavailableError
    from prefect_rollouts.runtimes.docker.engine import docker_client

    try:
        client = docker_client()
        client.images.get(vf.RuntimeConfig().image)
    except Exception as exc:  # no engine, or no sandbox image
        unavailable(f"Docker tests need a running engine and the sandbox image ({exc})",
                    "CI must provide them (.ci/run)")
    assert not isinstance(client, RuntimeUnavailableError)
    return client


@pytest.fixture(scope="session")
def _moto_endpoint():
    """moto's S3 server on loopback for the whole session (use ``s3_dataset`` in tests)."""
    from tests.fakes.object_store import moto_s3

    with moto_s3() as endpoint:
        yield endpoint


@pytest.fixture
def s3_dataset(_moto_endpoint, monkeypatch):
    """``s3://<fresh bucket>/traces``: a dataset root on the loopback S3 server, reached the usual AWS
    way (credentials and ``AWS_ENDPOINT_URL`` in the environment)."""
    from tests.fakes.object_store import CREDENTIALS, new_bucket

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", _moto_endpoint)
    return f"s3://{new_bucket(_moto_endpoint)}/traces"

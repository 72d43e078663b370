"""No API key reaches a trace, a Parquet file, a flow run's parameters or a log."""

from __future__ import annotations

import json
import logging

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from prefect_rollouts.blocks import ModelEndpoint
from prefect_rollouts.eval_config import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_rollouts
from tests.fakes.openai_server import reply, status
from tests.prefect.test_eval_flow import eval_toml

BLOCK_KEY = "sk-block-secret-1234"
ENV_KEY = "sk-env-secret-5678"
HEADER_KEY = "hdr-secret-9012"


async def test_keys_from_a_block_and_from_the_environment_never_leak(tmp_path, openai_server, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    await ModelEndpoint(base_url=openai_server.base_url, api_key=BLOCK_KEY).save("scripted-endpoint", overwrite=True)
    monkeypatch.setenv("ROLLOUTS_TEST_KEY", ENV_KEY)
    # one request fails with a body that echoes the header, as some proxies do
    openai_server.default = lambda request: (
        status(401, body=f"bad {request.headers['authorization']} {request.headers.get('x-api-key')}")
        if "task 3" in request.messages[-1]["content"]
        else reply("0"))
    runs = {}
    for source in ("block", "env"):
        toml = eval_toml(tmp_path / source, openai_server.base_url, num_tasks=4, max_concurrent=2)
        if source == "block":
            toml = toml.replace('api_key_env = ""', 'endpoint = "scripted-endpoint"')
        else:
            toml = toml.replace('api_key_env = ""', f'api_key_env = "ROLLOUTS_TEST_KEY"\nheaders = {{ X-Api-Key = "{HEADER_KEY}" }}')
        runs[source] = await eval_flow(load_eval_config(toml), run_id=f"secret-{source}")
    sent = {r.headers.get("authorization") for r in openai_server.requests}
    assert sent == {f"Bearer {BLOCK_KEY}", f"Bearer {ENV_KEY}"}            # the keys were used
    assert {r.headers.get("x-api-key") for r in openai_server.requests} == {None, HEADER_KEY}
    secrets = (BLOCK_KEY, ENV_KEY, HEADER_KEY)

    leaks = []
    for path in tmp_path.rglob("*"):
        if path.is_file() and any(secret.encode() in path.read_bytes() for secret in secrets):
            leaks.append(str(path))
    async with get_client() as client:
        flow_runs = await client.read_flow_runs()
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in flow_runs])))
    for flow_run in flow_runs:
        if any(secret in json.dumps(flow_run.parameters, default=str) for secret in secrets):
            leaks.append(f"parameters of {flow_run.name}")
    leaks += [f"log: {log.message}" for log in logs if any(secret in log.message for secret in secrets)]
    leaks += [f"local log: {line}" for line in caplog.text.splitlines() if any(secret in line for secret in secrets)]
    assert leaks == []
    rows = read_rollouts(tmp_path / "block")
    assert "Bearer ***" in rows[rows["task_id"] == "n3"]["error_message"].iloc[0]   # the echo was scrubbed
    assert len(flow_runs) > 8 and logs

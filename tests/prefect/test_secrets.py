"""No API key, nor any piece of one, reaches a trace, a Parquet file, a flow run's parameters,
its state message or a log."""

from __future__ import annotations

import json
import logging
import re

import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

from prefect_rollouts.blocks import ModelEndpoint
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import echo_header, reply, secret_fragments, status

pytestmark = pytest.mark.prefect

BLOCK_KEY = "sk-7Hq2Zr9Wm4Xv8Bd"     # no word in them, so any 4 characters found are a leak
ENV_KEY = "sk-3Jt8Pd6Ky1Nc5Rf"
HEADER_KEY = "h-5Gw9Lb2Qx7Fs4Tz"

#: Task number -> the failing reply: a 401 whose body echoes a header at a character offset
#: where the client's 300-character cut halves the value (task 3: the whole header, early).
ECHOES = {1: ("authorization", 277), 2: ("authorization", 283), 4: ("authorization", 291),
          5: ("x-api-key", 290)}


def answer(request):
    number = int(re.search(r"task (\d+)", request.messages[-1]["content"]).group(1))
    if number == 3:
        return status(401, body=f"bad {request.headers['authorization']} {request.headers.get('x-api-key')}")
    if number in ECHOES:
        header, at = ECHOES[number]
        return echo_header(401, at=at, header=header)(request)
    return reply(str(number))


def leaks(text: str, where: str) -> list[str]:
    found = [piece for secret in (BLOCK_KEY, ENV_KEY, HEADER_KEY) for piece in secret_fragments(text, secret)]
    return [f"{where}: {found}"] if found else []


async def test_keys_from_a_block_and_from_the_environment_never_leak(tmp_path, openai_server, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    await ModelEndpoint(base_url=openai_server.base_url, api_key=BLOCK_KEY).save("scripted-endpoint", overwrite=True)
    monkeypatch.setenv("ROLLOUTS_TEST_KEY", ENV_KEY)
    # requests fail with a body that echoes a header, as some proxies do, where the cut halves it
    openai_server.default = answer
    runs = {}
    for source in ("block", "env"):
        toml = eval_toml(tmp_path / source, openai_server.base_url, num_tasks=6, max_concurrent=2,
                         rollout_granularity="flow", max_error_fraction=1)   # flow runs carry the most parameters
        if source == "block":
            toml = toml.replace('api_key_env = ""', 'endpoint = "scripted-endpoint"')
        else:
            toml = toml.replace('api_key_env = ""',
                                f'api_key_env = "ROLLOUTS_TEST_KEY"\nheaders = {{ X-Api-Key = "{HEADER_KEY}" }}')
        runs[source] = await eval_flow(load_eval_config(toml), run_id=f"secret-{source}")
    sent = {r.headers.get("authorization") for r in openai_server.requests}
    assert sent == {f"Bearer {BLOCK_KEY}", f"Bearer {ENV_KEY}"}            # the keys were used
    assert {r.headers.get("x-api-key") for r in openai_server.requests} == {None, HEADER_KEY}
    secrets = (BLOCK_KEY, ENV_KEY, HEADER_KEY)

    found = []
    for path in tmp_path.rglob("*"):
        if not path.is_file():
            continue
        if any(secret.encode() in path.read_bytes() for secret in secrets):
            found.append(str(path))
        text = (json.dumps(pq.read_table(path).to_pylist(), default=str) if path.suffix == ".parquet"
                else path.read_bytes().decode("utf-8", "replace"))
        found += leaks(text, str(path))
    async with get_client() as client:
        flow_runs = await client.read_flow_runs()
        logs = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in flow_runs])))
    for flow_run in flow_runs:
        found += leaks(json.dumps(flow_run.parameters, default=str), f"parameters of {flow_run.name}")
        found += leaks(str(flow_run.state.message if flow_run.state else ""), f"state of {flow_run.name}")
    for log in logs:
        found += leaks(log.message, "log")
    found += leaks(caplog.text, "local log")
    assert found == []
    rows = read_rollouts(tmp_path / "block")
    assert "Bearer ***" in rows[rows["task_id"] == "n3"]["error_message"].iloc[0]   # the echo was scrubbed
    env_rows = read_rollouts(tmp_path / "env")
    assert set(env_rows[env_rows["is_error"]]["task_id"]) == {"n1", "n2", "n3", "n4", "n5"}
    assert len(flow_runs) > 12 and logs

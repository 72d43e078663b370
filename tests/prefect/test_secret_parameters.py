"""No secret of an eval config reaches what the Prefect server stores: flow runs' parameters,
deployments, artifacts, variables and events, neither as written nor as the base64 of
``user:password`` that httpx sends for userinfo in a URL (issue 19, item 1)."""

from __future__ import annotations

import base64
import json

import pytest
from prefect.client.orchestration import get_client

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply

pytestmark = pytest.mark.prefect

RUNTIME_SECRET = "rt-8Kd3Wq7Zp2Lx5Vn"     # no word in them, so any 4 characters found are a leak
SCORING_SECRET = "sc-4Hm9Tb6Yc1Rj8Gs"
HOST_SECRET = "hv-2Nf7Qa5Xe3Uw9Dk"      # reaches the runtime through ${ROLLOUTS_TEST_HOST_VAR} only
URL_SECRET = "ul-6Pz1Ck8Ms4Jt7Bh"
JUDGE_URL_SECRET = "ju-3Ve5Gy9Lw2Oq6Fa"
SECRETS = (RUNTIME_SECRET, SCORING_SECRET, HOST_SECRET, URL_SECRET, JUDGE_URL_SECRET,
           *(base64.b64encode(f"u:{key}".encode()).decode() for key in (URL_SECRET, JUDGE_URL_SECRET)))


def leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS for i in range(len(secret) - 7) if secret[i:i + 8] in text][:1]


async def stored_by_prefect() -> dict[str, str]:
    """Everything the Prefect server holds that a config could reach, as text per place."""
    async with get_client() as client:
        places = {f"parameters of flow run {run.name}": json.dumps(run.parameters)
                  for run in await client.read_flow_runs()}
        places |= {f"deployment {d.name}": json.dumps(d.parameters) for d in await client.read_deployments()}
        places |= {f"artifact {a.key}": json.dumps([a.data, a.description], default=str)
                   for a in await client.read_artifacts()}
        places |= {f"variable {v.name}": json.dumps(v.value) for v in await client.read_variables()}
        page = await client.read_events(limit=50)
        events = list(page.events)
        while page.next_page is not None:
            page = await client.read_events_page(page.next_page)
            events += page.events
        places |= {f"event {e.event} of {e.resource.id}": e.model_dump_json() for e in events}
    return places


async def test_no_secret_of_the_config_reaches_a_flow_run_parameter_or_anything_prefect_stores(
        tmp_path, openai_server, monkeypatch):
    monkeypatch.setenv("ROLLOUTS_TEST_HOST_VAR", HOST_SECRET)
    monkeypatch.setenv("ROLLOUTS_TEST_EXPECTED", f"{RUNTIME_SECRET}|{SCORING_SECRET}|{HOST_SECRET}")
    openai_server.default = reply("ok")
    # literal environment values in the runtime's and scoring's env tables, and a ${VAR} template
    env_toml = eval_toml(tmp_path / "env", openai_server.base_url, taskset={"id": "tests.prefect.tasksets:env_seen"},
                         rollout_granularity="flow")
    env_toml += (f'[env.agent.runtime]\nenv = {{ RUNTIME_TOKEN = "{RUNTIME_SECRET}", '
                 'FROM_HOST = "${ROLLOUTS_TEST_HOST_VAR}" }\n'
                 f'[env.agent.scoring]\nenv = {{ SCORING_TOKEN = "{SCORING_SECRET}" }}\n')
    summary = await eval_flow(load_eval_config(env_toml), run_id="secret-env")
    # userinfo in the agent's base_url and in a judge's
    userinfo_url = openai_server.base_url.replace("://", f"://u:{URL_SECRET}@")
    judge_url = openai_server.base_url.replace("://", f"://u:{JUDGE_URL_SECRET}@")
    url_toml = eval_toml(tmp_path / "url", userinfo_url, rollout_granularity="flow", num_tasks=2)
    url_toml += (f'[[env.agent.scoring.judges]]\nid = "reference"\nmodel = "scripted"\n'
                 f'client = {{ base_url = "{judge_url}", api_key_env = "" }}\n')
    refused = None
    try:
        await eval_flow(load_eval_config(url_toml), run_id="secret-url", return_state=True)
    except ConfigError as exc:
        refused = str(exc)

    found = {place: hit for place, text in (await stored_by_prefect()).items() if (hit := leaks(text))}
    assert found == {}
    assert not [r for r in openai_server.requests if "basic" in r.headers.get("authorization", "").lower()]
    # the literal values and the template still reached the commands: every rollout saw all three
    assert summary.rollouts == 2 and read_rollouts(tmp_path / "env")["reward"].tolist() == [1.0, 1.0]
    assert refused is not None and "[env.agent.client] base_url" in refused
    assert "[env.agent.scoring.judges[0].client] base_url" in refused and "api_key_env" in refused
    assert URL_SECRET not in refused and JUDGE_URL_SECRET not in refused

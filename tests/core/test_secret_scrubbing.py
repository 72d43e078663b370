"""No piece of an API key reaches a trace or Parquet, whatever cut the text went through:
model and judge errors, tool output and task errors are scrubbed before they are cut."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

import prefect_rollouts as vf
from prefect_rollouts.traces import TraceWriter
from tests.fakes.openai_server import echo_header, reply, secret_fragments, tool_call

pytestmark = pytest.mark.unit

AGENT_KEY = "sk-Wm4Xv8Bd7Hq2Zr9J"
JUDGE_KEY = "sk-Pd6Ky1Nc5Rf3Jt8G"
HEADER_KEY = "h-5Gw9Lb2Qx7Fs4Tz"
SECRETS = (AGENT_KEY, JUDGE_KEY, HEADER_KEY)
TOOL_CAP = 256


class Leaky(vf.Task):
    """A tool that prints the agent's key past the output cap, and a reward that raises with it."""

    def tools(self):
        def dump(at: int) -> str:
            """Print a long text with the key at character ``at``.

            Args:
                at: Where the key starts.
            """
            return ("y" * at + f"KEY={AGENT_KEY}").ljust(TOOL_CAP * 2, "y")
        return [dump]

    @vf.reward
    def raises(self, trace):
        if "raise" in str(self.data.prompt):
            raise ValueError(f"could not score with key {AGENT_KEY} and {HEADER_KEY}")
        return 1.0


def leaks(text: str) -> list[str]:
    return [piece for secret in SECRETS for piece in secret_fragments(text, secret)]


async def test_no_piece_of_a_key_reaches_the_trace_or_parquet_at_any_cut_offset(openai_server, agent_config,
                                                                                  monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_KEY_VAR", AGENT_KEY)
    monkeypatch.setenv("JUDGE_KEY_VAR", JUDGE_KEY)
    retries = vf.RetryConfig(max_retries=0)
    client = vf.ClientConfig(base_url=openai_server.base_url, api_key_env="AGENT_KEY_VAR", retries=retries,
                             headers={"X-Api-Key": HEADER_KEY})
    judge = {"id": "reference", "model": "judge",
             "client": {"base_url": openai_server.base_url, "api_key_env": "JUDGE_KEY_VAR",
                        "retries": {"max_retries": 0}}}
    scoring = vf.ScoringConfig.model_validate({"judges": [judge]})
    echoed = len(f"Bearer {AGENT_KEY}")
    offsets = range(300 - echoed - 1, 302)      # the model client cuts an error body at 300 characters
    shown = len(f"model endpoint: POST {openai_server.base_url}/chat/completions returned 401: ")
    # a judge also cuts its message at 300
    judge_offsets = [*range(300 - shown - echoed - 1, 300 - shown + 2), *offsets]
    tool_offsets = range(TOOL_CAP - len(f"KEY={AGENT_KEY}") - 1, TOOL_CAP + 1)
    traces = []
    async with vf.make_agent(agent_config(client=client, harness=vf.HarnessConfig(
            runtime_tools=[], tool_output_cap_chars=TOOL_CAP), scoring=scoring)) as agent:
        for at in offsets:                      # the agent's endpoint echoes its key across the cut
            openai_server.play([echo_header(401, at=at)])
            traces.append(await agent.run(Leaky(vf.TaskData(prompt="go", answer="1"))))
        for at in tool_offsets:                 # the tool prints the key across the output cap
            openai_server.play([tool_call("dump", at=at), reply("1"), reply("yes")])
            traces.append(await agent.run(Leaky(vf.TaskData(prompt="go", answer="1"))))
        for at in judge_offsets:                # the judge's endpoint echoes the judge's key across the cut
            openai_server.play([reply("1"), echo_header(401, at=at)])
            traces.append(await agent.run(Leaky(vf.TaskData(prompt="go", answer="1"))))
        openai_server.play([reply("1"), reply("yes")])   # a reward raises with the keys in its message
        traces.append(await agent.run(Leaky(vf.TaskData(prompt="raise", answer="1"))))
    sent = {(r.headers.get("authorization"), r.headers.get("x-api-key")) for r in openai_server.requests}
    assert (f"Bearer {AGENT_KEY}", HEADER_KEY) in sent and (f"Bearer {JUDGE_KEY}", None) in sent
    assert [t.errors[0].type for t in traces[:len(offsets)]] == ["ProviderError"] * len(offsets)
    assert all(t.model_calls[0].error and t.errors[0].message for t in traces[:len(offsets)])
    assert all(len(t.tool_calls) == 1 for t in traces[len(offsets):len(offsets) + len(tool_offsets)])
    assert {t.errors[0].type for t in traces[-len(judge_offsets) - 1:-1]} == {"JudgeError"}
    assert traces[-1].errors[0].type == "TaskError" and "***" in traces[-1].errors[0].message

    writer = TraceWriter(tmp_path, "secrets")
    for index, trace in enumerate(traces):
        writer.add(trace, rollout_index=index, environment="leaky", config_hash="h", elapsed_s=1.0)
    writer.flush()
    found = {f"trace {t.id}": leaks(t.model_dump_json()) for t in traces}
    for path in tmp_path.rglob("*.parquet"):
        found[str(path)] = leaks(json.dumps(pq.read_table(path).to_pylist(), default=str))
    assert {where: pieces for where, pieces in found.items() if pieces} == {}


async def test_a_reply_echoing_the_key_in_its_content_or_tool_arguments_is_scrubbed(openai_server, agent_config,
                                                                                   monkeypatch):
    monkeypatch.setenv("AGENT_KEY_VAR", AGENT_KEY)
    client = vf.ClientConfig(base_url=openai_server.base_url, api_key_env="AGENT_KEY_VAR",
                             retries=vf.RetryConfig(max_retries=0))

    def echo_in_content(request):
        return reply("your header was " + request.headers.get("authorization", ""))

    def echo_in_arguments(request):
        return tool_call("dump", at=0, note=request.headers.get("authorization", ""))
    openai_server.play([echo_in_arguments, echo_in_content])
    async with vf.make_agent(agent_config(client=client, harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        trace = await agent.run(Leaky(vf.TaskData(prompt="go", answer="1")))
    assert trace.last_reply == "your header was Bearer ***"
    assert leaks(trace.model_dump_json()) == []

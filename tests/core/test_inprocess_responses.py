"""The in-process harnesses and judges over OpenAI Responses (``api = "responses"``) against the scripted
server's Responses route (real sockets): a tools rollout's round trip resends the reasoning item in place,
an interaction carries the conversation, a judge's call is a Responses request."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from tests.core.test_judges import capital, judge_requests
from tests.core.test_run import Calculator
from tests.fakes.openai_server import reply
from tests.fakes.responses_server import function_call, output, reasoning, usage_of

pytestmark = pytest.mark.unit


@pytest.fixture
def over_responses(agent_config, openai_server):
    """``agent_config`` whose client speaks Responses to the scripted server."""
    def make(**fields):
        client = vf.ClientConfig(base_url=openai_server.base_url, api="responses", api_key_env="", timeout=10,
                                 retries=vf.RetryConfig(max_retries=1, backoff_s=0.01, max_backoff_s=0.05))
        return agent_config(client=client, **fields)
    return make


async def test_a_tools_rollout_resends_the_reasoning_item_in_place_with_the_call(openai_server, over_responses):
    thought = reasoning("add them", "gAAAAB-opaque-tools", "rs_t")
    openai_server.play([output(thought, function_call("add", {"a": 2, "b": 3}, "call_t", "fc_t"),
                               usage=usage_of(120, 40, cached=64, reasoning_tokens=30)), reply("5")])
    config = over_responses(harness=vf.HarnessConfig(id="tools", runtime_tools=[]))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Calculator(vf.TaskData(prompt="add 2 and 3")))
    assert trace.reward == 1.0 and [(t.name, t.output) for t in trace.tool_calls] == [("add", "5")]
    first, second = (request.body for request in openai_server.requests)
    add = next(tool for tool in first["tools"] if tool["name"] == "add")
    assert (add["type"], add["strict"], add["parameters"]["required"]) == ("function", False, ["a", "b"])
    assert first["input"] == [{"type": "message", "role": "user", "content": "add 2 and 3"}] and not first["store"]
    assert second["input"][1:] == [
        thought, {"type": "function_call", "call_id": "call_t", "name": "add", "arguments": '{"a": 2, "b": 3}',
                  "id": "fc_t", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_t", "output": "5"}]
    assert trace.messages[1]["content"] == [thought] and trace.last_reply == "5"
    assert (trace.usage.cached_tokens, trace.usage.reasoning_tokens) == (64, 30)
    assert trace.model_calls[0].finish_reason == "tool_calls"


async def test_an_interaction_carries_the_conversation_over_responses(openai_server, over_responses):
    openai_server.play([reply("hello"), reply("again")])
    async with vf.make_agent(over_responses()) as agent:
        async with agent.interaction(vf.Task(vf.TaskData(prompt=None))) as interaction:
            first = await interaction.turn("hi")
            second = await interaction.turn("once more")
    assert (first.last_reply, second.last_reply) == ("hello", "again")
    assert [(item["role"], item["content"]) for item in openai_server.requests[1].body["input"]] == [
        ("user", "hi"), ("assistant", [{"type": "output_text", "text": "hello"}]), ("user", "once more")]


async def test_a_judge_speaks_responses_when_its_client_does(openai_server, agent_config):
    openai_server.play([reply("It is Paris."), reply("Yes.", usage={"prompt_tokens": 40, "completion_tokens": 2})])
    client = {"base_url": openai_server.base_url, "api": "responses", "api_key_env": "",
              "retries": {"max_retries": 1, "backoff_s": 0.01}}
    scoring = vf.ScoringConfig.model_validate({"judges": [{"id": "reference", "model": "judge", "client": client}]})
    async with vf.make_agent(agent_config(scoring=scoring)) as agent:
        trace = await agent.run(capital())
    (call,) = trace.judge_calls
    assert (call.verdict, call.reply, call.prompt_tokens, call.completion_tokens) == ("yes", "Yes.", 40, 2)
    assert trace.rewards["reference"] == 1.0
    (request,) = judge_requests(openai_server)
    assert request.path == "/v1/responses" and request.body["temperature"] == 0.0
    assert request.body["input"] == [{"type": "message", "role": "user", "content": call.prompt}]
    assert openai_server.requests[0].path == "/v1/chat/completions"   # the agent's own client speaks chat

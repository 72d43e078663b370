"""An agent whose client speaks Anthropic Messages (``api = "messages"``), the scripted Anthropic server
upstream (real sockets): the tools harness and a judge over it, and the interception endpoint passing a
Claude-Code-shaped conversation through with nothing lost but the imposed fields, answering thinking
blocks with their signatures, and running a tool round trip for every program dialect."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message

import prefect_rollouts as vf
from prefect_rollouts.config.base import PriceConfig
from tests.core.test_endpoint_dialects import WIRES, launched, rewrites_of
from tests.core.test_endpoint_messages import BETA, claude_code_body, events_of, served  # noqa: F401
from tests.core.test_program_harness import KEY
from tests.core.test_run import Calculator
from tests.fakes.anthropic_server import message, thinking, tool_use
from tests.fakes.openai_server import reply, tool_call

pytestmark = pytest.mark.unit

THINKING = thinking("2 + 3: ask the shell", "RXVzaWduYXR1cmVfMDE=")
REDACTED = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVkX3RoaW5raW5n"}


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", KEY)


@pytest.fixture
def messages_client(anthropic_server):
    return vf.ClientConfig(base_url=anthropic_server.base_url, api="messages", api_key_env="TEST_OPENAI_KEY",
                           timeout=10, retries=vf.RetryConfig(max_retries=1, backoff_s=0.01, max_backoff_s=0.05),
                           price=PriceConfig(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75))


async def test_the_tools_harness_runs_a_tool_round_trip_with_thinking_over_messages(
        anthropic_server, agent_config, messages_client):
    usage = {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 0,
             "cache_creation_input_tokens": 1_000}
    anthropic_server.play([message(THINKING, tool_use("add", "toolu_01Add", a=2, b=3), usage=usage), reply("5")])
    config = agent_config(harness=vf.HarnessConfig(id="tools", runtime_tools=[]), client=messages_client,
                          max_turn_tokens=256)
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Calculator(vf.TaskData(prompt="add 2 and 3", system_prompt="Use the tools.")))
    assert trace.reward == 1.0 and [(t.id, t.output) for t in trace.tool_calls] == [("toolu_01Add", "5")]
    second = anthropic_server.requests[1].body
    assert second["system"] == "Use the tools." and second["max_tokens"] == 256
    assert second["messages"][1:] == [
        {"role": "assistant", "content": [THINKING, {"type": "tool_use", "id": "toolu_01Add", "name": "add",
                                                     "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01Add", "content": "5"}]}]
    assert [tool["name"] for tool in second["tools"]] == ["add", "explode"]
    first_call = trace.model_calls[0]
    assert (first_call.prompt_tokens, first_call.cache_write_tokens, first_call.finish_reason) == (1_100, 1_000,
                                                                                                   "tool_calls")
    assert trace.usage.cache_write_tokens == 1_000
    assert trace.usage.cost_usd == pytest.approx((100 * 3 + 1_000 * 3.75 + 20 * 15 + 30 * 3 + 1 * 15) / 1e6)


async def test_a_judge_grades_over_messages(anthropic_server, openai_server, agent_config, messages_client):
    openai_server.play([reply("It is Paris.")])
    anthropic_server.play([reply("Yes.")])
    judge = {"id": "reference", "model": "claude-judge", "client": messages_client.model_dump()}
    scoring = vf.ScoringConfig.model_validate({"judges": [judge]})

    class Capital(vf.Task):
        pass

    async with vf.make_agent(agent_config(scoring=scoring)) as agent:
        trace = await agent.run(Capital(vf.TaskData(prompt="Capital of France?", answer="Paris")))
    assert trace.rewards == {"reference": 1.0} and trace.judge_calls[0].verdict == "yes"
    sent = anthropic_server.requests[0]
    assert sent.body["model"] == "claude-judge" and sent.headers["x-api-key"] == KEY
    assert "Paris" in sent.body["messages"][0]["content"] and trace.judge_usage.prompt_tokens == 10


async def test_claude_codes_conversation_reaches_a_messages_upstream_as_it_sent_it(
        served, anthropic_server, messages_client):   # noqa: F811
    """The issue's done-when, in-process: thinking blocks and signatures, redacted thinking, cache marks,
    tool ids, is_error, the system turn, deferred tools, thinking/context-management settings and the
    anthropic-beta header arrive as Claude Code sent them; only the imposed fields (the model, streaming)
    differ, and nothing is recorded as lost."""
    anthropic_server.play([message(THINKING, REDACTED, tool_use("Bash", "toolu_01Bash", command="echo 5")),
                           reply("5")])
    s = await served(client=messages_client)
    headers = {"Authorization": f"Bearer {s.session.secret}", "anthropic-beta": BETA}
    first = await s.post(claude_code_body(), **headers)
    blocks = [event.content_block for event in events_of(first.text) if event.type == "content_block_start"]
    assert [block.type for block in blocks] == ["thinking", "redacted_thinking", "tool_use"]
    streamed = [event.delta for event in events_of(first.text) if event.type == "content_block_delta"]
    assert (streamed[0].thinking, streamed[1].signature) == (THINKING["thinking"], THINKING["signature"])
    assert blocks[2].id == "toolu_01Bash"
    resent = [{"role": "assistant", "content": [THINKING, REDACTED, {
        "type": "tool_use", "id": "toolu_01Bash", "name": "Bash", "input": {"command": "echo 5"}}]},
              {"role": "user", "content": [{"tool_use_id": "toolu_01Bash", "type": "tool_result", "content": "5",
                                            "is_error": False, "cache_control": {"type": "ephemeral"}}]}]
    body = claude_code_body(*resent)
    body["model"] = "claude-opus-4-5"
    second = await s.post(body, **headers)
    assert events_of(second.text)[2].delta.text == "5"
    upstream = anthropic_server.requests[1]
    imposed = {"model", "stream"}
    assert {k: v for k, v in upstream.body.items() if k not in imposed} == \
        {k: v for k, v in body.items() if k not in imposed}
    assert upstream.body["model"] == "scripted" and "stream" not in upstream.body
    sent, asked = upstream.body["messages"][2:], body["messages"][2:]   # byte for byte where it matters
    assert json.dumps(sent[0]["content"][:2]) == json.dumps(asked[0]["content"][:2])   # thinking, signatures
    assert json.dumps(upstream.body["system"]) == json.dumps(body["system"])   # cache marks
    assert upstream.headers["anthropic-beta"] == BETA and upstream.headers["x-api-key"] == KEY
    assert rewrites_of(s.trace, 1)["translated"] == {"dialect": "messages"}
    assert rewrites_of(s.trace, 1)["imposed"] == {"model": {"program": "claude-opus-4-5", "sent": "scripted"}}


async def test_a_thinking_reply_reaches_the_program_unchanged(served, anthropic_server, messages_client):  # noqa: F811
    usage = {"input_tokens": 7, "output_tokens": 9, "cache_read_input_tokens": 20, "cache_creation_input_tokens": 5}
    anthropic_server.play([message(THINKING, {"type": "text", "text": "5"}, usage=usage)])
    s = await served(client=messages_client)
    answer = await s.sdk.messages.create(model="m", max_tokens=64, messages=[{"role": "user", "content": "2+3?"}],
                                         thinking={"type": "enabled", "budget_tokens": 1024})
    assert [block.model_dump(exclude_none=True) for block in answer.content] == [THINKING,
                                                                               {"type": "text", "text": "5"}]
    assert (answer.usage.input_tokens, answer.usage.cache_read_input_tokens,
            answer.usage.cache_creation_input_tokens) == (7, 20, 5)
    assert anthropic_server.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    Message.model_validate(answer.model_dump())


TOOLS: dict[str, Any] = {
    "chat": [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}],
    "responses": [{"type": "function", "name": "Bash", "parameters": {"type": "object"}}],
    "messages": [{"name": "Bash", "input_schema": {"type": "object"}}],
}


def tool_round(name: str, answer: dict[str, Any]) -> tuple[str, list[Any]]:
    """``(the call id, the items that resend the call and its result "a.txt")`` of a dialect's answer."""
    if name == "chat":
        call = answer["choices"][0]["message"]["tool_calls"][0]
        return call["id"], [{"role": "assistant", "content": "", "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]
    if name == "responses":
        call = next(item for item in answer["output"] if item["type"] == "function_call")
        return call["call_id"], [call, {"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt"}]
    use = next(block for block in answer["content"] if block["type"] == "tool_use")
    return use["id"], [{"role": "assistant", "content": answer["content"]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                     "content": "a.txt"}]}]


@pytest.mark.parametrize("wire", WIRES, ids=[wire.name for wire in WIRES])
async def test_every_program_dialect_runs_a_tool_round_trip_to_a_messages_upstream(
        anthropic_server, agent_config, tmp_path, messages_client, wire):
    anthropic_server.play([tool_call("Bash", command="ls"), reply("a.txt is there")])
    key = "input" if wire.name == "responses" else "messages"
    async with launched(agent_config, tmp_path, wire, client=messages_client) as launch:
        body = wire.body([("user", "list the files")], {"tools": TOOLS[wire.name]})
        first = await launch.post(body)
        call_id, items = tool_round(wire.name, first.json())
        second = await launch.post({**body, key: [*body[key], *items]})
    assert second.status_code == 200 and wire.text(second.json()) == "a.txt is there"
    assert call_id.startswith("toolu_")
    sent = anthropic_server.requests[1].body
    assert sent["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "Bash",
                                           "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "a.txt"}]}]
    assert sent["tools"][0]["name"] == "Bash" and sent["max_tokens"] > 0


async def test_what_a_chat_program_asks_that_messages_has_no_field_for_is_recorded_lost(
        anthropic_server, agent_config, tmp_path, messages_client):
    anthropic_server.play([reply("ok")])
    wire = next(wire for wire in WIRES if wire.name == "chat")
    async with launched(agent_config, tmp_path, wire, client=messages_client) as launch:
        answer = await launch.ask([("user", "go")], seed=7, response_format={"type": "json_object"},
                                  parallel_tool_calls=False)
        trace = launch.interaction.trace
    assert answer.status_code == 200
    assert not {"seed", "response_format", "parallel_tool_calls"} & set(anthropic_server.requests[0].body)
    assert rewrites_of(trace, 0)["translated"] == {"dialect": "chat", "ignored": ["response_format", "seed"]}


async def test_sampling_extra_wins_over_the_programs_native_tool_choice_on_a_messages_upstream(
        anthropic_server, agent_config, tmp_path, messages_client):
    anthropic_server.play([reply("ok")])
    wire = next(wire for wire in WIRES if wire.name == "messages")
    extra = {"tool_choice": "none", "thinking": {"type": "disabled"}}
    async with launched(agent_config, tmp_path, wire, client=messages_client,
                        sampling=vf.SamplingConfig(extra=extra)) as launch:
        body = wire.body([("user", "go")], {"tools": TOOLS["messages"], "tool_choice": {"type": "any"},
                                            "thinking": {"type": "enabled", "budget_tokens": 2048}})
        assert (await launch.post(body)).status_code == 200
    sent = anthropic_server.requests[0].body
    assert (sent["tool_choice"], sent["thinking"]) == ({"type": "none"}, {"type": "disabled"})
    assert sent["tools"][0]["name"] == "Bash"   # not imposed: as the program sent them


def test_a_messages_request_rebuilt_for_a_messages_upstream_is_the_request_less_the_imposed_fields():
    """``MessagesDialect.to_chat`` to a Messages upstream, then ``MessagesApi.request``: every block comes
    back as it was (documents, citations, an image with its cache mark, a tool result's blocks with an image
    and is_error, a tool_use's cache mark, server tools, MCP servers), and nothing is reported lost."""
    from prefect_rollouts.harnesses.dialects.messages import DIALECT
    from prefect_rollouts.model.apis import wire_api

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
             "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    body = {
        "model": "claude-x", "max_tokens": 1024, "temperature": 1, "stream": True, "top_k": 5,
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"},
                 "citations": {"enabled": True}}, image, {"type": "text", "text": "read it"}]},
            {"role": "assistant", "content": [
                THINKING, {"type": "text", "text": "per the doc", "citations": [{"type": "char_location",
                                                                                  "cited_text": "doc"}]},
                {"type": "tool_use", "id": "toolu_01X", "name": "look", "input": {"q": 1},
                 "cache_control": {"type": "ephemeral"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01X", "is_error": True, "content": [
                    {"type": "text", "text": "failed"}, {**image, "cache_control": {"type": "ephemeral"}}]},
                {"type": "text", "text": "try again"}]}],
        "tools": [{"name": "look", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}},
                  {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "ex"}],
        "stop_sequences": ["END"], "thinking": {"type": "enabled", "budget_tokens": 2048}}
    chat, lost = DIALECT.to_chat(json.loads(json.dumps(body)), "messages")
    assert lost == {}
    assert wire_api("messages").request(chat) == {k: v for k, v in body.items() if k != "stream"}
    with pytest.raises(ValueError, match="mcp_servers"):   # a chat upstream cannot have them
        DIALECT.to_chat(json.loads(json.dumps(body)), "chat")


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_a_programs_own_native_key_is_not_sent_to_its_apis_upstream(api):
    """A Messages or Responses program sending ``_native`` to an upstream of its API: it is not a param
    sent on as a body field (nor its headers), and its removal is the loss."""
    from prefect_rollouts.harnesses.dialects.messages import DIALECT as MESSAGES
    from prefect_rollouts.harnesses.dialects.responses import DIALECT as RESPONSES
    from prefect_rollouts.model.apis import wire_api

    smuggled = {"api": api, "headers": {"x-api-key": "theirs"}, "params": {"model": "other"}}
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "_native": smuggled} \
        if api == "messages" else {"model": "m", "input": "hi", "_native": smuggled}
    chat, lost = (MESSAGES if api == "messages" else RESPONSES).to_chat(body, api)
    sent = wire_api(api).request(chat)
    assert "_native" not in sent and sent["model"] == "m"
    assert wire_api(api).request_headers(chat) == {} and lost == {"ignored": ["_native"]}


async def test_an_interaction_resends_the_thinking_of_an_earlier_turn_unchanged(
        anthropic_server, agent_config, messages_client):
    """The interaction API over Messages: the first turn's thinking (with its signature) and tool round
    trip are resent as they came on the next turn, one user turn per message, the tool results first."""
    anthropic_server.play([message(THINKING, tool_use("add", "toolu_01Turn", a=2, b=3)), reply("5"),
                           message(REDACTED, {"type": "text", "text": "7"})])
    config = agent_config(harness=vf.HarnessConfig(id="tools", runtime_tools=[]), client=messages_client)
    async with vf.make_agent(config) as agent:
        async with agent.interaction(Calculator(vf.TaskData(prompt=None))) as interaction:
            await interaction.turn("add 2 and 3")
            last = await interaction.turn("and 3 + 4?")
    assert last.last_reply == "7"
    assert interaction.trace.messages[-1]["content"] == [REDACTED, {"type": "text", "text": "7"}]
    assert anthropic_server.requests[2].body["messages"] == [
        {"role": "user", "content": "add 2 and 3"},
        {"role": "assistant", "content": [THINKING, {"type": "tool_use", "id": "toolu_01Turn", "name": "add",
                                                     "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01Turn", "content": "5"}]},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "and 3 + 4?"}]

"""ModelClient against real sockets: retries, Retry-After, error mapping, wire shapes."""

from __future__ import annotations

import time

import pytest

import prefect_rollouts as vf
from prefect_rollouts.model import ModelClient
from tests.fakes.openai_server import echo_header, malformed, reply, secret_fragments, status, tool_call
from tests.support.ports import free_port

pytestmark = pytest.mark.unit

BODY = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}]}
ECHOED_KEY = "sk-Qz8vKx3Lw7Rj2Tn5"


def client_for(base_url, **retry):
    policy = {"max_retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.05} | retry
    return ModelClient(vf.ClientConfig(base_url=base_url, api_key_env=None, timeout=2,
                                       retries=vf.RetryConfig(**policy)))


async def test_completion_parses_message_usage_and_finish_reason(openai_server):
    openai_server.play([tool_call("f", x=1)])
    client = client_for(openai_server.base_url)
    try:
        completion = await client.complete(BODY)
    finally:
        await client.aclose()
    assert completion.finish_reason == "tool_calls" and completion.retries == 0
    assert completion.message["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert (completion.prompt_tokens, completion.completion_tokens) == (10, 1)
    assert openai_server.requests[0].path == "/v1/chat/completions"


async def test_retry_after_is_honoured(openai_server):
    openai_server.play([status(429, headers={"Retry-After": "0.3"}), reply("ok")])
    client = client_for(openai_server.base_url, max_backoff_s=1.0)
    started = time.perf_counter()
    try:
        completion = await client.complete(BODY)
    finally:
        await client.aclose()
    assert completion.retries == 1 and time.perf_counter() - started >= 0.3


async def test_a_4xx_other_than_429_is_not_retried(openai_server):
    openai_server.default = status(401)
    client = client_for(openai_server.base_url)
    try:
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert (caught.value.status_code, caught.value.retryable, len(openai_server.requests)) == (401, False, 1)


async def test_a_401_names_the_variable_whose_key_was_refused_and_not_the_key(openai_server, monkeypatch):
    monkeypatch.setenv("TRIAL_KEY", "sk-ant-wrong-1234567890")
    openai_server.default = status(401)
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env="TRIAL_KEY", timeout=2))
    try:
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert "the server refused the key in client.api_key_env = 'TRIAL_KEY': export a valid key" in str(caught.value)
    assert "1234567890" not in str(caught.value)


async def test_a_404_hints_at_the_base_url(openai_server):
    client = client_for(openai_server.base_url.removesuffix("/v1"))
    try:
        with pytest.raises(vf.ProviderError, match=r"base_url usually ends in /v1, and the server must speak "
                                               r"client\.api = 'chat'") as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert caught.value.status_code == 404


async def test_a_malformed_body_is_retried_then_reported_as_502(openai_server):
    openai_server.play([malformed(), malformed(), reply("fine")])
    client = client_for(openai_server.base_url)
    try:
        completion = await client.complete(BODY)
        openai_server.default = malformed()
        with pytest.raises(vf.ProviderError, match="malformed body") as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert completion.retries == 2 and caught.value.status_code == 502


async def test_a_body_nested_past_the_bound_is_a_malformed_body_not_a_recursion_error(openai_server):
    openai_server.default = malformed("[" * 100_000 + "]" * 100_000)
    client = client_for(openai_server.base_url, max_retries=0)
    try:
        with pytest.raises(vf.ProviderError, match=r"malformed body \(ValueError: the body nests deeper than 128 "
                                                   r"levels \(MAX_JSON_DEPTH\)\)") as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert caught.value.status_code == 502


async def test_connection_refused_is_retried_then_reported_without_an_http_status():
    port = free_port()   # nothing listens on it
    client = client_for(f"http://127.0.0.1:{port}/v1", max_retries=1)
    try:
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert caught.value.status_code is None and caught.value.retries == 1 and caught.value.retryable
    assert f"failed: connection refused to 127.0.0.1:{port} (after 2 attempts)" in str(caught.value)
    refused = {"status_code": None, "error": f"failed: connection refused to 127.0.0.1:{port}"}
    assert caught.value.attempts == [refused, refused]


async def test_an_unresolvable_host_is_reported_as_such_without_an_http_status():
    client = client_for("http://no-such-host.invalid:8000/v1", max_retries=0)
    try:
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert caught.value.status_code is None
    assert "failed: cannot resolve host no-such-host.invalid (" in str(caught.value)


async def test_retrying_stops_at_max_elapsed_time(openai_server):
    openai_server.default = status(503, headers={"Retry-After": "0.2"})
    client = client_for(openai_server.base_url, max_retries=50, max_elapsed_s=0.5, max_backoff_s=0.2)
    try:
        with pytest.raises(vf.ProviderError):
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert 2 <= len(openai_server.requests) <= 5   # 0.5 s of 0.2 s waits, not the 51 requests max_retries allows


async def test_the_error_message_never_holds_the_api_key(openai_server, monkeypatch):
    monkeypatch.setenv("SECRET_KEY_VAR", "sk-do-not-print")
    openai_server.default = status(500, body="upstream exploded")
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env="SECRET_KEY_VAR",
                                         retries=vf.RetryConfig(max_retries=0)))
    try:
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert "sk-do-not-print" not in str(caught.value) and "upstream exploded" in str(caught.value)
    assert openai_server.requests[0].headers["authorization"] == "Bearer sk-do-not-print"


async def test_an_unset_key_variable_sends_no_header_and_warns_once(openai_server, monkeypatch, caplog):
    monkeypatch.delenv("UNSET_KEY_VAR", raising=False)
    openai_server.default = reply("ok")
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env="UNSET_KEY_VAR"))
    try:
        await client.complete(BODY)
        await client.complete(BODY)
    finally:
        await client.aclose()
    assert "authorization" not in openai_server.requests[0].headers
    warnings = [r.getMessage() for r in caplog.records if "UNSET_KEY_VAR" in r.getMessage()]
    assert len(warnings) == 1 and "is not set" in warnings[0]


async def test_a_key_echoed_at_any_offset_around_the_cut_leaves_no_piece_of_it(openai_server, monkeypatch):
    monkeypatch.setenv("ECHOED_KEY_VAR", ECHOED_KEY)
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env="ECHOED_KEY_VAR",
                                         retries=vf.RetryConfig(max_retries=0)))
    echoed = len(f"Bearer {ECHOED_KEY}")
    messages = []
    try:  # error bodies are cut at 300 characters, malformed (200) bodies at 200: before, across, after
        for code, cut in ((401, 300), (200, 200)):
            for at in range(cut - echoed - 2, cut + 3):
                openai_server.play([echo_header(code, at=at)])
                with pytest.raises(vf.ProviderError) as caught:
                    await client.complete(BODY)
                messages.append(str(caught.value))
    finally:
        await client.aclose()
    assert len(messages) == 2 * (echoed + 5) and "Bearer ***" in messages[0]
    assert [(m, secret_fragments(m, ECHOED_KEY)) for m in messages if secret_fragments(m, ECHOED_KEY)] == []


async def test_cached_and_reasoning_tokens_are_kept_and_absent_ones_stay_none(openai_server):
    detailed = {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70,
                "prompt_tokens_details": {"cached_tokens": 32}, "completion_tokens_details": {"reasoning_tokens": 12}}
    openai_server.play([reply("a", usage=detailed), reply("b"),
                        reply("c", usage={"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": None})])
    client = client_for(openai_server.base_url)
    try:
        results = [await client.complete(BODY) for _ in range(3)]
    finally:
        await client.aclose()
    assert [(c.cached_tokens, c.reasoning_tokens) for c in results] == [(32, 12), (None, None), (None, None)]


async def test_each_failed_attempt_keeps_its_status_and_scrubbed_error(openai_server, monkeypatch):
    monkeypatch.setenv("ECHOED_KEY_VAR", ECHOED_KEY)
    openai_server.play([status(500, body="upstream exploded"), echo_header(503, at=290), reply("ok")])
    client = ModelClient(vf.ClientConfig(base_url=openai_server.base_url, api_key_env="ECHOED_KEY_VAR", timeout=2,
                                         retries=vf.RetryConfig(max_retries=2, backoff_s=0.01, max_backoff_s=0.05)))
    try:
        completion = await client.complete(BODY)
        openai_server.play([status(429, headers={"Retry-After": "0"}), status(401)])
        with pytest.raises(vf.ProviderError) as caught:
            await client.complete(BODY)
    finally:
        await client.aclose()
    assert completion.retries == 2
    assert [a["status_code"] for a in completion.attempts] == [500, 503]
    assert "upstream exploded" in completion.attempts[0]["error"]
    assert secret_fragments(completion.attempts[1]["error"], ECHOED_KEY) == []
    assert all(sorted(a) == ["error", "status_code"] for a in completion.attempts)
    assert [a["status_code"] for a in caught.value.attempts] == [429, 401] and caught.value.retries == 1


async def test_an_unset_key_variable_is_warned_about_once_per_process_not_per_agent(openai_server, monkeypatch,
                                                                                      caplog):
    monkeypatch.delenv("PR_TEST_UNSET_KEY_ONCE", raising=False)
    openai_server.play([reply("a"), reply("b"), reply("c")])
    config = vf.AgentConfig(model="scripted", harness="chat", orchestrator="inline", client=vf.ClientConfig(
        base_url=openai_server.base_url, api_key_env="PR_TEST_UNSET_KEY_ONCE"))
    with caplog.at_level("WARNING", logger="prefect_rollouts.model"):
        for _ in range(3):
            async with vf.make_agent(config) as agent:
                await agent.run(vf.Task(vf.TaskData(prompt="hi")))
    warned = [r.getMessage() for r in caplog.records if "PR_TEST_UNSET_KEY_ONCE" in r.getMessage()]
    assert len(warned) == 1, warned
    assert warned[0].startswith("client.api_key_env = 'PR_TEST_UNSET_KEY_ONCE': the variable is not set")


async def test_parts_only_another_dialect_takes_stay_off_the_chat_request(openai_server):
    """A Responses reasoning item and an Anthropic thinking block with a cache mark ride on the
    trace's messages (``trace.KEPT_PART_TYPES``); the chat-completions request leaves them out."""
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": [reasoning, {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}],
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "u"}}]}]
    kept = [dict(message) for message in messages]
    openai_server.play([reply("ok")])
    client = client_for(openai_server.base_url)
    try:
        await client.complete({"model": "scripted", "messages": messages})
    finally:
        await client.aclose()
    assert openai_server.requests[0].messages == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ab"},
        {"role": "assistant", "content": "", "tool_calls": messages[2]["tool_calls"]},
        messages[3], messages[4]]
    assert messages == kept   # the trace's messages are not touched


def test_the_wire_api_is_one_the_client_speaks():
    """``api`` is validated with the config (a clear error naming the field), and chat is the default."""
    from pydantic import ValidationError
    assert vf.ClientConfig().api == "chat"
    with pytest.raises(ValidationError, match="api"):
        vf.ClientConfig(api="grpc")

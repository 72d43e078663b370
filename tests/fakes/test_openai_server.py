"""Self-tests of the scripted OpenAI server fake, using httpx over real sockets."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.fakes.openai_server import (
    RecordedRequest,
    ScriptedOpenAIServer,
    delayed,
    malformed,
    reply,
    status,
    tool_call,
    tool_calls,
)

pytestmark = pytest.mark.unit

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


@pytest.fixture
def server():
    with ScriptedOpenAIServer() as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=10) as c:
        yield c


def chat(client: httpx.Client, messages=MESSAGES, **extra) -> httpx.Response:
    return client.post("/chat/completions", json={"model": "m", "messages": messages, **extra})


def test_base_url_and_not_started():
    srv = ScriptedOpenAIServer()
    with pytest.raises(RuntimeError):
        _ = srv.base_url
    with srv:
        assert srv.base_url.startswith("http://127.0.0.1:") and srv.base_url.endswith("/v1")
    srv.stop()  # idempotent


def test_reply_shape_and_default_usage(server, client):
    server.play([reply("three word answer")])
    r = chat(client)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and body["model"] == "scripted"
    assert body["choices"] == [{"index": 0, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "three word answer"}}]
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}


def test_reply_custom_usage_model_finish_reason(server, client):
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    server.play([reply("", finish_reason="length", usage=usage, model="x")])
    body = chat(client).json()
    assert body["usage"] == usage and body["model"] == "x"
    assert body["choices"][0]["finish_reason"] == "length"


def test_tool_call_arguments_json_and_unique_ids(server, client):
    server.play([tool_call("search", query="cats", limit=3), tool_call("name_clash", name="n")])
    first, second = chat(client).json(), chat(client).json()
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "search"
    assert json.loads(call["function"]["arguments"]) == {"query": "cats", "limit": 3}
    [call2] = second["choices"][0]["message"]["tool_calls"]
    assert json.loads(call2["function"]["arguments"]) == {"name": "n"}
    assert (call["id"], call2["id"]) == ("call_1", "call_2")


def test_raw_arguments_verbatim(server, client):
    server.play([tool_call("search", raw_arguments='{"query": oops')])
    [call] = chat(client).json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["arguments"] == '{"query": oops'


def test_tool_calls_several(server, client):
    server.play([tool_calls(("a", {"x": 1}), ("b", {}), content="thinking")])
    msg = chat(client).json()["choices"][0]["message"]
    assert msg["content"] == "thinking"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg["tool_calls"]] == [("a", {"x": 1}), ("b", {})]
    assert len({c["id"] for c in msg["tool_calls"]}) == 2


def test_status_with_retry_after(server, client):
    server.play([status(429, headers={"Retry-After": "0"}), status(503, body={"error": "x"})])
    r = chat(client)
    assert r.status_code == 429 and r.headers["retry-after"] == "0"
    assert r.json() == {"error": {"message": "scripted 429"}}
    r = chat(client)
    assert r.status_code == 503 and r.json() == {"error": "x"}


def test_delayed_actually_delays(server, client):
    server.play([delayed(0.3, reply("late"))])
    start = time.perf_counter()
    r = chat(client)
    elapsed = time.perf_counter() - start
    assert r.json()["choices"][0]["message"]["content"] == "late"
    assert elapsed >= 0.3   # how much later: benchmarks/scripted_server.py


def test_malformed_body(server, client):
    server.play([malformed(), malformed("{truncated")])
    r = chat(client)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.text == "not json"
    with pytest.raises(json.JSONDecodeError):
        r.json()
    assert chat(client).text == "{truncated"


def test_callable_step_sees_request(server, client):
    seen: list[RecordedRequest] = []

    def step(request: RecordedRequest):
        seen.append(request)
        return reply(f"{len(request.messages)} msgs, last: {request.messages[-1]['content']}")

    server.play([step, lambda req: delayed(0.01, lambda r2: status(418))])
    assert chat(client).json()["choices"][0]["message"]["content"] == "2 msgs, last: hi"
    assert seen[0] is server.requests[0]
    assert chat(client).status_code == 418


def test_callable_step_error_becomes_500(server, client):
    server.play([lambda req: 1 / 0, lambda req: "not a step"])
    r = chat(client)
    assert r.status_code == 500 and "ZeroDivisionError" in r.json()["error"]["message"]
    assert chat(client).status_code == 500
    assert [type(e) for e in server.errors] == [ZeroDivisionError, TypeError]


def test_script_exhausted_then_default(server, client):
    server.play([reply("only")])
    assert chat(client).status_code == 200
    r = chat(client)
    assert r.status_code == 500 and r.json() == {"error": {"message": "script exhausted"}}
    server.default = reply("fallback")
    assert [chat(client).json()["choices"][0]["message"]["content"] for _ in range(2)] == [
        "fallback", "fallback"]
    assert server.remaining == 0


def test_requests_recorded_with_headers_and_body(server, client):
    server.play([reply("a")])
    client.post(
        "/chat/completions?x=1", headers={"Authorization": "Bearer sk-test"},
        json={"model": "m", "messages": MESSAGES, "tools": [{"type": "function"}]})
    client.post("/chat/completions", content=b"plain text")
    [first, second] = server.requests
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == "Bearer sk-test"
    assert first.body["tools"] == [{"type": "function"}] and first.messages == MESSAGES
    assert second.body == {"_raw": "plain text"} and second.messages == []


def test_models_and_unknown_paths(server, client):
    server.play([reply("kept")])
    r = client.get("/models")
    assert r.status_code == 200
    assert r.json() == {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
    assert client.get("/nope").status_code == 404
    assert client.post("/completions", json={}).status_code == 404
    assert chat(client).json()["choices"][0]["message"]["content"] == "kept"  # not consumed


def test_reset(server, client):
    server.play([reply("x")])
    server.default = reply("d")
    chat(client)
    server.reset()
    assert server.requests == [] and server.remaining == 0 and server.default is None
    assert chat(client).status_code == 500


def test_keep_alive_reuses_the_connection(server, client):
    server.default = reply("ok")
    ports = set()
    for _ in range(2):
        with client.stream("POST", "/chat/completions", json={"messages": MESSAGES}) as r:
            ports.add(r.extensions["network_stream"].get_extra_info("client_addr")[1])
            r.read()
    assert len(ports) == 1  # same local port -> same TCP connection
    # its speed (the delayed-ACK stall TCP_NODELAY avoids): benchmarks/scripted_server.py


def test_concurrent_requests_get_distinct_steps(server):
    n = 20
    server.play([delayed(0.05, reply(f"step {i}")) for i in range(n)])

    limits = httpx.Limits(max_connections=n)  # one connection per thread, shared client
    with httpx.Client(base_url=server.base_url, timeout=10, limits=limits) as c:
        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(lambda _: chat(c).json()["choices"][0]["message"]["content"],
                                    range(n)))
    assert sorted(answers) == sorted(f"step {i}" for i in range(n))
    assert len(server.requests) == n
    assert server.max_in_flight > 1   # handled in parallel, not serially (the wall: benchmarks/scripted_server.py)


def test_stop_closes_keep_alive_connections():
    with ScriptedOpenAIServer() as srv, httpx.Client(base_url=srv.base_url, timeout=5) as c:
        srv.default = reply("x")
        assert chat(c).status_code == 200
        srv.stop()
        with pytest.raises(httpx.TransportError):
            chat(c)


def test_session_fixture_is_reset(openai_server):
    assert openai_server.requests == [] and openai_server.remaining == 0
    openai_server.play([reply("from fixture")])
    with httpx.Client(base_url=openai_server.base_url) as c:
        assert chat(c).json()["choices"][0]["message"]["content"] == "from fixture"


async def test_async_client_concurrent(server):
    server.play([delayed(0.05, reply(str(i))) for i in range(10)])
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as c:
        rs = await asyncio.gather(*(c.post("/chat/completions", json={"messages": []})
                                    for _ in range(10)))
    assert sorted(int(r.json()["choices"][0]["message"]["content"]) for r in rs) == list(range(10))


def test_max_in_flight_counts_requests_answered_at_once(server):
    server.default = delayed(0.2, reply("ok"))
    with ThreadPoolExecutor(3) as pool, httpx.Client(base_url=server.base_url, timeout=10) as client:
        list(pool.map(lambda _: chat(client), range(3)))
    assert (server.max_in_flight, server.in_flight) == (3, 0)
    server.reset()
    assert server.max_in_flight == 0

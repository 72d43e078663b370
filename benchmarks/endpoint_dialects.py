"""Endpoint CPU per model call, per wire dialect: the same conversation sent as chat completions and as
OpenAI Responses (what Codex sends: two developer messages, a 17 KB one among them, eight function
tools, a tool round trip resent with a reasoning item; streamed as Codex streams), and Claude Code's
conversation as Anthropic Messages (three system blocks, a system turn among the messages, twelve tools,
a tool round trip with a thinking block and cache_control marks; about 50 KB as its first request).

Setup: one ``InterceptionEndpoint`` in this process with one ``ProgramSession`` whose model client is a
stand-in answering at once (no upstream, so this process's CPU is the endpoint's: HTTP parsing, the
body read, ``read_json``, the dialect's ``to_chat``, ``exchange`` with its rewrites and the recording in
``sample``, the upstream API's request built from it (``WireApi.request``), ``from_chat`` and the JSON
or SSE answer), once per upstream API (``ClientConfig.api``) the client speaks. The requests come from a child process over the
endpoint's Unix socket, one at a time on one keep-alive connection, so the client's CPU is not counted.

    .venv/bin/python benchmarks/endpoint_dialects.py [--calls 300]

Prints, per dialect and stream mode: the body size and this process's CPU per call (``time.process_time``
over the timed calls, after 20 warm-up calls), beside the target (<= 3 ms, the issue's, as for chat).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import prefect_rollouts as vf
from prefect_rollouts.harnesses.endpoint import InterceptionEndpoint
from prefect_rollouts.harnesses.session import ProgramSession
from prefect_rollouts.model.apis import API_NAMES, wire_api
from prefect_rollouts.model.client import Completion

TARGET_MS = 3.0
WARMUP = 20


class InstantClient:
    """A model client of wire API ``api`` that builds its request and answers at once with one text message."""

    def __init__(self, api: str) -> None:
        self.api = wire_api(api)
        self.config = vf.ClientConfig(api=api)   # type: ignore[arg-type]

    async def complete(self, body: dict[str, Any]) -> Completion:
        self.api.request(body)
        return Completion(message={"role": "assistant", "content": "done"}, finish_reason="stop",
                          prompt_tokens=9000, completion_tokens=3, retries=0, status_code=200, cached_tokens=8000)


def bodies() -> dict[str, dict[str, Any]]:
    """The same conversation in each dialect (Codex's shape, its texts replaced by filler)."""
    tools = [{"type": "function", "name": f"tool_{i}", "description": "d" * 300, "strict": False,
              "parameters": {"type": "object", "properties": {f"p{j}": {"type": "string", "description": "x" * 80}
                                                              for j in range(8)}}} for i in range(8)]
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "tool_0",
            "arguments": json.dumps({"p0": "echo $((2+3)) > answer.txt"}), "status": "completed"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "g" * 2000}
    responses = {
        "model": "m", "stream": True, "store": False, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k", "reasoning": {"summary": "auto"}, "tool_choice": "auto", "parallel_tool_calls": True,
        "tools": tools, "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "a" * 17000}]},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "b" * 2500}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "c" * 370}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is 2 + 3?"}]},
            reasoning, call, {"type": "function_call_output", "call_id": "call_1", "output": "o" * 100}]}
    chat = {"model": "m", "stream": True, "tool_choice": "auto", "parallel_tool_calls": True,
            "tools": [{"type": "function", "function": {key: tool[key] for key in ("name", "description", "parameters")}}
                      for tool in tools],
            "messages": [{"role": "system", "content": "a" * 17000 + "\n\n" + "b" * 2500},
                         {"role": "user", "content": "c" * 370}, {"role": "user", "content": "What is 2 + 3?"},
                         {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                          "function": {"name": "tool_0", "arguments": call["arguments"]}}]},
                         {"role": "tool", "tool_call_id": "call_1", "content": "o" * 100}]}
    messages = {
        "model": "m", "stream": True, "max_tokens": 32000, "metadata": {"user_id": "u" * 150},
        "thinking": {"type": "adaptive", "display": "updates"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328;"},
                   {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
                   {"type": "text", "text": "s" * 6800, "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": f"Tool{i}", "description": "d" * 2000, "input_schema": {
            "type": "object", "properties": {f"p{j}": {"type": "string", "description": "x" * 80} for j in range(5)}}}
            for i in range(12)],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "e" * 576}, {"type": "text", "text": "What is 2 + 3?"}]},
            {"role": "system", "content": [{"type": "text", "text": "c" * 9100, "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t" * 300, "signature": "g" * 400},
                                              {"type": "tool_use", "id": "toolu_1", "name": "Tool0",
                                               "input": {"p0": "echo $((2+3)) > answer.txt"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "o" * 100,
                                          "is_error": False, "cache_control": {"type": "ephemeral"}}]}]}
    return {"chat": chat, "chat (not streamed)": {**chat, "stream": False}, "responses": responses,
            "responses (not streamed)": {**responses, "stream": False}, "messages": messages,
            "messages (not streamed)": {**messages, "stream": False}}


async def _never() -> bool:
    return False


async def _nothing(*args: Any) -> None:
    return None


def client(socket_path: str, secret: str, path: str, body: bytes, calls: int, ready: Any) -> None:
    """The program's side, in a child process: ``calls`` requests, one after another."""
    import httpx
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://endpoint",
                      headers={"Authorization": f"Bearer {secret}", "x-api-key": secret,   # as Claude Code sends
                               "Content-Type": "application/json"}) as http:
        for index in range(calls):
            if index == WARMUP:
                ready.send("timed")
                ready.recv()
            answer = http.post(path, content=body)
            if answer.status_code != 200:   # say so: the parent waits for a word
                ready.send(f"failed: {answer.status_code} {answer.text[:300]}")
                return
    ready.send("done")


async def measure(endpoint: InterceptionEndpoint, name: str, body: dict[str, Any], calls: int,
                  upstream: str) -> tuple[int, float]:
    """``(body bytes, CPU ms per call)`` of ``calls`` requests of ``body`` to an ``upstream`` API."""
    trace = vf.Trace(task_id="t", model="m")
    ctx = SimpleNamespace(config=vf.AgentConfig(model="m"), trace=trace, client=InstantClient(upstream), stopped=False,
                          turn_limit_reached=lambda: False, steer_inbox=[], turns=0, segment_index=0, segment_inputs=0,
                          budget_reached=_never, charge=_nothing)
    session = ProgramSession(ctx, "p", None, carried=[])   # type: ignore[arg-type]
    endpoint.open_session(session)
    raw = json.dumps(body).encode()
    path = {"responses": "/v1/responses", "messages": "/v1/messages?beta=true"}.get(name.split()[0],
                                                                                    "/v1/chat/completions")
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.Process(target=client, args=(str(endpoint.socket_path), session.secret, path, raw,
                                                         WARMUP + calls, theirs))
    child.start()
    loop = asyncio.get_running_loop()
    said = await loop.run_in_executor(None, ours.recv)   # warmed up
    cpu = time.process_time()
    if said == "timed":
        ours.send("go")
        said = await loop.run_in_executor(None, ours.recv)   # done
    if said != "done":
        raise SystemExit(f"{name} -> {upstream}: {said}")
    cpu = time.process_time() - cpu
    child.join()
    endpoint.close_session(session)
    return len(raw), cpu / calls * 1e3


async def main(args: argparse.Namespace) -> None:
    endpoint = InterceptionEndpoint()
    await endpoint.start()
    try:
        print(f"{args.calls} calls per row after {WARMUP} warm-up calls; load average "
              f"{os.getloadavg()[0]:.2f}, cores {os.cpu_count()}")
        upstreams = []
        for api in API_NAMES:
            try:
                upstreams.append(wire_api(api).name)
            except ValueError:   # not spoken by this client (yet)
                continue
        for name, body in bodies().items():
            for upstream in upstreams:
                size, per_call = await measure(endpoint, name, body, args.calls, upstream)
                verdict = "ok" if per_call <= TARGET_MS else "over"
                print(f"  {name:26} -> {upstream:9} {size / 1024:6.1f} KiB  {per_call:6.2f} ms CPU per call  "
                      f"(target <= {TARGET_MS:g} ms: {verdict})")
    finally:
        await endpoint.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    asyncio.run(main(parser.parse_args()))

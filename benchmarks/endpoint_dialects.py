"""Endpoint CPU per model call, per (program dialect, upstream API) pair: the same conversation sent as
chat completions and as OpenAI Responses (what Codex sends: two developer messages, a 17 KB one among them, eight function
tools, a tool round trip resent with a reasoning item; streamed as Codex streams), and Claude Code's
conversation as Anthropic Messages (three system blocks, a system turn among the messages, twelve tools,
a tool round trip with a thinking block and cache_control marks; about 50 KB as its first request).

Setup: one ``InterceptionEndpoint`` in this process with one ``ProgramSession`` whose model client is a
stand-in answering at once in its upstream API (no socket, so this process's CPU is the endpoint's and the
wire API's: HTTP parsing, the body read, ``read_json``, the dialect's ``to_chat`` for that upstream,
``exchange`` with its rewrites and the recording in ``sample``, the API's ``request`` and the JSON
encoding of what would be sent, the decoding and ``parse`` of a canned answer (``ANSWERS``), ``from_chat``
and the JSON or SSE answer). The requests come from a child process over the endpoint's Unix socket, one
at a time on one keep-alive connection, so the client's CPU is not counted.

``PAIRS`` lists the (program dialect, upstream API) pairs measured, one line each; ``ANSWERS`` one canned
answer per upstream API.

    .venv/bin/python benchmarks/endpoint_dialects.py [--calls 300] [--pairs responses:responses,chat:chat]

Prints, per pair and stream mode: the body size, the size of what goes upstream (a translation sends less:
what it drops) and this process's CPU per call (``time.process_time``
over the timed calls, after 20 warm-up calls), beside the target (<= 3 ms, the issue's, as for chat); then,
per program dialect, pass-through (its own API upstream) beside the cheapest translation.
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
from prefect_rollouts.model.apis import wire_api
from prefect_rollouts.model.client import Completion

TARGET_MS = 3.0
WARMUP = 20

PAIRS: list[tuple[str, str]] = [
    ("chat", "chat"),
    ("chat", "responses"),
    ("responses", "chat"),
    ("responses", "responses"),
    ("messages", "chat"),
    ("messages", "responses"),
    ("chat", "messages"),
    ("responses", "messages"),
    ("messages", "messages"),
]
"""(program dialect, upstream API) pairs measured: one line per pair."""

ANSWERS: dict[str, dict[str, Any]] = {
    "chat": {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9000, "completion_tokens": 3, "total_tokens": 9003,
                  "prompt_tokens_details": {"cached_tokens": 8000}}},
    "responses": {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "m",
                  "output": [{"type": "message", "id": "msg_2", "status": "completed", "role": "assistant",
                              "content": [{"type": "output_text", "text": "done", "annotations": []}]}],
                  "usage": {"input_tokens": 9000, "output_tokens": 3, "total_tokens": 9003,
                            "input_tokens_details": {"cached_tokens": 8000, "cache_write_tokens": 0},
                            "output_tokens_details": {"reasoning_tokens": 0}}},
    "messages": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                 "stop_sequence": None, "content": [{"type": "text", "text": "done"}],
                 "usage": {"input_tokens": 1000, "output_tokens": 3, "cache_read_input_tokens": 8000,
                           "cache_creation_input_tokens": 0}},
}
"""A canned answer per upstream API, decoded and parsed on every call as the client would: the same reply
("done", the same usage) in each API's form, so a pair's cost is the endpoint's and the API's work, not the
answer's size (a reasoning item in a Responses answer, which chat cannot carry, adds its bytes)."""


class InstantClient:
    """A model client in ``api`` that answers every call at once: it builds and encodes the request as
    the real client does, then decodes and parses ``ANSWERS[api]``."""

    def __init__(self, api: str) -> None:
        self.api = wire_api(api)
        self.config = vf.ClientConfig(api=api)   # type: ignore[arg-type]
        self.answer = json.dumps(ANSWERS[api]).encode()
        self.sent = 0
        """Bytes of the last request it would have sent upstream."""

    async def complete(self, body: dict[str, Any]) -> Completion:
        self.sent = len(json.dumps(self.api.request(body)).encode())
        return self.api.parse(json.loads(self.answer), 0, 200)


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


async def _never() -> bool:
    return False


async def _uncharged(*args: Any) -> None:
    return None


async def measure(endpoint: InterceptionEndpoint, name: str, body: dict[str, Any], calls: int,
                  upstream: str) -> tuple[int, int, float]:
    """``(body bytes, bytes sent upstream, CPU ms per call)`` of ``calls`` requests of ``body`` to an
    ``upstream`` API."""
    trace = vf.Trace(task_id="t", model="m")
    stand_in = InstantClient(upstream)
    ctx = SimpleNamespace(config=vf.AgentConfig(model="m"), trace=trace, client=stand_in, stopped=False,
                          turn_limit_reached=lambda: False, steer_inbox=[], turns=0, segment_index=0, segment_inputs=0,
                          budget_reached=_never, charge=_uncharged)
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
    return len(raw), stand_in.sent, cpu / calls * 1e3


async def main(args: argparse.Namespace) -> None:
    endpoint = InterceptionEndpoint()
    await endpoint.start()
    try:
        print(f"{args.calls} calls per row after {WARMUP} warm-up calls; load average "
              f"{os.getloadavg()[0]:.2f}, cores {os.cpu_count()}")
        pairs = [tuple(pair.split(":")) for pair in args.pairs.split(",")] if args.pairs else PAIRS
        costs: dict[tuple[str, str], float] = {}
        for dialect, upstream in pairs:
            for name, body in bodies().items():
                if name.split()[0] != dialect:
                    continue
                size, sent, per_call = await measure(endpoint, name, body, args.calls, upstream)
                costs[(name, upstream)] = per_call
                verdict = "ok" if per_call <= TARGET_MS else "over"
                print(f"  {name:26} -> {upstream:10} {size / 1024:6.1f} KiB in, {sent / 1024:6.1f} KiB upstream  "
                      f"{per_call:6.2f} ms CPU per call  (target <= {TARGET_MS:g} ms: {verdict})")
        for (name, upstream), own in costs.items():
            if name.split()[0] != upstream:
                continue
            others = {up: cost for (other, up), cost in costs.items() if other == name and up != upstream}
            if others:
                cheapest = min(others, key=others.__getitem__)
                verdict = "no more" if own <= others[cheapest] else "MORE"
                print(f"  pass-through {name:26} {own:6.2f} ms vs translated to {cheapest}: "
                      f"{others[cheapest]:6.2f} ms ({verdict})")
    finally:
        await endpoint.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--pairs", default="", help="dialect:upstream pairs, comma-separated (default: PAIRS)")
    asyncio.run(main(parser.parse_args()))

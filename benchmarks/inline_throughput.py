"""Inline-path throughput: one-call rollouts per second against a 50 ms scripted server.

Setup from issue 2 (the anchors were measured the same way): 200 rollouts, one model call
each, the server answers after 50 ms, 32 rollouts at once, `chat` harness, local runtime.
The scripted server runs in its own process so it does not share the client's GIL.

    .venv/bin/python benchmarks/inline_throughput.py [--rollouts 200] [--concurrency 32] [--latency 0.05]

Prints rollouts/s, p50/p95 rollout wall time and client CPU per rollout. Target: >= 100/s
(raw httpx 132/s, verifiers v1 86/s, Inspect AI 48/s on this 2-core machine).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import prefect_rollouts as vf


def serve(latency: float, ready: multiprocessing.Queue) -> None:
    from tests.fakes.openai_server import ScriptedOpenAIServer, delayed, reply

    server = ScriptedOpenAIServer().start()
    server.default = delayed(latency, reply("ok"))
    ready.put(server.base_url)
    while True:
        time.sleep(3600)


class Echo(vf.Task):
    @vf.reward
    def said_ok(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == "ok")


async def raw_httpx(args: argparse.Namespace, base_url: str) -> tuple[float, float]:
    """The floor: the same requests with a bare pooled httpx client: (requests/s, CPU ms per request)."""
    import httpx

    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    gate = asyncio.Semaphore(args.concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        async def one(i: int) -> None:
            async with gate:
                body = {"model": "bench", "messages": [{"role": "user", "content": f"say ok {i}"}]}
                response = await client.post(base_url + "/chat/completions", json=body)
                assert response.json()["choices"][0]["message"]["content"] == "ok"
        await asyncio.gather(*(one(i) for i in range(args.concurrency)))
        cpu, started = time.process_time(), time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(args.rollouts)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        return args.rollouts / elapsed, cpu / args.rollouts * 1e3


async def main(args: argparse.Namespace, base_url: str) -> None:
    config = vf.AgentConfig(model="bench", client=vf.ClientConfig(base_url=base_url, api_key_env=None,
                                                                   max_connections=args.concurrency),
                            harness=vf.HarnessConfig(id="chat"), orchestrator="inline")
    gate = asyncio.Semaphore(args.concurrency)
    walls: list[float] = []

    async def one(agent: vf.Agent, i: int) -> vf.Trace:
        async with gate:
            started = time.perf_counter()
            trace = await agent.run(Echo(vf.TaskData(prompt=f"say ok {i}")))
            walls.append(time.perf_counter() - started)
            return trace

    async with vf.make_agent(config) as agent:
        await asyncio.gather(*(one(agent, i) for i in range(args.concurrency)))  # warm the pool
        walls.clear()
        cpu, started = time.process_time(), time.perf_counter()
        traces = await asyncio.gather(*(one(agent, i) for i in range(args.rollouts)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert all(t.reward == 1.0 for t in traces), [t.errors for t in traces if t.reward != 1.0][:1]
    walls.sort()
    print(f"rollouts: {args.rollouts}  concurrency: {args.concurrency}  server latency: {args.latency * 1e3:.0f} ms")
    print(f"throughput: {args.rollouts / elapsed:.1f} rollouts/s  (wall {elapsed:.2f} s)")
    print(f"rollout wall p50: {statistics.median(walls) * 1e3:.1f} ms  p95: {walls[int(0.95 * len(walls))] * 1e3:.1f} ms")
    print(f"client CPU per rollout: {cpu / args.rollouts * 1e3:.2f} ms")
    rate, cpu_ms = await raw_httpx(args, base_url)
    print(f"raw httpx, same server and concurrency: {rate:.1f} requests/s, client CPU {cpu_ms:.2f} ms per request")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.05)
    arguments = parser.parse_args()
    queue: multiprocessing.Queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=serve, args=(arguments.latency, queue), daemon=True)
    process.start()
    try:
        asyncio.run(main(arguments, queue.get(timeout=30)))
    finally:
        process.terminate()

"""How soon the core's deadlines hold: the figures the unit tests used to assert as wall-clock bounds.

The tests now assert what happens (the command is killed, the rollout ends while the blocked call still
blocks, the others finish first); how long it takes is printed here. Each case runs ``--runs`` times,
inline (no Prefect), against the scripted OpenAI server on loopback:

- ``exec timeout 1 s, setsid child``: ``runtime.exec("setsid sleep 31.41 & wait", timeout=1)`` (issue 9:
  within a second of the timeout);
- ``background job``: ``runtime.exec("sleep 31.25 & echo started")`` returns when the shell does;
- ``artifact cap, 2 GB file``: ``collect_artifacts`` refuses a sparse 2 GB file before reading it;
- ``blocking tool, 0.2 s``: a rollout whose sync tool sleeps 1 s with ``tool_timeout_s = 0.2``;
- ``blocking reward, 1 s``: a rollout whose sync reward blocks with ``scoring = 1`` (its
  ``timings["scoring"]``, and the longest the event loop went without running a 20 ms ticker);
- ``retries, max_elapsed_s 0.5``: a model call answered 503 (Retry-After 0.2) until the client gives up.

    .venv/bin/python benchmarks/deadlines.py [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.fakes.openai_server import ScriptedOpenAIServer, reply, status, tool_call

import prefect_rollouts as vf
from prefect_rollouts.model import ModelClient
from prefect_rollouts.runtimes import make_runtime

RELEASE = threading.Event()   # set at the end: no blocked thread outlives the benchmark


async def timed(run: Callable[[], Awaitable[object]]) -> tuple[float, object]:
    started = time.perf_counter()
    result = await run()
    return time.perf_counter() - started, result


async def largest_loop_gap_s(stop: asyncio.Event) -> float:
    largest, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.02)
        now = time.perf_counter()
        largest, last = max(largest, now - last), now
    return largest


async def runtime_cases() -> dict[str, float]:
    runtime = make_runtime(vf.RuntimeConfig(exec_timeout_s=5, artifact_max_bytes=10_000_000))
    await runtime.start()
    try:
        exec_s, _ = await timed(lambda: runtime.exec("setsid sleep 31.41 & wait", timeout=1))
        background_s, _ = await timed(lambda: runtime.exec("sleep 31.25 & echo started"))
        await runtime.exec("truncate -s 2G big.bin")

        async def collect() -> None:
            try:
                await runtime.collect_artifacts(["big.bin"])
            except vf.TaskError:
                pass
        cap_s, _ = await timed(collect)
    finally:
        await runtime.stop()
    return {"exec timeout 1 s, setsid child": exec_s, "background job": background_s,
            "artifact cap, 2 GB file": cap_s}


class SlowTool(vf.Task):
    def tools(self):
        def nap() -> str:
            """Sleep (a blocking call)."""
            RELEASE.wait(1.0)
            return "rested"
        return [nap]


class BlockingReward(vf.Task):
    @vf.reward
    def stuck(self, trace):
        RELEASE.wait(60)
        return 1.0


async def rollout_cases(server: ScriptedOpenAIServer) -> dict[str, float]:
    client = vf.ClientConfig(base_url=server.base_url, api_key_env="", timeout=10,
                             retries=vf.RetryConfig(max_retries=2, backoff_s=0.01, max_backoff_s=0.05))

    def agent(**fields: object) -> vf.Agent:
        return vf.make_agent(vf.AgentConfig(model="scripted", client=client, orchestrator="inline", **fields))
    figures = {}
    server.reset()
    server.play([tool_call("nap"), reply("done")])
    async with agent(harness=vf.HarnessConfig(runtime_tools=[], tool_timeout_s=0.2)) as tools_agent:
        figures["blocking tool, 0.2 s"], _ = await timed(lambda: tools_agent.run(SlowTool(vf.TaskData(prompt="x"))))
    server.reset()
    server.default = reply("5")
    stop = asyncio.Event()
    ticker = asyncio.ensure_future(largest_loop_gap_s(stop))
    async with agent(timeouts=vf.TimeoutConfig(scoring=1.0)) as scoring_agent:
        figures["blocking reward, 1 s"], trace = await timed(
            lambda: scoring_agent.run(BlockingReward(vf.TaskData(prompt="2+3?"))))
    stop.set()
    figures["  its timings['scoring']"] = trace.timings["scoring"]   # type: ignore[attr-defined]
    figures["  largest event loop gap"] = await ticker
    server.reset()
    server.default = status(503, headers={"Retry-After": "0.2"})
    model = ModelClient(vf.ClientConfig(base_url=server.base_url, api_key_env="", retries=vf.RetryConfig(
        max_retries=50, max_elapsed_s=0.5, max_backoff_s=0.2)))

    async def give_up() -> None:
        try:
            await model.complete({"model": "scripted", "messages": [{"role": "user", "content": "hi"}]})
        except vf.ProviderError:
            pass
    try:
        figures["retries, max_elapsed_s 0.5"], _ = await timed(give_up)
    finally:
        await model.aclose()
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("prefect_rollouts").setLevel(logging.ERROR)   # no line per abandoned thread
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    seen: dict[str, list[float]] = {}
    with ScriptedOpenAIServer() as server:
        for _ in range(args.runs):
            for name, seconds in {**await runtime_cases(), **await rollout_cases(server)}.items():
                seen.setdefault(name, []).append(seconds)
    RELEASE.set()
    print(f"{'case':34} {'median s':>9} {'max s':>7}   ({args.runs} runs)")
    for name, seconds in seen.items():
        print(f"{name:34} {statistics.median(seconds):9.3f} {max(seconds):7.3f}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())

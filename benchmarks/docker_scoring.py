"""Container start latency, the wall time isolated scoring adds over shared, and concurrent commands.

50 rollouts (sequential, so each figure is one rollout's own latency) of a task whose agent
writes a file with one bash call and whose reward reads it, on the ``docker`` runtime against
the scripted OpenAI server. Prints median and p95.

Then 32 containers at once (as 32 concurrent rollouts would have), each running ``sleep 1``
at the same moment: prints the wall time of the 32 concurrent commands against one command,
with the runtime's own thread pool and with asyncio's default pool (the code before issue 10;
target at most 1.3x with the runtime's pool).

    .venv/bin/python benchmarks/docker_scoring.py [--rollouts 50] [--concurrent 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.fakes.openai_server import ScriptedOpenAIServer, reply, tool_call

import prefect_rollouts as vf
from prefect_rollouts.runtimes import make_runtime


class Solution(vf.Task):
    @vf.reward
    async def solved(self, runtime: object) -> float:
        return float((await runtime.read_file("solution.txt")).strip() == b"42")  # type: ignore[attr-defined]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def container_starts(n: int) -> list[float]:
    latencies = []
    for _ in range(n):
        runtime = make_runtime(vf.RuntimeConfig(type="docker"))
        started = time.perf_counter()
        await runtime.start()
        await runtime.exec("true")
        latencies.append(time.perf_counter() - started)
        await runtime.stop()
    return latencies


async def rollouts(server: ScriptedOpenAIServer, mode: str, n: int) -> list[float]:
    config = vf.AgentConfig(model="bench", orchestrator="inline", client=vf.ClientConfig(base_url=server.base_url,
                            api_key_env=""), runtime=vf.RuntimeConfig(type="docker"), scoring=vf.ScoringConfig(mode=mode))
    walls = []
    async with vf.make_agent(config) as agent:
        for _ in range(n):
            server.play([tool_call("bash", command="echo 42 > solution.txt"), reply("done")])
            started = time.perf_counter()
            trace = await agent.run(Solution(vf.TaskData(prompt="solve", artifacts=["solution.txt"])))
            walls.append(time.perf_counter() - started)
            assert trace.reward == 1.0, trace.errors
    return walls


async def concurrent_commands(n: int) -> tuple[float, float]:
    """(wall of one ``sleep 1``, wall of ``n`` concurrent ``sleep 1`` in ``n`` containers), seconds."""
    runtimes = [make_runtime(vf.RuntimeConfig(type="docker")) for _ in range(n)]
    await asyncio.gather(*(runtime.start() for runtime in runtimes))
    try:
        started = time.perf_counter()
        await runtimes[0].exec("sleep 1")
        one = time.perf_counter() - started
        started = time.perf_counter()
        results = await asyncio.gather(*(runtime.exec("sleep 1") for runtime in runtimes))
        many = time.perf_counter() - started
        assert all(r.exit_code == 0 for r in results), results
    finally:
        await asyncio.gather(*(runtime.stop() for runtime in runtimes))
    return one, many


async def main(n: int, concurrent: int) -> None:
    from prefect_rollouts.runtimes.docker import engine as docker_engine

    own_pool = docker_engine.executor
    docker_engine.executor = lambda: None         # type: ignore[assignment]  # asyncio's default pool
    default_one, default_many = await concurrent_commands(concurrent)
    docker_engine.executor = own_pool             # type: ignore[assignment]
    one, many = await concurrent_commands(concurrent)
    print(f"{concurrent} concurrent `sleep 1` commands in {concurrent} containers (one alone in brackets):")
    print(f"  runtime's own thread pool:   {many:.2f} s ({one:.2f} s) = {many / one:.2f}x   (target <= 1.3x)")
    print(f"  asyncio's default pool (before): {default_many:.2f} s ({default_one:.2f} s) = "
          f"{default_many / default_one:.2f}x")
    starts = await container_starts(n)
    with ScriptedOpenAIServer() as server:
        await rollouts(server, "shared", 3)   # warm up
        shared = await rollouts(server, "shared", n)
        isolated = await rollouts(server, "isolated", n)
    print(f"{n} samples each, docker runtime, image {vf.RuntimeConfig().image}")
    print(f"container start (create + start + first exec): median {statistics.median(starts) * 1e3:.0f} ms, "
          f"p95 {pct(starts, 0.95) * 1e3:.0f} ms")
    print(f"rollout wall, shared scoring:   median {statistics.median(shared) * 1e3:.0f} ms, p95 {pct(shared, 0.95) * 1e3:.0f} ms")
    print(f"rollout wall, isolated scoring: median {statistics.median(isolated) * 1e3:.0f} ms, p95 {pct(isolated, 0.95) * 1e3:.0f} ms")
    print(f"added by isolated scoring:      median {(statistics.median(isolated) - statistics.median(shared)) * 1e3:.0f} ms, "
          f"p95 {(pct(isolated, 0.95) - pct(shared, 0.95)) * 1e3:.0f} ms (quantile differences)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=50)
    parser.add_argument("--concurrent", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(main(args.rollouts, args.concurrent))

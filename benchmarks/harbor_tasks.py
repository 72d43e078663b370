"""Harbor tasks: where a rollout's time goes, and an eval's wall at 1, 4 and 8 rollouts at once.

Setup: the shipped tasks (``examples/harbor-tasks``), the ``oracle`` harness (no model), the docker
runtime. Three parts:

1. Images: each task's image rebuilt after its tag is removed (Docker's layer cache stays warm, so
   the shared apt layer is not rebuilt: a first build on a fresh engine adds that once, ~1 min
   here), then the cached check a second eval makes (``HarborTask.prepare`` on a built image).
2. Per rollout (``Agent.run``, inline, one at a time): setup (cached image check + container start +
   log dirs), the agent (``solve.sh``), finalize (the ``/logs/artifacts`` listing), scoring (copying
   ``tests/``, ``test.sh``, reading the reward), teardown; and the overhead outside the agent's and
   the tests' own commands (elapsed minus ``solve.sh`` minus ``test.sh``), median and max.
3. The whole eval through ``eval_flow`` (a temporary Prefect server) at ``max_concurrent`` 1, 4, 8.

    .venv/bin/python benchmarks/harbor_tasks.py [--path examples/harbor-tasks] [--concurrency 1,4,8]

Targets (issue 21, printed, not asserted): a cached build check under 0.2 s per task; per-rollout
overhead outside the agent and the tests under 1 s. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")   # the figures, not every task run's state

import prefect_rollouts as vf
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.runtimes.docker import images
from prefect_rollouts.runtimes.docker.engine import docker_client

REPO = Path(__file__).resolve().parent.parent


def oracle_config() -> vf.AgentConfig:
    return vf.AgentConfig(harness="oracle", orchestrator="inline", runtime=vf.RuntimeConfig(type="docker"))


async def image_figures(path: Path) -> None:
    tasks = load_taskset("harbor", {"path": str(path)})
    config = oracle_config()
    for task in tasks:
        tag = images.image_tag(task.id, task.directory / "environment")
        try:
            docker_client().images.remove(tag)
        except Exception:
            pass
    rebuilt = []
    for task in tasks:
        started = time.perf_counter()
        await task.prepare(config)
        rebuilt.append(time.perf_counter() - started)
    cached = []
    for task in load_taskset("harbor", {"path": str(path)}):   # new task objects: a second eval's
        started = time.perf_counter()
        await task.prepare(config)
        cached.append(time.perf_counter() - started)
    print(f"images of {len(tasks)} tasks: rebuild (tag removed, layer cache warm) median {statistics.median(rebuilt):.2f} s"
          f", max {max(rebuilt):.2f} s, total {sum(rebuilt):.1f} s")
    print(f"  cached check per task: median {statistics.median(cached) * 1e3:.1f} ms, max {max(cached) * 1e3:.1f} ms"
          f"  (target < 200 ms)")


async def rollout_figures(path: Path) -> None:
    tasks = load_taskset("harbor", {"path": str(path)})
    phases: dict[str, list[float]] = {name: [] for name in ("setup", "agent", "finalize", "scoring", "teardown")}
    overhead, solve_s, tests_s = [], [], []
    async with vf.make_agent(oracle_config()) as agent:
        for task in tasks:
            started = time.perf_counter()
            trace = await agent.run(task)
            elapsed = time.perf_counter() - started
            assert trace.reward is not None and not trace.errors, (task.id, trace.errors)
            for name in phases:
                phases[name].append(trace.timings.get(name, 0.0))
            harbor = trace.info["harbor"]
            solve, tests = harbor["solution"]["seconds"], harbor["verifier"]["seconds"]
            solve_s.append(solve)
            tests_s.append(tests)
            overhead.append(elapsed - solve - tests)
    print(f"per rollout of the oracle ({len(tasks)} tasks, one at a time), median / max seconds:")
    for name, values in phases.items():
        print(f"  {name:<9} {statistics.median(values):6.3f} / {max(values):6.3f}")
    print(f"  solve.sh  {statistics.median(solve_s):6.3f} / {max(solve_s):6.3f}   test.sh "
          f"{statistics.median(tests_s):6.3f} / {max(tests_s):6.3f}")
    print(f"  overhead outside solve.sh and test.sh: {statistics.median(overhead):.3f} / {max(overhead):.3f}"
          "  (target < 1 s)")


def eval_figures(path: Path, levels: list[int]) -> None:
    from prefect_rollouts.cli.server import api_url, drain_prefect_services
    from prefect_rollouts.config.eval import load_eval_config
    from prefect_rollouts.flows.eval import eval_flow
    from prefect_rollouts.servers.temporary import TemporaryServer

    with TemporaryServer(120) as server, api_url(server.api_url), tempfile.TemporaryDirectory() as traces:
        for level in levels:
            text = (f'max_concurrent = {level}\nrollout_granularity = "task"\n[traces]\npath = "{traces}"\n'
                    f'[env.taskset]\nid = "harbor"\npath = "{path}"\n[env.agent]\nharness = "oracle"\n'
                    '[env.agent.runtime]\ntype = "docker"\n')
            started = time.perf_counter()
            summary = asyncio.run(eval_flow(load_eval_config(text), run_id=f"bench-{level}"))
            wall = time.perf_counter() - started
            env = summary.environments[0]
            print(f"  eval_flow, {env.rollouts} rollouts, max_concurrent {level}: {wall:.1f} s wall "
                  f"({env.rollouts / wall:.2f} rollouts/s), mean reward {env.mean_reward}", flush=True)
        drain_prefect_services()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=REPO / "examples" / "harbor-tasks")
    parser.add_argument("--concurrency", default="1,4,8")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    asyncio.run(image_figures(args.path))
    asyncio.run(rollout_figures(args.path))
    eval_figures(args.path.resolve(), [int(level) for level in args.concurrency.split(",")])
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

"""Prefect overhead per rollout: the same eval inline and at each granularity, at concurrency 1 and 32.

Setup (issue 3): 200 one-call rollouts of the arithmetic taskset, the scripted OpenAI server in
its own process answering after 50 ms, traces written to Parquet. Prefect modes run against a
fresh local Prefect server on PostgreSQL in its own processes (``prefect-rollouts server``).
A mode's time runs until the server has recorded every flow and task run in a final state.

Every mode is measured warm: before timing, the Prefect layer is imported and each Prefect mode
runs one 2-rollout eval, so the first mode measured is not charged with what any process pays
once. Those one-off costs are printed on their own (``cold start``): importing the Prefect layer,
and the first eval flow run of a process against the same eval run warm.

    .venv/bin/python benchmarks/overhead.py [--rollouts 200] [--modes inline,batch,task,flow]
                                            [--concurrency 1,32] [--repeat 1]

Prints, per mode and concurrency: sustained rollouts/s, client CPU ms and server CPU ms
(Prefect server + PostgreSQL) per rollout, the ratio to inline, and ``settle s``: how long after
the eval returned the server took to record every run (the task-run recorder flushes its batch
at least every second, ``pgserver.SERVER_SETTINGS``). ``--repeat N`` runs the modes N times,
alternating, one line each: on a noisy machine, compare lines of the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")

TICKS = os.sysconf("SC_CLK_TCK")


def serve_model(latency: float, ready: multiprocessing.Queue) -> None:
    import re

    from tests.fakes.openai_server import ScriptedOpenAIServer, delayed, reply

    def answer(request):
        a, b = map(int, re.findall(r"\d+", request.messages[-1]["content"])[:2])
        return delayed(latency, reply(str(a + b)))
    server = ScriptedOpenAIServer().start()
    server.default = answer
    ready.put(server.base_url)
    while True:
        time.sleep(3600)


def server_cpu_s(session_ids: set[int]) -> float:
    """CPU seconds of the Prefect server's session and every process of the postgres user."""
    import pwd

    postgres_uid = pwd.getpwnam("postgres").pw_uid if _has_user("postgres") else -1
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            uid = os.stat(f"/proc/{entry}").st_uid
        except (OSError, IndexError):
            continue
        if int(stat[3]) in session_ids or uid == postgres_uid:
            total += int(stat[11]) + int(stat[12])
    return total / TICKS


def _has_user(name: str) -> bool:
    import pwd
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


async def recorded(api_url: str, flow_runs: int, task_runs: int, timeout_s: float = 600) -> None:
    """Wait until the server holds at least this many flow and task runs in a final state."""
    import httpx

    final = {"state": {"type": {"any_": ["COMPLETED", "FAILED", "CRASHED", "CANCELLED"]}}}
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=api_url, timeout=30) as client:
        while time.monotonic() < deadline:
            flows = (await client.post("/flow_runs/count", json={"flow_runs": final})).json()
            tasks = (await client.post("/task_runs/count", json={"task_runs": final})).json()
            if flows >= flow_runs and tasks >= task_runs:
                return
            await asyncio.sleep(0.05)
    raise TimeoutError("the server did not record every run")


def eval_config(mode: str, rollouts: int, concurrency: int, base_url: str, traces: Path):
    from prefect_rollouts.config.eval import load_eval_config

    return load_eval_config(f"""
num_tasks = {rollouts}
max_concurrent = {concurrency}
rollout_granularity = "{mode}"
batch_size = 50
[traces]
path = "{traces}"
[env.taskset]
id = "arithmetic"
count = {rollouts}
[env.agent]
model = "bench"
harness = "chat"
[env.agent.client]
base_url = "{base_url}"
api_key_env = ""
max_connections = {max(concurrency, 1)}
""")


async def run_inline(rollouts: int, concurrency: int, base_url: str, traces: Path) -> None:
    """The same eval with no Prefect: agent rollouts on the inline orchestrator, rows to Parquet."""
    import prefect_rollouts as vf
    from prefect_rollouts.environments import load_taskset
    from prefect_rollouts.traces import TraceWriter

    config = eval_config("batch", rollouts, concurrency, base_url, traces).env.agent.model_copy(
        update={"orchestrator": "inline"})
    writer = TraceWriter(traces, "inline", batch_size=min(64, concurrency))
    gate = asyncio.Semaphore(concurrency)
    async with vf.make_agent(config) as agent:
        async def one(task: vf.Task) -> None:
            async with gate:
                started = time.perf_counter()
                trace = await agent.run(task)
                if writer.add(trace, rollout_index=0, environment="arithmetic", config_hash="bench",
                              elapsed_s=time.perf_counter() - started):
                    await writer.aflush()
        await asyncio.gather(*(one(t) for t in load_taskset("arithmetic", {"count": rollouts})))
    await writer.aflush()


async def measure(mode: str, rollouts: int, concurrency: int, base_url: str, api_url: str | None,
                  sessions: set[int], traces: Path) -> tuple[float, float, float, float]:
    """One eval; returns (rollouts/s, client CPU ms per rollout, server CPU ms per rollout, settle s)."""
    cpu0, server0, started = time.process_time(), server_cpu_s(sessions), time.perf_counter()
    returned = None
    if mode == "inline":
        await run_inline(rollouts, concurrency, base_url, traces)
    else:
        import httpx

        from prefect_rollouts.flows.eval import run_eval

        async with httpx.AsyncClient(base_url=api_url) as client:
            final = {"state": {"type": {"any_": ["COMPLETED", "FAILED", "CRASHED", "CANCELLED"]}}}
            flows0 = (await client.post("/flow_runs/count", json={"flow_runs": final})).json()
            tasks0 = (await client.post("/task_runs/count", json={"task_runs": final})).json()
        summary, failure = await run_eval(eval_config(mode, rollouts, concurrency, base_url, traces))  # as the CLI
        assert failure is None and summary.rollouts == rollouts and summary.environments[0].mean_reward == 1.0, summary
        returned = time.perf_counter()
        flows = 1 + (rollouts if mode == "flow" else 0)
        # stage task runs per rollout flow: segment, finalize, skip-check, scoring (tasks/stage_runner.py IN_FLOW_BODY)
        tasks = {"flow": 4 * rollouts, "task": rollouts, "batch": math.ceil(rollouts / 50)}[mode]
        await recorded(api_url, flows0 + flows, tasks0 + tasks)
    ended = time.perf_counter()
    return rollouts / (ended - started), (time.process_time() - cpu0) / rollouts * 1e3, \
        (server_cpu_s(sessions) - server0) / rollouts * 1e3, ended - (returned or ended)


def cold_start(modes: list[str], base_url: str, api_url: str, sessions: set[int], home: Path) -> None:
    """Import the Prefect layer and run each Prefect mode once (2 rollouts); print what the first
    eval of a process costs over the same eval run warm."""
    wall, cpu = time.perf_counter(), time.process_time()
    from prefect_rollouts.flows.eval import run_eval  # noqa: F401
    print(f"cold start: importing the Prefect layer {time.perf_counter() - wall:.2f} s wall, "
          f"{time.process_time() - cpu:.2f} s CPU")
    for mode in [m for m in modes if m != "inline"]:
        first = _timed(mode, base_url, api_url, sessions, home / f"cold-{mode}-1")
        warm = _timed(mode, base_url, api_url, sessions, home / f"cold-{mode}-2")
        print(f"cold start: first {mode} eval of 2 rollouts {first[0]:.2f} s wall, {first[1]:.2f} s CPU; "
              f"warm {warm[0]:.2f} s wall, {warm[1]:.2f} s CPU")


def _timed(mode: str, base_url: str, api_url: str, sessions: set[int], traces: Path) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    asyncio.run(measure(mode, 2, 32, base_url, api_url, sessions, traces))
    return time.perf_counter() - wall, time.process_time() - cpu


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--modes", default="inline,batch,task,flow")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of all modes, alternating")
    args = parser.parse_args()
    queue: multiprocessing.Queue = multiprocessing.Queue()
    model = multiprocessing.Process(target=serve_model, args=(args.latency, queue), daemon=True)
    model.start()
    base_url = queue.get(timeout=30)

    from prefect_rollouts.servers import postgres as pgserver

    home = Path(tempfile.mkdtemp(prefix="prefect-rollouts-bench-"))
    home.chmod(0o755)
    api_url = pgserver.start(home, port=free_port(), pg_port=free_port())
    os.environ["PREFECT_API_URL"] = api_url
    sessions = {int(Path(f"/proc/{(home / 'prefect-server.pid').read_text()}/stat").read_text()
                    .rsplit(")", 1)[1].split()[3])}
    try:
        print(f"{args.rollouts} one-call rollouts, model latency {args.latency * 1e3:.0f} ms, "
              f"Prefect server on PostgreSQL at {api_url}")
        modes = args.modes.split(",")
        cold_start(modes, base_url, api_url, sessions, home)
        print(f"{'mode':8} {'conc':>4} {'rollouts/s':>11} {'client ms':>10} {'server ms':>10} {'x inline':>9} "
              f"{'settle s':>9}")
        for round_ in range(args.repeat):
            for concurrency in map(int, args.concurrency.split(",")):
                inline_rate = None
                for mode in modes:
                    rate, client_ms, server_ms, settle_s = asyncio.run(measure(
                        mode, args.rollouts, concurrency, base_url, api_url, sessions,
                        home / f"traces-{mode}-{round_}"))
                    inline_rate = rate if mode == "inline" else inline_rate
                    ratio = f"{rate / inline_rate:.2f}" if inline_rate else "-"
                    print(f"{mode:8} {concurrency:>4} {rate:>11.1f} {client_ms:>10.2f} {server_ms:>10.2f} "
                          f"{ratio:>9} {settle_s:>9.2f}", flush=True)
    finally:
        pgserver.stop(home)
        shutil.rmtree(home, ignore_errors=True)
        model.terminate()


if __name__ == "__main__":
    main()

"""An eval in-process against the same eval dispatched to 1 and 2 local Prefect process workers.

Setup (issue 12): 200 one-call rollouts of the arithmetic taskset, the scripted OpenAI server in
its own process answering after 50 ms, a Prefect server on PostgreSQL (``pgserver``), a process
work pool, and ``prefect worker start`` processes polling every second
(``PREFECT_WORKER_QUERY_SECONDS=1``; Prefect's default of 10 s adds up to 10 s to every shard's
start) and running at most ``--worker-limit`` flow runs each.

    .venv/bin/python benchmarks/distributed.py [--rollouts 200] [--shard-size 25] [--workers 0,1,2]
                                               [--granularity task] [--concurrency 8]

Prints, per number of workers (0 = in-process): rollouts/s over the whole eval; per shard (means)
the time queued (created -> a worker took it: waiting for a poll or a free slot), the start
(taken -> Running: a new process, imports, Prefect's engine), the in-run overhead (Running ->
Completed minus the work: the agent, the dataset, the flow run's end) and the work (first
rollout's start to last rollout's end); and the shard size at which start + in-run overhead is
10% of a shard's time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")

from benchmarks.overhead import free_port, serve_model

REPO = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))


def eval_config(rollouts: int, base_url: str, traces: Path, granularity: str, concurrency: int,
                pool: str | None, shard_size: int):
    from prefect_rollouts.config.eval import load_eval_config

    dispatch = f'[dispatch]\nwork_pool = "{pool}"\nshard_size = {shard_size}\nmax_shards_in_flight = 8\n' if pool else ""
    return load_eval_config(f"""
num_tasks = {rollouts}
max_concurrent = {concurrency}
rollout_granularity = "{granularity}"
[traces]
path = "{traces}"
{dispatch}
[env.taskset]
id = "arithmetic"
count = {rollouts}
[env.agent]
model = "bench"
harness = "chat"
[env.agent.client]
base_url = "{base_url}"
api_key_env = ""
max_connections = {concurrency}
""")


async def shard_figures(run_id: str, traces: Path) -> list[tuple[float, float, float, float, int]]:
    """Per shard flow run of ``run_id``: (queued s: created -> a worker took it, start s: taken ->
    Running, i.e. a new process, Prefect's engine and the flow run; in-run overhead s: Running ->
    Completed minus the work; work s: first rollout's start to last rollout's end; rollouts)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    from prefect_rollouts.traces import read_rollouts

    rows = read_rollouts(traces, run_id=run_id)
    rows["ended"] = rows["started_at"].astype("int64") / 1e3 + rows["elapsed_s"]   # started_at: ms
    rows["began"] = rows["started_at"].astype("int64") / 1e3
    async with get_client() as client:
        runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["shard"])), limit=200)
        figures = []
        for run in runs:
            mine = rows[rows["shard_flow_run_id"] == str(run.id)]
            if mine.empty or run.start_time is None or run.end_time is None:
                continue
            states = {state.type.value: state.timestamp.timestamp()
                      for state in await client.read_flow_run_states(run.id)}
            created, ended = run.created.timestamp(), run.end_time.timestamp()
            taken, running = states.get("PENDING", created), states.get("RUNNING", run.start_time.timestamp())
            work = mine["ended"].max() - mine["began"].min()
            figures.append((taken - created, running - taken, (ended - running) - work, work, len(mine)))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--shard-size", type=int, default=25)
    parser.add_argument("--workers", default="0,1,2")
    parser.add_argument("--worker-limit", type=int, default=2, help="flow runs at once per worker")
    parser.add_argument("--granularity", default="task")
    parser.add_argument("--concurrency", type=int, default=8, help="rollouts in flight per shard (max_concurrent)")
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()

    import multiprocessing

    queue: multiprocessing.Queue = multiprocessing.Queue()
    model = multiprocessing.Process(target=serve_model, args=(args.latency, queue), daemon=True)
    model.start()
    base_url = queue.get(timeout=30)

    from prefect_rollouts.servers import postgres as pgserver

    home = Path(tempfile.mkdtemp(prefix="prefect-rollouts-distributed-"))
    home.chmod(0o755)
    api_url = pgserver.start(home, port=free_port(), pg_port=free_port())
    os.environ["PREFECT_API_URL"] = api_url
    env = {**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "PREFECT_LOGGING_LEVEL": "WARNING"}
    workers: list[subprocess.Popen] = []
    try:
        from prefect_rollouts.flows.eval import eval_flow

        subprocess.run([PREFECT, "work-pool", "create", "bench", "--type", "process"], env=env, check=True,
                       capture_output=True)
        print(f"{args.rollouts} one-call rollouts, model latency {args.latency * 1e3:.0f} ms, granularity "
              f"{args.granularity}, {args.concurrency} in flight per shard, shard size {args.shard_size}, "
              f"worker limit {args.worker_limit}; Prefect server on PostgreSQL at {api_url}")
        print(f"{'workers':>7} {'rollouts/s':>11} {'queued s':>9} {'start s':>8} {'in-run s':>9} {'work s':>7} "
              f"{'size for 10%':>13}")
        for count in map(int, args.workers.split(",")):
            while len(workers) < count:
                workers.append(subprocess.Popen(
                    [PREFECT, "worker", "start", "--pool", "bench", "--limit", str(args.worker_limit)], env=env,
                    cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            if count:
                time.sleep(5)   # the workers have started polling
            traces = home / f"traces-{count}"
            config = eval_config(args.rollouts, base_url, traces, args.granularity, args.concurrency,
                                 "bench" if count else None, args.shard_size)
            started = time.perf_counter()
            summary = asyncio.run(eval_flow(config, run_id=f"bench-{count}"))
            rate = args.rollouts / (time.perf_counter() - started)
            assert summary.rollouts == args.rollouts and summary.environments[0].mean_reward == 1.0, summary
            if not count:
                print(f"{count:>7} {rate:>11.1f} {'-':>9} {'-':>8} {'-':>9} {'-':>7} {'-':>13}", flush=True)
                continue
            figures = asyncio.run(shard_figures(f"bench-{count}", traces))
            queued, start, in_run, work = (statistics.mean(f[i] for f in figures) for i in range(4))
            per_rollout = sum(f[3] for f in figures) / sum(f[4] for f in figures)
            overhead = start + in_run   # what a shard costs besides its rollouts, once a worker has a free slot
            size = 9 * overhead / per_rollout   # overhead / (overhead + size * per_rollout) <= 10%
            print(f"{count:>7} {rate:>11.1f} {queued:>9.2f} {start:>8.2f} {in_run:>9.2f} {work:>7.2f} {size:>13.0f}",
                  flush=True)
    finally:
        for worker in workers:
            os.killpg(worker.pid, 9)
        pgserver.stop(home)
        shutil.rmtree(home, ignore_errors=True)
        model.terminate()


if __name__ == "__main__":
    main()

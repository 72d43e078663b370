"""What a Prefect global concurrency limit slot adds to each model request (``[limits] model_requests``).

Setup: the scripted OpenAI server in its own process (answering after ``--latency`` s), a fresh
Prefect server on PostgreSQL (``prefect-rollouts server``), and ``ModelClient.complete`` called
``--requests`` times at each concurrency, without a limit and then inside a limit of as many
slots as the concurrency (so no request waits for a slot: the figure is the slot's own cost).

    .venv/bin/python benchmarks/limits.py [--requests 300] [--concurrency 1,8] [--latency 0.05]

Prints per concurrency and case: requests/s, wall ms per request (at concurrency 1: the latency a
slot adds), client CPU ms per request (this process, threads included) and server CPU ms per
request (Prefect server + PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")

from benchmarks.overhead import free_port, server_cpu_s


def concurrency_slot(limit):  # type: ignore[no-untyped-def]
    """The slot as ``prefect.concurrency.asyncio.concurrency`` takes it (what flows/services/concurrency.py does not use)."""
    from prefect.concurrency.asyncio import concurrency

    return concurrency(limit.name, strict=True, lease_duration=60, raise_on_lease_renewal_failure=False)


def serve_model(latency: float, ready: multiprocessing.Queue) -> None:
    from tests.fakes.openai_server import ScriptedOpenAIServer, delayed, reply

    server = ScriptedOpenAIServer().start()
    server.default = delayed(latency, reply("ok")) if latency else reply("ok")
    ready.put(server.base_url)
    while True:
        time.sleep(3600)


async def measure(base_url: str, requests: int, concurrency: int, limited: str,
                  sessions: set[int]) -> tuple[float, float, float, float]:
    from prefect_rollouts import limits
    from prefect_rollouts.config.agent import ClientConfig
    from prefect_rollouts.config.eval_tables import LimitsConfig
    from prefect_rollouts.flows.services.concurrency import ensure_limit, prefect_slot
    from prefect_rollouts.model.client import ModelClient

    client = ModelClient(ClientConfig(base_url=base_url, api_key_env="", max_connections=concurrency))
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
    config = LimitsConfig(model_requests=concurrency, model_requests_name=f"bench-{uuid.uuid4().hex[:8]}")
    active = limits.ActiveLimits(config, prefect_slot if limited == "lease" else concurrency_slot,
                                 agent_client=client.config)
    limit = active.endpoint(client.config)
    assert limit is not None
    await ensure_limit(limit)
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            await client.complete(body)
    for _ in range(concurrency):   # warm the connections (and Prefect's clients) first
        await one()
    cpu0, server0, started = time.process_time(), server_cpu_s(sessions), time.perf_counter()
    if limited:
        with limits.applied(active):
            await asyncio.gather(*(one() for _ in range(requests)))
    else:
        await asyncio.gather(*(one() for _ in range(requests)))
    elapsed = time.perf_counter() - started
    await asyncio.sleep(1.5)   # let the server finish what the requests queued (events), then count its CPU
    server_ms = (server_cpu_s(sessions) - server0) / requests * 1e3
    await client.aclose()
    return requests / elapsed, elapsed / requests * concurrency * 1e3, \
        (time.process_time() - cpu0) / requests * 1e3, server_ms


async def in_a_flow(*args: object) -> tuple[float, float, float, float]:
    """``measure`` inside a flow run, as in an eval (Prefect's run context and API clients)."""
    from prefect import flow

    @flow(name="limits-bench", persist_result=False)
    async def bench() -> tuple[float, float, float, float]:
        return await measure(*args)  # type: ignore[arg-type]
    return await bench()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--latency", type=float, default=0.05)
    args = parser.parse_args()
    queue: multiprocessing.Queue = multiprocessing.Queue()
    multiprocessing.Process(target=serve_model, args=(args.latency, queue), daemon=True).start()
    base_url = queue.get(timeout=30)

    from prefect_rollouts.servers import postgres as pgserver

    home = Path(tempfile.mkdtemp(prefix="prefect-rollouts-bench-"))
    home.chmod(0o755)
    api_url = pgserver.start(home, port=free_port(), pg_port=free_port())
    os.environ["PREFECT_API_URL"] = api_url
    sessions = {int(Path(f"/proc/{(home / 'prefect-server.pid').read_text()}/stat").read_text()
                    .rsplit(")", 1)[1].split()[3])}
    try:
        print(f"{args.requests} model requests, model latency {args.latency * 1e3:.0f} ms, "
              f"Prefect server on PostgreSQL at {api_url}")
        print(f"{'conc':>4} {'case':10} {'requests/s':>11} {'wall ms':>8} {'client ms':>10} {'server ms':>10}")
        for concurrency in map(int, args.concurrency.split(",")):
            for limited in ("", "concurrency", "lease"):
                rate, wall_ms, client_ms, server_ms = asyncio.run(
                    in_a_flow(base_url, args.requests, concurrency, limited, sessions))
                print(f"{concurrency:>4} {limited or 'no limit':10} {rate:>11.1f} {wall_ms:>8.1f} "
                      f"{client_ms:>10.2f} {server_ms:>10.2f}", flush=True)
    finally:
        pgserver.stop(home)
        import shutil
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

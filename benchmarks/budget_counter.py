"""What the shared budget counter adds to each model call of a work-pool eval (``flows/services/budget.py``).

A rollout of an eval with ``token_budget`` on a work pool reads the run's counter (a Prefect global
concurrency limit) before each model call and increments it after. This measures that pair of API calls
against a fresh Prefect server on PostgreSQL (``prefect-rollouts server``), ``--calls`` times at each
concurrency (rollouts in flight in one process), without a model: the figure is the counter's own cost.

    .venv/bin/python benchmarks/budget_counter.py [--calls 300] [--concurrency 1,8]

Prints per concurrency: model calls/s the counter alone allows, wall ms per call (at concurrency 1: the
latency it adds to each call), client CPU ms per call, and whether the counter ended at the exact sum.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "ERROR")

from benchmarks.overhead import free_port


async def measure(calls: int, concurrency: int, run_id: str, kept_open: bool) -> tuple[float, float, float, bool]:
    """``(calls/s, wall ms per call, client CPU ms per call, exact)`` of ``calls`` check-and-charge pairs,
    through one client kept open (a shard: ``open_shared_budget``) or a new client per API call."""
    from prefect import get_client

    from prefect_rollouts.config.eval import EvalConfig
    from prefect_rollouts.flows.services.budget import shared_budget

    config = EvalConfig.model_validate({"token_budget": 10**9, "env": {"taskset": {"id": "arithmetic"}, "agent": {}}})
    async with get_client() as client:
        budget = shared_budget(config, run_id, client if kept_open else None)
        assert budget is not None
        return await _pairs(budget, calls, concurrency)


async def _pairs(budget, calls: int, concurrency: int) -> tuple[float, float, float, bool]:  # type: ignore[no-untyped-def]
    pending = iter(range(calls))

    async def rollout() -> None:
        for _ in pending:
            await budget.check()
            await budget.charge(100, None)

    cpu0, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(rollout() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0
    return calls / elapsed, elapsed / calls * 1e3 * concurrency, cpu / calls * 1e3, \
        (await budget.ledger.total()).tokens == 100 * calls


async def seeded(run_id: str) -> None:
    """Create the run's counter as the eval flow does (``seed_shared_budget``), at 0."""
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from prefect_rollouts.flows.services.budget import SLOT_MAX, counter_name

    async with get_client() as client:
        await client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(
            name=counter_name(run_id, "tokens"), limit=SLOT_MAX, active_slots=0, slot_decay_per_second=0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--concurrency", default="1,8")
    args = parser.parse_args()

    from prefect_rollouts.servers import postgres as pgserver

    home = Path(tempfile.mkdtemp(prefix="prefect-rollouts-bench-"))
    home.chmod(0o755)
    api_url = pgserver.start(home, port=free_port(), pg_port=free_port())
    os.environ["PREFECT_API_URL"] = api_url
    try:
        print(f"{args.calls} model calls' budget check and charge, Prefect server on PostgreSQL at {api_url}")
        print(f"{'conc':>4} {'client':10} {'calls/s':>8} {'wall ms':>8} {'client ms':>10} {'exact':>6}")
        for concurrency in map(int, args.concurrency.split(",")):
            for kept_open in (True, False):
                run_id = f"bench-{concurrency}-{kept_open}-{os.getpid()}"
                asyncio.run(seeded(run_id))
                rate, wall_ms, client_ms, exact = asyncio.run(measure(args.calls, concurrency, run_id, kept_open))
                print(f"{concurrency:>4} {'kept open' if kept_open else 'per call':10} {rate:>8.1f} {wall_ms:>8.1f} "
                      f"{client_ms:>10.2f} {exact!s:>6}", flush=True)
    finally:
        pgserver.stop(home)
        import shutil
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

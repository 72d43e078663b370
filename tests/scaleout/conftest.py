"""Real parts for scale-out tests: a process work pool with two ``prefect worker`` processes on the
PostgreSQL-backed Prefect server of ``pg_api`` (tests/support), the scripted OpenAI server on loopback."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from tests.support.workers import PREFECT, Worker, prefect_env, worker_names


@pytest.fixture(scope="module")
def work_pool(pg_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Worker]]]:
    """A process work pool ``rollouts`` with two workers (at most 2 flow runs each)."""
    pool = "rollouts"
    subprocess.run([PREFECT, "work-pool", "create", pool, "--type", "process"], env=prefect_env(pg_api),
                   check=True, capture_output=True, timeout=120)
    logs = tmp_path_factory.mktemp("workers")
    workers = [Worker(pg_api, pool, f"worker-{i}", 2, logs / f"worker-{i}.log") for i in range(2)]
    assert wait_until(lambda: len(worker_names(pg_api, pool)) >= 2, timeout_s=180,
                      what="the 2 workers to poll the pool")
    try:
        yield pool, workers
    finally:
        for worker in workers:
            worker.stop()


def raw_keys(traces: Path, run_id: str) -> list[tuple[str, int]]:
    """``(task id, rollout index)`` of every row file of ``run_id`` as written: the readers drop
    duplicate rows, so a test of "no duplicates" must look beneath them."""
    import pyarrow.dataset as ds

    table = ds.dataset(Path(traces) / "rollouts", format="parquet", partitioning="hive").to_table(
        columns=["task_id", "rollout_index"], filter=ds.field("run_id") == run_id)
    return list(zip(table["task_id"].to_pylist(), table["rollout_index"].to_pylist(), strict=True))

"""Issue 36 on a work pool: --retry-errors and max_rollout_attempts hold when the rollouts run as shard flow
runs on real workers (each shard is handed the attempt it runs of each rollout)."""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from typing import Any

import pyarrow.dataset as ds
import pytest

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply, status

pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]


def rows_written(traces, run_id: str) -> list[tuple[str, int]]:
    """``(task id, attempt)`` of every row file of ``run_id`` as written (duplicates included)."""
    table = ds.dataset(traces / "rollouts", format="parquet", partitioning="hive").to_table(
        columns=["task_id", "attempt"], filter=ds.field("run_id") == run_id)
    return list(zip(table["task_id"].to_pylist(), table["attempt"].to_pylist(), strict=True))


def test_errored_rollouts_run_again_in_shards_after_the_run_and_within_it(work_pool, openai_server, tmp_path):
    pool, _ = work_pool
    down, first_fails, lock = {"3", "7", "12"}, {"5": 1}, threading.Lock()

    def step(request: Any) -> Any:
        number = re.search(r"say (\d+)", request.messages[-1]["content"]).group(1)
        with lock:
            failing = number in down or first_fails.get(number, 0) > 0
            first_fails[number] = first_fails.get(number, 0) - 1
        return status(503) if failing else delayed(0.2, reply(number))
    openai_server.default = step
    text = eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity="task", max_concurrent=4,
                     taskset={"id": "tests.prefect.tasksets:numbered", "count": 16}, max_rollout_attempts=2,
                     rollout_backoff_s=0.0)
    text += f'[dispatch]\nwork_pool = "{pool}"\nshard_size = 4\nmax_shards_in_flight = 4\n'
    config = load_eval_config(text)

    final = asyncio.run(eval_flow(config, run_id="pool-retry", return_state=True))
    assert final.is_failed() and final.message.startswith("3 of 16 rollouts errored")   # n5 recovered in its shard
    assert Counter(task for task, _ in rows_written(tmp_path / "traces", "pool-retry")) == {
        **{f"n{i}": 1 for i in range(16)}, "n3": 2, "n5": 2, "n7": 2, "n12": 2}   # 2 attempts in all, each errored

    down.clear()
    summary = asyncio.run(eval_flow(config, resume="pool-retry", retry_errors=True))
    assert (summary.rollouts, summary.errored, summary.retried, summary.recovered) == (16, 0, 4, 4)
    written = rows_written(tmp_path / "traces", "pool-retry")
    assert len(written) == len(set(written)) == 16 + 4 + 3, "every attempt once, in the files too"
    assert sorted(task for task, attempt in written if attempt == 3) == ["n12", "n3", "n7"]
    latest = read_rollouts(tmp_path / "traces", run_id="pool-retry")
    assert len(latest) == 16 and not latest["is_error"].any() and latest["shard_flow_run_id"].notna().all()

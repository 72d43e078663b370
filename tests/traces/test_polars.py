"""Polars reads the trace dataset lazily with hive partitioning: the same rows as read_rollouts."""

from __future__ import annotations

import json

import polars as pl
import pytest

import prefect_rollouts as vf
from prefect_rollouts.trace import ModelCall
from prefect_rollouts.traces import TraceWriter, read_model_calls, read_rollouts

pytestmark = pytest.mark.unit

#: Partition values as text: a run id such as "20261201" would otherwise be read as a number.
HIVE_SCHEMA = {"date": pl.String, "run_id": pl.String}


def write_run(root, run_id: str, rewards: list[float]) -> None:
    writer = TraceWriter(root, run_id)
    for index, reward in enumerate(rewards):
        trace = vf.Trace(task_id=f"t{index}", model="m", reward=reward, stop_condition="agent_completed",
                         info={"task": {"category": "simple_python" if index % 2 else "multiple"}})
        trace.model_calls.append(ModelCall(segment=0, started_at=1_800_000_000.0, latency_ms=50.0 * (index + 1),
                                           prompt_tokens=10, completion_tokens=5, finish_reason="stop"))
        trace.usage.add(10, 5)
        writer.add(trace, rollout_index=0, environment="bfcl", config_hash="h", elapsed_s=1.0)
    writer.flush()


def test_scan_parquet_with_hive_partitioning_reads_the_dataset(tmp_path):
    write_run(tmp_path, "20261201", [1.0, 0.0, 1.0])   # looks like a number
    write_run(tmp_path, "nightly-b", [0.0, 0.0])

    rollouts = pl.scan_parquet(tmp_path / "rollouts" / "**" / "*.parquet", hive_partitioning=True,
                               hive_schema=HIVE_SCHEMA)
    per_run = (rollouts.filter(pl.col("reward").is_not_null())   # a lazy query: only these columns are read
               .group_by("run_id").agg(pl.len().alias("rollouts"), pl.col("reward").mean().alias("mean_reward"))
               .sort("run_id").collect())
    assert per_run.to_dicts() == [{"run_id": "20261201", "rollouts": 3, "mean_reward": 2 / 3},
                                  {"run_id": "nightly-b", "rollouts": 2, "mean_reward": 0.0}]

    pandas_rows = read_rollouts(tmp_path, run_id="20261201", columns=["reward", "info", "date"]).sort_values("task_id")
    polars_rows = (rollouts.filter(pl.col("run_id") == "20261201")
                   .select("task_id", "reward", "date", pl.col("info").str.json_path_match("$.task.category"))
                   .sort("task_id").collect())
    assert polars_rows["reward"].to_list() == pandas_rows["reward"].tolist()
    assert polars_rows["date"].to_list() == pandas_rows["date"].tolist()
    assert polars_rows["info"].to_list() == [json.loads(i)["task"]["category"] for i in pandas_rows["info"]]

    calls = pl.scan_parquet(tmp_path / "model_calls" / "**" / "*.parquet", hive_partitioning=True,
                            hive_schema=HIVE_SCHEMA)
    latency = calls.filter(pl.col("run_id") == "20261201").select(pl.col("latency_ms").sort()).collect()
    assert latency["latency_ms"].to_list() == sorted(read_model_calls(tmp_path, run_id="20261201")["latency_ms"])

"""Attempts (schema version 6): a rollout run again is a new row with ``attempt`` one higher; readers give each
rollout's latest attempt unless asked for all, older files read as attempt 1, and what a resume runs follows
from each rollout's latest attempt."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

import prefect_rollouts as vf
from prefect_rollouts.config.taskset import EnvironmentSpec
from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.evals.plan import Planned, still_to_run
from prefect_rollouts.trace import ErrorRecord, ModelCall
from prefect_rollouts.traces import (
    TraceWriter,
    compact_run,
    durable_keys,
    read_model_calls,
    read_rollouts,
    read_traces,
)
from prefect_rollouts.traces.read import LatestAttempt, latest_attempts

pytestmark = pytest.mark.unit


def trace(task_id: str, *, error: str | None = None, stop: str = "agent_completed", calls: int = 1) -> vf.Trace:
    made = vf.Trace(task_id=task_id, model="m", reward=None if error or stop == "budget" else 1.0,
                    stop_condition=stop)
    for i in range(calls):
        made.model_calls.append(ModelCall(segment=0, started_at=1_800_000_000.0 + i, latency_ms=5.0,
                                          prompt_tokens=3, completion_tokens=1, finish_reason="stop"))
    if error:
        made.errors.append(ErrorRecord(type=error, message="down", stage="segment", status_code=503))
    return made


def write(root, *rows: tuple[vf.Trace, int, int], run_id: str = "r1") -> None:
    """One file of ``(trace, rollout_index, attempt)`` rows."""
    writer = TraceWriter(root, run_id, batch_size=100)
    for made, index, attempt in rows:
        writer.add(made, rollout_index=index, environment="arith", config_hash="h", elapsed_s=0.1, attempt=attempt)
    writer.flush()


def test_readers_give_the_latest_attempt_of_each_rollout_and_all_of_them_when_asked(tmp_path):
    first = trace("a", error="ProviderError", calls=2)
    second = trace("a", calls=3)
    write(tmp_path, (first, 0, 1), (trace("b"), 0, 1))
    write(tmp_path, (second, 0, 2))
    rows = read_rollouts(tmp_path, run_id="r1").sort_values("task_id")
    assert rows[["task_id", "attempt", "is_error"]].values.tolist() == [["a", 2, False], ["b", 1, False]]
    assert rows["rollout_id"].iloc[0] == second.id
    every = read_rollouts(tmp_path, run_id="r1", attempts="all").sort_values(["task_id", "attempt"])
    assert every[["task_id", "attempt"]].values.tolist() == [["a", 1], ["a", 2], ["b", 1]]
    calls = read_model_calls(tmp_path, run_id="r1")
    assert calls.groupby("rollout_id").size().to_dict() == {second.id: 3, rows["rollout_id"].iloc[1]: 1}
    assert set(calls.loc[calls["task_id"] == "a", "attempt"]) == {2}
    assert len(read_model_calls(tmp_path, run_id="r1", attempts="all")) == 2 + 3 + 1
    assert [t.id for t in read_traces(tmp_path, run_id="r1", task_id="a")] == [second.id]
    assert {t.id for t in read_traces(tmp_path, run_id="r1", task_id="a", attempts="all")} == {first.id, second.id}


def test_a_filter_on_a_column_attempts_differ_in_applies_to_the_latest_attempt(tmp_path):
    write(tmp_path, (trace("a", error="ProviderError"), 0, 1), (trace("b", error="ProviderError"), 0, 1))
    write(tmp_path, (trace("a"), 0, 2))
    assert read_rollouts(tmp_path, run_id="r1", is_error=True)["task_id"].tolist() == ["b"]
    assert read_rollouts(tmp_path, run_id="r1", attempt=1)["task_id"].tolist() == ["b"]
    assert sorted(read_rollouts(tmp_path, run_id="r1", attempt=1, attempts="all")["task_id"]) == ["a", "b"]
    only = read_rollouts(tmp_path, run_id="r1", columns=["reward"], is_error=False)
    assert only["task_id"].tolist() == ["a"] and "is_error" not in only.columns and "reward" in only.columns


def test_an_unknown_attempts_value_or_filter_is_refused_with_the_choices(tmp_path):
    write(tmp_path, (trace("a"), 0, 1))
    with pytest.raises(ValueError, match='use "latest"'):
        read_rollouts(tmp_path, attempts="newest")
    with pytest.raises(TraceStoreError, match="no such column"):
        read_rollouts(tmp_path, colour="red")


def test_a_file_of_schema_version_5_reads_as_attempt_1_and_a_row_written_twice_once(tmp_path):
    write(tmp_path, (trace("a"), 0, 1))
    [path] = (tmp_path / "rollouts").rglob("*.parquet")
    old = pq.read_table(path)
    pq.write_table(old.drop_columns(["attempt"]), path)   # as a version-5 writer left it
    write(tmp_path, (trace("a"), 0, 1))                   # the same attempt again (a crash before its record)
    rows = read_rollouts(tmp_path, run_id="r1", attempts="all")
    assert rows["attempt"].tolist() == [1] and rows["rollout_id"].tolist() == [old["rollout_id"][0].as_py()]
    assert latest_attempts(tmp_path, "r1") == {("arith", "a", 0): LatestAttempt(1, "agent_completed", None)}


def test_a_rollout_a_budget_stopped_is_not_durable_and_runs_again_as_its_next_attempt(tmp_path):
    write(tmp_path, (trace("a", stop="budget"), 0, 1), (trace("b", error="ProviderError"), 0, 1), (trace("c"), 0, 1))
    write(tmp_path, (trace("a", stop="budget"), 0, 2))
    latest = latest_attempts(tmp_path, "r1")
    assert latest[("arith", "a", 0)] == LatestAttempt(2, "budget", None) and not latest[("arith", "a", 0)].done
    assert latest[("arith", "b", 0)].error_type == "ProviderError" and latest[("arith", "b", 0)].done
    assert durable_keys(tmp_path, "r1") == {("arith", "b", 0), ("arith", "c", 0)}
    env = EnvironmentSpec("arith", "arith", {}, None, vf.AgentConfig(model="m"))
    plan = [Planned(env, vf.Task(vf.TaskData(prompt="p", id=task_id)), 0) for task_id in "abcd"]
    todo = still_to_run(plan, latest)
    assert [(planned.task.id, planned.attempt) for planned in todo] == [("a", 3), ("d", 1)]


def test_compaction_keeps_every_attempt(tmp_path):
    write(tmp_path, (trace("a", error="ProviderError"), 0, 1))
    write(tmp_path, (trace("a"), 0, 2))
    write(tmp_path, (trace("a"), 0, 2))   # a repeat of attempt 2: dropped
    result = compact_run(tmp_path, "r1")
    assert result.duplicates_dropped == 1
    rows = read_rollouts(tmp_path, run_id="r1", attempts="all")
    assert sorted(rows["attempt"]) == [1, 2] and len(list((tmp_path / "rollouts").rglob("*.parquet"))) == 1

"""The Parquet trace dataset: atomic batched writes, readers, DuckDB, the summary."""

from __future__ import annotations

import math

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import prefect_rollouts as vf
from prefect_rollouts.trace import TRACE_VERSION, ErrorRecord, ModelCall
from prefect_rollouts.traces import (
    SCHEMA_VERSION,
    TraceWriter,
    durable_keys,
    pass_at_k,
    read_model_calls,
    read_rollouts,
    read_traces,
    summarize,
)
from prefect_rollouts.traces.schema import MODEL_CALLS, model_call_rows
from prefect_rollouts.traces.writer import write_table

pytestmark = pytest.mark.unit


def make_trace(task_id: str, reward: float | None, calls: int = 1, **fields) -> vf.Trace:
    trace = vf.Trace(task_id=task_id, model="m", reward=reward, stop_condition="agent_completed", **fields)
    for i in range(calls):
        trace.model_calls.append(ModelCall(segment=0, started_at=1_800_000_000.0 + i, latency_ms=10.0 * (i + 1),
                                           prompt_tokens=5, completion_tokens=2, finish_reason="stop"))
    trace.usage.add(5 * calls, 2 * calls)
    if reward is None:
        trace.errors.append(ErrorRecord(type="ProviderError", message="down", stage="segment", status_code=503))
    return trace


def add(writer, trace, index=0, env="arith"):
    return writer.add(trace, rollout_index=index, environment=env, config_hash="h", elapsed_s=0.5)


def test_flush_writes_one_file_per_table_per_batch_atomically(tmp_path):
    writer = TraceWriter(tmp_path, "r1", batch_size=10)
    for name in "abc":
        add(writer, make_trace(name, 1.0, calls=2))
    assert writer.flush() == 3 and writer.durable == {("arith", "a", 0), ("arith", "b", 0), ("arith", "c", 0)}
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert len(files) == 2
    assert files[0].startswith("model_calls/date=") and "/run_id=r1/part-" in files[0]
    assert files[1].startswith("rollouts/date=")
    assert pq.read_table(tmp_path / files[1]).num_rows == 3 and pq.read_table(tmp_path / files[0]).num_rows == 6
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


async def test_add_says_when_the_batch_is_full_and_aflush_makes_it_durable(tmp_path):
    writer = TraceWriter(tmp_path, "r1", batch_size=2)
    assert add(writer, make_trace("a", 1.0)) is False and writer.pending == 1
    assert add(writer, make_trace("b", 1.0)) is True
    assert await writer.aflush() == 2
    assert writer.pending == 0 and writer.durable == {("arith", "a", 0), ("arith", "b", 0)}
    assert len(read_rollouts(tmp_path, run_id="r1")) == 2


def test_readers_filter_and_ignore_temporary_files_and_drop_orphan_calls(tmp_path):
    writer = TraceWriter(tmp_path, "r1")
    add(writer, make_trace("a", 1.0, calls=2))
    writer.flush()
    other = TraceWriter(tmp_path, "r2")
    add(other, make_trace("b", 0.0))
    other.flush()
    day_dir = next((tmp_path / "rollouts").iterdir()) / "run_id=r1"
    (day_dir / ".part-crash.parquet.tmp").write_bytes(b"half a file")
    orphan_dir = next((tmp_path / "model_calls").iterdir()) / "run_id=r1"   # calls whose rollouts file never landed
    orphan_rows = model_call_rows(make_trace("ghost", 1.0), rollout_index=0, environment="arith")
    write_table(tmp_path, f"model_calls/{orphan_dir.parent.name}/run_id=r1/part-orphan.parquet",
                pa.Table.from_pylist(orphan_rows, schema=MODEL_CALLS))

    rows = read_rollouts(tmp_path, run_id="r1")
    assert list(rows["task_id"]) == ["a"] and rows["schema_version"].tolist() == [SCHEMA_VERSION]
    assert set(read_rollouts(tmp_path)["run_id"]) == {"r1", "r2"}
    calls = read_model_calls(tmp_path, run_id="r1")
    assert list(calls["call_index"]) == [0, 1] and set(calls["rollout_id"]) == {rows["rollout_id"][0]}
    assert durable_keys(tmp_path, "r1") == {("arith", "a", 0)}
    with pytest.raises(vf.errors.TraceStoreError, match="no such column"):
        read_rollouts(tmp_path, colour="red")


def test_model_calls_read_only_the_columns_asked_for_and_still_drop_orphans_and_duplicates(tmp_path):
    writer = TraceWriter(tmp_path, "r1")
    add(writer, make_trace("a", 1.0, calls=2))
    writer.flush()
    calls_dir = next((tmp_path / "model_calls").iterdir()) / "run_id=r1"
    ghost = model_call_rows(make_trace("ghost", 1.0), rollout_index=0, environment="arith")   # no rollout row
    write_table(tmp_path, f"model_calls/{calls_dir.parent.name}/run_id=r1/part-orphan.parquet",
                pa.Table.from_pylist(ghost, schema=MODEL_CALLS))
    again = pq.read_table(next(calls_dir.glob("part-*.parquet")))   # a compaction cut short: the same calls twice
    write_table(tmp_path, f"model_calls/{calls_dir.parent.name}/run_id=r1/part-copy.parquet", again)

    calls = read_model_calls(tmp_path, columns=["latency_ms"], run_id="r1")
    assert list(calls.columns) == ["run_id", "rollout_id", "call_index", "latency_ms"]
    assert sorted(calls["latency_ms"]) == [10.0, 20.0]
    assert len(read_model_calls(tmp_path, run_id="r1").columns) == len(MODEL_CALLS) + 2   # + date, run_id


def test_full_traces_come_back(tmp_path):
    writer = TraceWriter(tmp_path, "r1")
    trace = make_trace("a", 1.0, info={"k": "v"})
    add(writer, trace)
    writer.flush()
    assert read_traces(tmp_path, run_id="r1") == [trace]


def test_an_empty_dataset_reads_as_empty_frames(tmp_path):
    assert read_rollouts(tmp_path).empty and read_model_calls(tmp_path).empty
    assert durable_keys(tmp_path, "nothing") == set()


def test_the_same_files_query_with_duckdb_and_join(tmp_path):
    writer = TraceWriter(tmp_path, "r1")
    add(writer, make_trace("a", 1.0, calls=3))
    add(writer, make_trace("b", 0.0, calls=1))
    writer.flush()
    joined = duckdb.sql(f"""
        select r.task_id, count(*) as calls, avg(c.latency_ms) as latency, max(r.reward) as reward
        from read_parquet('{tmp_path}/rollouts/**/*.parquet', hive_partitioning = true) r
        join read_parquet('{tmp_path}/model_calls/**/*.parquet', hive_partitioning = true) c using (rollout_id)
        where r.run_id = 'r1' group by r.task_id order by r.task_id""").fetchall()
    assert joined == [("a", 3, 20.0, 1.0), ("b", 1, 10.0, 0.0)]


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))   # 0.5
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_summary_excludes_errors_from_means_and_counts_outcomes(tmp_path):
    writer = TraceWriter(tmp_path, "r1")
    add(writer, make_trace("t1", 1.0), 0)
    add(writer, make_trace("t1", 0.0), 1)
    add(writer, make_trace("t2", 0.0, is_timeout=True), 0)
    add(writer, make_trace("t2", None), 1)                      # an infrastructure error: not a 0
    skipped = make_trace("t3", 0.0, info={"scoring_skipped": "truncated"})
    skipped.stop_condition = "max_turns"
    add(writer, skipped, 0)
    judged = make_trace("t3", 1.0)
    judged.judge_usage.add(30, 2)
    add(writer, judged, 1)
    writer.flush()
    summary = summarize(read_rollouts(tmp_path), run_id="r1", rollouts_per_task=2)
    env = summary.environments[0]
    assert (env.rollouts, env.scored, env.errored, env.truncated, env.timed_out, env.skipped) == (6, 5, 1, 1, 1, 1)
    assert env.mean_reward == pytest.approx(0.4)
    assert env.stderr == pytest.approx(math.sqrt(0.3) / math.sqrt(5))
    # t1: n=2, c=1; t2: n=1 (error excluded), c=0; t3: n=2, c=1
    assert env.pass_at_k[1] == pytest.approx((0.5 + 0.0 + 0.5) / 3)
    assert env.pass_at_k[2] == pytest.approx((1.0 + 1.0) / 2)      # t2 has fewer than 2 scored rollouts
    assert env.total_tokens == 6 * 7 and summary.errored == 1
    assert env.judge_tokens == summary.judge_tokens == 32                # apart from the agent's tokens
    assert summary.table()[0]["pass@2"] == 1.0 and summary.table()[0]["judge_tokens"] == 32


def test_a_trace_holding_objects_that_are_not_json_is_still_written(tmp_path):
    writer = TraceWriter(tmp_path, "r1")
    odd = make_trace("odd", 1.0)
    odd.info["handle"] = object()                               # task code may put anything in info
    add(writer, odd, 0)
    add(writer, make_trace("plain", 1.0), 0)
    assert writer.flush() == 2
    rows = read_rollouts(tmp_path).set_index("task_id")
    assert "<object object" in rows.loc["odd", "info"] and rows.loc["plain", "reward"] == 1.0
    (trace,) = read_traces(tmp_path, task_id="odd")
    assert trace.info["handle"].startswith("<object object")


def test_a_reply_is_stored_once_in_its_row_and_read_back_as_last_reply(tmp_path):
    import os

    reply = os.urandom(2_500_000).hex()        # 5 MB that does not compress
    trace = make_trace("big", 1.0, messages=[{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": reply}])
    writer = TraceWriter(tmp_path, "r1")
    add(writer, trace)
    writer.flush()
    stored = read_rollouts(tmp_path, run_id="r1")["trace"][0]
    assert stored.count(reply[:64]) == 1 and len(stored) < len(reply) + 10_000    # was twice: 10 MB
    assert sum(p.stat().st_size for p in (tmp_path / "rollouts").rglob("*.parquet")) < 5_500_000
    again, = read_traces(tmp_path, run_id="r1")
    assert again.last_reply == reply and again.messages == trace.messages


def test_a_row_of_schema_version_3_with_last_reply_in_its_trace_reads_as_before(tmp_path):
    trace = make_trace("old", 1.0, messages=[{"role": "assistant", "content": "42"}])
    writer = TraceWriter(tmp_path, "r1")
    add(writer, trace)
    writer.flush()
    path, = (tmp_path / "rollouts").rglob("*.parquet")
    table = pq.read_table(path, schema=pq.read_schema(path))
    old = table.set_column(table.schema.get_field_index("trace"), "trace", pa.array([trace.model_dump_json()]))
    old = old.set_column(old.schema.get_field_index("schema_version"), "schema_version", pa.array([3], pa.int16()))
    pq.write_table(old, path)
    again, = read_traces(tmp_path, run_id="r1")
    assert '"last_reply":"42"' in trace.model_dump_json() and again.last_reply == "42"
    assert read_rollouts(tmp_path, run_id="r1")["schema_version"].tolist() == [3]


def test_a_trace_of_version_2_reads_and_one_with_typed_parts_round_trips(tmp_path):
    """Version 3 lets messages hold typed parts (a reasoning item beside the text); a row written
    with version 2 (no such parts) reads as before."""
    old = make_trace("old", 1.0, messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}])
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"}
    new = make_trace("new", 1.0, messages=[{"role": "user", "content": "q"}, {
        "role": "assistant", "content": [reasoning, {"type": "text", "text": "42"}]}])
    writer = TraceWriter(tmp_path, "r1")
    add(writer, old)
    add(writer, new)
    writer.flush()
    path, = (tmp_path / "rollouts").rglob("*.parquet")
    table = pq.read_table(path, schema=pq.read_schema(path))
    texts = [text.replace(f'"version":{TRACE_VERSION}', '"version":2', 1) if '"old"' in text else text
             for text in table.column("trace").to_pylist()]
    pq.write_table(table.set_column(table.schema.get_field_index("trace"), "trace", pa.array(texts)), path)
    again = {trace.task_id: trace for trace in read_traces(tmp_path, run_id="r1")}
    assert again["old"].version == 2 and again["old"].messages == old.messages and again["old"].last_reply == "42"
    assert again["new"].version == vf.Trace(task_id="t", model="m").version == TRACE_VERSION
    assert again["new"].messages == new.messages and again["new"].last_reply == "42"


def test_first_rows_keeps_the_first_row_of_each_key_in_arrow():
    import pyarrow as pa

    from prefect_rollouts.traces.read import first_rows

    words = pa.DictionaryArray.from_arrays(pa.array([0, 0, 1, 0, 1], pa.int32()), pa.array(["a", "b"]))
    table = pa.table({"k": words, "n": [1, 2, 3, 4, 5], "v": ["x1", "x2", "x3", "x4", "x5"]})
    kept = first_rows(table, ["k"])
    assert isinstance(kept, pa.Table) and kept.column("n").to_pylist() == [1, 3]
    assert first_rows(table, ["k", "n"]) is table   # nothing repeated: the table as it is
    assert first_rows(table.slice(0, 0), ["k"]).num_rows == 0

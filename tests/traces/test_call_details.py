"""What a model call reports beyond its token totals reaches the trace and both tables: cached and
reasoning tokens (None when the server does not say), and each failed attempt of a retried call."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest

import prefect_rollouts as vf
from prefect_rollouts.trace import ModelCall
from prefect_rollouts.traces import TraceWriter, read_model_calls, read_rollouts, summarize
from prefect_rollouts.traces.schema import MODEL_CALLS, ROLLOUTS, model_call_rows, rollout_row
from prefect_rollouts.traces.writer import write_table
from tests.fakes.openai_server import reply, status, tool_call

pytestmark = pytest.mark.unit


def usage(prompt, completion, cached=None, reasoning=None):
    found = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached is not None:
        found["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        found["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return found


class Echo(vf.Task):
    def tools(self):
        def look() -> str:
            """Look around."""
            return "nothing"
        return [look]

    @vf.reward
    def answered(self, trace):
        return float(trace.last_reply == "done")


def null(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


async def test_cached_and_reasoning_tokens_reach_the_trace_both_tables_and_the_summary(openai_server, agent_config,
                                                                                       tmp_path):
    openai_server.play([tool_call("look"), reply("done", usage=usage(50, 20, cached=32, reasoning=12)),
                        reply("done", usage=usage(40, 3, cached=8)),
                        reply("done", usage=usage(9, 1))])
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        detailed = await agent.run(Echo(vf.TaskData(prompt="first")))
        partial = await agent.run(Echo(vf.TaskData(prompt="second")))
        plain = await agent.run(Echo(vf.TaskData(prompt="third")))
    assert [(c.cached_tokens, c.reasoning_tokens) for c in detailed.model_calls] == [(None, None), (32, 12)]
    assert (detailed.usage.cached_tokens, detailed.usage.reasoning_tokens) == (32, 12)
    assert (partial.usage.cached_tokens, partial.usage.reasoning_tokens) == (8, None)   # absent is not 0
    assert (plain.usage.cached_tokens, plain.usage.reasoning_tokens) == (None, None)

    writer = TraceWriter(tmp_path, "details")
    for index, trace in enumerate((detailed, partial, plain)):
        writer.add(trace, rollout_index=index, environment="echo", config_hash="h", elapsed_s=1.0)
    writer.flush()
    rows = read_rollouts(tmp_path).sort_values("rollout_index")
    assert rows["cached_tokens"].tolist()[:2] == [32, 8] and null(rows["cached_tokens"].iloc[2])
    assert rows["reasoning_tokens"].iloc[0] == 12 and null(rows["reasoning_tokens"].iloc[1])
    calls = read_model_calls(tmp_path).sort_values(["rollout_id", "call_index"])
    mine = calls[calls["rollout_id"] == detailed.id]
    assert null(mine["cached_tokens"].iloc[0])
    assert (mine["cached_tokens"].iloc[1], mine["reasoning_tokens"].iloc[1]) == (32, 12)
    summary = summarize(rows, run_id="details")
    assert (summary.cached_tokens, summary.reasoning_tokens) == (40, 12)
    assert (summary.environments[0].cached_tokens, summary.environments[0].reasoning_tokens) == (40, 12)
    assert summary.table()[0]["cached_tokens"] == 40
    only_plain = summarize(rows[rows["rollout_index"] == 2], run_id="details")
    assert (only_plain.cached_tokens, only_plain.reasoning_tokens) == (None, None)
    assert "cached_tokens" not in only_plain.table()[0]          # no column of unknowns in the printed table


async def test_a_retried_call_keeps_each_failed_attempt_on_the_trace_and_in_model_calls(openai_server, agent_config,
                                                                                      tmp_path):
    openai_server.play([status(500, body="upstream exploded"), status(503), reply("done")])
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(Echo(vf.TaskData(prompt="go")))
    (call,) = trace.model_calls
    assert (call.retries, call.status_code, trace.reward) == (2, 200, 1.0)
    assert [(a.status_code, "upstream exploded" in a.error) for a in call.attempts] == [(500, True), (503, False)]

    openai_server.play([status(500, body="still down")] * 3)
    async with vf.make_agent(agent_config(retries=vf.StageRetryConfig(segment=0))) as agent:
        failed = await agent.run(Echo(vf.TaskData(prompt="go")))
    assert [a.status_code for a in failed.model_calls[0].attempts] == [500, 500, 500]   # every failed attempt

    writer = TraceWriter(tmp_path, "attempts")
    writer.add(trace, rollout_index=0, environment="echo", config_hash="h", elapsed_s=1.0)
    writer.add(failed, rollout_index=1, environment="echo", config_hash="h", elapsed_s=1.0)
    writer.flush()
    calls = read_model_calls(tmp_path).set_index("rollout_id")
    stored = json.loads(calls.loc[trace.id, "attempts"])
    assert [(a["status_code"], sorted(a)) for a in stored] == [(500, ["error", "status_code"]),
                                                                (503, ["error", "status_code"])]
    assert "upstream exploded" in stored[0]["error"] and len(json.loads(calls.loc[failed.id, "attempts"])) == 3


def test_a_dataset_written_before_these_columns_stays_readable(tmp_path):
    trace = vf.Trace(task_id="old", model="m", reward=1.0, stop_condition="agent_completed")
    new_only = {"cached_tokens", "reasoning_tokens", "attempts", "cache_write_tokens"}
    old_rollouts = pa.schema([f for f in ROLLOUTS if f.name not in new_only])
    old_calls = pa.schema([f for f in MODEL_CALLS if f.name not in new_only])
    row = {k: v for k, v in rollout_row(trace, rollout_index=0, environment="e", config_hash="h", elapsed_s=1.0).items()
           if k not in new_only} | {"schema_version": 1}
    write_table(tmp_path, "rollouts/date=2026-11-30/run_id=old/part-1.parquet",
                pa.Table.from_pylist([row], schema=old_rollouts))
    trace.model_calls.append(ModelCall(segment=0, started_at=1.8e9, latency_ms=5.0, finish_reason="stop"))
    call = {k: v for k, v in model_call_rows(trace, rollout_index=0, environment="e")[0].items() if k not in new_only}
    write_table(tmp_path, "model_calls/date=2026-11-30/run_id=old/part-1.parquet",
                pa.Table.from_pylist([call], schema=old_calls))
    rows = read_rollouts(tmp_path)
    assert null(rows["cached_tokens"].iloc[0]) and null(rows["reasoning_tokens"].iloc[0])
    assert null(rows["cache_write_tokens"].iloc[0])
    assert [null(value) for value in read_model_calls(tmp_path)["attempts"]] == [True]
    assert [null(value) for value in read_model_calls(tmp_path)["cache_write_tokens"]] == [True]
    summary = summarize(rows, run_id="old")
    assert (summary.rollouts, summary.cached_tokens, summary.reasoning_tokens) == (1, None, None)


def test_cache_writes_reach_the_call_the_usage_both_tables_and_the_price(tmp_path):
    """Anthropic bills a prompt-cache write at its own price (``price.cache_write``): a call's
    ``cache_write_tokens`` lands on its record, the trace's usage, both tables (schema 8), and the cost."""
    from prefect_rollouts.config.base import PriceConfig
    from prefect_rollouts.pricing import call_cost_usd

    price = PriceConfig(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75)
    cost = call_cost_usd(price, 10_000, 500, cached_tokens=8_000, cache_write_tokens=1_000)
    assert math.isclose(cost, (1_000 * 3 + 8_000 * 0.3 + 1_000 * 3.75 + 500 * 15) / 1e6)
    trace = vf.Trace(task_id="t", model="m", reward=1.0, stop_condition="agent_completed")
    trace.model_calls.append(ModelCall(segment=0, started_at=1.8e9, latency_ms=5.0, prompt_tokens=10_000,
                                       completion_tokens=500, cached_tokens=8_000, cache_write_tokens=1_000))
    trace.usage.add(10_000, 500, 8_000, None, cost, 1_000)
    trace.usage.add(100, 5)   # a call that reports no cache write leaves the sum as it is
    writer = TraceWriter(tmp_path, "r")
    writer.add(trace, rollout_index=0, environment="e", config_hash="h", elapsed_s=1.0)
    writer.flush()
    assert read_rollouts(tmp_path)["cache_write_tokens"].tolist() == [1_000]
    assert read_model_calls(tmp_path)["cache_write_tokens"].tolist() == [1_000]

"""rollout_flow: each stage a task run, retries and deadlines visible in Prefect, same traces as inline."""

from __future__ import annotations

import json

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

import prefect_rollouts as vf
from tests.fakes.openai_server import delayed, reply, status, tool_call
from tests.support.waiting import wait_for

pytestmark = pytest.mark.prefect


class Add(vf.Task):
    @vf.reward
    def correct(self, trace):
        return float(trace.last_reply == "5")


async def task_runs_of(flow_run_id: str, expected: int) -> list:
    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        final = [r for r in runs if r.state and r.state.is_final()]
        return sorted(final, key=lambda r: r.expected_start_time) if len(final) >= expected else None
    return await wait_for(read, what=f"{expected} task runs of flow run {flow_run_id} to end")


def prefect_config(agent_config, **fields):
    return agent_config(orchestrator="prefect", **fields)


async def test_each_stage_is_a_task_run_of_one_flow_run_named_after_task_index_and_model(openai_server, agent_config):
    openai_server.play([tool_call("bash", command="true"), reply("5")])
    async with vf.make_agent(prefect_config(agent_config)) as agent:
        trace = await agent.run(Add(vf.TaskData(prompt="2+3?", id="add-1")))
    assert trace.reward == 1.0
    flow_run_id = trace.info["flow_run_id"]
    runs = await task_runs_of(flow_run_id, 4)     # setup and teardown run in the flow body (IN_FLOW_BODY)
    assert [(r.name, r.state.name) for r in runs] == [
        ("segment-0", "Completed"), ("finalize", "Completed"), ("skip-check", "Completed"), ("scoring", "Completed")]
    assert {"setup", "teardown"} <= set(trace.timings)
    async with get_client() as client:
        flow_run = await client.read_flow_run(flow_run_id)
    assert flow_run.name == "add-1 #0 · scripted" and flow_run.state.is_completed()   # Agent.run: rollout 0
    assert flow_run.parameters["rollout"]["task_id"] == "add-1"


async def test_a_stage_deadline_is_a_timed_out_task_run_and_on_the_trace(openai_server, agent_config):
    openai_server.play([delayed(2.0, reply("5"))])
    config = prefect_config(agent_config, timeouts=vf.TimeoutConfig(agent=0.3))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Add(vf.TaskData(prompt="2+3?")))
    assert (trace.stop_condition, trace.is_timeout) == ("agent_timeout", True)
    runs = {r.name: r.state.name for r in await task_runs_of(trace.info["flow_run_id"], 4)}
    assert runs["segment-0"] == "TimedOut" and runs["scoring"] == "Completed"


async def test_a_segment_is_retried_as_a_task_run_retry_after_a_provider_error(openai_server, agent_config):
    openai_server.play([status(500)] * 3 + [reply("5")])   # client: 1 + 2 retries fail; the segment retry succeeds
    async with vf.make_agent(prefect_config(agent_config)) as agent:
        trace = await agent.run(Add(vf.TaskData(prompt="2+3?")))
    assert (trace.reward, trace.errors, [c.status_code for c in trace.model_calls]) == (1.0, [], [500, 200])
    runs = await task_runs_of(trace.info["flow_run_id"], 4)
    segment = next(r for r in runs if r.name == "segment-0")
    assert segment.run_count == 2 and segment.state.name == "Completed"


async def test_an_interaction_is_one_flow_run_with_a_segment_task_run_per_turn(openai_server, agent_config):
    openai_server.play([reply("hi"), reply("5")])
    async with vf.make_agent(prefect_config(agent_config, harness="chat")) as agent:
        async with agent.interaction(Add(vf.TaskData(prompt=None))) as interaction:
            first = await interaction.turn("hello")
            second = await interaction.turn("2+3?")
    assert (first.last_reply, second.last_reply, interaction.trace.reward) == ("hi", "5", 1.0)
    names = [r.name for r in await task_runs_of(interaction.trace.info["flow_run_id"], 5)]
    assert names == ["segment-0", "segment-1", "finalize", "skip-check", "scoring"]


def comparable(trace: vf.Trace) -> dict:
    """The trace without what differs run to run (ids, clocks, the flow run id)."""
    data = json.loads(trace.model_dump_json())
    for key in ("id", "started_at", "timings", "agent"):
        data.pop(key)
    data["info"].pop("flow_run_id", None)
    for call in data["model_calls"]:
        call.pop("started_at"), call.pop("latency_ms")
    for call in data["tool_calls"]:
        call.pop("latency_ms"), call.pop("id")
        call["output"] = call["output"].split("/rollout-")[0]
    for message in data["messages"]:              # the scripted server numbers tool calls per session
        message.pop("tool_call_id", None)
        for call in message.get("tool_calls") or []:
            call.pop("id")
    return data


async def test_inline_and_prefect_give_the_same_trace_for_the_same_replies(openai_server, agent_config):
    script = [tool_call("bash", command="echo hi"), status(500), reply("4", finish_reason="length"), reply("5")]
    traces = {}
    for orchestrator in ("inline", "prefect"):
        openai_server.play(list(script))
        config = agent_config(orchestrator=orchestrator, client=vf.ClientConfig(
            base_url=openai_server.base_url, api_key_env=None, retries=vf.RetryConfig(max_retries=0)))
        async with vf.make_agent(config) as agent:
            traces[orchestrator] = await agent.run(Add(vf.TaskData(prompt="2+3?")))
    assert traces["inline"].reward == 0.0 and traces["inline"].is_truncated
    assert comparable(traces["inline"]) == comparable(traces["prefect"])


async def test_each_user_turn_of_a_multi_turn_task_is_a_segment_task_run(openai_server, agent_config):
    openai_server.play([reply("1"), reply("2"), reply("5")])
    task = Add(vf.TaskData(prompt="1?", user_turns=["2?", "2+3?"]))
    async with vf.make_agent(prefect_config(agent_config)) as agent:
        trace = await agent.run(task)
    assert trace.reward == 1.0 and len(trace.segments) == 3
    names = [r.name for r in await task_runs_of(trace.info["flow_run_id"], 6)]
    assert names == ["segment-0", "segment-1", "segment-2", "finalize", "skip-check", "scoring"]

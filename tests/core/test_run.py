"""Agent.run: the whole lifecycle against the scripted server (real sockets)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

import prefect_rollouts as vf
from tests.fakes.openai_server import delayed, reply, status, tool_call, tool_calls
from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit


class Add(vf.Task):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == self.data.answer)

    @vf.metric
    def reply_length(self, trace):
        return len(trace.last_reply)


def add_task(**fields):
    return Add(vf.TaskData(prompt="2+3? Answer with a number.", answer="5", **fields))


async def test_run_happy_path_scores_and_records_everything(openai_server, agent_config):
    openai_server.play([reply("5", usage={"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13})])
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(add_task(system_prompt="Be brief."))
    assert (trace.reward, trace.rewards, trace.metrics) == (1.0, {"correct": 1.0}, {"reply_length": 1.0})
    assert (trace.stop_condition, trace.is_truncated, trace.is_timeout, trace.errors) == ("agent_completed", False,
                                                                                          False, [])
    assert (trace.usage.prompt_tokens, trace.usage.completion_tokens, trace.usage.total_tokens) == (12, 1, 13)
    assert [m["role"] for m in trace.messages] == ["system", "user", "assistant"]
    assert len(trace.model_calls) == 1 and trace.model_calls[0].finish_reason == "stop"
    assert trace.model_calls[0].latency_ms > 0 and trace.model_calls[0].retries == 0
    assert set(trace.timings) >= {"setup", "agent", "finalize", "scoring", "teardown"}
    assert trace.task_id == add_task(system_prompt="Be brief.").id and len(trace.id) == 32
    request = openai_server.requests[0].body
    assert request["model"] == "scripted" and request["messages"][1]["content"].startswith("2+3?")


async def test_wrong_answer_scores_zero(openai_server, agent_config):
    openai_server.play([reply("6")])
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(add_task())
    assert trace.reward == 0.0


async def test_reward_weights_sum_and_a_raising_reward_leaves_no_reward(openai_server, agent_config):
    class Weighted(vf.Task):
        @vf.reward(weight=0.25)
        def half(self):
            return 1.0

        @vf.reward(weight=2.0)
        def two(self, trace, task, runtime):
            assert task is self and runtime is not None
            return True

    class Broken(vf.Task):
        @vf.reward
        def boom(self, trace):
            raise KeyError("missing")

    openai_server.default = reply("ok")
    async with vf.make_agent(agent_config()) as agent:
        good = await agent.run(Weighted(vf.TaskData(prompt="x")))
        bad = await agent.run(Broken(vf.TaskData(prompt="x")))
    assert good.reward == pytest.approx(2.25)
    assert bad.reward is None and bad.rewards == {"boom": None}
    assert bad.errors[0].type == "TaskError" and "boom" in bad.errors[0].message
    assert bad.stop_condition == "scoring_error"     # the agent finished, then scoring failed


async def test_a_failing_finalize_or_interaction_scoring_replaces_the_completed_stop(openai_server, agent_config):
    class BrokenFinalize(Add):
        async def finalize(self, trace):
            raise OSError("disk gone")

    class BrokenReward(vf.Task):
        @vf.reward
        def boom(self, trace):
            raise KeyError("missing")

    openai_server.default = reply("5")
    async with vf.make_agent(agent_config(max_turns=3)) as agent:
        finalize_failed = await agent.run(BrokenFinalize(vf.TaskData(prompt="2+3?", answer="5")))
        async with agent.interaction(BrokenReward(vf.TaskData(prompt=None))) as interaction:
            await interaction.turn("hi")
    assert (finalize_failed.stop_condition, finalize_failed.reward, finalize_failed.errors[0].stage) == (
        "task_error", None, "finalize")
    trace = interaction.trace
    assert (trace.stop_condition, trace.reward, trace.errors[0].stage) == ("scoring_error", None, "scoring")


class Calculator(vf.Task):
    def tools(self):
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: First addend.
                b: Second addend.
            """
            return a + b

        def explode() -> str:
            """Always fails."""
            raise RuntimeError("kaboom")
        return [add, explode]

    @vf.reward
    def correct(self, trace):
        return float(trace.last_reply == "5")


async def test_tools_loop_runs_a_python_tool_and_returns_its_result_to_the_model(openai_server, agent_config):
    openai_server.play([tool_call("add", a=2, b=3), reply("5")])
    config = agent_config(harness=vf.HarnessConfig(id="tools", runtime_tools=[]))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Calculator(vf.TaskData(prompt="add 2 and 3")))
    assert trace.reward == 1.0
    assert [(t.name, t.output, t.is_error) for t in trace.tool_calls] == [("add", "5", False)]
    offered = openai_server.requests[0].body["tools"]
    add_schema = next(t["function"] for t in offered if t["function"]["name"] == "add")
    assert add_schema["description"] == "Add two integers."
    assert add_schema["parameters"]["properties"]["a"] == {"type": "integer", "description": "First addend."}
    assert add_schema["parameters"]["required"] == ["a", "b"]
    second = openai_server.requests[1].messages
    assert second[-2]["role"] == "assistant" and second[-2]["content"] == ""   # "" not null next to tool_calls
    assert second[-1] == {"role": "tool", "tool_call_id": second[-2]["tool_calls"][0]["id"], "content": "5"}


async def test_tool_errors_go_back_to_the_model_and_the_loop_continues(openai_server, agent_config):
    openai_server.play([
        tool_calls(("explode", {}), ("nope", {}), ("add", {"a": "x"})),
        tool_call("add", raw_arguments="{not json"),
        reply("5"),
    ])
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        trace = await agent.run(Calculator(vf.TaskData(prompt="add")))
    outputs = [t.output for t in trace.tool_calls]
    assert all(t.is_error for t in trace.tool_calls) and len(outputs) == 4
    assert outputs[0] == "Error: explode raised RuntimeError: kaboom"
    assert outputs[1].startswith("Error: unknown tool 'nope'. Available tools: add, explode")
    assert "invalid arguments for 'add'" in outputs[2] and "a: Input should be a valid integer" in outputs[2]
    assert "not a valid JSON object" in outputs[3]
    assert (trace.reward, trace.errors, trace.stop_condition) == (1.0, [], "agent_completed")
    assert [m["content"] for m in openai_server.requests[1].messages if m["role"] == "tool"] == outputs[:3]


async def test_bash_tool_runs_in_the_rollout_workspace(openai_server, agent_config):
    class Files(vf.Task):
        @vf.reward
        async def wrote(self, runtime):
            return float((await runtime.read_file("out.txt")) == b"hello\n")

    openai_server.play([tool_call("bash", command="cat seed.txt > out.txt && pwd"), reply("done")])
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(Files(vf.TaskData(prompt="copy", files={"seed.txt": "hello\n"})))
    assert trace.reward == 1.0
    output = trace.tool_calls[0].output
    assert output.startswith("exit_code: 0\nstdout:\n/") and "rollout-" in output
    workspace = output.split("\n")[2]
    import os
    assert not os.path.exists(workspace)   # noqa: ASYNC240 (one stat) teardown removed the workspace


async def test_max_turns_stops_the_tools_loop_and_truncates(openai_server, agent_config):
    openai_server.play([tool_call("bash", command="true")] * 5)
    async with vf.make_agent(agent_config(max_turns=2)) as agent:
        trace = await agent.run(add_task())
    assert (trace.stop_condition, trace.is_truncated) == ("max_turns", True)
    assert len(openai_server.requests) == 2 and len(trace.tool_calls) == 2
    assert trace.reward == 0.0   # scored (no skip rule): the partial run answers nothing


async def test_max_turn_tokens_is_sent_and_a_length_finish_stops_before_the_next_call(openai_server, agent_config):
    openai_server.play([reply("2 plus 3 is", finish_reason="length"), reply("5")])
    async with vf.make_agent(agent_config(max_turn_tokens=4)) as agent:
        trace = await agent.run(add_task())
    assert openai_server.requests[0].body["max_tokens"] == 4
    assert (trace.stop_condition, trace.is_truncated, len(openai_server.requests)) == ("max_turn_tokens", True, 1)
    assert trace.reward == 0.0 and "scoring_skipped" not in trace.info


async def test_skip_on_truncated_gives_zero_reward_and_still_finalizes(openai_server, agent_config):
    finalized = []

    class Tracked(Add):
        async def finalize(self, trace, runtime):
            finalized.append(trace.stop_condition)

    openai_server.play([reply("5", finish_reason="length")])
    config = agent_config(max_turn_tokens=4, scoring=vf.ScoringConfig(skip_on_truncated=True))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Tracked(vf.TaskData(prompt="2+3?", answer="5")))
    assert (trace.reward, trace.rewards, trace.metrics) == (0.0, {}, {})
    assert trace.info["scoring_skipped"] == "truncated" and finalized == ["max_turn_tokens"]


async def test_a_length_finish_without_a_token_cap_is_truncated_but_not_stopped(openai_server, agent_config):
    openai_server.play([reply("5", finish_reason="length")])
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(add_task())
    assert (trace.stop_condition, trace.is_truncated, trace.reward) == ("agent_completed", True, 1.0)


@pytest.mark.parametrize("skip", [False, True])
async def test_agent_timeout_stops_the_run_and_skip_on_timeout_decides_scoring(openai_server, agent_config, skip):
    openai_server.play([delayed(1.0, reply("5"))])
    config = agent_config(timeouts=vf.TimeoutConfig(agent=0.2), scoring=vf.ScoringConfig(skip_on_timeout=skip))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(add_task())
    assert (trace.stop_condition, trace.is_timeout, trace.errors) == ("agent_timeout", True, [])
    (call,) = trace.model_calls                                  # the call the deadline cut short
    assert call.finish_reason is None and "cancelled" in call.error and call.latency_ms > 150   # cut at 0.2 s
    if skip:
        assert (trace.reward, trace.info["scoring_skipped"], trace.rewards) == (0.0, "timeout", {})
    else:
        assert (trace.reward, trace.rewards) == (0.0, {"correct": 0.0})   # scored on the partial run
        assert "scoring_skipped" not in trace.info


async def test_setup_and_finalize_timeouts(openai_server, agent_config):
    class SlowSetup(Add):
        async def setup(self, runtime):
            await asyncio.sleep(5)

    class SlowFinalize(Add):
        async def finalize(self, trace, runtime):
            await asyncio.sleep(5)

    openai_server.default = reply("5")
    config = agent_config(timeouts=vf.TimeoutConfig(setup=0.1, finalize=0.1))
    async with vf.make_agent(config) as agent:
        slow_setup = await agent.run(SlowSetup(vf.TaskData(prompt="2+3?", answer="5")))
        slow_finalize = await agent.run(SlowFinalize(vf.TaskData(prompt="2+3?", answer="5")))
    assert (slow_setup.stop_condition, slow_setup.is_timeout, slow_setup.model_calls) == ("setup_timeout", True, [])
    assert (slow_setup.reward, slow_setup.rewards) == (None, {})   # the agent never ran: not scored
    assert (slow_finalize.stop_condition, slow_finalize.is_timeout) == ("finalize_timeout", True)
    assert slow_finalize.reward == 1.0     # scoring still runs after a finalize timeout


async def test_scoring_timeout_leaves_no_reward(openai_server, agent_config):
    class SlowScore(vf.Task):
        @vf.reward
        async def slow(self):
            await asyncio.sleep(5)
            return 1.0

    openai_server.play([reply("5")])
    async with vf.make_agent(agent_config(timeouts=vf.TimeoutConfig(scoring=0.1))) as agent:
        trace = await agent.run(SlowScore(vf.TaskData(prompt="x")))
    assert (trace.stop_condition, trace.is_timeout, trace.reward) == ("scoring_timeout", True, None)


async def test_429_then_success_is_retried_and_counted(openai_server, agent_config):
    openai_server.play([status(429, headers={"Retry-After": "0"}), reply("5")])
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(add_task())
    assert trace.reward == 1.0 and trace.model_calls[0].retries == 1 and len(openai_server.requests) == 2


async def test_persistent_500_is_a_provider_error_on_the_trace_and_no_reward(openai_server, agent_config):
    openai_server.default = status(500)
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(add_task())
    assert len(openai_server.requests) == 6          # (1 + client max_retries=2) x (1 + segment retries=1)
    assert trace.reward is None and trace.rewards == {}
    assert (trace.stop_condition, trace.errors[0].type, trace.errors[0].status_code) == ("provider_error",
                                                                                         "ProviderError", 500)
    assert trace.model_calls[0].status_code == 500 and trace.model_calls[0].retries == 2


async def test_a_retried_segment_resumes_where_the_failed_call_left_it(openai_server, agent_config):
    openai_server.play([tool_call("bash", command="echo one >> log; cat log"), status(500), status(500), status(500),
                        tool_call("bash", command="echo two >> log; cat log"), reply("5")])
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(add_task())
    assert (trace.reward, trace.errors, trace.stop_condition) == (1.0, [], "agent_completed")
    retried = openai_server.requests[4].messages
    assert [m["role"] for m in retried] == ["user", "assistant", "tool"]   # the tool result was kept
    assert [t.output.split("\n")[2:4] for t in trace.tool_calls] == [["one", ""], ["one", "two"]]
    assert [c.status_code for c in trace.model_calls] == [200, 500, 200, 200]   # the failed call stays visible
    assert len(trace.segments) == 1 and trace.segments[0].model_calls == 4


async def test_a_steer_delivered_before_a_retried_call_is_not_lost(openai_server, agent_config):
    # the first reply waits, so the steer lands before the second call (the one that fails)
    openai_server.play([delayed(0.3, tool_call("bash", command="true")), status(500), status(500), status(500),
                        reply("5")])
    async with vf.make_agent(agent_config()) as agent:
        async with agent.interaction(add_task()) as it:
            turn = asyncio.create_task(it.turn())
            await wait_for(lambda: openai_server.requests, 5, 0.01, what="the turn's first model request")
            await it.send("answer with a number", mode="steer")
            await turn
        trace = it.trace
    (sent,) = trace.sends
    assert sent.status == "delivered" and any(m.get("content") == "answer with a number" for m in trace.messages)
    # the failed call
    assert any(m.get("content") == "answer with a number" for m in openai_server.requests[1].messages)
    assert any(m.get("content") == "answer with a number" for m in openai_server.requests[-1].messages)  # its retry


async def test_api_key_is_read_at_request_time_and_never_reaches_the_trace(openai_server, agent_config, monkeypatch):
    openai_server.default = reply("5")
    config = agent_config(client=vf.ClientConfig(base_url=openai_server.base_url, api_key_env="TEST_OPENAI_KEY",
                                                 headers={"X-Org": "org-secret"}),
                          scoring=vf.ScoringConfig(env={"TOKEN": "${JUDGE}", "RAW": "literal-secret"}))
    async with vf.make_agent(config) as agent:
        monkeypatch.setenv("TEST_OPENAI_KEY", "sk-first")
        await agent.run(add_task())
        monkeypatch.setenv("TEST_OPENAI_KEY", "sk-second")
        monkeypatch.setenv("JUDGE", "judge-secret")
        trace = await agent.run(add_task())
    assert [r.headers["authorization"] for r in openai_server.requests] == ["Bearer sk-first", "Bearer sk-second"]
    assert openai_server.requests[0].headers["x-org"] == "org-secret"
    dumped = trace.model_dump_json()
    for secret in ("sk-first", "sk-second", "org-secret", "literal-secret", "judge-secret"):
        assert secret not in dumped
    assert trace.agent["scoring"]["env"] == {"TOKEN": "${JUDGE}", "RAW": "***"}


async def test_trace_round_trips_through_json(openai_server, agent_config):
    openai_server.play([tool_call("add", a=2, b=3), reply("5")])
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        trace = await agent.run(Calculator(vf.TaskData(prompt="add", info={"category": "math"})))
    text = trace.model_dump_json()
    again = vf.Trace.model_validate_json(text)
    assert again == trace and again.model_dump_json() == text
    assert json.loads(text)["is_truncated"] is False and json.loads(text)["last_reply"] == "5"
    assert again.info["task"] == {"category": "math"}


async def test_run_without_a_prompt_is_a_config_error(agent_config):
    async with vf.make_agent(agent_config()) as agent:
        with pytest.raises(vf.ConfigError, match=re.escape("TaskData.prompt = None")):
            await agent.run(vf.Task(vf.TaskData(prompt=None)))


async def test_unentered_agent_still_runs(openai_server, agent_config):
    openai_server.play([reply("5")])
    trace = await vf.make_agent(agent_config()).run(add_task())
    assert trace.reward == 1.0


async def test_cancellation_still_tears_down_the_workspace(openai_server, agent_config):
    seen = []

    class Watch(vf.Task):
        async def setup(self, runtime):
            seen.append(runtime.workspace)

    openai_server.play([delayed(2.0, reply("x"))])
    async with vf.make_agent(agent_config()) as agent:
        job = asyncio.create_task(agent.run(Watch(vf.TaskData(prompt="x"))))
        await wait_for(lambda: openai_server.requests, 5, 0.01, what="the rollout's model request")
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
    assert seen and not seen[0].exists()


class Counter(vf.Task):
    """A stateful tool kept on the task: each rollout must get its own count."""

    async def setup(self, runtime):
        self.count = 0

    def tools(self):
        def bump() -> int:
            """Add one to the counter and return it."""
            self.count += 1
            return self.count
        return [bump]

    @vf.metric
    def count_at_end(self):
        return self.count


async def test_user_turns_each_run_as_one_more_segment(openai_server, agent_config):
    openai_server.play([tool_call("bump"), reply("one"), reply("noted"), tool_call("bump"), reply("two")])
    task = Counter(vf.TaskData(prompt="bump", user_turns=["say noted", [{"role": "user", "content": "bump again"}]]))
    async with vf.make_agent(agent_config(harness="tools")) as agent:
        trace = await agent.run(task)
    assert [s.index for s in trace.segments] == [0, 1, 2] and trace.stop_condition == "agent_completed"
    assert [m["content"] for m in trace.messages if m["role"] == "user"] == ["bump", "say noted", "bump again"]
    assert [(c.segment, c.output) for c in trace.tool_calls] == [(0, "1"), (2, "2")]
    assert trace.metrics == {"count_at_end": 2.0} and not hasattr(task, "count")


async def test_a_stopped_run_sends_no_further_user_turns(openai_server, agent_config):
    openai_server.play([tool_call("bump"), tool_call("bump")])
    task = Counter(vf.TaskData(prompt="bump", user_turns=["again", "and again"]))
    async with vf.make_agent(agent_config(harness="tools", max_turns=2)) as agent:
        trace = await agent.run(task)
    assert trace.stop_condition == "max_turns" and len(trace.segments) == 1 and len(openai_server.requests) == 2


async def test_concurrent_rollouts_of_one_task_keep_their_own_task_state(openai_server, agent_config):
    openai_server.default = lambda request: (reply("done") if request.messages[-1]["role"] == "tool"
                                             else tool_call("bump"))
    task = Counter(vf.TaskData(prompt="bump"))
    async with vf.make_agent(agent_config(harness="tools")) as agent:
        traces = await asyncio.gather(*(agent.run(task) for _ in range(4)))
    assert [t.metrics["count_at_end"] for t in traces] == [1.0] * 4


@pytest.mark.parametrize("turns, problem", [([""], r"user_turns\[0\] is empty"), ([[]], "empty message list"),
                                            ([[{"foo": 1}]], "needs a role")])
def test_user_turns_must_be_real_messages(turns, problem):
    with pytest.raises(ValueError, match=problem):
        vf.TaskData(prompt="hi", user_turns=turns)


async def test_max_turns_reached_before_a_user_turn_sends_no_more_turns(openai_server, agent_config):
    openai_server.play([reply("one"), reply("two")])
    async with vf.make_agent(agent_config(max_turns=2)) as agent:
        trace = await agent.run(Counter(vf.TaskData(prompt="a", user_turns=["b", "c"])))
    assert trace.stop_condition == "max_turns"
    assert [m["content"] for m in trace.messages if m["role"] == "user"] == ["a", "b"]
    assert len(trace.segments) == 2 and trace.segments[-1].terminated


class Clienty(vf.Task):
    """A task whose pickling hook drops a live client, and which keeps a log made per rollout."""

    def __init__(self, data, client):
        super().__init__(data)
        self.client = client

    def __getstate__(self):
        return {**self.__dict__, "client": None}

    async def setup(self, runtime):
        self.log = []

    @vf.metric
    def has_client(self):
        return self.client is not None


async def test_rollout_copies_keep_attributes_a_pickling_hook_would_drop(openai_server, agent_config):
    openai_server.default = reply("x")
    async with vf.make_agent(agent_config()) as agent:
        task = Clienty(vf.TaskData(prompt="hi"), client=object())
        trace = await agent.run(task)
        async with agent.interaction(task) as it:
            await it.turn()
            assert it.task is not task and it.task.log == [] and not hasattr(task, "log")
    assert trace.metrics == {"has_client": 1.0}


async def test_tool_arguments_nested_100000_deep_are_a_tool_error_not_a_recursion_error(openai_server, agent_config):
    openai_server.play([tool_call("add", raw_arguments='{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"), reply("5")])
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        trace = await agent.run(Calculator(vf.TaskData(prompt="add")))
    assert trace.tool_calls[0].is_error and trace.errors == []
    assert "the text nests deeper than 128 levels (MAX_JSON_DEPTH)" in trace.tool_calls[0].output

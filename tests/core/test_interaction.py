"""Agent.interaction: turn(), send() with steer and queue, receipts, closing."""

from __future__ import annotations

import asyncio

import pytest

import prefect_rollouts as vf
from tests.fakes.openai_server import delayed, reply, tool_call
from tests.support.waiting import wait_for, within

pytestmark = pytest.mark.unit


class Echo(vf.Task):
    @vf.reward
    def said_bye(self, trace):
        return float(trace.last_reply == "bye")


async def test_interaction_with_a_prompt_opens_with_a_bare_turn_and_scores_on_exit(openai_server, agent_config):
    openai_server.play([reply("hi"), reply("bye")])
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(id="chat"))) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt="greet me"))) as interaction:
            first = await interaction.turn()
            second = await interaction.turn("now leave")
    trace = interaction.trace
    assert (first.last_reply, first.terminated, second.last_reply) == ("hi", False, "bye")
    assert [m["role"] for m in first.messages] == ["assistant"]
    assert [m["content"] for m in trace.messages] == ["greet me", "hi", "now leave", "bye"]
    assert (trace.stop_condition, trace.reward, len(trace.segments)) == ("user_closed", 1.0, 2)


async def test_opening_turn_must_match_the_prompt(openai_server, agent_config):
    openai_server.default = reply("x")
    async with vf.make_agent(agent_config()) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt="p"))) as interaction:
            with pytest.raises(ValueError, match="bare turn"):
                await interaction.turn("hello")
        async with agent.interaction(Echo(vf.TaskData(prompt=None))) as interaction:
            with pytest.raises(ValueError, match="turn\\(message\\)"):
                await interaction.turn()


async def test_seed_loop_with_prompt_none_ends_at_max_turns(openai_server, agent_config):
    openai_server.default = lambda request: reply(f"echo {len(request.messages)}")
    config = agent_config(max_turns=3, harness=vf.HarnessConfig(id="chat"))
    async with vf.make_agent(config) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt=None))) as interaction:
            segment = await interaction.turn("hello")
            replies = [segment.last_reply]
            while not segment.terminated and len(replies) < 10:   # bounded: the assert below names a runaway
                segment = await interaction.turn(f"you said: {segment.last_reply}")
                replies.append(segment.last_reply)
    trace = interaction.trace
    assert replies == ["echo 1", "echo 3", "echo 5"]     # the third segment is terminated: the cap is reached
    assert (trace.stop_condition, trace.is_truncated, len(openai_server.requests)) == ("max_turns", True, 3)
    assert trace.segments[-1].terminated and trace.messages[-1] == {"role": "assistant", "content": "echo 5"}


async def test_turn_after_the_max_turns_segment_does_not_consume_the_message(openai_server, agent_config):
    openai_server.default = reply("only")
    async with vf.make_agent(agent_config(max_turns=1, harness="chat")) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt=None))) as interaction:
            first = await interaction.turn("hello")
            later = await interaction.turn("ignored")
    assert first.terminated and (later.messages, later.terminated) == ([], True)
    assert [m["content"] for m in interaction.trace.messages] == ["hello", "only"]


async def test_turn_after_termination_returns_an_empty_terminated_segment(openai_server, agent_config):
    openai_server.play([reply("cut", finish_reason="length")])
    async with vf.make_agent(agent_config(max_turn_tokens=2)) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt=None))) as interaction:
            first = await interaction.turn("go")
            later = await interaction.turn("more")
    assert first.terminated and interaction.trace.stop_condition == "max_turn_tokens"
    assert (later.messages, later.terminated, later.last_reply) == ([], True, "")
    assert "more" not in [m["content"] for m in interaction.trace.messages]


async def test_two_queued_sends_are_delivered_together_in_order_at_the_next_turn(openai_server, agent_config):
    openai_server.play([delayed(0.3, reply("working")), reply("got both")])
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(id="chat"))) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt="start"))) as interaction:
            opening = asyncio.create_task(interaction.turn())
            await wait_for(lambda: openai_server.requests, 5, 0.01, what="the opening turn's model request")
            first = await interaction.send("one", mode="queue", message_id="q1")
            second = await interaction.send("two", mode="queue", message_id="q2")
            assert len(openai_server.requests) == 1          # nothing interrupted the running turn
            await opening
            await interaction.wait_idle()
    trace = interaction.trace
    assert first.accepted and second.accepted and first.mode == "queue"
    assert [m["content"] for m in openai_server.requests[1].messages[-2:]] == ["one", "two"]
    assert [m["role"] for m in openai_server.requests[1].messages] == ["user", "assistant", "user", "user"]
    assert [(s.message_id, s.status, s.delivered_segment) for s in trace.sends] == [("q1", "delivered", 1),
                                                                                  ("q2", "delivered", 1)]
    assert len(trace.segments) == 2 and trace.last_reply == "got both"


async def test_steer_lands_between_a_tool_call_and_the_next_model_call(openai_server, agent_config):
    started, steered = asyncio.Event(), asyncio.Event()

    class Slow(vf.Task):
        def tools(self):
            async def wait() -> str:
                """Wait until the test has steered."""
                started.set()
                await asyncio.wait_for(steered.wait(), timeout=5)
                return "waited"
            return [wait]

    openai_server.play([tool_call("wait"), reply("adjusted")])
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(runtime_tools=[]))) as agent:
        async with agent.interaction(Slow(vf.TaskData(prompt="do it"))) as interaction:
            opening = asyncio.create_task(interaction.turn())
            await within(started.wait(), 5, "the tool to start")
            receipt = await interaction.send("use the fast path", mode="steer", message_id="s1")
            steered.set()
            segment = await opening
    assert receipt.accepted and receipt.mode == "steer"
    roles = [(m["role"], m.get("content")) for m in openai_server.requests[1].messages]
    assert roles[-3:] == [("assistant", ""), ("tool", "waited"), ("user", "use the fast path")]
    assert segment.last_reply == "adjusted" and len(interaction.trace.segments) == 1
    assert interaction.trace.sends[0].delivered_segment == 0


async def test_steer_on_the_chat_harness_is_refused_with_a_reason(openai_server, agent_config):
    openai_server.default = reply("x")
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(id="chat"))) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt="p"))) as interaction:
            await interaction.turn()
            receipt = await interaction.send("faster", mode="steer")
    assert not receipt.accepted and "cannot steer" in receipt.reason and "queue" in receipt.reason
    assert interaction.trace.sends[0].status == "refused" and len(openai_server.requests) == 1


async def test_duplicate_message_id_is_delivered_once(openai_server, agent_config):
    openai_server.default = reply("ok")
    async with vf.make_agent(agent_config()) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt=None))) as interaction:
            await interaction.turn("hello")
            first = await interaction.send("again", mode="queue", message_id="dup")
            second = await interaction.send("again", mode="queue", message_id="dup")
            await interaction.wait_idle()
            with pytest.raises(ValueError, match="different message"):
                await interaction.send("other text", mode="queue", message_id="dup")
    assert first == second and first.accepted
    user_texts = [m["content"] for m in interaction.trace.messages if m["role"] == "user"]
    assert user_texts == ["hello", "again"] and len(interaction.trace.sends) == 1


async def test_send_wakes_an_idle_interaction(openai_server, agent_config):
    openai_server.play([reply("first"), reply("woken")])
    async with vf.make_agent(agent_config()) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt="p"))) as interaction:
            await interaction.turn()
            receipt = await interaction.send("are you there?")
            await interaction.wait_idle()
    assert receipt.accepted and receipt.reason == "woke the idle interaction"
    assert interaction.trace.last_reply == "woken" and interaction.trace.sends[0].delivered_segment == 1


async def test_send_before_the_opening_turn_is_refused(openai_server, agent_config):
    async with vf.make_agent(agent_config()) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt="p"))) as interaction:
            receipt = await interaction.send("early", mode="queue")
    assert not receipt.accepted and "opening turn()" in receipt.reason
    assert openai_server.requests == []


async def test_leaving_the_block_cancels_outstanding_deliveries_then_scores(openai_server, agent_config):
    openai_server.play([reply("first"), delayed(2.0, reply("never"))])
    async with vf.make_agent(agent_config()) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt="p"))) as interaction:
            await interaction.turn()
            await interaction.send("late", mode="queue", message_id="late")
            await wait_for(lambda: len(openai_server.requests) >= 2, 5, 0.01, what="the queued send's model request")
    trace = interaction.trace
    assert trace.sends[0].status == "delivered"   # its turn had started; the turn was cancelled
    assert trace.last_reply == "first" and trace.stop_condition == "user_closed" and trace.reward == 0.0


async def test_leaving_waits_for_a_running_turn_and_cancels_queued_sends(openai_server, agent_config):
    openai_server.play([delayed(0.3, reply("slow"))])
    async with vf.make_agent(agent_config()) as agent:
        async with agent.interaction(Echo(vf.TaskData(prompt="p"))) as interaction:
            opening = asyncio.create_task(interaction.turn())
            await wait_for(lambda: openai_server.requests, 5, 0.01, what="the opening turn's model request")
            receipt = await interaction.send("later", mode="queue")
    assert receipt.accepted and opening.done() and opening.result().last_reply == "slow"
    assert [s.status for s in interaction.trace.sends] == ["cancelled"]
    assert len(openai_server.requests) == 1 and interaction.trace.stop_condition == "user_closed"


async def test_exception_inside_the_block_is_recorded_and_reraised(openai_server, agent_config):
    openai_server.default = reply("x")
    with pytest.raises(KeyError):
        async with vf.make_agent(agent_config()) as agent:
            async with agent.interaction(Echo(vf.TaskData(prompt="p"))) as interaction:
                await interaction.turn()
                raise KeyError("caller bug")
    assert interaction.trace.errors[0].type == "KeyError" and interaction.trace.reward is None


async def test_the_readme_steer_pattern_is_accepted_once_the_turn_has_started(openai_server, agent_config):
    import asyncio

    openai_server.play([delayed(0.3, reply("first")), reply("second")])
    async with vf.make_agent(agent_config(harness="tools")) as agent:
        async with agent.interaction(vf.Task(vf.TaskData(prompt="go"))) as interaction:
            turn = asyncio.create_task(interaction.turn())
            await asyncio.sleep(0)     # as the README does: let the turn start
            receipt = await interaction.send("also check X", mode="steer", message_id="s-1")
            await turn
    assert receipt.accepted, receipt.reason

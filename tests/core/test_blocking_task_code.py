"""Sync task code that blocks (a reward, a metric, a hook, a judge's parser) runs off the event
loop: its deadline holds, the other rollouts keep running, and the abandoned thread holds up
neither the eval nor the interpreter's exit."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import prefect_rollouts as vf
from tests.fakes.openai_server import delayed, reply

pytestmark = pytest.mark.unit

RELEASE = threading.Event()
"""Set when a test ends, so no blocked thread outlives it (the blocking calls wait on it)."""

BLOCKED_IN: list[int] = []
"""The thread of each blocking call of the test: none is the event loop's, and none returns before the
test ends (their deadlines are under 1.5 s; they block for 60)."""


@pytest.fixture(autouse=True)
def _release_blocked_threads():
    RELEASE.clear()
    BLOCKED_IN.clear()
    yield
    RELEASE.set()


def block() -> None:
    BLOCKED_IN.append(threading.get_ident())
    RELEASE.wait(60)          # like time.sleep(60), a subprocess.run or a requests.get without timeout


def blocked_off_the_loop() -> bool:
    """Whether a blocking call ran, in a thread other than this one (the event loop's), and is still blocked."""
    return bool(BLOCKED_IN) and threading.get_ident() not in BLOCKED_IN and not RELEASE.is_set()


class Blocking(vf.Task):
    @vf.reward
    def stuck(self, trace):
        block()
        return 1.0


class Fast(vf.Task):
    @vf.reward
    def correct(self, trace):
        return float(trace.last_reply == "5")

    @vf.metric
    def length(self, trace):
        return float(len(trace.last_reply))


async def run_noting_the_order(*runs) -> tuple[list, list[int]]:
    """The results of ``runs``, run at once, and the order in which they finished (indexes into ``runs``);
    a blocking call on the event loop would hold the others back until its deadline."""
    finished: list[int] = []

    async def noted(index: int, run):
        result = await run
        finished.append(index)
        return result
    return list(await asyncio.gather(*(noted(i, run) for i, run in enumerate(runs)))), finished


@pytest.mark.timeout(30)
async def test_a_blocking_sync_reward_times_out_on_time_and_the_other_rollouts_keep_running(
        openai_server, agent_config):
    openai_server.default = lambda request: (delayed(0.5, reply("5")) if "fast" in request.messages[-1]["content"]
                                             else reply("5"))
    async with vf.make_agent(agent_config(timeouts=vf.TimeoutConfig(scoring=1.0))) as agent:
        (trace, *others), finished = await run_noting_the_order(
            agent.run(Blocking(vf.TaskData(prompt="blocking: 2+3?"))),
            agent.run(Fast(vf.TaskData(prompt="fast: 2+3?"))),
            agent.run(Fast(vf.TaskData(prompt="fast: 2+3 again?"))))
        assert blocked_off_the_loop(), "the rollout ended at its deadline, its reward still blocked in a thread"
    assert (trace.stop_condition, trace.is_timeout, trace.reward, trace.rewards) == (
        "scoring_timeout", True, None, {"stuck": None})
    assert trace.timings["scoring"] >= 1.0                 # the whole deadline, not less
    (note,) = trace.info["abandoned_threads"]
    assert "reward 'stuck'" in note and "abandoned" in note and "async" in note
    for other in others:
        assert (other.stop_condition, other.reward, other.metrics) == ("agent_completed", 1.0, {"length": 1.0})
        assert "abandoned_threads" not in other.info
    assert finished[-1] == 0, "the others finished while the reward blocked (a 0.5 s reply; a 1 s deadline)"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hook", ["setup", "finalize"])
async def test_a_blocking_sync_hook_times_out_on_time_without_stalling_the_loop(openai_server, agent_config, hook):
    task_type = type("Stuck", (Fast,), {hook: lambda self, trace, runtime: block()})
    openai_server.default = reply("5")
    config = agent_config(timeouts=vf.TimeoutConfig(**{hook: 0.5}))
    async with vf.make_agent(config) as agent:
        (trace, other), finished = await run_noting_the_order(agent.run(task_type(vf.TaskData(prompt="2+3?"))),
                                                              agent.run(Fast(vf.TaskData(prompt="2+3?"))))
        assert blocked_off_the_loop()
    assert (trace.stop_condition, trace.is_timeout) == (f"{hook}_timeout", True)
    assert trace.timings[hook] >= 0.5
    assert f"{hook} hook" in trace.info["abandoned_threads"][0]
    if hook == "finalize":
        assert trace.reward == 1.0                         # scoring still runs after a finalize timeout
    assert (other.stop_condition, other.reward) == ("agent_completed", 1.0)
    assert finished == [1, 0]                              # the other did not wait for the hook's deadline


class BlockingParser(vf.Judge):
    """A plugin whose reply parser blocks."""

    async def score(self, task, trace):
        return await self.ask(trace, "rate it", lambda text: block() or 1.0)


@pytest.mark.timeout(30)
async def test_a_judge_whose_parser_blocks_times_out_on_time_without_stalling_the_loop(openai_server, agent_config):
    openai_server.default = reply("5")
    judge = {"id": "tests.core.test_blocking_task_code:BlockingParser", "model": "judge",
             "client": {"base_url": openai_server.base_url, "api_key_env": ""}}
    config = agent_config(timeouts=vf.TimeoutConfig(scoring=0.5), scoring=vf.ScoringConfig.model_validate(
        {"judges": [judge]}))
    async with vf.make_agent(config) as agent, vf.make_agent(agent_config()) as plain:
        (trace, other), finished = await run_noting_the_order(agent.run(Fast(vf.TaskData(prompt="2+3?"))),
                                                              plain.run(Fast(vf.TaskData(prompt="2+3?"))))
        assert blocked_off_the_loop()
    assert (trace.stop_condition, trace.reward, trace.rewards["correct"]) == ("scoring_timeout", None, 1.0)
    assert trace.timings["scoring"] >= 0.5 and trace.judge_calls[0].error == "cancelled"
    assert "BlockingParser" in trace.info["abandoned_threads"][0]
    assert (other.stop_condition, other.reward) == ("agent_completed", 1.0)
    assert finished == [1, 0]


SCRIPT = """
import asyncio, sys, time
import prefect_rollouts as vf

class Sleeper(vf.Task):
    @vf.reward
    def slow(self, trace):
        time.sleep(600)
        return 1.0

async def main():
    config = vf.AgentConfig(model="scripted", orchestrator="inline", timeouts=vf.TimeoutConfig(scoring=0.5),
                            client=vf.ClientConfig(base_url=sys.argv[1], api_key_env=None))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Sleeper(vf.TaskData(prompt="2+3?")))
    print(trace.stop_condition)

asyncio.run(main())
"""


@pytest.mark.timeout(60)
def test_an_abandoned_thread_does_not_hold_up_the_interpreters_exit(openai_server):
    openai_server.default = reply("5")
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), openai_server.base_url],
                              capture_output=True, text=True, timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail("the process waited for the reward's sleep(600)")
    assert (done.returncode, done.stdout.strip()) == (0, "scoring_timeout"), done.stderr
    assert "reward 'slow'" in done.stderr and "abandoned" in done.stderr   # the log line


class Recorded(vf.Task):
    """Sync metrics and a reward that note where and when they ran."""

    calls: list = []

    def note(self, name):
        started = time.perf_counter()
        time.sleep(0.05)
        self.calls.append((name, threading.get_ident(), started, time.perf_counter()))
        return 1.0

    @vf.metric
    def first(self):
        return self.note("first")

    @vf.metric
    def second(self):
        return self.note("second")

    @vf.reward
    def third(self):
        return self.note("third")


@pytest.mark.timeout(30)
async def test_a_rollouts_sync_scoring_functions_run_off_the_loop_one_after_another(openai_server, agent_config):
    openai_server.default = reply("5")
    Recorded.calls = []
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(Recorded(vf.TaskData(prompt="2+3?")))
    assert (trace.reward, trace.metrics) == (1.0, {"first": 1.0, "second": 1.0})
    assert [name for name, *_ in Recorded.calls] == ["first", "second", "third"]
    assert threading.get_ident() not in {ident for _, ident, *_ in Recorded.calls}
    spans = [(started, ended) for *_, started, ended in Recorded.calls]
    assert all(ended <= next_started for (_, ended), (next_started, _) in itertools.pairwise(spans))

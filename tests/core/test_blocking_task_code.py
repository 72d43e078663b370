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


@pytest.fixture(autouse=True)
def _release_blocked_threads():
    RELEASE.clear()
    yield
    RELEASE.set()


class Blocking(vf.Task):
    @vf.reward
    def stuck(self, trace):
        RELEASE.wait(60)          # like time.sleep(60), a subprocess.run or a requests.get without timeout
        return 1.0


class Fast(vf.Task):
    @vf.reward
    def correct(self, trace):
        return float(trace.last_reply == "5")

    @vf.metric
    def length(self, trace):
        return float(len(trace.last_reply))


async def largest_loop_gap_s(stop: asyncio.Event) -> float:
    """The longest the event loop went without running this ticker (it wakes every 20 ms)."""
    largest, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.02)
        now = time.perf_counter()
        largest, last = max(largest, now - last), now
    return largest


async def run_beside_a_ticker(*runs):
    stop = asyncio.Event()
    ticker = asyncio.ensure_future(largest_loop_gap_s(stop))
    try:
        results = await asyncio.gather(*runs)
    finally:
        stop.set()
    return results, await ticker


@pytest.mark.timeout(30)
async def test_a_blocking_sync_reward_times_out_on_time_and_the_other_rollouts_keep_running(
        openai_server, agent_config):
    openai_server.default = lambda request: (delayed(0.5, reply("5")) if "fast" in request.messages[-1]["content"]
                                             else reply("5"))
    started = time.perf_counter()

    async def timed(agent, task):
        trace = await agent.run(task)
        return trace, time.perf_counter() - started

    async with vf.make_agent(agent_config(timeouts=vf.TimeoutConfig(scoring=1.0))) as agent:
        (blocked, fast, after), gap_s = await run_beside_a_ticker(
            timed(agent, Blocking(vf.TaskData(prompt="blocking: 2+3?"))),
            timed(agent, Fast(vf.TaskData(prompt="fast: 2+3?"))),
            timed(agent, Fast(vf.TaskData(prompt="fast: 2+3 again?"))))
    trace, blocked_s = blocked
    assert (trace.stop_condition, trace.is_timeout, trace.reward, trace.rewards) == (
        "scoring_timeout", True, None, {"stuck": None})
    assert blocked_s < 5                                   # the 1 s deadline held; the reward blocks for 60 s
    assert 1.0 <= trace.timings["scoring"] < 3
    (note,) = trace.info["abandoned_threads"]
    assert "reward 'stuck'" in note and "abandoned" in note and "async" in note
    for other, other_s in (fast, after):
        assert (other.stop_condition, other.reward, other.metrics) == ("agent_completed", 1.0, {"length": 1.0})
        assert other_s < 3                                 # finished while the reward was blocked
        assert "abandoned_threads" not in other.info
    assert gap_s < 0.5                                     # the loop never stalled


@pytest.mark.timeout(30)
@pytest.mark.parametrize("hook", ["setup", "finalize"])
async def test_a_blocking_sync_hook_times_out_on_time_without_stalling_the_loop(openai_server, agent_config, hook):
    def stuck(self, **_):
        RELEASE.wait(60)

    task_type = type("Stuck", (Fast,), {hook: lambda self, trace, runtime: stuck(self)})
    openai_server.default = reply("5")
    config = agent_config(timeouts=vf.TimeoutConfig(**{hook: 0.5}))
    async with vf.make_agent(config) as agent:
        (trace, other), gap_s = await run_beside_a_ticker(agent.run(task_type(vf.TaskData(prompt="2+3?"))),
                                                          agent.run(Fast(vf.TaskData(prompt="2+3?"))))
    assert (trace.stop_condition, trace.is_timeout) == (f"{hook}_timeout", True)
    assert trace.timings[hook] < 2.5
    assert f"{hook} hook" in trace.info["abandoned_threads"][0]
    if hook == "finalize":
        assert trace.reward == 1.0                         # scoring still runs after a finalize timeout
    assert (other.stop_condition, other.reward) == ("agent_completed", 1.0)
    assert gap_s < 0.4


class BlockingParser(vf.Judge):
    """A plugin whose reply parser blocks."""

    async def score(self, task, trace):
        return await self.ask(trace, "rate it", lambda text: RELEASE.wait(60) and 1.0)


@pytest.mark.timeout(30)
async def test_a_judge_whose_parser_blocks_times_out_on_time_without_stalling_the_loop(openai_server, agent_config):
    openai_server.default = reply("5")
    judge = {"id": "tests.core.test_blocking_task_code:BlockingParser", "model": "judge",
             "client": {"base_url": openai_server.base_url, "api_key_env": ""}}
    config = agent_config(timeouts=vf.TimeoutConfig(scoring=0.5), scoring=vf.ScoringConfig.model_validate(
        {"judges": [judge]}))
    async with vf.make_agent(config) as agent, vf.make_agent(agent_config()) as plain:
        (trace, other), gap_s = await run_beside_a_ticker(agent.run(Fast(vf.TaskData(prompt="2+3?"))),
                                                          plain.run(Fast(vf.TaskData(prompt="2+3?"))))
    assert (trace.stop_condition, trace.reward, trace.rewards["correct"]) == ("scoring_timeout", None, 1.0)
    assert trace.timings["scoring"] < 2.5 and trace.judge_calls[0].error == "cancelled"
    assert "BlockingParser" in trace.info["abandoned_threads"][0]
    assert (other.stop_condition, other.reward) == ("agent_completed", 1.0)
    assert gap_s < 0.4


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
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT), openai_server.base_url],
                              capture_output=True, text=True, timeout=40)
    except subprocess.TimeoutExpired:
        pytest.fail("the process waited for the reward's sleep(600)")
    assert (done.returncode, done.stdout.strip()) == (0, "scoring_timeout"), done.stderr
    assert "reward 'slow'" in done.stderr and "abandoned" in done.stderr   # the log line
    assert time.perf_counter() - started < 40


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

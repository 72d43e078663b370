"""What only the local runtime does (the shared contract is in tests/runtimes/test_contract.py),
and isolated scoring on top of it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

import prefect_rollouts as vf
from prefect_rollouts.runtimes import make_runtime
from tests.fakes.openai_server import reply, tool_call
from tests.support.waiting import next_line, wait_until

pytestmark = pytest.mark.unit


@pytest.fixture
async def runtime():
    rt = make_runtime(vf.RuntimeConfig(exec_timeout_s=5, output_cap_bytes=1024, artifact_max_bytes=40_000))
    await rt.start()
    yield rt
    await rt.stop()


async def test_exec_runs_in_the_workspace_with_exit_code_and_streams(runtime):
    result = await runtime.exec("echo out; echo err >&2; pwd; exit 3")
    assert (result.exit_code, result.stderr, result.timed_out) == (3, "err\n", False)
    assert result.stdout == f"out\n{runtime.workspace}\n"


async def test_the_local_runtime_refuses_another_user_with_the_fix(runtime):
    with pytest.raises(ValueError, match=r"user = 'agent': the local runtime runs commands as this process's user. "
                                         r'Set type = "docker", or remove user'):
        vf.RuntimeConfig(user="agent")
    with pytest.raises(ValueError, match=r"runtime \"local\" cannot run a command as user 'agent'"):
        await runtime.exec("id -u", user="agent")
    assert (await runtime.exec("true", user="")).exit_code == 0   # IMAGE_USER: this process's user here


def _processes_with(marker: str) -> list[str]:
    """Command lines of the live processes on this host that contain ``marker``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found


async def test_exec_timeout_holds_when_the_command_leaves_its_session(runtime):
    result = await runtime.exec("setsid sleep 31.41 & wait", timeout=1)   # how soon: benchmarks/deadlines.py
    assert (result.exit_code, result.timed_out) == (-9, True)
    assert _processes_with("sleep 31.41") == []


@pytest.mark.parametrize("escape", ["setsid -f sleep {m}", "nohup sleep {m} >/dev/null 2>&1 &",
                                    "(setsid sleep {m} &)", "bash -c 'sleep {m} & disown' &"])
async def test_no_process_a_command_started_outlives_it(runtime, escape):
    marker = f"{random.randint(100, 999)}.{random.randint(100, 999)}"
    result = await runtime.exec(escape.format(m=marker) + "\nsleep 0.2; echo started", timeout=5)
    assert (result.exit_code, result.stdout) == (0, "started\n")
    assert _processes_with(f"sleep {marker}") == []


async def test_a_rollout_leaves_no_process_behind_after_a_bash_tool_escapes(openai_server, agent_config):
    marker = f"{random.randint(100, 999)}.{random.randint(100, 999)}"
    openai_server.play([tool_call("bash", command=f"setsid -f sleep {marker}; echo ok"), reply("done")])
    async with vf.make_agent(agent_config(harness=vf.HarnessConfig(runtime_tools=["bash"]))) as agent:
        trace = await agent.run(vf.Task(vf.TaskData(prompt="start a daemon")))
    assert trace.errors == [] and "stdout:\nok" in trace.tool_calls[0].output
    assert _processes_with(f"sleep {marker}") == []


async def test_stop_removes_the_workspace():
    rt = make_runtime(vf.RuntimeConfig())
    await rt.start()
    workspace = rt.workspace
    await rt.write_file("x", "y")
    await rt.stop()
    await rt.stop()
    assert not workspace.exists()


async def test_network_none_leaves_only_loopback_and_blocks_the_host(openai_server):
    port = openai_server.base_url.split(":")[2].split("/")[0]
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected"
    results = {}
    for mode in ("open", "none"):
        rt = make_runtime(vf.RuntimeConfig(network=mode))
        await rt.start()
        try:
            links = await rt.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
            results[mode] = (links.stdout.split(), (await rt.exec(probe, timeout=5)).stdout.strip())
        finally:
            await rt.stop()
    assert results["none"] == (["lo"], "")
    assert results["open"][1] == "connected" and len(results["open"][0]) >= 1


class Solution(vf.Task):
    """The agent writes solution.txt (declared) and notes.txt (not declared)."""

    @vf.reward
    async def solved(self, runtime):
        try:
            return float((await runtime.read_file("solution.txt")) == b"42")
        except FileNotFoundError:
            return 0.0

    @vf.metric
    async def notes_visible(self, runtime):
        return float((await runtime.exec("test -e notes.txt")).exit_code == 0)


def solution_task(**scoring):
    return Solution(vf.TaskData(prompt="solve", artifacts=["solution.txt"],
                                scoring=vf.ScoringConfig(**scoring) if scoring else None))


def play_solution(server):
    server.play([tool_call("bash", command="printf 42 > solution.txt; echo draft > notes.txt"), reply("done")])


@pytest.mark.parametrize("mode", ["shared", "isolated"])
async def test_the_same_task_scores_the_same_shared_and_isolated(openai_server, agent_config, mode):
    play_solution(openai_server)
    async with vf.make_agent(agent_config(scoring=vf.ScoringConfig(mode=mode))) as agent:
        trace = await agent.run(solution_task())
    assert trace.reward == 1.0 and trace.errors == [], (trace.tool_calls, trace.messages, openai_server.requests)
    # only declared artifacts reach the isolated scoring runtime
    assert trace.metrics == {"notes_visible": 1.0 if mode == "shared" else 0.0}


async def test_a_missing_declared_artifact_is_noted_and_scores_zero(openai_server, agent_config):
    openai_server.play([reply("I did nothing")])
    async with vf.make_agent(agent_config(scoring=vf.ScoringConfig(mode="isolated"))) as agent:
        trace = await agent.run(solution_task())
    assert (trace.reward, trace.info["artifacts_missing"], trace.errors) == (0.0, ["solution.txt"], [])


async def test_task_default_isolated_mode_is_used_when_the_agent_sets_none(openai_server, agent_config):
    play_solution(openai_server)
    async with vf.make_agent(agent_config()) as agent:
        trace = await agent.run(solution_task(mode="isolated"))
    assert trace.metrics == {"notes_visible": 0.0} and trace.info["scoring_attempts"] == 1


class Flaky(Solution):
    failures = 0

    @vf.reward
    async def solved(self, runtime):
        if type(self).failures > 0:
            type(self).failures -= 1
            raise vf.RuntimeUnavailableError("scoring runtime lost")
        return float((await runtime.read_file("solution.txt")) == b"42")


async def test_isolated_scoring_retries_with_a_fresh_runtime_and_reuses_the_submission(openai_server, agent_config):
    Flaky.failures = 2
    play_solution(openai_server)
    config = agent_config(scoring=vf.ScoringConfig(mode="isolated",
                                                   retries=vf.RetryConfig(max_retries=2, backoff_s=0.01)))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Flaky(vf.TaskData(prompt="solve", artifacts=["solution.txt"])))
    assert (trace.reward, trace.info["scoring_attempts"], trace.errors) == (1.0, 3, [])
    assert len(openai_server.requests) == 2          # the agent never ran again


async def test_exhausted_isolated_retries_leave_an_error_and_no_reward(openai_server, agent_config):
    Flaky.failures = 5
    play_solution(openai_server)
    config = agent_config(scoring=vf.ScoringConfig(mode="isolated",
                                                   retries=vf.RetryConfig(max_retries=1, backoff_s=0.01)))
    async with vf.make_agent(config) as agent:
        trace = await agent.run(Flaky(vf.TaskData(prompt="solve", artifacts=["solution.txt"])))
    assert trace.reward is None and trace.info["scoring_attempts"] == 2
    assert (trace.errors[0].type, trace.errors[0].stage) == ("RuntimeUnavailableError", "scoring")


async def test_shared_scoring_is_not_retried(openai_server, agent_config):
    Flaky.failures = 1
    play_solution(openai_server)
    async with vf.make_agent(agent_config(scoring=vf.ScoringConfig(mode="shared"))) as agent:
        trace = await agent.run(Flaky(vf.TaskData(prompt="solve")))
    assert trace.reward is None and Flaky.failures == 0 and "scoring_attempts" not in trace.info


async def test_a_secret_straddling_the_output_cap_is_scrubbed_before_the_cut():
    from prefect_rollouts.errors import register_secret
    from tests.fakes.openai_server import secret_fragments

    secret = "sk-cap-Zq8Wv3Rt6Yb1Nm4Kp7"
    register_secret(secret)
    rt = make_runtime(vf.RuntimeConfig(output_cap_bytes=1024))
    await rt.start()
    try:
        for offset in range(1000, 1030, 3):    # the key starts before the cap and ends after it
            result = await rt.exec(f"printf 'x%.0s' $(seq {offset}); printf '{secret}'; printf '{secret}' >&2")
            assert len(result.stdout) <= 1024
            assert secret_fragments(result.stdout + result.stderr, secret) == [], offset
    finally:
        await rt.stop()


def test_commands_die_with_the_process_that_runs_the_rollout(tmp_path):
    marker = f"{random.randint(100, 999)}.{random.randint(100, 999)}"
    script = tmp_path / "owner.py"
    script.write_text(f"""
import asyncio, prefect_rollouts as vf
from prefect_rollouts.runtimes import make_runtime
async def main():
    rt = make_runtime(vf.RuntimeConfig(exec_timeout_s=600))
    await rt.start()
    print("started", flush=True)
    await rt.exec("sleep {marker} & setsid -f sleep {marker}; wait")
asyncio.run(main())
""")
    import subprocess
    import sys
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert next_line(owner, 5, "the owner to start its runtime") == b"started\n"

        def sleeps() -> int:
            return sum(cmd.startswith("sleep ") for cmd in _processes_with(f"sleep {marker}"))
        wait_until(lambda: sleeps() >= 2, timeout_s=5, interval_s=0.05, what="both sleeps to start")
        assert sleeps() == 2
    finally:
        owner.kill()                                   # kill -9: no teardown runs
        owner.wait(timeout=5)
    wait_until(lambda: not _processes_with(f"sleep {marker}"), timeout_s=5, interval_s=0.05,
               what="the sleeps to die with their owner")
    assert _processes_with(f"sleep {marker}") == []

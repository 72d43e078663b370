"""The agent's own failure is its result (issue 34 item 3; docs/scoring-failed-agents.md), for program
harnesses on the local runtime: a program that started and then failed, or that a deadline stopped,
is scored by the task; one that could not start, never reached the model, or met an outage is an error;
a stop the endpoint imposed wins over the exit code the program then returns."""

from __future__ import annotations

import asyncio
import os
import textwrap

import pytest

import prefect_rollouts as vf
from tests.core.test_program_harness import program
from tests.fakes.openai_server import reply

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


class Wrote(vf.Task):
    """The tests: did the program leave ``out.txt`` saying "done"? (They run whatever the program did.)"""

    @vf.reward
    async def tests(self, trace, runtime):
        try:
            return float((await runtime.read_file("out.txt")).strip() == b"done")
        except FileNotFoundError:
            return 0.0


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-provider-failures-test")


# asks the model once, writes its answer to out.txt, then exits with EXIT (after printing to stderr)
CALL_THEN_EXIT = """
    import json, os, sys, urllib.request
    body = {{"messages": [{{"role": "user", "content": open(os.environ["PROMPT_FILE"]).read()}}]}}
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", json.dumps(body).encode(),
                                     {{"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}})
    answer = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"]
    open("out.txt", "w").write(answer)
    print("crashed after the work", file=sys.stderr)
    sys.exit({exit})
"""


async def run(config: vf.AgentConfig) -> vf.Trace:
    async with vf.make_agent(config) as agent:
        return await asyncio.wait_for(agent.run(Wrote(vf.TaskData(prompt="write done"))), 50)


@pytest.mark.parametrize("code", [3, 127])   # 127 after a model call: it had started, whatever the code says
async def test_a_program_that_fails_after_it_started_is_scored_by_the_tests(openai_server, agent_config, tmp_path,
                                                                              code):
    openai_server.play([reply("done")])
    trace = await run(agent_config(harness=program(tmp_path, CALL_THEN_EXIT.format(exit=code))))
    assert (trace.stop_condition, trace.errors, trace.reward, trace.is_timeout) == ("program_failed", [], 1.0, False)
    assert trace.info["program"][0]["exit_code"] == code
    assert trace.info["agent_failure"] == {
        "stop_condition": "program_failed", "scored": True,
        "message": f'harness "program": the program exited with code {code}. stderr: crashed after the work'}


async def test_a_program_that_crashes_before_its_first_model_call_is_scored_too(openai_server, agent_config):
    crash = vf.HarnessConfig(id="program", command=["bash", "-c", "echo 'ImportError: no module x' >&2; exit 1"])
    trace = await run(agent_config(harness=crash))
    assert (trace.stop_condition, trace.errors, trace.reward) == ("program_failed", [], 0.0)
    assert trace.info["agent_failure"]["message"].endswith("exited with code 1. stderr: ImportError: no module x")


@pytest.mark.parametrize("skip_on_timeout", [False, True])
async def test_a_program_its_own_timeout_killed_is_a_scored_timeout(openai_server, agent_config, tmp_path,
                                                                     skip_on_timeout):
    slow = """
        import os, sys, time
        open("out.txt", "w").write("done")
        print(os.path.dirname(os.environ["PROMPT_FILE"]), flush=True)   # the launcher's private directory
        print("still thinking", file=sys.stderr, flush=True)
        time.sleep(600)
    """
    config = agent_config(harness=program(tmp_path, slow, timeout_s=1.5),
                          scoring=vf.ScoringConfig(skip_on_timeout=skip_on_timeout))
    trace = await run(config)
    assert (trace.stop_condition, trace.is_timeout, trace.errors) == ("program_timeout", True, [])
    [launch] = trace.info["program"]
    assert (launch["timed_out"], launch["stderr_tail"]) == (True, "still thinking\n")   # kept in the launcher's file
    assert not await asyncio.to_thread(os.path.exists, launch["stdout_tail"].strip())   # read, then removed
    assert trace.info["agent_failure"]["message"] == ('harness "program": the program ran longer than '
                                                      "[env.agent.harness] timeout_s = 1.5 and was killed. "
                                                      "stderr: still thinking")
    if skip_on_timeout:
        assert (trace.reward, trace.info["scoring_skipped"]) == (0.0, "timeout")
    else:
        assert trace.reward == 1.0 and "scoring_skipped" not in trace.info   # the tests decided


@pytest.mark.parametrize("skip_on_timeout", [False, True])
async def test_a_program_the_agent_deadline_stopped_is_a_scored_timeout(openai_server, agent_config, tmp_path,
                                                                         skip_on_timeout):
    slow = """
        import time
        open("out.txt", "w").write("done")
        time.sleep(600)
    """
    config = agent_config(harness=program(tmp_path, slow), timeouts=vf.TimeoutConfig(agent=1.5),
                          scoring=vf.ScoringConfig(skip_on_timeout=skip_on_timeout))
    trace = await run(config)
    assert (trace.stop_condition, trace.is_timeout, trace.errors) == ("agent_timeout", True, [])
    assert trace.info["program"][0]["killed"] == "the agent deadline or a cancellation"
    assert trace.reward == (0.0 if skip_on_timeout else 1.0)
    assert trace.info.get("scoring_skipped") == ("timeout" if skip_on_timeout else None)


async def test_a_stop_the_endpoint_imposed_wins_over_the_exit_code(openai_server, agent_config, tmp_path):
    twice = CALL_THEN_EXIT.format(exit=0).replace("sys.exit(0)", textwrap.dedent("""
        try:
            urllib.request.urlopen(request)   # refused: max_turns = 1
        except Exception as exc:
            print(exc, file=sys.stderr)
        sys.exit(9)
    """).replace("\n", "\n    "))
    openai_server.play([reply("done")])
    trace = await run(agent_config(harness=program(tmp_path, twice), max_turns=1))
    assert (trace.stop_condition, trace.errors, trace.reward, trace.is_truncated) == ("max_turns", [], 1.0, True)
    assert trace.info["program"][0]["exit_code"] == 9 and "agent_failure" not in trace.info


@pytest.mark.parametrize(("command", "expected"), [
    (["/no/such/agent"], "the program could not start (exit code 127, before any model call). stderr: launch: "
                         "cannot run '/no/such/agent'"),
    (["bash", "-c", "echo 'env: python9: No such file' >&2; exit 127"], "could not start (exit code 127"),
    (["bash", "-c", "exit 126"], "could not start (exit code 126"),
    (["bash", "-c", "exit 0"], "exited (code 0) without calling the model"),
])
async def test_a_program_that_could_not_start_or_never_reached_the_model_is_an_error(
        openai_server, agent_config, command, expected):
    trace = await run(agent_config(harness=vf.HarnessConfig(id="program", command=command)))
    assert (trace.reward, trace.stop_condition) == (None, "harness_error") and len(trace.errors) == 1
    assert trace.errors[0].type == "TaskError"
    assert expected in trace.errors[0].message and "agent_failure" not in trace.info

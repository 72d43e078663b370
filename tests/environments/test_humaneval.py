"""HumanEval programs: what runs against the problem's tests for each shape of reply."""

from __future__ import annotations

import subprocess
import sys

import pytest

import prefect_rollouts as vf
from prefect_rollouts.environments.humaneval import STDERR_LINES, load
from tests.fakes.openai_server import reply

pytestmark = pytest.mark.unit


def passes(task, reply: str) -> bool:
    info = task.data.info
    source = f"{task.program(reply)}\n\n{info['test']}\n\ncheck({info['entry_point']})\n"
    return subprocess.run([sys.executable, "-c", source], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def tasks():
    return {task.id: task for task in load(count=51)}


def test_a_body_only_reply_continues_the_prompt(tasks):
    task = tasks["HumanEval-0"]
    body = ("    return any(abs(a - b) < threshold for i, a in enumerate(numbers)"
            " for b in numbers[i + 1:])\n")
    assert passes(task, f"```python\n{body}```") and passes(task, body)


def test_a_whole_function_keeps_the_prompts_imports_and_helpers(tasks):
    # uses List from the prompt's `from typing import List`, which the reply does not import
    whole = ("```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
             "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")
    assert passes(tasks["HumanEval-0"], whole)
    # HumanEval/50's prompt defines encode_shift, which the solution of decode_shift may call
    helper = ("Here you go:\n```python\ndef decode_shift(s: str):\n"
              "    return ''.join(chr(((ord(ch) - 5 - ord('a')) % 26) + ord('a')) for ch in s)\n```")
    assert passes(tasks["HumanEval-50"], helper)


def test_a_wrong_function_fails(tasks):
    assert not passes(tasks["HumanEval-0"],
                      "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")


WRONG = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
RIGHT = ("```python\ndef has_close_elements(numbers, threshold):\n"
         "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")


async def score(agent_config, openai_server, answer: str, *, timeout_s: float = 10.0) -> vf.Trace:
    """One HumanEval-0 rollout answered with ``answer``, scored in a local runtime (inline)."""
    openai_server.play([reply(answer)])
    async with vf.make_agent(agent_config(harness="chat")) as agent:
        return await agent.run(load(count=1, timeout_s=timeout_s)[0])


async def test_a_failed_test_run_records_its_exit_code_and_the_end_of_its_stderr(agent_config, openai_server):
    assert "humaneval_failure" not in (await score(agent_config, openai_server, RIGHT)).info
    trace = await score(agent_config, openai_server, WRONG)
    assert trace.reward == 0.0 and not trace.errors
    failure = trace.info["humaneval_failure"]
    assert (failure["exit_code"], failure["timed_out"]) == (1, False)
    lines = failure["stderr"].splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "AssertionError"
    assert len(lines) <= STDERR_LINES


async def test_a_test_run_killed_by_its_timeout_says_so(agent_config, openai_server):
    loop = "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
    trace = await score(agent_config, openai_server, loop, timeout_s=1)
    assert trace.reward == 0.0
    assert trace.info["humaneval_failure"] == {"exit_code": -9, "timed_out": True, "stderr": ""}


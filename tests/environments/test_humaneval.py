"""HumanEval programs: what runs against the problem's tests for each shape of reply."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prefect_rollouts.environments.humaneval import load


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
    assert not passes(tasks["HumanEval-0"], "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")

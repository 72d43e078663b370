"""The oracle's ``solve.sh`` failing is the oracle's own result, scored by the tests as Harbor scores it
(``harbor/agents/oracle.py`` records the exit code and the verifier runs); one that could not start is an
error (``agent_exits``). Without Docker: ``HarborTask.solve`` against a stand-in box."""

from __future__ import annotations

from pathlib import Path

import pytest

import prefect_rollouts as vf
from prefect_rollouts.environments import load_taskset
from prefect_rollouts.errors import AgentFailure, TaskError
from prefect_rollouts.runtimes.base import ExecResult

pytestmark = pytest.mark.unit


class Box:
    """Answers the oracle's command (``harbor_scripts.SOLVE``) with ``result`` and any other command with exit 0."""

    def __init__(self, result: ExecResult) -> None:
        self.result = result
        self.config = vf.RuntimeConfig()

    async def upload(self, source: Path, target: str) -> None:
        """Nothing to copy."""

    async def exec(self, cmd: str, timeout: float | None = None, env: dict[str, str] | None = None,
                   user: str | None = None) -> ExecResult:
        return self.result if "/logs/agent/oracle.txt" in cmd else ExecResult(0, "", "")


FILES = {"task.toml": 'version = "1.0"\n[agent]\ntimeout_sec = 60.0\n', "instruction.md": "Do it.",
         "environment/Dockerfile": "FROM prefect-rollouts-sandbox:latest\n",
         "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n", "solution/solve.sh": "exit 4\n"}


def task(tmp_path: Path):
    directory = tmp_path / "t"
    for name, text in FILES.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
    [loaded] = load_taskset("harbor", {"path": str(directory)})
    return loaded


@pytest.mark.parametrize(("result", "stop_condition", "timeout"), [
    (ExecResult(4, "", "boom\n"), "program_failed", False),
    (ExecResult(-9, "", "", timed_out=True), "program_timeout", True),
])
async def test_a_solution_that_fails_on_its_own_is_the_oracles_result(tmp_path, result, stop_condition, timeout):
    trace = vf.Trace(task_id="t", model="none")
    with pytest.raises(AgentFailure) as caught:
        await task(tmp_path).solve(Box(result), trace)
    assert (caught.value.stop_condition, caught.value.scored, caught.value.timeout) == (stop_condition, True, timeout)
    assert str(caught.value).startswith("Harbor task 't': solution/solve.sh ")
    assert trace.info["harbor"]["solution"]["exit_code"] == result.exit_code


async def test_a_solution_that_could_not_start_is_an_error(tmp_path):
    missing = Box(ExecResult(127, "", "bash: /solution/solve.sh: not found\n"))
    with pytest.raises(TaskError, match="exited with code 127"):
        await task(tmp_path).solve(missing, vf.Trace(task_id="t", model="none"))

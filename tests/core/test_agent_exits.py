"""The rule of ``agent_exits`` (docs/scoring-failed-agents.md): which failures are the agent's result,
which are errors, and a box the agent broke so that the tests cannot run, scored 0 with ``box_broken``."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.agent_exits import box_broken, program_failure
from prefect_rollouts.errors import AgentFailure, TaskError
from prefect_rollouts.runtimes.base import ExecResult

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

# What docker 20.10 (runc) answered, measured on this machine, after the agent deleted bash, made it
# non-executable, removed the workdir, or overwrote bash with text
CANNOT_EXEC = [
    ExecResult(126, 'OCI runtime exec failed: exec failed: unable to start container process: exec: "bash": '
                    "executable file not found in $PATH: unknown\r\n", ""),
    ExecResult(126, 'OCI runtime exec failed: exec failed: unable to start container process: chdir to cwd ("/app") '
                    "set in config.json failed: no such file or directory: unknown\r\n", ""),
    ExecResult(1, "", "exec /usr/bin/bash: exec format error\n"),
    ExecResult(127, "crun: executable file `bash` not found in $PATH: No such file or directory: OCI runtime "
                    "attempted to invoke a command that was not found\n", ""),   # podman's crun
]


@pytest.mark.parametrize("result", CANNOT_EXEC)
def test_a_box_that_cannot_start_a_process_after_the_agent_is_broken_by_it(result):
    broken = box_broken(result, "tests/test.sh")
    assert isinstance(broken, AgentFailure)
    assert (broken.stop_condition, broken.scored, broken.timeout) == ("box_broken", False, False)
    assert str(broken).startswith(f"tests/test.sh cannot run: the box cannot start a process any more (exit "
                                  f"{result.exit_code}: ")


@pytest.mark.parametrize("result", [
    ExecResult(0, "", ""),
    ExecResult(127, "", "tests/test.sh: line 3: pytest: command not found\n"),   # the tests' own failure
    ExecResult(1, "FAILED test_out.py::test_done\n", ""),
    ExecResult(126, "OCI runtime exec failed: exec failed: unable to start container process: error executing "
                    "setns process: exit status 1: unknown\r\n", ""),   # the engine's fault, not the agent's
    ExecResult(126, "OCI runtime exec failed: exec failed: cannot exec in a stopped container: unknown", ""),
    ExecResult(-9, "", "", timed_out=True),
])
def test_a_failing_test_or_an_engine_fault_is_not_a_broken_box(result):
    assert box_broken(result, "tests/test.sh") is None


def test_a_failed_program_is_its_result_unless_it_could_not_start():
    failed = program_failure("exited with code 2", timed_out=False, started=True)
    timed_out = program_failure("ran too long", timed_out=True, started=True)
    assert (type(failed), failed.stop_condition, failed.timeout) == (AgentFailure, "program_failed", False)
    assert (type(timed_out), timed_out.stop_condition, timed_out.timeout) == (AgentFailure, "program_timeout", True)
    assert type(program_failure("exit 127", timed_out=False, started=False)) is TaskError


class BrokenBox(vf.Task):
    """Its tests find the box broken (``box_broken``); another reward would have given 1."""

    @vf.reward(weight=1.0)
    def other(self) -> float:
        return 1.0

    @vf.reward(weight=1.0)
    async def tests(self, trace: vf.Trace) -> float:
        failure = box_broken(CANNOT_EXEC[0], "tests/test.sh")
        assert failure is not None
        raise failure

    async def solve(self, runtime, trace) -> None:
        """The oracle does nothing."""


async def test_tests_that_cannot_run_in_the_box_the_agent_broke_score_0_with_box_broken_not_an_error():
    config = vf.AgentConfig(model="none", harness=vf.HarnessConfig(id="oracle"), orchestrator="inline")
    async with vf.make_agent(config) as agent:
        trace = await agent.run(BrokenBox(vf.TaskData(prompt="solve it")))
    assert (trace.stop_condition, trace.errors, trace.reward, trace.rewards) == ("box_broken", [], 0.0, {})
    assert trace.info["scoring_skipped"] == "box_broken" and trace.info["agent_failure"]["scored"] is False
    assert trace.info["agent_failure"]["message"].startswith("tests/test.sh cannot run")

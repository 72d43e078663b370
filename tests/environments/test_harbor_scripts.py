"""Harbor's scripts without Docker (issue 34, items 2 and 4): whether the oracle kills what the solution
left (a Harbor task keeps it for its tests; a failed or late solution is killed all the same), the tails of
logs scrubbed of secrets that straddle their cut, and the private view's collected files read back."""

from __future__ import annotations

import io
import tarfile
from types import SimpleNamespace

import pytest

from prefect_rollouts.config.harness import HarnessConfig
from prefect_rollouts.environments.harbor import scripts as harbor_scripts
from prefect_rollouts.errors import TaskError, register_secret
from prefect_rollouts.harnesses.oracle import OracleHarness
from prefect_rollouts.runtimes.base import SCRUB_SLACK_BYTES
from prefect_rollouts.runtimes.docker import private as docker_private
from prefect_rollouts.task import Task, TaskData
from prefect_rollouts.trace import Trace

pytestmark = pytest.mark.unit


class Solved(Task):
    keeps = False
    fails = False

    @property
    def keeps_agent_processes(self) -> bool:  # type: ignore[override]
        return self.keeps

    async def solve(self, runtime, trace) -> None:
        if self.fails:
            raise TaskError("solution/solve.sh exited with code 1")


class Runtime:
    def __init__(self) -> None:
        self.kills = 0

    async def kill_all(self) -> None:
        self.kills += 1


@pytest.mark.parametrize(("keeps", "fails", "kills"), [
    (False, False, 1),   # today's rule: nothing outlives the agent
    (True, False, 0),    # Harbor: the solution's server runs until the tests end
    (True, True, 1),     # a failed (or late) solution is killed all the same
])
async def test_the_oracle_kills_what_the_solution_left_unless_the_task_keeps_it(keeps, fails, kills):
    task = Solved(TaskData(id="t", prompt="p"))
    task.keeps, task.fails = keeps, fails
    runtime = Runtime()
    ctx = SimpleNamespace(task=task, runtime=runtime, trace=Trace(task_id="t", model="none"))
    harness = OracleHarness(HarnessConfig(id="oracle"))
    if fails:
        with pytest.raises(TaskError):
            await harness.run_segment(ctx)
    else:
        await harness.run_segment(ctx)
    assert runtime.kills == kills


def test_a_log_tail_that_starts_inside_a_secret_drops_its_start_before_scrubbing():
    secret = "sk-harbor-scripts-0123456789abcdef"
    register_secret(secret)
    whole = f"head {secret} middle {secret} end\n"
    # the file's end only: it starts with the last 9 characters of the secret, which scrub cannot recognise
    tail = whole[len("head ") + len(secret) - 9:]
    text = harbor_scripts._log_text("x" * (SCRUB_SLACK_BYTES - 9) + tail, size=10 * SCRUB_SLACK_BYTES,
                                    read=SCRUB_SLACK_BYTES + len(tail))
    assert text == " middle *** end\n"
    assert harbor_scripts._log_text(whole, size=len(whole), read=len(whole)) == "head *** middle *** end\n"


def test_the_private_views_files_are_read_back_with_their_sizes():
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in {"out/result": b"0 0 0.512", "out/files/reward.txt": b"1\n",
                           "out/files/test-stdout.txt": b"end\n",
                           "out/sizes": b"reward.txt\x002\x00test-stdout.txt\x0070000\x00"}.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    code, timed_out, seconds, files = docker_private._read_out(archive.getvalue())
    assert (code, timed_out, seconds) == (0, False, 0.512)
    assert files == {"reward.txt": (2, b"1\n"), "test-stdout.txt": (70000, b"end\n")}

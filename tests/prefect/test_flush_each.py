"""A finished rollout is durable at once when rewards have side effects (or rollouts_per_task > 1),
so kill -9 then --resume never scores it again.

The eval runs with a 30 s periodic flush (set by the wrapper below) so that, without per-rollout
flushing, finished rollouts would certainly still be buffered when the process is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

import prefect_rollouts as vf
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.support.cli import eval_env, finish, start_eval
from tests.support.datasets import durable_rows
from tests.support.waiting import poll_until, wait_until

pytestmark = pytest.mark.prefect

LONG_FLUSH = ("import sys, prefect_rollouts.evals.engine as e; e.FLUSH_INTERVAL_S = 30.0; "
              "from prefect_rollouts.cli.main import app; sys.argv[0] = 'prefect-rollouts'; app()")


class ChargesOnScoring(vf.Task):
    """A reward that acts on the world: one line per scoring in the file ``data.info["log"]``."""

    rewards_have_side_effects = True

    @vf.reward
    def charged(self, trace: vf.Trace) -> float:
        with open(self.data.info["log"], "a") as log:
            log.write(f"{trace.task_id}\n")
        return 1.0


class LogsOnScoring(ChargesOnScoring):
    rewards_have_side_effects = False


def side_effect_tasks(log: str, count: int = 6, declared: bool = True) -> list[vf.Task]:
    cls = ChargesOnScoring if declared else LogsOnScoring
    return [cls(vf.TaskData(id=f"t{i}", prompt=f"task {i}", info={"log": log})) for i in range(count)]


def run_cli(config: Path, *args: str) -> subprocess.Popen[str]:
    return start_eval(config, *args, env=eval_env(PREFECT_LOGGING_LEVEL="WARNING"), entry=("-c", LONG_FLUSH))


@pytest.mark.parametrize(("declared", "rollouts_per_task"), [(True, 1), (False, 2)],
                         ids=["task-declares-side-effects", "rollouts-per-task-2"])
def test_kill_9_after_scoring_does_not_score_a_finished_rollout_again(tmp_path, openai_server, declared,
                                                                      rollouts_per_task):
    log = tmp_path / "charges.log"
    log.touch()
    total = 6 * rollouts_per_task
    openai_server.play([reply("0")] * 3)                  # three rollouts finish; the others wait on the model
    openai_server.default = delayed(60, reply("0"))
    config = tmp_path / "eval.toml"
    taskset = {"id": "tests.prefect.test_flush_each:side_effect_tasks", "log": log, "declared": declared}
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, taskset=taskset,
                                rollouts_per_task=rollouts_per_task, max_concurrent=total))
    process = run_cli(config, "--run-id", "charged")
    try:
        def three_scored() -> bool:
            assert process.poll() is None, process.stdout.read()[-3000:]
            return len(log.read_text().split()) >= 3
        assert wait_until(three_scored, timeout_s=120, interval_s=0.05, what="three rollouts scored")
        # a row takes milliseconds to write; a batch waits 30 s (the test then finds the rows missing)
        poll_until(lambda: durable_rows(tmp_path / "traces") >= 3, timeout_s=3, interval_s=0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    openai_server.default = reply("0")
    resumed = run_cli(config, "--resume", "charged")
    output = finish(resumed, 180)
    assert resumed.returncode == 0, output[-3000:]
    assert len(read_rollouts(tmp_path / "traces", run_id="charged")) == total
    charges = log.read_text().split()
    assert len(charges) == total, f"{len(charges) - total} finished rollouts were scored twice"

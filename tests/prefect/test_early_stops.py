"""An eval that stops early says why in one line, how many rollouts are durable and how to resume, and
runs no rollout twice: a full traces disk (issue 19, item 5c) and SIGTERM (item 6)."""

from __future__ import annotations

import asyncio
import errno
import re
import signal
import uuid
from collections import Counter

import pytest
from prefect.client.schemas.filters import FlowRunFilterName
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.runtimes.docker.engine import LABEL
from prefect_rollouts.traces import read_rollouts, store
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.prefect.test_failure_states import final_flow_runs
from tests.support.cli import eval_env, finish, start_eval
from tests.support.datasets import durable_rows
from tests.support.waiting import poll_until, wait_until


def disk_full_after(rollout_files: int, monkeypatch) -> None:
    """The file system takes ``rollout_files`` rollouts files, then every write fails with ENOSPC."""
    real, landed = store._write_local, []

    def write(target, data):
        if len(landed) >= rollout_files:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(target, data)
        if "/rollouts/" in target.as_posix():
            landed.append(target)
    monkeypatch.setattr(store, "_write_local", write)


@pytest.mark.prefect
def test_a_full_traces_disk_stops_the_eval_at_once_with_the_true_count_and_runs_nothing_twice(
        tmp_path, openai_server, monkeypatch):
    openai_server.default = delayed(0.05, reply("0"))
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity="batch",
                                batch_size=10, max_concurrent=4, taskset={"id": "tests.prefect.tasksets:numbered",
                                                                          "count": 30}))
    disk_full_after(2, monkeypatch)

    result = CliRunner().invoke(app, ["eval", str(config), "--run-id", "disk-full"])
    monkeypatch.undo()
    output = " ".join(result.output.split())

    durable = len(read_rollouts(tmp_path / "traces", run_id="disk-full"))
    assert result.exit_code == 1, output
    # two files landed: flushes of up to 4 rows (the writer's batch), fewer when the periodic flush came
    # first (a clean-clone run on a busy machine had 4 + 1); the message below gives that true count
    assert 2 <= durable <= 8
    prompts = Counter(request.messages[-1]["content"] for request in openai_server.requests)
    assert max(prompts.values()) == 1, prompts            # no rollout ran twice (the batch was not retried)
    assert len(prompts) < 30                              # and the eval stopped instead of running them all
    stopped = re.search(r"eval stopped: (.*?) \d+ of 30 rollouts durable", output)
    assert stopped and "No space left on device" in stopped.group(1), output
    assert f"{30 - durable} of 30 rollouts of run disk-full have no row" in stopped.group(1)
    assert f"{durable} of 30 rollouts durable; resume with: prefect-rollouts eval {config} --resume disk-full" \
        in output


@pytest.mark.prefect
@pytest.mark.parametrize(("signal_number", "exit_code", "reason"), [
    (signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted (Ctrl-C)")])
def test_sigterm_ends_an_eval_as_ctrl_c_does(tmp_path, openai_server, signal_number, exit_code, reason):
    openai_server.default = delayed(0.3, reply("0"))
    run_id = f"stopped-by-{signal_number.name.lower()}"
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=1, flush_each_rollout=True))
    process = start_eval(config, "--run-id", run_id, env=eval_env(PREFECT_LOGGING_LEVEL="WARNING"))
    def two_durable_or_ended() -> bool:   # (an eval that ended: the asserts below say how)
        return process.poll() is not None or durable_rows(tmp_path / "traces") >= 2
    poll_until(two_durable_or_ended, timeout_s=120, interval_s=0.05)
    process.send_signal(signal_number)
    output = " ".join(finish(process, 120).split())

    rows = read_rollouts(tmp_path / "traces", run_id=run_id)
    durable = len(rows)
    assert process.returncode == exit_code, output
    assert not rows["is_error"].any(), rows["error_message"].tolist()     # a stopped rollout is no errored row
    assert f"eval stopped: {reason}" in output and "Traceback" not in output, output
    assert 2 <= durable < 10
    assert f"{durable} of 10 rollouts durable; resume with: prefect-rollouts eval {config} --resume {run_id}" in output
    (flow_run,) = asyncio.run(final_flow_runs(name=FlowRunFilterName(any_=[run_id])))
    assert flow_run.state.name == "Crashed", flow_run.state     # as Prefect marks a run whose process was stopped


@pytest.mark.system
@pytest.mark.usefixtures("prefect_harness")
def test_sigterm_removes_the_containers_of_the_rollouts_in_flight(tmp_path, openai_server, docker_engine):
    openai_server.default = delayed(60, reply("0"))
    run_id = f"sigterm-docker-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=3,
                                rollout_granularity="flow") + '[env.agent.runtime]\ntype = "docker"\n')
    process = start_eval(config, "--run-id", run_id, env=eval_env(PREFECT_LOGGING_LEVEL="WARNING"))

    def of_run() -> list:
        return docker_engine.containers.list(all=True, sparse=True, filters={"label": f"{LABEL}.run_id={run_id}"})

    def started() -> bool:
        assert process.poll() is None, "the eval exited before it started its containers"
        return len(of_run()) >= 3
    try:
        assert wait_until(started, timeout_s=90, what="the eval to start its 3 containers")
    finally:
        process.send_signal(signal.SIGTERM)
    output = " ".join(finish(process, 120).split())
    assert process.returncode == 143, output
    assert "0 of 10 rollouts durable; resume with:" in output and "Traceback" not in output, output
    assert of_run() == []                                  # torn down by the eval, not left for the janitor
    (flow_run,) = asyncio.run(final_flow_runs(name=FlowRunFilterName(any_=[run_id])))
    assert flow_run.state.name == "Crashed"

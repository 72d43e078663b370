"""Issue 19, item 5(b): one eval per run id at a time, across processes (two CLI evals of one run
against one Prefect server)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterTags

from prefect_rollouts.flows.services.run_lock import lock_name
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply
from tests.support.cli import finish, start_eval
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.prefect, pytest.mark.timeout(600)]

ROLLOUTS = 16


def eval_runs(run_id: str) -> list:
    async def read() -> list:
        async with get_client() as client:
            return await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["eval"])),
                                               flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(
                                                   all_=[lock_name(run_id)])))
    return asyncio.run(read())


def wait_running(run_id: str, process: subprocess.Popen[str], server: object, timeout_s: float = 120) -> object:
    """The eval flow run of ``run_id`` once it is Running and holds the run: its first rollout has asked
    the model (a rollout starts only inside ``hold_run``; Running alone comes before the lock is taken)."""
    def running() -> object:
        assert process.poll() is None, process.communicate(timeout=30)[0]
        if not server.requests:   # type: ignore[attr-defined]
            return None
        return next((run for run in eval_runs(run_id) if run.state_type.value == "RUNNING"), None)
    return wait_until(running, timeout_s=timeout_s, interval_s=0.5,
                      what=f"the eval flow run of {run_id} to turn Running and hold the run")


def config_file(tmp_path: Path, base_url: str) -> Path:
    path = tmp_path / "eval.toml"
    path.write_text(eval_toml(tmp_path / "traces", base_url, max_concurrent=1,
                              taskset={"id": "tests.prefect.tasksets:numbered", "count": ROLLOUTS}))
    return path


def test_a_second_eval_of_a_live_run_is_refused_and_names_the_live_one(tmp_path, openai_server):
    go_on = threading.Event()   # the model answers the first eval only once the second has ended

    def answer(request: object) -> object:
        go_on.wait(timeout=150)   # without the lock the second eval's requests wait here too
        return reply("0")
    openai_server.default = answer
    config = config_file(tmp_path, openai_server.base_url)
    first = start_eval(config, "--run-id", "held", new_session=True)
    try:
        holder = wait_running("held", first, openai_server)
        second = start_eval(config, "--resume", "held", new_session=True)
        output = finish(second, 300)
        still_running = first.poll() is None
    finally:
        go_on.set()
    first_output = finish(first, 300)

    assert second.returncode == 2, output
    assert still_running, "the refusal came while the first eval ran"
    assert "another eval is running this run" in output and str(holder.id) in output, output
    assert f".venv/bin/prefect flow-run cancel {holder.id}" in output
    assert first.returncode == 0, first_output
    rows = read_rollouts(tmp_path / "traces", run_id="held")
    assert len(rows) == ROLLOUTS and not rows.duplicated(["task_id", "rollout_index"]).any()
    assert len(openai_server.requests) == ROLLOUTS, "every rollout ran once"
    states = sorted(run.state_type.value for run in eval_runs("held"))
    assert states == ["COMPLETED", "FAILED"]


def test_a_resume_right_after_the_eval_was_killed_takes_the_run_over(tmp_path, openai_server):
    """``kill -9`` of the eval on this machine, then ``--resume`` at once: the dead holder's process is
    gone, so the resume does not wait for its lease to lapse; the dead eval flow run ends Crashed."""
    openai_server.default = delayed(0.5, reply("0"))
    config = config_file(tmp_path, openai_server.base_url)
    first = start_eval(config, "--run-id", "taken-over", new_session=True)
    dead = wait_running("taken-over", first, openai_server)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    resumed = start_eval(config, "--resume", "taken-over", new_session=True)
    output = finish(resumed, 300)
    assert resumed.returncode == 0, output
    # at once, not after the dead eval's lease lapsed (LEASE_DURATION_S)
    assert "whose process is gone; taking it over" in " ".join(output.split()), output
    assert len(read_rollouts(tmp_path / "traces", run_id="taken-over")) == ROLLOUTS
    runs = {run.id: run for run in eval_runs("taken-over")}
    assert runs[dead.id].state_type.value == "CRASHED" and "its process is gone" in runs[dead.id].state.message
    assert re.search(r"COMPLETED", " ".join(run.state_type.value for run in runs.values()))

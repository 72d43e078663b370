"""Finishing a run whose provider failed on some tasks (issue 36): `eval --resume RUN --retry-errors` runs the
errored rollouts again as new attempts and keeps the first ones; max_rollout_attempts recovers them within one
run at every granularity; a kill -9 during the retries and a resume write no attempt twice and lose none; a
shard runs its planned attempt once, however often it is submitted; reconcile gives each attempt's flow run
its own row's state; the launch form finishes a run too."""

from __future__ import annotations

import os
import re
import signal
import threading
from collections import Counter

import pyarrow.parquet as pq
import pytest
from prefect.client.orchestration import get_client
from prefect.states import Running
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.evals.engine import EvalRun
from prefect_rollouts.evals.identity import prepare_run
from prefect_rollouts.evals.launch_form import AdvancedSettings, LaunchForm
from prefect_rollouts.evals.launch_tasksets import CustomTaskset
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.flows.eval import run_eval as run_eval_flow
from prefect_rollouts.flows.launch import launch_flow
from prefect_rollouts.flows.rollout import RolloutRequest, rollout_flow
from prefect_rollouts.flows.services.reconcile import reconcile_run
from prefect_rollouts.flows.shard import shard_flow
from prefect_rollouts.trace import ErrorRecord
from prefect_rollouts.traces import TraceWriter, read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply, status
from tests.prefect.test_run_lock import wait_running
from tests.support.cli import eval_env, finish, run_eval, start_eval
from tests.support.datasets import durable_rows
from tests.support.waiting import wait_until

pytestmark = pytest.mark.prefect

NUMBERED = "tests.prefect.tasksets:numbered"


def provider_down_for(down: set[str], delay_s: float = 0.0):
    """Task i says i, except the tasks of ``down`` (by number), which get 503 while they are in it."""
    def step(request):
        number = re.search(r"say (\d+)", request.messages[-1]["content"]).group(1)
        answer = status(503) if number in down else reply(number)
        return delayed(delay_s, answer) if delay_s else answer
    return step


def provider_fails_first(fails: dict[str, int]):
    """Task i says i, except that the first ``fails[i]`` requests of task i get 503."""
    def step(request):
        number = re.search(r"say (\d+)", request.messages[-1]["content"]).group(1)
        if fails.get(number, 0) > 0:
            fails[number] -= 1
            return status(503)
        return reply(number)
    return step


def raw_rows(root) -> list[tuple[str, int, int]]:
    """``(task id, rollout index, attempt)`` of every rollout row on disk, duplicates included."""
    rows = []
    for path in (root / "rollouts").rglob("part-*.parquet"):
        table = pq.read_table(path, columns=["task_id", "rollout_index", "attempt"]).to_pylist()
        rows += [(row["task_id"], row["rollout_index"], row["attempt"]) for row in table]
    return rows


def test_retry_errors_finishes_a_run_whose_provider_failed_and_keeps_the_first_attempts(tmp_path, openai_server):
    down = {"2", "5", "7"}
    openai_server.default = provider_down_for(down)
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=3))
    env = eval_env(PREFECT_LOGGING_LEVEL="WARNING")
    first = run_eval(config, "--run-id", "flaky", env=env)
    assert first.returncode == 1 and "3 of 10 rollouts errored (ProviderError" in first.stdout, first.stdout[-3000:]
    assert "run the 3 errored rollouts again (as new attempts) with: prefect-rollouts eval " in first.stdout
    assert " --resume flaky --retry-errors" in first.stdout
    plain = run_eval(config, "--resume", "flaky", env=env)   # a plain resume leaves errored rows as they are
    assert plain.returncode == 1 and len(openai_server.requests) == 10, plain.stdout[-3000:]
    other = run_eval(config, "--resume", "flaky", "--retry-errors", "TaskError", env=env)   # matches none
    assert other.returncode == 1 and len(openai_server.requests) == 10, other.stdout[-3000:]
    assert ("--retry-errors TaskError: 0 errored rollouts run again as new attempts; errored ones left as they "
            "are: 3 ProviderError") in " ".join(other.stdout.split()), other.stdout[-3000:]

    down.clear()   # the provider is back
    finished = run_eval(config, "--resume", "flaky", "--retry-errors", env=env)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    assert "retried: 3 rollouts after an errored attempt, 3 recovered" in finished.stdout
    assert len(openai_server.requests) == 13   # each errored rollout ran again once, nothing else
    latest = read_rollouts(tmp_path / "traces", run_id="flaky")
    assert len(latest) == 10 and set(latest["reward"]) == {1.0} and not latest["is_error"].any()
    every = read_rollouts(tmp_path / "traces", run_id="flaky", attempts="all").sort_values(["task_id", "attempt"])
    first_attempts = every[every["attempt"] == 1]
    assert len(every) == 13 and len(first_attempts) == 10
    assert sorted(first_attempts.loc[first_attempts["is_error"], "task_id"]) == ["n2", "n5", "n7"]
    assert set(first_attempts.loc[first_attempts["is_error"], "error_type"]) == {"ProviderError"}
    assert sorted(every.loc[every["attempt"] == 2, "task_id"]) == ["n2", "n5", "n7"]
    shown = CliRunner().invoke(app, ["traces", "show", str(tmp_path / "traces"), "flaky", "n5"])
    assert "attempt 1 · stop provider_error" in shown.output and "attempt 2 · stop agent_completed" in shown.output


def test_a_kill_9_during_the_retries_then_a_resume_writes_no_attempt_twice_and_loses_none(tmp_path, openai_server):
    down = {"0", "1", "3", "4", "6", "8"}
    openai_server.default = provider_down_for(down)
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=2,
                                flush_each_rollout=True))
    env = eval_env(PREFECT_LOGGING_LEVEL="WARNING")
    assert run_eval(config, "--run-id", "killed", env=env).returncode == 1
    down.clear()
    openai_server.default = provider_down_for(down, delay_s=1.0)   # slow retries: the kill lands among them
    process = start_eval(config, "--resume", "killed", "--retry-errors", env=env)
    wait_until(lambda: process.poll() is not None or durable_rows(tmp_path / "traces") >= 12, timeout_s=120,
               interval_s=0.05, what="two retries to be durable")
    assert process.poll() is None, "the retries ended before the kill"
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    killed_at = Counter(attempt for _, _, attempt in raw_rows(tmp_path / "traces"))
    assert killed_at[1] == 10 and 2 <= killed_at[2] < 6

    resumed = start_eval(config, "--resume", "killed", "--retry-errors", env=env)
    output = finish(resumed, 300)
    assert resumed.returncode == 0, output[-3000:]
    rows = raw_rows(tmp_path / "traces")
    assert not [row for row, count in Counter(rows).items() if count > 1], "an attempt written twice"
    assert Counter(attempt for _, _, attempt in rows) == {1: 10, 2: 6}   # every first attempt kept, one retry each
    latest = read_rollouts(tmp_path / "traces", run_id="killed")
    assert len(latest) == 10 and not latest["is_error"].any()


@pytest.mark.parametrize("granularity", ["flow", "task", "batch"])
async def test_max_rollout_attempts_recovers_errored_rollouts_within_one_run(tmp_path, openai_server, granularity):
    fails = {"1": 1, "4": 1}   # these tasks' first requests fail, then the provider answers
    openai_server.default = provider_fails_first(fails)
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity=granularity,
                                        batch_size=4, max_concurrent=3, max_rollout_attempts=2,
                                        rollout_backoff_s=0.0).replace("count = 10", "count = 6"))
    summary = await eval_flow(config, run_id=f"in-run-{granularity}")
    assert (summary.rollouts, summary.errored, summary.retried, summary.recovered) == (6, 0, 2, 2)
    every = read_rollouts(tmp_path / "traces", run_id=f"in-run-{granularity}", attempts="all")
    assert sorted(every.loc[every["attempt"] == 2, "task_id"]) == ["n1", "n4"]
    assert sorted(every.loc[every["is_error"], "task_id"]) == ["n1", "n4"] and len(every) == 8



async def test_a_batch_retried_after_a_crash_runs_the_attempt_the_crash_cut_off(tmp_path, openai_server, monkeypatch):
    fails = {"1": 1}   # task 1's first request fails; its second attempt crashes the batch before it starts
    openai_server.default = provider_fails_first(fails)
    crashed: list[str] = []
    make = EvalRun.rollout

    def rollout(self, planned):
        if planned.attempt == 2 and not crashed:
            crashed.append(planned.task.id)
            raise RuntimeError("the worker lost its runtime")
        return make(self, planned)
    monkeypatch.setattr(EvalRun, "rollout", rollout)
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity="batch",
                                        batch_size=4, max_concurrent=2, max_rollout_attempts=2,
                                        rollout_backoff_s=0.0).replace("count = 10", "count = 4"))
    summary = await eval_flow(config, run_id="batch-crash")
    assert crashed == ["n1"]   # the batch raised and its task run was retried
    assert (summary.rollouts, summary.errored, summary.retried, summary.recovered) == (4, 0, 1, 1)
    every = read_rollouts(tmp_path / "traces", run_id="batch-crash", attempts="all")
    assert sorted(zip(every["task_id"], every["attempt"], strict=True)) == [
        ("n0", 1), ("n1", 1), ("n1", 2), ("n2", 1), ("n3", 1)]


async def test_a_batch_that_crashes_again_says_to_retry_the_errors_whose_next_attempt_it_cut_off(
        tmp_path, openai_server, monkeypatch):
    fails = {"1": 2}   # task 1's first two requests fail; its attempts 2 and 3 crash the batch (once each)
    openai_server.default = provider_fails_first(fails)
    crashes = {2, 3}
    make = EvalRun.rollout

    def rollout(self, planned):
        if planned.task.id == "n1" and planned.attempt in crashes:
            crashes.discard(planned.attempt)
            raise RuntimeError("the worker lost its runtime")
        return make(self, planned)
    monkeypatch.setattr(EvalRun, "rollout", rollout)
    toml = eval_toml(tmp_path / "traces", openai_server.base_url, rollout_granularity="batch", batch_size=4,
                     max_concurrent=2, max_rollout_attempts=3, rollout_backoff_s=0.0).replace("count = 10", "count = 4")
    with pytest.raises(RuntimeError, match=r"0 of 4 rollouts have no row .*--resume batch-crash2 --retry-errors"):
        await eval_flow(load_eval_config(toml), run_id="batch-crash2")
    monkeypatch.setattr(EvalRun, "rollout", make)
    summary = await eval_flow(load_eval_config(toml), resume="batch-crash2", retry_errors=True)
    assert (summary.rollouts, summary.errored) == (4, 0)
    assert sorted(raw_rows(tmp_path / "traces")) == [   # the attempt the crash cut off ran once, none twice
        ("n0", 0, 1), ("n1", 0, 1), ("n1", 0, 2), ("n1", 0, 3), ("n2", 0, 1), ("n3", 0, 1)]


async def test_retry_errors_of_given_types_runs_only_the_rollouts_with_those_errors(tmp_path, openai_server):
    down = {"3"}
    openai_server.default = provider_down_for(down)
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url).replace("count = 10", "count = 4"))
    final = await eval_flow(config, run_id="typed", return_state=True)
    assert final.is_failed()
    down.clear()
    other, failure = await run_eval_flow(config, resume="typed", retry_errors=True,
                                         retry_error_types=["RuntimeUnavailableError"])
    assert (other.errored, other.retried) == (1, 0) and len(openai_server.requests) == 4   # not of that type
    assert failure is not None and failure.startswith("1 of 4 rollouts errored (ProviderError")
    fixed, failure = await run_eval_flow(config, resume="typed", retry_errors=True, retry_error_types=["ProviderError"])
    assert (fixed.errored, fixed.retried, fixed.recovered, failure) == (0, 1, 1, None)
    assert len(openai_server.requests) == 5


async def test_a_shard_runs_the_attempt_it_was_planned_once_however_often_it_is_submitted(tmp_path, openai_server):
    down = {"0"}
    openai_server.default = provider_down_for(down)
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url).replace("count = 10", "count = 2"))
    prepare_run(config.traces.dataset_root(), "sharded", config, resume=False)
    root = str(tmp_path / "traces")
    assert await shard_flow("sharded", config, root, [[NUMBERED, "n0", 0], [NUMBERED, "n1", 0]]) == 2
    down.clear()
    retry = [[NUMBERED, "n0", 0, 2], [NUMBERED, "n1", 0, 1]]   # the eval planned n0's second attempt
    assert await shard_flow("sharded", config, root, retry, attempt=1) == 1
    assert await shard_flow("sharded", config, root, retry, attempt=2) == 0   # re-submitted: nothing twice
    assert sorted(raw_rows(tmp_path / "traces")) == [("n0", 0, 1), ("n0", 0, 2), ("n1", 0, 1)]
    assert len(openai_server.requests) == 3


async def test_reconcile_gives_each_attempts_flow_run_the_state_of_its_own_row(tmp_path):
    first = vf.Trace(task_id="n0", task_type="Numbered", model="scripted", stop_condition="provider_error")
    first.errors.append(ErrorRecord(type="ProviderError", message="503 from the provider", stage="segment"))
    second = vf.Trace(task_id="n0", task_type="Numbered", model="scripted", stop_condition="agent_completed",
                      reward=1.0)
    writer = TraceWriter(tmp_path / "traces", "two-attempts")
    for attempt, made in enumerate((first, second), start=1):
        writer.add(made, rollout_index=0, environment=NUMBERED, config_hash="h", elapsed_s=1.0, attempt=attempt)
    writer.flush()
    async with get_client() as client:   # what an outage leaves: both attempts' flow runs still Running
        runs = [await client.create_flow_run(rollout_flow, name=f"left-{i}", state=Running(), parameters={
            "rollout": RolloutRequest(rollout_id=made.id, task_id="n0", rollout_index=0, task_type="Numbered",
                                      model="scripted", run_id="two-attempts").model_dump()})
            for i, made in enumerate((first, second))]
        # a flow run whose rollout id no row has (matched by task type, task, index and its own attempt)
        runs.append(await client.create_flow_run(rollout_flow, name="left-by-key", state=Running(), parameters={
            "rollout": RolloutRequest(rollout_id="not-a-row", task_id="n0", rollout_index=0, task_type="Numbered",
                                      model="scripted", run_id="two-attempts", attempt=1).model_dump()}))
        report = await reconcile_run(tmp_path / "traces", "two-attempts")
        states = [(await client.read_flow_run(run.id)).state for run in runs]
    assert sorted(report.rollouts_set) == ["left-0", "left-1", "left-by-key"]
    # each gets its own attempt's state, not the latest attempt's
    assert [state.name for state in states] == ["Failed", "Completed", "Failed"]
    assert states[0].message == states[2].message == "ProviderError: 503 from the provider"


async def test_the_launch_form_finishes_a_run_with_its_errored_rollouts(tmp_path, openai_server):
    down = {"1"}
    openai_server.default = provider_down_for(down)
    form = LaunchForm(taskset=CustomTaskset(loader=NUMBERED, options={"count": 3}), model="scripted",
                      endpoint=openai_server.base_url, advanced=AdvancedSettings(
                          harness="chat", api_key_env="", traces_path=str(tmp_path / "traces"),
                          overrides={"env.agent.client.retries.max_retries": 0, "env.agent.retries.segment": 0}))
    final = await launch_flow(form, return_state=True)
    assert final.is_failed()
    run_id = (await final.aresult(raise_on_failure=False)).summary.run_id
    down.clear()
    again = form.model_copy(update={"advanced": form.advanced.model_copy(update={"finish_run": run_id})})
    summary = await launch_flow(again)
    assert (summary.run_id, summary.rollouts, summary.errored, summary.retried, summary.recovered) == (
        run_id, 3, 0, 1, 1)


def test_a_second_retry_of_a_live_run_is_refused_by_the_run_lock(tmp_path, openai_server):
    down = {str(i) for i in range(6)}
    openai_server.default = provider_down_for(down)
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=1)
                      .replace("count = 10", "count = 6"))
    assert run_eval(config, "--run-id", "held-retry", env=eval_env(PREFECT_LOGGING_LEVEL="WARNING")).returncode == 1
    go_on = threading.Event()   # the retries wait at the model until the second eval has ended

    def answer(request):
        go_on.wait(timeout=150)
        return provider_down_for(set())(request)
    openai_server.reset()
    openai_server.default = answer
    first = start_eval(config, "--resume", "held-retry", "--retry-errors", new_session=True)
    try:
        wait_running("held-retry", first, openai_server)
        second = start_eval(config, "--resume", "held-retry", "--retry-errors", new_session=True)
        output = finish(second, 300)
        still_running = first.poll() is None
    finally:
        go_on.set()
    first_output = finish(first, 300)
    assert second.returncode == 2 and "another eval is running this run" in output, output
    assert still_running and first.returncode == 0, first_output
    assert len(openai_server.requests) == 6, "each errored rollout ran again once"
    every = read_rollouts(tmp_path / "traces", run_id="held-retry", attempts="all")
    assert Counter(every["attempt"]) == {1: 6, 2: 6}

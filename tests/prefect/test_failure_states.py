"""A run where rollouts errored says so: Failed rollout flow, task and batch runs, a Failed eval flow
run with the reason, the CLI's exit status and top errors; scored 0 stays Completed (issue 13, item 1)."""

from __future__ import annotations

import asyncio
import re
import signal

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import run_eval
from prefect_rollouts.traces import read_model_calls, read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply, status
from tests.prefect.tasksets import Numbered
from tests.support.cli import eval_env, finish, start_eval
from tests.support.datasets import durable_rows
from tests.support.ports import free_port
from tests.support.waiting import poll_until, wait_for

pytestmark = pytest.mark.prefect


def run_cli(config_path, *args: str):
    result = CliRunner().invoke(app, ["eval", str(config_path), *args])
    return result, " ".join(result.output.split())       # rich wraps long lines


async def final_flow_runs(**filters) -> list:
    """Flow runs matching ``filters`` once the server has recorded each in a final state."""
    async def read():
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(**filters))
        return runs if runs and all(r.state and r.state.is_final() for r in runs) else None
    return await wait_for(read, what=f"the flow runs of {filters} to end")


async def final_task_runs(flow_run_id, expected: int) -> list:
    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        final = [r for r in runs if r.state and r.state.is_final()]
        return final if len(final) >= expected else None
    return await wait_for(read, what=f"{expected} task runs of flow run {flow_run_id} to end")


def eval_run(run_id: str):
    runs = asyncio.run(final_flow_runs(name=FlowRunFilterName(any_=[run_id])))
    assert len(runs) == 1, runs
    return runs[0]


def test_an_eval_against_an_endpoint_that_is_down_fails_everywhere_and_exits_1(tmp_path):
    port = free_port()
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", f"http://127.0.0.1:{port}/v1", num_tasks=3,
                                rollout_granularity="flow"))
    result, output = run_cli(config, "--run-id", "endpoint-down")
    refused = f"model endpoint: POST http://127.0.0.1:{port}/v1/chat/completions failed: connection refused to " \
              f"127.0.0.1:{port} (after 1 attempt)"
    assert result.exit_code == 1, result.output
    assert f"top errors: ProviderError x3, e.g.: {refused}" in output
    assert f"eval failed: 3 of 3 rollouts errored (ProviderError: {refused})" in output
    # then the way to finish the run: its errored rollouts again, as new attempts
    assert output.endswith("run the 3 errored rollouts again (as new attempts) with: "
                           f"prefect-rollouts eval {config} --resume endpoint-down --retry-errors"), output

    rows = read_rollouts(tmp_path / "traces", run_id="endpoint-down")     # the rows are the record
    assert len(rows) == 3 and rows["is_error"].all() and set(rows["stop_condition"]) == {"provider_error"}
    assert set(rows["error_message"]) == {refused}
    calls = read_model_calls(tmp_path / "traces", run_id="endpoint-down")
    assert len(calls) == 3 and calls["status_code"].isna().all()          # no response, no HTTP status

    eval_flow_run = eval_run("endpoint-down")
    assert eval_flow_run.state.is_failed()
    assert eval_flow_run.state.message == f"3 of 3 rollouts errored (ProviderError: {refused})"
    rollout_runs = asyncio.run(final_flow_runs(id=FlowRunFilterId(any_=list(rows["flow_run_id"]))))
    assert [(r.state.name, r.state.message) for r in rollout_runs] == [("Failed", f"ProviderError: {refused}")] * 3
    for flow_run in rollout_runs:
        stages = {r.name: r.state.name for r in asyncio.run(final_task_runs(flow_run.id, 1))}
        assert stages == {"segment-0": "Failed"}        # finalize and scoring do not run after an error


def test_scored_zero_is_completed_and_max_error_fraction_is_the_line_between_exit_0_and_1(tmp_path, openai_server):
    def wrong_but_task_9_down(request):
        return status(400) if "task 9:" in request.messages[-1]["content"] else reply("wrong")
    openai_server.default = wrong_but_task_9_down
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url))   # 10 tasks, a task run each

    result, output = run_cli(config, "--run-id", "zeros", "--set", "num_tasks=9")
    assert result.exit_code == 0, result.output
    assert "top errors" not in output and "eval failed" not in output
    assert eval_run("zeros").state.is_completed()
    assert set(read_rollouts(tmp_path / "traces", run_id="zeros")["reward"]) == {0.0}

    result, output = run_cli(config, "--run-id", "at-limit", "--set", "max_error_fraction=0.1")
    assert result.exit_code == 0, result.output                        # 1 of 10 errored: exactly the limit
    assert "top errors: ProviderError x1, e.g.: model endpoint: POST" in output and "returned 400" in output
    assert "eval failed" not in output and eval_run("at-limit").state.is_completed()

    result, output = run_cli(config, "--run-id", "over-limit", "--set", "max_error_fraction=0.09")
    assert result.exit_code == 1, result.output
    message = eval_run("over-limit").state.message
    assert re.fullmatch(r"1 of 10 rollouts errored, more than max_error_fraction = 0.09 allows "
                        r"\(ProviderError: model endpoint: POST .* returned 400: .*\)", message), message
    assert f"eval failed: {message}" in output
    assert f"run the 1 errored rollout again (as new attempts) with: prefect-rollouts eval {config} " in output
    assert output.endswith("--set=max_error_fraction=0.09 --resume over-limit --retry-errors"), output


@pytest.mark.parametrize("granularity", ["task", "batch"])
async def test_errored_rollouts_are_failed_task_runs_at_task_and_batch_granularity(tmp_path, openai_server,
                                                                                     granularity):
    def task_1_down(request):
        return status(500, body="down") if "task 1:" in request.messages[-1]["content"] else reply("0")
    openai_server.default = task_1_down
    run_id = f"errored-{granularity}"
    config = load_eval_config(eval_toml(tmp_path, openai_server.base_url, num_tasks=3, batch_size=3,
                                        rollout_granularity=granularity))
    summary, failure = await run_eval(config, run_id=run_id)
    assert (summary.rollouts, summary.errored) == (3, 1)
    assert failure is not None and failure.startswith("1 of 3 rollouts errored (ProviderError: model endpoint: POST")
    assert [(e.type, e.count) for e in summary.errors] == [("ProviderError", 1)]
    (eval_flow_run,) = await final_flow_runs(name=FlowRunFilterName(any_=[run_id]))
    assert (eval_flow_run.state.name, eval_flow_run.state.message) == ("Failed", failure)
    runs = {r.name: r for r in await final_task_runs(eval_flow_run.id, 1 if granularity == "batch" else 3)}
    if granularity == "task":
        assert {name: r.state.name for name, r in runs.items()} == {
            "n0#0": "Completed", "n1#0": "Failed", "n2#0": "Completed"}
        assert runs["n1#0"].state.message.startswith("ProviderError: model endpoint: POST")
    else:
        batch = runs["batch-0"]                   # errored rollouts have rows: the batch is not retried
        assert (batch.state.name, batch.run_count) == ("Failed", 1)
        assert batch.state.message.startswith("1 of 3 rollouts errored (ProviderError: model endpoint: POST")
    assert len(read_rollouts(tmp_path, run_id=run_id)) == 3


async def test_agent_run_returns_the_errored_trace_of_its_failed_flow_run(agent_config):
    port = free_port()
    client = vf.ClientConfig(base_url=f"http://127.0.0.1:{port}/v1", api_key_env=None,
                             retries=vf.RetryConfig(max_retries=0))
    async with vf.make_agent(agent_config(orchestrator="prefect", client=client)) as agent:
        trace = await agent.run(Numbered(vf.TaskData(id="n5", prompt="say 5", answer="5")))
    assert trace.stop_condition == "provider_error" and trace.reward is None
    (flow_run,) = await final_flow_runs(id=FlowRunFilterId(any_=[trace.info["flow_run_id"]]))
    assert flow_run.state.name == "Failed"
    assert flow_run.state.message == f"ProviderError: {trace.errors[0].message}"
    assert f"connection refused to 127.0.0.1:{port}" in flow_run.state.message


def test_ctrl_c_prints_how_many_rollouts_are_durable_and_the_resume_command(tmp_path, openai_server):
    openai_server.default = delayed(0.3, reply("0"))
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=1, flush_each_rollout=True))
    process = start_eval(config, "--run-id", "ctrl-c", env=eval_env(PREFECT_LOGGING_LEVEL="WARNING"))
    def two_durable_or_ended() -> bool:   # (an eval that ended: the asserts below say how)
        return process.poll() is not None or durable_rows(tmp_path / "traces") >= 2
    poll_until(two_durable_or_ended, timeout_s=120, interval_s=0.05)
    process.send_signal(signal.SIGINT)
    output = " ".join(finish(process, 120).split())
    durable = len(read_rollouts(tmp_path / "traces", run_id="ctrl-c"))
    assert process.returncode == 130, output
    assert "eval stopped: interrupted (Ctrl-C)" in output and "Traceback" not in output
    assert 2 <= durable < 10
    assert f"{durable} of 10 rollouts durable; resume with: prefect-rollouts eval {config} --resume ctrl-c" in output


def test_an_eval_whose_every_rollout_hit_scoring_timeout_fails_and_says_why(tmp_path, openai_server):
    openai_server.default = lambda request: reply("0")
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url,
                                taskset={"id": "tests.prefect.tasksets:slow_reward", "count": 3}))
    result, output = run_cli(config, "--run-id", "all-timed-out", "--set", "env.agent.timeouts.scoring=0.5")
    assert result.exit_code == 1, output[-3000:]
    assert "eval failed: 3 of 3 rollouts errored or were not scored (not scored: scoring_timeout x3)" in output
    assert "not scored: scoring_timeout x3" in output

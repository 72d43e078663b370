"""eval_flow against the scripted server: rows, summary, granularities, secrets."""

from __future__ import annotations

import hashlib
import re

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_model_calls, read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply, status

pytestmark = pytest.mark.prefect


def even_tasks_right_task_9_down(request):
    number = int(re.search(r"task (\d+)", request.messages[-1]["content"]).group(1))
    if number == 9:
        return status(500)
    return reply(str(number) if number % 2 == 0 else "wrong")


async def test_an_eval_of_20_rollouts_writes_20_rows_and_the_right_summary(tmp_path, openai_server):
    openai_server.default = even_tasks_right_task_9_down
    config = load_eval_config(eval_toml(tmp_path, openai_server.base_url, rollouts_per_task=2, max_concurrent=4,
                                            max_error_fraction=0.1))
    summary = await eval_flow(config, run_id="twenty")
    rows = read_rollouts(tmp_path, run_id="twenty")
    assert len(rows) == 20 and len(rows.drop_duplicates(["task_id", "rollout_index"])) == 20
    env = summary.environments[0]
    assert (env.environment, env.rollouts, env.scored, env.errored) == ("tests.prefect.tasksets:numbered", 20, 18, 2)
    assert env.mean_reward == pytest.approx(10 / 18)                # the 500s are excluded, not zeros
    assert env.pass_at_k == {1: pytest.approx(5 / 9), 2: pytest.approx(5 / 9)}
    assert summary.total_tokens == int(rows["total_tokens"].sum()) > 0
    assert set(rows[rows["is_error"]]["error_type"]) == {"ProviderError"}
    assert len(read_model_calls(tmp_path, run_id="twenty")) == 20
    series = "tests.prefect.tasksets:numbered"                        # no run_name: the taskset's series
    summary_key = f"eval-summary-tests-prefect-tasksets-numbered-{hashlib.sha256(series.encode()).hexdigest()[:8]}"
    async with get_client() as client:
        artifacts = await client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[summary_key, "eval-progress-twenty"])))
    kinds = {a.key: a for a in artifacts if a.key != summary_key or "run twenty " in a.description}
    assert kinds["eval-progress-twenty"].data == 100.0
    assert '"mean_reward": 0.5556' in kinds[summary_key].data


def comparable_rows(frame):
    columns = ["task_id", "rollout_index", "reward", "rewards", "stop_condition", "is_error", "total_tokens",
               "num_model_calls", "is_truncated"]
    return frame[columns].sort_values(["task_id", "rollout_index"]).reset_index(drop=True)


async def test_all_granularities_write_identical_rows(tmp_path, openai_server):
    openai_server.default = even_tasks_right_task_9_down
    frames = {}
    for granularity in ("flow", "task", "batch"):
        config = load_eval_config(eval_toml(tmp_path, openai_server.base_url, rollout_granularity=granularity,
                                            batch_size=3, max_concurrent=4, max_error_fraction=0.1))
        await eval_flow(config, run_id=f"g-{granularity}")
        frames[granularity] = comparable_rows(read_rollouts(tmp_path, run_id=f"g-{granularity}"))
    assert len(frames["flow"]) == 10
    assert frames["flow"].equals(frames["task"]) and frames["flow"].equals(frames["batch"])


async def test_resume_runs_only_the_rollouts_without_a_durable_row(tmp_path, openai_server):
    openai_server.default = even_tasks_right_task_9_down
    first = load_eval_config(eval_toml(tmp_path, openai_server.base_url, num_tasks=4))
    await eval_flow(first, run_id="resumable")
    openai_server.reset()
    openai_server.default = even_tasks_right_task_9_down
    whole = load_eval_config(eval_toml(tmp_path, openai_server.base_url, max_error_fraction=0.1))
    summary = await eval_flow(whole, resume="resumable", force_config=True)   # grown on purpose (num_tasks)
    assert len(openai_server.requests) == 6                           # tasks 4..9 only
    assert summary.rollouts == 10 and len(read_rollouts(tmp_path, run_id="resumable")) == 10

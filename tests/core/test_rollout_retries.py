"""max_rollout_attempts in the eval engine without Prefect: an errored rollout runs again within the run as a
new attempt with a row of its own, after a backoff that holds no concurrency slot; the rule decides which."""

from __future__ import annotations

import re
import threading

import pytest

import prefect_rollouts as vf
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import AgentFailure, ProviderError
from prefect_rollouts.evals.engine import inline_runner, run_rollouts
from prefect_rollouts.evals.prepare import prepare_eval
from prefect_rollouts.traces import read_rollouts, summarize_run
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply, status

pytestmark = pytest.mark.unit


def failing_first(times: dict[str, int], code: int = 503):
    """Task i says i; the tasks of ``times`` first answer ``code`` that many times (then recover)."""
    lock = threading.Lock()

    def step(request):
        number = re.search(r"say (\d+)", request.messages[-1]["content"]).group(1)
        with lock:
            left = times.get(f"n{number}", 0)
            times[f"n{number}"] = left - 1
        return status(code) if left > 0 else reply(number)
    return step


async def run(config, run_id: str, concurrency: int = 2):
    prepared = prepare_eval(config, run_id=run_id, resume=False)
    return await run_rollouts(prepared.config, prepared.root, prepared.run_id, prepared.todo,
                              inline_runner(concurrency), total=prepared.total, durable=prepared.durable)


async def test_max_rollout_attempts_recovers_errored_rollouts_within_the_run(tmp_path, openai_server):
    openai_server.default = failing_first({"n1": 2, "n3": 99})   # n1 recovers at its third attempt; n3 never
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=2,
                                        max_rollout_attempts=3, rollout_backoff_s=0.0)
                              .replace("count = 10", "count = 5"))
    await run(config, "in-run")
    every = read_rollouts(tmp_path / "traces", run_id="in-run", attempts="all").sort_values(["task_id", "attempt"])
    attempts = {task: group[["attempt", "is_error"]].values.tolist() for task, group in every.groupby("task_id")}
    assert attempts == {"n0": [[1, False]], "n1": [[1, True], [2, True], [3, False]], "n2": [[1, False]],
                        "n3": [[1, True], [2, True], [3, True]], "n4": [[1, False]]}
    assert set(every.loc[every["is_error"], "error_type"]) == {"ProviderError"}
    latest = read_rollouts(tmp_path / "traces", run_id="in-run").set_index("task_id")
    assert latest.loc["n1", "reward"] == 1.0 and latest["attempt"].to_dict() == {
        "n0": 1, "n1": 3, "n2": 1, "n3": 3, "n4": 1}
    summary = summarize_run(tmp_path / "traces", "in-run")
    assert (summary.rollouts, summary.errored, summary.retried, summary.recovered) == (5, 1, 2, 1)
    assert "retried: 2 rollouts after an errored attempt, 1 recovered" in summary.text()


async def test_an_error_outside_the_rule_is_not_retried_and_retry_error_types_replaces_the_rule(
        tmp_path, openai_server):
    openai_server.default = failing_first({"n1": 1})
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url, max_rollout_attempts=2,
                                        rollout_backoff_s=0.0, retry_error_types=["RuntimeUnavailableError"])
                              .replace("count = 10", "count = 3"))
    await run(config, "rule")
    every = read_rollouts(tmp_path / "traces", run_id="rule", attempts="all")
    assert sorted(every["task_id"]) == ["n0", "n1", "n2"]   # a ProviderError is not of the types given: no retry
    assert summarize_run(tmp_path / "traces", "rule").retried == 0


async def test_a_rollout_waiting_for_its_retry_holds_no_concurrency_slot(tmp_path, openai_server):
    openai_server.default = failing_first({"n0": 1})
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=1,
                                        max_rollout_attempts=2, rollout_backoff_s=2.0)
                              .replace("count = 10", "count = 4"))
    await run(config, "gate", concurrency=1)
    asked = [re.search(r"say (\d+)", r.messages[-1]["content"]).group(1) for r in openai_server.requests]
    # n0 failed, and while it waited (1-3 s) the one slot ran the other tasks: n0's retry came last
    assert asked == ["0", "1", "2", "3", "0"]
    latest = read_rollouts(tmp_path / "traces", run_id="gate")
    assert set(latest["reward"]) == {1.0} and latest.set_index("task_id").loc["n0", "attempt"] == 2


class AgentThenProvider(vf.Task):
    """The oracle's solution fails on its own (``program_failed``) for task ``failed``; the reward of every
    task then raises a ``ProviderError``, an error the default rule retries."""

    async def solve(self, runtime, trace) -> None:
        if self.data.id == "failed":
            raise AgentFailure("the program exited with code 2", "program_failed")

    @vf.reward
    def tests(self, trace: vf.Trace) -> float:
        raise ProviderError("the judge's endpoint answered 503", status_code=503)


def agent_then_provider() -> list[AgentThenProvider]:
    return [AgentThenProvider(vf.TaskData(id=task_id, prompt="solve it")) for task_id in ("failed", "solved")]


async def test_a_rollout_the_agent_itself_failed_is_not_retried_even_with_a_retryable_error(tmp_path, openai_server):
    text = eval_toml(tmp_path / "traces", openai_server.base_url, max_rollout_attempts=3, rollout_backoff_s=0.0,
                     taskset={"id": "tests.core.test_rollout_retries:agent_then_provider"})
    await run(load_eval_config(text.replace('harness = "chat"', 'harness = "oracle"')), "agent-failed")
    every = read_rollouts(tmp_path / "traces", run_id="agent-failed", attempts="all")
    attempts = every.groupby("task_id")["attempt"].max().to_dict()
    assert attempts == {"failed": 1, "solved": 3}   # the agent's own failure is its result, whatever came after
    assert set(every["error_type"]) == {"ProviderError"}
    assert set(every.loc[every["task_id"] == "failed", "stop_condition"]) == {"program_failed"}

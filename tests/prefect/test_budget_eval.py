"""An eval its token budget stops, as a user runs it (the CLI in a process of its own, the scripted
server over a real socket): rollouts in flight stop as ``budget``, no new one starts, the eval flow run
ends ``BudgetReached``, the CLI exits 4 and prints the spend, the budget and the resume command, and that
command (a larger budget) finishes the run with every first attempt kept (issue 36, item 4)."""

from __future__ import annotations

import asyncio
import re
import shlex

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilterName

from prefect_rollouts.cli.main import BUDGET_EXIT
from prefect_rollouts.flows.services.keys import spend_key, summary_key
from prefect_rollouts.traces import read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply, status
from tests.prefect.test_failure_states import eval_run, final_flow_runs
from tests.support.cli import eval_env, run_eval

pytestmark = pytest.mark.prefect


async def series_artifacts(series: str) -> list:
    async with get_client() as client:
        return await client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[summary_key(series), spend_key(series)])))


def says_its_number(request):
    number = re.search(r"say (\d+)", request.messages[-1]["content"]).group(1)
    return reply(number, usage={"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100})


def test_a_budget_stops_the_eval_with_exit_4_and_its_resume_command_finishes_the_run(tmp_path, openai_server):
    openai_server.default = delayed(0.05, says_its_number)
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=4, token_budget=1_000,
                                taskset={"id": "tests.core.budget_tasks:chatty", "count": 8, "turns": 5}))
    env = eval_env(PREFECT_LOGGING_LEVEL="WARNING")
    stopped = run_eval(config, "--run-id", "budget-cli", env=env)
    output = " ".join((stopped.stdout + stopped.stderr).split())
    assert stopped.returncode == BUDGET_EXIT == 4, output
    assert re.search(r"budget reached: spent 1,[0-9]{3} tokens, \$0\.0000 of token_budget = 1,000: \d of 8 rollouts "
                     r"not done \(\d stopped as budget, \d not started\)", output), output
    command = re.search(r"resume with a larger budget: (.*--set=token_budget=(\d+)) \(an estimate", output)
    assert int(command.group(2)) >= 2_000, output   # the spend so far and each rollout not done at the costliest
    rows = read_rollouts(tmp_path / "traces", run_id="budget-cli", attempts="all")
    in_flight = rows[rows["stop_condition"] == "budget"]
    assert len(in_flight) >= 2 and in_flight["reward"].isna().all() and len(rows) < 8
    assert 1_000 <= int(rows["total_tokens"].sum()) <= 1_000 + 4 * 100   # one call per rollout in flight past it
    run = eval_run("budget-cli")
    assert (run.state_type.value, run.state_name) == ("FAILED", "BudgetReached")
    assert run.state.message.startswith("budget reached: spent")
    artifacts = asyncio.run(series_artifacts("tests.core.budget_tasks:chatty"))
    summary = next(a for a in artifacts if a.key == summary_key("tests.core.budget_tasks:chatty")
                   and "run budget-cli (" in a.description)
    assert "budget reached: spent" in summary.description and "spend: 1," in summary.description
    spend = next(a for a in artifacts if a.key == spend_key("tests.core.budget_tasks:chatty"))
    assert "Spend of run budget-cli:" in spend.description and '"tokens": ' in spend.data

    args = shlex.split(command.group(1))
    assert args[:3] == ["prefect-rollouts", "eval", str(config)] and args[3:5] == ["--resume", "budget-cli"]
    # the estimate counts a stopped rollout's partial spend as a whole one's: give more than it says
    finished = run_eval(config, *args[3:], "--set=token_budget=100000", env=env)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    latest = read_rollouts(tmp_path / "traces", run_id="budget-cli")
    every = read_rollouts(tmp_path / "traces", run_id="budget-cli", attempts="all")
    assert len(latest) == 8 and set(latest["stop_condition"]) == {"agent_completed"} and set(latest["reward"]) == {1.0}
    assert (every["stop_condition"] == "budget").sum() == len(in_flight)
    assert set(latest[latest["task_id"].isin(in_flight["task_id"])]["attempt"]) == {2}


def test_a_budget_that_cuts_off_retries_is_a_budget_stop_not_a_failure(tmp_path, openai_server):
    """Errored rollouts still due a retry (``--retry-errors``, ``max_rollout_attempts``) are not done: a budget
    reached before they ran again ends the eval BudgetReached, exit 4, with the resume command."""
    def first_four_fail(request):
        number = int(re.search(r"say (\d+)", request.messages[-1]["content"]).group(1))
        return status(500, {"error": {"message": "overloaded"}}) if number < 4 else says_its_number(request)
    openai_server.default = first_four_fail
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=2,
                                taskset={"id": "tests.core.budget_tasks:chatty", "count": 6, "turns": 1}))
    env = eval_env(PREFECT_LOGGING_LEVEL="WARNING")
    failed = run_eval(config, "--run-id", "cut-retries", env=env)   # 4 of 6 errored, 200 tokens spent
    assert failed.returncode == 1, failed.stdout + failed.stderr
    requests = len(openai_server.requests)
    for args, resume in ((["--retry-errors", "--set=token_budget=150"], "--retry-errors"),
                         (["--set=max_rollout_attempts=3", "--set=token_budget=150"], "--set=max_rollout_attempts=3")):
        stopped = run_eval(config, "--resume", "cut-retries", *args, env=env)
        output = " ".join((stopped.stdout + stopped.stderr).split())
        assert stopped.returncode == BUDGET_EXIT, output
        assert ("budget reached: spent 200 tokens, $0.0000 of token_budget = 150: 4 of 6 rollouts not done "
                "(0 stopped as budget, 0 not started, 4 errored and due a retry)") in output, output
        assert "eval failed" not in output and re.search(rf"resume with a larger budget: .*{resume}", output), output
    assert len(openai_server.requests) == requests   # the budget was reached before any retry started
    runs = asyncio.run(final_flow_runs(name=FlowRunFilterName(any_=["cut-retries"])))
    assert sorted(run.state_name for run in runs) == ["BudgetReached", "BudgetReached", "Failed"]


def test_a_resume_counts_what_a_killed_eval_spent_and_the_counter_is_never_lowered(tmp_path, openai_server):
    """A local eval's spend is mirrored to the run's counter, so a resume after kill -9 (1,300 tokens served,
    no row durable) starts from it; reseeding from the rows never lowers the counter."""
    from prefect_rollouts.config.eval import load_eval_config
    from prefect_rollouts.evals.budget import Spend
    from prefect_rollouts.flows.services.budget import GclLedger, seed_shared_budget

    openai_server.default = says_its_number
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=2, token_budget=1_000,
                                taskset={"id": "tests.core.budget_tasks:chatty", "count": 4, "turns": 1}))
    loaded = load_eval_config(config.read_text())

    async def killed_eval_spent(tokens: int) -> Spend:   # what the killed process counted, then a reseed
        budget = await seed_shared_budget(loaded, loaded.traces.dataset_root(), "killed")
        await budget.charge(tokens, None)
        again = await seed_shared_budget(loaded, loaded.traces.dataset_root(), "killed")   # rows: 0 tokens
        return await again.ledger.total()
    assert asyncio.run(killed_eval_spent(1_300)).tokens == 1_300
    stopped = run_eval(config, "--run-id", "killed", env=eval_env(PREFECT_LOGGING_LEVEL="WARNING"))
    output = " ".join((stopped.stdout + stopped.stderr).split())
    assert stopped.returncode == BUDGET_EXIT, output
    assert "budget reached: spent 1,300 tokens, $0.0000 of token_budget = 1,000: 4 of 4 rollouts not done" in output
    assert openai_server.requests == []   # nothing spent twice
    finished = run_eval(config, "--resume", "killed", "--set=token_budget=100000",
                        env=eval_env(PREFECT_LOGGING_LEVEL="WARNING"))
    assert finished.returncode == 0, finished.stdout + finished.stderr
    counted = asyncio.run(GclLedger("killed", 100_000, None).total())
    assert counted.tokens == 1_300 + 4 * 100   # the local eval's calls went to the counter too

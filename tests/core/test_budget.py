"""Token and cost budgets (evals/budget.py), per-rollout token caps and prices, on the inline engine
against the scripted server over a real socket."""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.engine import inline_runner, run_rollouts
from prefect_rollouts.evals.prepare import prepare_eval
from prefect_rollouts.pricing import call_cost_usd
from prefect_rollouts.traces import read_rollouts, read_traces, summarize_run
from tests.core.budget_tasks import chatty
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply, status, tool_call

pytestmark = pytest.mark.unit

CALL_TOKENS = 100
"""Every scripted call's tokens (90 prompt + 10 completion)."""


def numbered_reply(request):
    """The number the last user message asks for, costing ``CALL_TOKENS`` tokens."""
    number = re.search(r"say (\d+)", request.messages[-1]["content"]).group(1)
    return reply(number, usage={"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": CALL_TOKENS})


def budget_toml(tmp_path, base_url, turns=3, **top):
    return eval_toml(tmp_path / "traces", base_url, **top,
                     taskset={"id": "tests.core.budget_tasks:chatty", "count": 10, "turns": turns})


async def run(prepared, concurrency):
    return await run_rollouts(prepared.config, prepared.root, prepared.run_id, prepared.todo,
                              inline_runner(concurrency), total=prepared.total, durable=prepared.durable)


def test_a_call_costs_its_tokens_at_the_prices_given():
    price = vf.ClientConfig(price={"input": 3.0, "output": 15.0, "cached_input": 0.3, "cache_write": 3.75}).price
    # 2,000 fresh + 8,000 cached prompt tokens, 500 completion tokens (reasoning included in them)
    assert call_cost_usd(price, 10_000, 500, cached_tokens=8_000) == pytest.approx((2_000 * 3 + 8_000 * 0.3
                                                                                    + 500 * 15) / 1e6)
    assert call_cost_usd(price, 1_000, 0, cache_write_tokens=1_000) == pytest.approx(1_000 * 3.75 / 1e6)
    assert call_cost_usd(None, 10_000, 500) is None


def test_a_cost_budget_needs_a_price_on_every_client_it_uses(tmp_path):
    text = budget_toml(tmp_path, "http://127.0.0.1:9/v1", cost_budget_usd=1.5)
    with pytest.raises(ConfigError, match=r"cost_budget_usd = 1\.5: \[env\.agent\.client\] has no price.*Set "
                                          r"\[env\.agent\.client\] price = \{ input = \.\.\., output = \.\.\. \}"):
        load_eval_config(text)
    priced = text.replace('api_key_env = ""\n', 'api_key_env = ""\nprice = { input = 1.0, output = 2.0 }\n')
    judged = priced + ('[[env.agent.scoring.judges]]\nid = "reference"\nmodel = "j"\n'
                       '[env.agent.scoring.judges.client]\nbase_url = "http://127.0.0.1:9/v1"\n')
    assert load_eval_config(priced).cost_budget_usd == 1.5
    with pytest.raises(ConfigError, match=r"\[env\.agent\.scoring\.judges\.0\.client\] has no price"):
        load_eval_config(judged)


async def test_max_rollout_tokens_stops_the_rollout_before_its_next_call(agent_config, openai_server):
    openai_server.default = numbered_reply
    task = chatty(1, turns=5)[0]
    async with vf.make_agent(agent_config(max_rollout_tokens=250)) as agent:
        trace = await agent.run(task)
    assert (trace.stop_condition, trace.is_truncated) == ("max_rollout_tokens", True)
    assert len(openai_server.requests) == 3 and trace.usage.total_tokens == 300   # passed by one call at most


async def test_rows_carry_the_cost_of_the_calls_at_the_clients_price(tmp_path, openai_server):
    openai_server.default = lambda request: reply("1", usage={
        "prompt_tokens": 1_000, "completion_tokens": 200, "total_tokens": 1_200,
        "prompt_tokens_details": {"cached_tokens": 400}, "completion_tokens_details": {"reasoning_tokens": 50}})
    text = budget_toml(tmp_path, openai_server.base_url, num_tasks=2, max_concurrent=2).replace(
        'api_key_env = ""\n', 'api_key_env = ""\nprice = { input = 2.0, output = 10.0, cached_input = 0.5 }\n')
    prepared = prepare_eval(load_eval_config(text), run_id="priced", resume=False)
    await run(prepared, 2)
    rows = read_rollouts(tmp_path / "traces", run_id="priced")
    call = (600 * 2.0 + 400 * 0.5 + 200 * 10.0) / 1e6        # reasoning tokens bill as output (they are in the 200)
    assert rows["cost_usd"].tolist() == pytest.approx([3 * call, 3 * call])
    summary = summarize_run(tmp_path / "traces", "priced")
    assert summary.spend.cost_usd == pytest.approx(6 * call) and summary.spend.tokens == 6 * 1_200
    assert summary.environments[0].cost_usd == pytest.approx(6 * call)
    assert "cost_usd" in summary.table()[0] and f"${6 * call:.4f}" in summary.text()
    shown = CliRunner().invoke(app, ["traces", "summary", str(tmp_path / "traces"), "--run-id", "priced"]).output
    assert f"spend: 7,200 tokens (judges 0), ${6 * call:.4f} over 2 attempts of 2 rollouts (every attempt)" in shown
    summary.wall_time_s = 1.0   # as the eval prints it: the latest attempts' tokens beside the spend, each labeled
    assert "tokens of the latest attempts: 7200" in summary.text() and "(every attempt)" in summary.text()
    assert f"per rollout 3,600 tokens, ${3 * call:.4f}" in shown and "costliest tasks:" in shown
    one = CliRunner().invoke(app, ["traces", "show", str(tmp_path / "traces"), "priced", "c0"]).output
    assert f"tokens: prompt 3000, completion 600 · cost ${3 * call:.6f}" in one


async def test_a_budget_stops_rollouts_in_flight_as_budget_and_a_larger_one_finishes_the_run(tmp_path, openai_server):
    openai_server.default = delayed(0.02, numbered_reply)
    budget = 1_000   # 10 rollouts x 5 calls x 100 tokens = 5,000 to finish; the first 4 alone need 2,000
    config = load_eval_config(budget_toml(tmp_path, openai_server.base_url, turns=5, max_concurrent=4,
                                          token_budget=budget))
    prepared = prepare_eval(config, run_id="budgeted", resume=False)
    run_state, complete = await run(prepared, 4)
    assert complete and run_state.budget is not None and run_state.budget.is_reached
    rows = read_rollouts(tmp_path / "traces", run_id="budgeted", attempts="all")
    stopped = rows[rows["stop_condition"] == "budget"]
    assert len(stopped) >= 2 and stopped["reward"].isna().all() and not stopped["is_error"].any()
    assert len(rows) < 10                                     # no new rollout started once it was reached
    spent = int(rows["total_tokens"].sum())
    overshoot = spent - budget                                # measured: the calls in flight when it was reached
    assert 0 <= overshoot <= 4 * CALL_TOKENS, overshoot       # at most one call per rollout in flight
    assert len(openai_server.requests) * CALL_TOKENS == spent

    raised = load_eval_config(budget_toml(tmp_path, openai_server.base_url, turns=5, max_concurrent=4,
                                          token_budget=10_000))
    resumed = prepare_eval(raised, run_id="budgeted", resume=True)
    assert sorted(p.key for p in resumed.todo if p.attempt == 2) == sorted(
        ("tests.core.budget_tasks:chatty", t, i) for t, i in zip(stopped["task_id"], stopped["rollout_index"],
                                                                   strict=True))
    assert len(resumed.todo) == 10 - int((rows["stop_condition"] == "agent_completed").sum())
    await run(resumed, 4)
    latest = read_rollouts(tmp_path / "traces", run_id="budgeted")
    every = read_rollouts(tmp_path / "traces", run_id="budgeted", attempts="all")
    assert len(latest) == 10 and set(latest["stop_condition"]) == {"agent_completed"} and set(latest["reward"]) == {1.0}
    assert (every["stop_condition"] == "budget").sum() == len(stopped)   # the first attempts stay
    assert summarize_run(tmp_path / "traces", "budgeted").spend.tokens == int(every["total_tokens"].sum())


def bash_forever(request):
    """A tool call to run ``true``, again and again (a program that never finishes), ``CALL_TOKENS`` each."""
    return dataclasses.replace(tool_call("bash", command="true"),
                               usage={"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": CALL_TOKENS})


async def test_program_rollouts_in_flight_are_refused_their_next_request_as_budget(tmp_path, openai_server):
    openai_server.default = bash_forever
    text = budget_toml(tmp_path, openai_server.base_url, max_concurrent=4, num_tasks=4, token_budget=1_000)
    prepared = prepare_eval(load_eval_config(text.replace('harness = "chat"', 'harness = "bash"')),
                            run_id="programs", resume=False)
    await run(prepared, 4)
    rows = read_rollouts(tmp_path / "traces", run_id="programs")
    assert len(rows) == 4 and set(rows["stop_condition"]) == {"budget"} and not rows["is_error"].any()
    assert rows["reward"].isna().all()                           # not scored: it runs again on resume
    assert 0 <= int(rows["total_tokens"].sum()) - 1_000 <= 4 * CALL_TOKENS
    traces = read_traces(tmp_path / "traces", run_id="programs")
    assert all("rollout stopped: budget" in trace.info["program"][0]["stderr_tail"] for trace in traces)
    assert all("agent_failure" not in trace.info for trace in traces)   # the endpoint's stop wins over the exit


async def test_max_rollout_tokens_refuses_a_programs_next_request(openai_server, agent_config):
    openai_server.default = bash_forever
    async with vf.make_agent(agent_config(harness="bash", max_rollout_tokens=250)) as agent:
        trace = await agent.run(chatty(1, turns=1)[0])
    assert len(openai_server.requests) == 3 and (trace.stop_condition, trace.is_truncated) == ("max_rollout_tokens",
                                                                                                True)
    assert trace.errors == [] and "rollout stopped: max_rollout_tokens" in trace.info["program"][0]["stderr_tail"]


async def test_judge_calls_bill_at_their_own_clients_price_and_count_in_the_spend(tmp_path, openai_server):
    def answer(request):
        if request.body.get("model") == "judge-model":
            return reply("yes", usage={"prompt_tokens": 1_000, "completion_tokens": 1, "total_tokens": 1_001})
        return numbered_reply(request)
    openai_server.default = answer
    text = budget_toml(tmp_path, openai_server.base_url, turns=1, num_tasks=2, max_concurrent=2).replace(
        'api_key_env = ""\n', 'api_key_env = ""\nprice = { input = 2.0, output = 10.0 }\n')
    text += ('[[env.agent.scoring.judges]]\nid = "reference"\nmodel = "judge-model"\n'
             '[env.agent.scoring.judges.client]\n'
             f'base_url = "{openai_server.base_url}"\napi_key_env = ""\nprice = {{ input = 1.0, output = 4.0 }}\n')
    prepared = prepare_eval(load_eval_config(text.replace("num_tasks", "cost_budget_usd = 5.0\nnum_tasks")),
                            run_id="judged", resume=False)
    run_state, _ = await run(prepared, 2)
    rows = read_rollouts(tmp_path / "traces", run_id="judged")
    agent, judge = (90 * 2.0 + 10 * 10.0) / 1e6, (1_000 * 1.0 + 1 * 4.0) / 1e6
    assert rows["cost_usd"].tolist() == pytest.approx([agent + judge] * 2)
    spend = summarize_run(tmp_path / "traces", "judged").spend
    assert (spend.tokens, spend.judge_tokens) == (2 * (100 + 1_001), 2 * 1_001)
    counted = await run_state.budget.ledger.total()                 # the budget counted the judges too
    assert counted.tokens == spend.tokens and counted.cost_usd == pytest.approx(2 * (agent + judge))


def test_the_shared_counters_count_whole_units_and_scale_a_budget_past_a_billion():
    from prefect_rollouts.evals.budget import Spend
    from prefect_rollouts.flows.services.budget import SLOT_MAX, GclLedger, counter_name

    exact = GclLedger("nightly-1", 1_000_000, 25.0)
    assert exact.names == {"tokens": "budget-tokens-nightly-1", "usd": "budget-usd-nightly-1"}
    assert exact.slots(Spend(1_234, 0.0123456)) == {"tokens": 1_234, "usd": 12_346}   # micro-dollars, rounded up
    assert exact.spend_of({"tokens": 1_234, "usd": 12_346}) == Spend(1_234, pytest.approx(0.012346))
    huge = GclLedger("r", 5_000_000_000, None)          # 5e9 tokens: counted in units of 5 tokens
    assert huge.units == {"tokens": 5.0} and huge.slots(Spend(12, 0.0)) == {"tokens": 3}
    assert 2 * 5_000_000_000 / huge.units["tokens"] < SLOT_MAX   # twice the budget still fits the counter
    assert counter_name("Run/With Slashes", "tokens").startswith("budget-tokens-run-with-slashes-")


async def test_a_judge_call_checks_the_budget_before_it_starts_and_its_rollout_ends_budget(tmp_path, openai_server):
    def answer(request):   # c0's agent answers at once, the others after 0.3 s; each judge call reports 5,000
        if request.body.get("model") == "judge-model":
            return reply("yes", usage={"prompt_tokens": 4_990, "completion_tokens": 10, "total_tokens": 5_000})
        fast = "task 0:" in request.messages[-1]["content"]
        return numbered_reply(request) if fast else delayed(0.3, numbered_reply)
    openai_server.default = answer
    text = budget_toml(tmp_path, openai_server.base_url, turns=1, num_tasks=4, max_concurrent=4, token_budget=1_000)
    text += ('[[env.agent.scoring.judges]]\nid = "reference"\nmodel = "judge-model"\n'
             f'[env.agent.scoring.judges.client]\nbase_url = "{openai_server.base_url}"\napi_key_env = ""\n')
    prepared = prepare_eval(load_eval_config(text), run_id="judge-cut", resume=False)
    await run(prepared, 4)
    rows = read_rollouts(tmp_path / "traces", run_id="judge-cut").set_index("task_id")
    # c0 was judged (100 + 5,000 tokens: the budget reached); c1..c3's agent calls were in flight and land,
    # but their judge calls would start past the budget: none starts, and they end budget (not scored, not done)
    assert tuple(rows.loc["c0", ["stop_condition", "reward"]]) == ("agent_completed", 2.0)   # task + judge
    others = rows.loc[["c1", "c2", "c3"]]
    assert set(others["stop_condition"]) == {"budget"} and others["reward"].isna().all()
    assert not others["is_error"].any() and (others["judge_prompt_tokens"] == 0).all()
    assert sum(request.body.get("model") == "judge-model" for request in openai_server.requests) == 1
    assert summarize_run(tmp_path / "traces", "judge-cut").spend.tokens == 4 * CALL_TOKENS + 5_000
    resumed = prepare_eval(load_eval_config(text), run_id="judge-cut", resume=True)
    assert sorted((p.key[1], p.attempt) for p in resumed.todo) == [("c1", 2), ("c2", 2), ("c3", 2)]


async def test_usage_that_is_missing_negative_or_huge_counts_as_unknown_with_a_warning(tmp_path, openai_server,
                                                                                        caplog):
    usages = {"1": {"prompt_tokens": -19_800, "completion_tokens": 10, "total_tokens": -19_790},
              "2": {"prompt_tokens": 1e20, "completion_tokens": 10, "total_tokens": 1e20}}

    def answer(request):
        number = re.search(r"say (\d+)", request.messages[-1]["content"]).group(1)
        if number == "0":   # a body without usage
            return status(200, {"id": "c", "object": "chat.completion", "model": "scripted", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "0"}, "finish_reason": "stop"}]})
        return reply(number, usage=usages.get(number, {"prompt_tokens": 90, "completion_tokens": 10,
                                                       "total_tokens": 100}))
    openai_server.default = answer
    text = budget_toml(tmp_path, openai_server.base_url, turns=1, num_tasks=4, max_concurrent=1,
                       token_budget=100_000)
    prepared = prepare_eval(load_eval_config(text), run_id="usage", resume=False)
    with caplog.at_level("WARNING", logger="prefect_rollouts.budget"):
        await run(prepared, 1)
    rows = read_rollouts(tmp_path / "traces", run_id="usage").set_index("task_id")
    assert len(rows) == 4 and not rows["is_error"].any()                 # no crash, every row durable
    assert rows["total_tokens"].to_dict() == {"c0": 0, "c1": 10, "c2": 10, "c3": 100}   # unknown counts 0, never < 0
    traces = {trace.task_id: trace for trace in read_traces(tmp_path / "traces", run_id="usage")}
    assert traces["c0"].info["usage_unknown"] == {"calls": 1, "notes": ["the response reported no usage"]}
    assert traces["c1"].info["usage_unknown"]["notes"] == [
        "usage.prompt_tokens = -19800: not a whole number from 0 to 1,000,000,000, counted as 0"]
    assert "usage.prompt_tokens = 1e+20" in traces["c2"].info["usage_unknown"]["notes"][0]
    assert "usage_unknown" not in traces["c3"].info
    warned = [r.getMessage() for r in caplog.records if "usage is unknown" in r.getMessage()]
    assert len(warned) == 1 and "the response reported no usage" in warned[0]   # once per run


async def test_a_judge_call_without_usage_is_noted_and_warned_once_in_a_budgeted_run(tmp_path, openai_server, caplog):
    def answer(request):   # the judge's server reports no usage
        if request.body.get("model") == "judge-model":
            return status(200, {"id": "j", "object": "chat.completion", "model": "judge-model", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "yes"}, "finish_reason": "stop"}]})
        return numbered_reply(request)
    openai_server.default = answer
    text = budget_toml(tmp_path, openai_server.base_url, turns=1, num_tasks=2, max_concurrent=1,
                       token_budget=100_000)
    text += ('[[env.agent.scoring.judges]]\nid = "reference"\nmodel = "judge-model"\n'
             f'[env.agent.scoring.judges.client]\nbase_url = "{openai_server.base_url}"\napi_key_env = ""\n')
    prepared = prepare_eval(load_eval_config(text), run_id="judge-usage", resume=False)
    with caplog.at_level("WARNING", logger="prefect_rollouts.budget"):
        await run(prepared, 1)
    traces = read_traces(tmp_path / "traces", run_id="judge-usage")
    assert [trace.info["usage_unknown"]["notes"] for trace in traces] == [
        ["judge 'reference': the response reported no usage"]] * 2
    warned = [r.getMessage() for r in caplog.records if "usage is unknown" in r.getMessage()]
    assert len(warned) == 1 and "judge 'reference': the response reported no usage" in warned[0]


async def test_the_resume_command_prices_rollouts_not_done_at_the_finished_ones_and_replaces_the_budget(
        tmp_path, openai_server, capsys):
    import typer

    from prefect_rollouts.cli.main import _finish_budget_stop

    openai_server.default = numbered_reply
    config = load_eval_config(budget_toml(tmp_path, openai_server.base_url, turns=5, max_concurrent=2,
                                          token_budget=1_200))
    prepared = prepare_eval(config, run_id="estimate", resume=False)
    await run(prepared, 2)   # some finish (500 tokens each: 5 calls), the others are cut short or never start
    summary = summarize_run(tmp_path / "traces", "estimate")
    summary.budget_stop = "spent 1,200 tokens"
    hint = "prefect-rollouts eval eval.toml --set=token_budget=150 --set=max_concurrent=2 --resume estimate"
    with pytest.raises(typer.Exit):
        _finish_budget_stop(summary, config, hint, 8)
    shown = " ".join(capsys.readouterr().out.split())
    said = re.search(r"resume with a larger budget: prefect-rollouts eval eval.toml --set=max_concurrent=2 --resume "
                     r"estimate --set=token_budget=(\d+) \(an estimate: the spend so far and each rollout not done "
                     r"at 500 tokens, \$0\.0000, the mean of the \d finished ones\)", shown)
    assert said and int(said.group(1)) == summary.spend.tokens + 8 * 500, shown   # the text says how the number came
    assert shown.count("token_budget=") == 1                                      # the earlier --set is replaced


@pytest.mark.parametrize("value", ["1e308", "inf", "nan"])
def test_a_price_that_is_not_a_finite_sane_number_is_refused(tmp_path, value):
    text = budget_toml(tmp_path, "http://127.0.0.1:9/v1", cost_budget_usd=1.5).replace(
        'api_key_env = ""\n', f'api_key_env = ""\nprice = {{ input = {value}, output = 2.0 }}\n')
    with pytest.raises(ConfigError, match=r"\[env\.agent\.client\.price\] input = .*: Input should be "
                                          r"(less than or equal to 1000000|a finite number)"):
        load_eval_config(text)   # 1e308 had printed a cost of $inf and suggested cost_budget_usd=inf


async def test_progress_and_traces_summary_do_not_count_budget_stopped_rollouts_as_done(tmp_path, openai_server):
    from prefect_rollouts.evals.engine import progress_listener

    openai_server.default = numbered_reply
    config = load_eval_config(budget_toml(tmp_path, openai_server.base_url, turns=5, max_concurrent=4,
                                          token_budget=1_000))
    seen: list[tuple[int, int]] = []
    token = progress_listener.set(lambda done, total: seen.append((done, total)))
    try:
        await run(prepare_eval(config, run_id="progress", resume=False), 4)
    finally:
        progress_listener.reset(token)
    rows = read_rollouts(tmp_path / "traces", run_id="progress")
    done = int((rows["stop_condition"] != "budget").sum())
    assert (rows["stop_condition"] == "budget").sum() >= 2 and seen[-1] == (done, 10), seen   # "8/8" had shown
    stopped = int((rows["stop_condition"] == "budget").sum())
    shown = " ".join(CliRunner().invoke(app, ["traces", "summary", str(tmp_path / "traces"), "--run-id",
                                              "progress"]).output.split())
    assert f"unfinished: {stopped} rollouts not done (stopped as budget;" in shown, shown   # not listed as complete

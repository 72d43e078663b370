"""What the summary shows of a run (issue 13, item 4): the model and each reward component's mean,
as the artifact's table and as the eval flow run's log text; and one rollout's outcome in a line."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.trace import ErrorRecord
from prefect_rollouts.traces import TraceWriter, summarize_run
from prefect_rollouts.traces.summary import outcome_line

pytestmark = pytest.mark.unit


def judged(task_id: str, correct: float, judge: float, **fields) -> vf.Trace:
    trace = vf.Trace(task_id=task_id, model="gpt-x", stop_condition="agent_completed", **fields)
    trace.rewards.update(correct=correct, judge=judge)
    trace.reward_weights.update(correct=1.0, judge=1.0)
    trace.reward = correct + judge
    return trace


def write(root, traces: list[tuple[vf.Trace, str]]) -> None:
    writer = TraceWriter(root, "r1")
    for index, (trace, environment) in enumerate(traces):
        writer.add(trace, rollout_index=index, environment=environment, config_hash="h", elapsed_s=0.1)
    writer.flush()


def test_each_reward_component_has_its_mean_so_a_lenient_judge_cannot_hide_a_failed_exact_match(tmp_path):
    skipped = vf.Trace(task_id="t3", model="gpt-x", reward=0.0, stop_condition="max_turns",
                       info={"scoring_skipped": "truncated"})          # no reward ran: 0 for each, as its reward
    errored = vf.Trace(task_id="t4", model="gpt-x", stop_condition="provider_error")
    errored.errors.append(ErrorRecord(type="ProviderError", message="down", stage="segment"))
    exact = vf.Trace(task_id="e1", model="other", reward=1.0, stop_condition="agent_completed")
    exact.rewards["exact"] = 1.0
    write(tmp_path, [(judged("t1", 0.0, 1.0), "qa"), (judged("t2", 0.0, 1.0), "qa"), (judged("t2", 1.0, 1.0), "qa"),
                     (skipped, "qa"), (errored, "qa"), (exact, "math")])
    summary = summarize_run(tmp_path, "r1")
    math_env, qa = summary.environments
    assert (qa.model, qa.scored, qa.mean_reward) == ("gpt-x", 4, pytest.approx(1.0))
    assert qa.reward_components == {"correct": pytest.approx(0.25), "judge": pytest.approx(0.75)}
    assert (math_env.model, math_env.reward_components) == ("other", {"exact": 1.0})

    table = summary.table()                         # one set of columns for every environment
    assert list(table[0])[:10] == ["environment", "harness", "model", "rollouts", "scored", "mean_reward", "stderr",
                                   "reward.exact", "reward.correct", "reward.judge"]
    assert [(row["environment"], row["reward.exact"], row["reward.correct"], row["reward.judge"]) for row in table] == [
        ("math", 1.0, None, None), ("qa", None, 0.25, 0.75), ("all", None, None, None)]   # all: two environments
    assert [(row["pass@1"], row["pass@2"]) for row in table] == [(1.0, None), (0.6667, 1.0), (0.75, 1.0)]
    assert (summary.overall.rollouts, summary.overall.scored, summary.overall.errored) == (6, 5, 1)

    lines = summary.text().splitlines()
    assert lines[0] == "run r1: 6 rollouts, 1 errored"
    assert lines[1].split() == list(table[0])
    assert lines[2].split()[:10] == ["math", "—", "other", "1", "1", "1.0", "—", "1.0", "—", "—"]   # harness: no config
    assert lines[3].split()[:10] == ["qa", "—", "gpt-x", "5", "4", "1.0", "0.4082", "—", "0.25", "0.75"]
    assert lines[-2:] == ["top errors:", "  ProviderError x1, e.g.: down"]


def test_a_run_with_several_models_names_each_and_old_rows_without_rewards_have_no_components(tmp_path):
    other = judged("t2", 1.0, 1.0)
    other.model = "gpt-y"
    write(tmp_path, [(judged("t1", 0.0, 1.0), "qa"), (other, "qa")])
    (qa,) = summarize_run(tmp_path, "r1").environments
    assert qa.model == "gpt-x,gpt-y"
    from prefect_rollouts.traces import read_rollouts, summarize
    rows = read_rollouts(tmp_path).drop(columns=["rewards", "model"])     # a frame without those columns
    (old,) = summarize(rows, run_id="r1").environments
    assert (old.model, old.reward_components, old.mean_reward) == (None, {}, 1.5)


def test_the_outcome_line_gives_reward_components_stop_condition_skip_and_first_error():
    assert outcome_line(judged("t1", 0.0, 1.0)) == "reward 1 (correct 0, judge 1) · stop agent_completed"
    skipped = vf.Trace(task_id="t", model="m", reward=0.0, stop_condition="max_turns",
                       info={"scoring_skipped": "truncated"})
    assert outcome_line(skipped) == "reward 0 · stop max_turns · scoring skipped (truncated)"
    failed = vf.Trace(task_id="t", model="m", stop_condition="scoring_error")
    failed.rewards.update(correct=1.0, judge=None)
    failed.errors += [ErrorRecord(type="JudgeError", message="x" * 400, stage="scoring"),
                      ErrorRecord(type="RuntimeError", message="later", stage="teardown")]
    line = outcome_line(failed)
    assert line == f"reward — (correct 1, judge —) · stop scoring_error · error JudgeError: {'x' * 300}..."


def test_an_environment_with_several_task_categories_has_a_line_per_category(tmp_path):
    def bfcl(task_id: str, category: str, reward: float) -> vf.Trace:
        return vf.Trace(task_id=task_id, model="m", reward=reward, stop_condition="agent_completed",
                        info={"task": {"category": category}})
    writer = TraceWriter(tmp_path, "r1")
    for trace in [bfcl("simple_0", "simple_python", 1.0), bfcl("simple_1", "simple_python", 0.0),
                  bfcl("multiple_0", "multiple", 1.0)]:
        writer.add(trace, rollout_index=0, environment="bfcl", config_hash="h", elapsed_s=0.1)
    writer.add(bfcl("one_0", "only", 1.0), rollout_index=0, environment="single", config_hash="h", elapsed_s=0.1)
    writer.flush()

    summary = summarize_run(tmp_path, "r1")
    assert [(row["environment"], row["rollouts"], row["mean_reward"]) for row in summary.table()] == [
        ("bfcl", 3, 0.6667), ("bfcl / multiple", 1, 1.0), ("bfcl / simple_python", 2, 0.5),
        ("single", 1, 1.0), ("all", 4, 0.75)]   # one category is the environment itself: no line of its own
    assert "bfcl / simple_python" in summary.text()


def test_a_category_line_counts_every_rollout_of_its_tasks(tmp_path):
    writer = TraceWriter(tmp_path, "r2")
    for task_id, category in [("s0", "simple"), ("s1", "simple"), ("m0", "multiple")]:
        for index, reward in [(0, 1.0), (1, 0.0)]:   # the category is read from a task's first row only
            writer.add(vf.Trace(task_id=task_id, model="m", reward=reward, stop_condition="agent_completed",
                                info={"task": {"category": category}}),
                       rollout_index=index, environment="bfcl", config_hash="h", elapsed_s=0.1)
    writer.flush()

    rows = {row["environment"]: row for row in summarize_run(tmp_path, "r2", rollouts_per_task=2).table()}
    assert [(name, row["rollouts"], row["mean_reward"], row["pass@2"]) for name, row in rows.items()] == [
        ("bfcl", 6, 0.5, 1.0), ("bfcl / multiple", 2, 0.5, 1.0), ("bfcl / simple", 4, 0.5, 1.0)]

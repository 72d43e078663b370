"""Runs whose rollouts have several attempts (a retried error) as the views read them: `traces show` lists a
rollout's attempts and shows any of them, `traces summary` says how many were retried and recovered, and
comparisons, baseline verdicts and summaries use each rollout's latest attempt."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.evals.baseline import comparison_events, verdict_lines
from prefect_rollouts.trace import ErrorRecord
from prefect_rollouts.traces import TraceWriter, compare_runs, summarize_run

pytestmark = pytest.mark.unit


def trace(task_id: str, reward: float | None, reply: str = "ok") -> vf.Trace:
    made = vf.Trace(task_id=task_id, model="m", reward=reward,
                    stop_condition="agent_completed" if reward is not None else "provider_error",
                    messages=[{"role": "user", "content": "go"}, {"role": "assistant", "content": reply}])
    if reward is None:
        made.errors.append(ErrorRecord(type="ProviderError", message="503 from the provider", stage="segment",
                                       status_code=503))
    return made


def write(root, run_id: str, rows: list[tuple[vf.Trace, int]]) -> None:
    """One file of ``(trace, attempt)`` rows, rollout index 0."""
    writer = TraceWriter(root, run_id, batch_size=1000)
    for made, attempt in rows:
        writer.add(made, rollout_index=0, environment="arith", config_hash="h", elapsed_s=1.0, attempt=attempt)
    writer.flush()


def invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["traces", *map(str, args)])
    return result.exit_code, result.output


def test_traces_show_lists_a_rollouts_attempts_and_shows_an_earlier_one(tmp_path):
    write(tmp_path, "r", [(trace("t0", None, reply="first try"), 1), (trace("t1", 1.0), 1)])
    write(tmp_path, "r", [(trace("t0", 1.0, reply="second try"), 2)])
    code, output = invoke("show", tmp_path, "r", "t0")
    assert code == 0, output
    assert "attempts: 2 (traces show --attempt N shows another)" in output
    assert "  attempt 1 · stop provider_error · reward — · error ProviderError: 503 from the provider" in output
    assert "  attempt 2 · stop agent_completed · reward 1.000" in output
    assert "second try" in output and "first try" not in output   # the latest attempt by default
    code, output = invoke("show", tmp_path, "r", "t0", "--attempt", "1")
    assert code == 0 and "first try" in output and "ProviderError in segment (status 503)" in output, output
    code, output = invoke("show", tmp_path, "r", "t1")
    assert code == 0 and "attempts:" not in output    # one attempt: nothing to list
    code, output = invoke("show", tmp_path, "r", "t0", "--attempt", "3")
    assert code == 1 and "task 't0' of run 'r' has no attempt 3; its attempts: 1, 2" in output


def test_traces_show_of_an_attempt_names_it_and_says_which_attempts_a_task_has(tmp_path):
    body = '{"error": {"message": "upstream overloaded, try again later", "code": 503}} '
    long = "provider returned 503: " + body * 3
    first = trace("t0", None, reply="first try")
    first.errors[0].message = long
    write(tmp_path, "r", [(first, 1), (trace("t1", 1.0), 1)])
    write(tmp_path, "r", [(trace("t0", 1.0, reply="second try"), 2)])
    code, output = invoke("show", tmp_path, "r", "t1", "--attempt", "2")   # t0 has an attempt 2, t1 does not
    assert code == 1 and "task 't1' of run 'r' has no attempt 2; its attempts: 1" in output, output
    code, output = invoke("show", tmp_path, "r", "t0", "--attempt", "1")
    header = output.splitlines()[0]
    assert code == 0 and " · attempt 1 of 2 · model m" in header, output
    assert '503: {"error": {"message": "upstream overloaded, try again later", "code": 503}}' in output
    assert " …" in output and "attempt 2 of 2" in invoke("show", tmp_path, "r", "t0")[1].splitlines()[0]
    result = CliRunner().invoke(app, ["traces", "show", str(tmp_path), "r", "--attempt", "1"])
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "--attempt: 1 needs a task: prefect-rollouts traces show" in text, text


def test_traces_summary_says_how_many_rollouts_were_retried_and_recovered(tmp_path):
    write(tmp_path, "r", [(trace("t0", None), 1), (trace("t1", None), 1), (trace("t2", 1.0), 1)])
    write(tmp_path, "r", [(trace("t0", 1.0), 2), (trace("t1", None), 2)])
    code, output = invoke("summary", tmp_path, "--run-id", "r")
    assert code == 0, output
    assert "retried: 2 rollouts after an errored attempt, 1 recovered" in output
    summary = summarize_run(tmp_path, "r")
    assert (summary.rollouts, summary.errored, summary.retried, summary.recovered) == (3, 1, 2, 1)


@pytest.mark.parametrize(("second", "verdict"), [(1.0, "no change shown"), (0.0, "regressed")])
def test_comparisons_and_baseline_verdicts_read_each_rollouts_latest_attempt(tmp_path, second, verdict):
    tasks = [f"t{i}" for i in range(20)]
    write(tmp_path, "a", [(trace(task, 1.0), 1) for task in tasks])
    write(tmp_path, "b", [(trace(task, None), 1) for task in tasks])      # every first attempt errored
    write(tmp_path, "b", [(trace(task, second), 2) for task in tasks])    # the retries decide
    result = compare_runs(tmp_path, "a", "b")
    [group] = result.environments
    assert (group.n_paired, group.rollouts_b, group.errored_b, group.mean_b) == (20, 20, 0, second)
    events = comparison_events(result, "series")
    assert [line.split(",")[0] for line in verdict_lines(result, events)] == [f"arith: {verdict}"]
    assert len(events) == (verdict == "regressed")


def test_one_retried_rollout_reads_in_the_singular(tmp_path):
    write(tmp_path, "r", [(trace("t0", None), 1), (trace("t1", 1.0), 1)])
    write(tmp_path, "r", [(trace("t0", 1.0), 2)])
    code, output = invoke("summary", tmp_path, "--run-id", "r")
    assert code == 0 and "retried: 1 rollout after an errored attempt, 1 recovered" in output, output

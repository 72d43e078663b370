"""The summary's top errors and ``run_failure``, the rule behind the eval's state and the CLI's exit status."""

from __future__ import annotations

import pytest

import prefect_rollouts as vf
from prefect_rollouts.trace import ErrorRecord
from prefect_rollouts.traces import TraceWriter, run_failure, summarize_run

pytestmark = pytest.mark.unit


def write(root, outcomes: list[tuple[str, str] | float]) -> None:
    """A row per outcome: a reward, or an error ``(type, message)``; task ids ``t0``, ``t1``, ..."""
    writer = TraceWriter(root, "r1")
    for i, outcome in enumerate(outcomes):
        trace = vf.Trace(task_id=f"t{i}", model="m", stop_condition="agent_completed")
        if isinstance(outcome, tuple):
            trace.errors.append(ErrorRecord(type=outcome[0], message=outcome[1], stage="segment"))
        else:
            trace.reward = outcome
        writer.add(trace, rollout_index=0, environment="env", config_hash="h", elapsed_s=0.1)
    writer.flush()


def test_the_summary_counts_error_types_most_frequent_first_with_their_first_message(tmp_path):
    write(tmp_path, [("TaskError", "reward 'x' raised"), ("ProviderError", "refused"), 0.0,
                     ("ProviderError", "returned 500"), ("ProviderError", "refused"), 1.0])
    summary = summarize_run(tmp_path, "r1")
    assert [(e.type, e.count, e.example) for e in summary.errors] == [
        ("ProviderError", 3, "refused"), ("TaskError", 1, "reward 'x' raised")]
    assert run_failure(summary, planned=6) == "4 of 6 rollouts errored (ProviderError: refused; 1 other error type)"
    assert run_failure(summary, planned=6, max_error_fraction=0.5) == (
        "4 of 6 rollouts errored, more than max_error_fraction = 0.5 allows (ProviderError: refused; "
        "1 other error type)")
    assert run_failure(summary, planned=6, max_error_fraction=4 / 6) is None        # exactly the limit passes


def test_a_run_scored_zero_has_no_errors_and_a_run_with_missing_rows_fails(tmp_path):
    write(tmp_path, [0.0, 0.0, 0.0])
    summary = summarize_run(tmp_path, "r1")
    assert (summary.errored, summary.errors, run_failure(summary, planned=3)) == (0, [], None)
    assert run_failure(summary, planned=5, max_error_fraction=1.0) == "2 of 5 rollouts have no row"


def write_timeouts(root, stops: list[str | None], skip: bool = False) -> None:
    """A row per stop condition: ``None`` a rollout scored 1.0, else one whose deadline expired
    before scoring finished (reward None), or, with ``skip``, one ``skip_on_timeout`` gave reward 0."""
    writer = TraceWriter(root, "r1")
    for i, stop in enumerate(stops):
        trace = vf.Trace(task_id=f"t{i}", model="m", stop_condition=stop or "agent_completed", reward=1.0)
        if stop is not None:
            trace.record_timeout(stop.removesuffix("_timeout"))
            trace.reward = 0.0 if skip else None
            if skip:
                trace.info["scoring_skipped"] = "timeout"
        writer.add(trace, rollout_index=0, environment="env", config_hash="h", elapsed_s=0.1)
    writer.flush()


def test_a_run_whose_every_rollout_hit_scoring_timeout_fails(tmp_path):
    write_timeouts(tmp_path, ["scoring_timeout"] * 6)
    summary = summarize_run(tmp_path, "r1")
    assert (summary.errored, summary.unscored) == (0, {"scoring_timeout": 6})
    assert run_failure(summary, planned=6) == (
        "6 of 6 rollouts errored or were not scored (not scored: scoring_timeout x6)")
    assert "6 not scored (scoring_timeout x6)" in summary.text().splitlines()[0]


def test_timeouts_before_scoring_count_against_max_error_fraction_with_the_errors(tmp_path):
    write_timeouts(tmp_path, ["setup_timeout", "scoring_timeout", None, None])
    summary = summarize_run(tmp_path, "r1")
    assert summary.unscored == {"scoring_timeout": 1, "setup_timeout": 1}
    assert run_failure(summary, planned=4, max_error_fraction=0.5) is None
    assert run_failure(summary, planned=4, max_error_fraction=0.25) == (
        "2 of 4 rollouts errored or were not scored, more than max_error_fraction = 0.25 allows "
        "(not scored: scoring_timeout x1, setup_timeout x1)")


def test_rollouts_skipped_on_timeout_are_counted_as_not_scored_not_as_passing(tmp_path):
    write_timeouts(tmp_path, ["segment_timeout"] * 3 + [None], skip=True)
    summary = summarize_run(tmp_path, "r1")
    assert summary.unscored == {"skip_on_timeout": 3}
    assert summary.environments[0].scored == 4
    assert summary.environments[0].mean_reward == 0.25   # their reward 0 stays in the mean, as the rule says
    assert run_failure(summary, planned=4) == (
        "3 of 4 rollouts errored or were not scored (not scored: skip_on_timeout x3)")


def test_a_long_program_error_keeps_its_last_line_in_the_summary(tmp_path):
    """A failed program's message ends in its output's last lines; the line that says what failed
    (Codex's ``404``) is the last one, and a cut at the start used to drop it."""
    lines = "\n".join(f"retrying request to /responses (attempt {i}): stream disconnected" for i in range(8))
    message = ('harness "program": the program exited with code 1. stderr: ' + lines
               + "\nERROR: unexpected status 404 Not Found: not_found")
    write(tmp_path, [("TaskError", message)])
    text = run_failure(summarize_run(tmp_path, "r1"), planned=1)
    assert text is not None and text.endswith(" ... ERROR: unexpected status 404 Not Found: not_found)")
    assert 'TaskError: harness "program": the program exited with code 1. stderr: retrying' in text

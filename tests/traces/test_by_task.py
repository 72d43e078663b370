"""Per-task lines: ``traces summary --by-task`` and ``traces compare --by-task`` on runs written by the real
TraceWriter (an errored rollout counts as errored, never as a 0)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.traces.by_task import run_task_lines, task_changes
from tests.traces.test_compare import rollout, write

pytestmark = pytest.mark.unit


def runs(root) -> None:
    write(root, "a", [("harbor", rollout("fix", 1.0), 0), ("harbor", rollout("fix", 0.0), 1),
                      ("harbor", rollout("slow", None), 0), ("harbor", rollout("slow", 1.0), 1),
                      ("harbor", rollout("gone", 1.0), 0)])
    write(root, "b", [("harbor", rollout("fix", 1.0), 0), ("harbor", rollout("fix", 1.0), 1),
                      ("harbor", rollout("slow", None), 0), ("harbor", rollout("slow", None), 1),
                      ("harbor", rollout("new", 0.5), 0)])


def test_task_lines_count_passes_errors_and_the_mean_of_scored_rollouts(tmp_path):
    runs(tmp_path)
    lines = run_task_lines(tmp_path, "a").set_index("task_id")
    assert lines.loc["fix", ["rollouts", "mean_reward", "passed", "errored", "error"]].tolist() == \
        [2, 0.5, 1, 0, ""]
    assert lines.loc["slow", ["rollouts", "mean_reward", "passed", "errored", "error"]].tolist() == \
        [2, 1.0, 1, 1, "ProviderError"]


def test_task_changes_pair_the_runs_tasks_and_leave_unscored_ones_without_a_difference(tmp_path):
    runs(tmp_path)
    changes = task_changes(run_task_lines(tmp_path, "a"), run_task_lines(tmp_path, "b")).set_index("task_id")
    assert changes.loc["fix", ["reward_a", "reward_b", "difference"]].tolist() == [0.5, 1.0, 0.5]
    assert math.isnan(changes.loc["slow", "reward_b"]) and math.isnan(changes.loc["slow", "difference"])
    assert changes.loc["slow", ["errored_a", "errored_b"]].tolist() == [1, 2]
    assert math.isnan(changes.loc["gone", "reward_b"]) and math.isnan(changes.loc["new", "reward_a"])


def test_the_cli_prints_the_lines(tmp_path):
    runs(tmp_path)
    summary = CliRunner().invoke(app, ["traces", "summary", str(tmp_path), "--run-id", "a", "--by-task"])
    assert summary.exit_code == 0, summary.output
    per_task = summary.output.split("per task:")[1].splitlines()
    assert per_task[1].split() == ["environment", "task_id", "rollouts", "mean_reward", "passed", "errored", "error"]
    assert per_task[-1].split() == ["harbor", "slow", "2", "1.000", "1", "1", "ProviderError"]
    refused = CliRunner().invoke(app, ["traces", "summary", str(tmp_path), "--by-task"])
    assert refused.exit_code == 2 and "--by-task needs --run-id" in refused.output
    compared = CliRunner().invoke(app, ["traces", "compare", str(tmp_path), "a", "b", "--by-task", "--json"])
    assert compared.exit_code == 0, compared.output
    tasks = {row["task_id"]: row for row in json.loads(compared.output)["tasks"]}
    assert tasks["fix"]["difference"] == 0.5 and tasks["slow"]["difference"] is None
    text = CliRunner().invoke(app, ["traces", "compare", str(tmp_path), "a", "b", "--by-task"])
    assert "per task (difference = B - A):" in text.output and " fix " in text.output

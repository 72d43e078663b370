"""What the eval prints while rollouts fail: a line per failed rollout, tracebacks only with
``--verbose`` (issue 19, item 10)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from tests.eval_toml import eval_toml
from tests.support.ports import free_port

pytestmark = pytest.mark.prefect


def run_against_a_refused_port(tmp_path, *args: str):
    port = free_port()
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", f"http://127.0.0.1:{port}/v1", num_tasks=3,
                                rollout_granularity="flow"))
    result = CliRunner().invoke(app, ["eval", str(config), "--run-id", tmp_path.name, *args])
    assert result.exit_code == 1, result.output
    return result.output


def log_lines(output: str) -> list[str]:
    """The lines of Prefect's console handler (``HH:MM:SS.mmm | LEVEL | ...``)."""
    return [line for line in output.splitlines() if re.match(r"\d\d:\d\d:\d\d\.\d+ \| ", line)]


def test_a_failed_rollout_is_one_line_without_a_traceback(tmp_path):
    output = run_against_a_refused_port(tmp_path)
    assert "Traceback" not in output
    rollout_lines = [line for line in log_lines(output) if "scripted' - " in line]
    assert len(rollout_lines) == 3, output          # one per failed rollout: n0, n1, n2
    assert all("Finished in state Failed('ProviderError: model endpoint: POST" in line for line in rollout_lines)
    assert sorted(re.search(r"'(n\d) #0", line).group(1) for line in rollout_lines) == ["n0", "n1", "n2"]
    assert "Task run" not in output
    assert "top errors: ProviderError x3" in " ".join(output.split())


def test_verbose_prints_the_tracebacks_of_the_failed_stages(tmp_path):
    output = run_against_a_refused_port(tmp_path, "--verbose")
    assert output.count("Traceback (most recent call last)") == 3, output
    assert "Task run 'segment-0' - Task run failed with exception: ProviderError" in output


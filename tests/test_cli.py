"""The CLI's error paths: messages print as written (table names are not swallowed as markup)."""

from __future__ import annotations

from typer.testing import CliRunner

from prefect_rollouts.cli import app


def test_a_config_error_prints_its_table_name_and_exits_2(tmp_path):
    config = tmp_path / "eval.toml"
    config.write_text('[env.taskset]\nid = "arithmetic"\n[env.agent]\nmodel = "m"\n')
    result = CliRunner().invoke(app, ["eval", str(config), "--set", "env.agent.scoring.skip_on_truncatd=true"])
    assert result.exit_code == 2
    assert "[env.agent.scoring] skip_on_truncatd: unknown key" in result.output


def test_a_missing_dataset_is_reported_by_traces_summary(tmp_path):
    result = CliRunner().invoke(app, ["traces", "summary", str(tmp_path / "nothing")])
    assert result.exit_code == 1 and f"no rollouts in {tmp_path / 'nothing'}" in result.output.replace("\n", "")


def test_a_bad_taskset_option_fails_before_prefect_starts(tmp_path):
    config = tmp_path / "eval.toml"
    config.write_text('[env.taskset]\nid = "arithmetic"\ncout = 5\n[env.agent]\nmodel = "m"\n')
    result = CliRunner().invoke(app, ["eval", str(config)])
    assert result.exit_code == 2 and "config error:" in result.output and "cout" in result.output
    assert "Starting temporary server" not in result.output

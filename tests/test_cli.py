"""The CLI's error paths: messages print as written (table names are not swallowed as markup)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli.main import app, retry_errors_args

pytestmark = pytest.mark.unit


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


def run_eval(tmp_path, taskset: str, *args: str):
    config = tmp_path / "eval.toml"
    config.write_text(f'[traces]\npath = "{tmp_path / "traces"}"\n[env.taskset]\n{taskset}\n[env.agent]\nmodel = "m"\n')
    return CliRunner().invoke(app, ["eval", str(config), *args])


def assert_config_error_before_prefect(result, *expected: str) -> None:
    text = " ".join(result.output.split())     # rich wraps long lines
    assert result.exit_code == 2, result.output
    assert text.startswith("config error: ") and all(part in text for part in expected), text
    assert "Traceback" not in text and "Starting temporary server" not in text and result.exception is not None


def test_a_mistyped_option_of_a_generator_taskset_is_a_config_error_naming_the_key(tmp_path):
    result = run_eval(tmp_path, 'id = "arithmetic"\ncount = "ten"')
    assert_config_error_before_prefect(result, '[env.taskset] count = "ten"', "count: int")


def test_a_generator_loader_failing_while_iterating_is_a_config_error(tmp_path):
    result = run_eval(tmp_path, 'id = "tests.test_cli:fails_after_one"\nlimit = 3')
    assert_config_error_before_prefect(result, "tests.test_cli:fails_after_one", "ValueError: limit 3 is too high")


def test_a_taskset_with_no_tasks_is_a_config_error(tmp_path):
    result = run_eval(tmp_path, 'id = "arithmetic"\ncount = 0')
    assert_config_error_before_prefect(result, "no tasks with the options {count = 0}")


def test_a_traces_path_under_a_file_is_a_config_error_before_prefect_starts(tmp_path):
    (tmp_path / "file").write_text("")
    result = run_eval(tmp_path, 'id = "arithmetic"\ncount = 2', "--set", f"traces.path={tmp_path / 'file' / 'traces'}")
    assert_config_error_before_prefect(result, f"[traces] path = '{tmp_path / 'file' / 'traces'}': cannot create it",
                                       "Choose a writable directory")


def test_a_traces_path_that_is_a_file_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("")
    result = run_eval(tmp_path, 'id = "arithmetic"\ncount = 2', "--set", f"traces.path={tmp_path / 'file'}")
    assert_config_error_before_prefect(result, "is a file, not a directory")


def test_a_missing_config_file_is_a_config_error(tmp_path):
    result = CliRunner().invoke(app, ["eval", str(tmp_path / "nope.toml")])
    assert_config_error_before_prefect(result, "not found")


def fails_after_one(limit: int = 1):
    """A generator taskset that rejects its option only once iterated (as generator loaders do)."""
    import prefect_rollouts as vf

    yield vf.Task(vf.TaskData(id="first", prompt="x"))
    raise ValueError(f"limit {limit} is too high")


def test_eval_without_a_config_or_resume_is_a_config_error():
    result = CliRunner().invoke(app, ["eval"])
    assert_config_error_before_prefect(result, "eval: no config given", "--resume RUN_ID")


def test_resume_without_a_config_of_a_run_with_no_stored_config_is_a_config_error(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--resume", "ghost", "--set", f"traces.path={tmp_path}"])
    assert_config_error_before_prefect(result, "--resume ghost: the run has no stored config",
                                       "prefect-rollouts eval CONFIG --resume ghost")


def eval_with(tmp_path, agent_tables: str, *args: str):
    """``eval`` of a two-task arithmetic config whose ``[env.agent]`` ends with ``agent_tables``."""
    config = tmp_path / "eval.toml"
    config.write_text(f'[traces]\npath = "{tmp_path / "traces"}"\n[env.taskset]\nid = "arithmetic"\ncount = 2\n'
                      f'[env.agent]\nmodel = "m"\n{agent_tables}')
    return CliRunner().invoke(app, ["eval", str(config), *args])


def test_a_base_url_that_is_not_a_url_is_a_config_error_before_prefect_starts(tmp_path):
    result = eval_with(tmp_path, '[env.agent.client]\nbase_url = "not a url"\n')
    assert_config_error_before_prefect(result, "[env.agent.client] base_url = 'not a url': not an http(s) URL",
                                       "http://127.0.0.1:8000/v1")


def test_userinfo_in_a_base_url_is_a_config_error_that_does_not_show_the_password(tmp_path):
    result = eval_with(tmp_path, '[env.agent.client]\nbase_url = "http://u:sk-Pw4Zq8Lm@127.0.0.1:9/v1"\n')
    assert_config_error_before_prefect(result, "[env.agent.client] base_url = 'http://***@127.0.0.1:9/v1'",
                                       "user name or password", "api_key_env", "ModelEndpoint block")
    assert "sk-Pw4Zq8Lm" not in result.output and "u:" not in result.output


def test_a_nul_in_run_name_is_a_config_error_before_prefect_starts(tmp_path):
    result = eval_with(tmp_path, "", "--set", 'run_name="night\\u0000ly"')
    assert_config_error_before_prefect(result, "run_name = 'night\\x00ly'", "no control character")


def test_a_300_character_run_name_is_a_config_error_before_prefect_starts(tmp_path):
    result = eval_with(tmp_path, "", "--set", f"run_name={'n' * 300}")
    assert_config_error_before_prefect(result, "run_name = 'nnnn", "at most 120 bytes")


def test_a_nul_in_run_id_is_a_config_error_before_prefect_starts(tmp_path):
    result = eval_with(tmp_path, "", "--run-id", "night\x01ly")
    assert_config_error_before_prefect(result, "run id 'night\\x01ly'", "no control character")


def test_an_unset_variable_in_runtime_env_is_a_config_error_naming_the_key_before_prefect_starts(tmp_path, monkeypatch):
    monkeypatch.delenv("ROLLOUTS_TEST_UNSET", raising=False)
    result = eval_with(tmp_path, '[env.agent.runtime]\nenv = { TOKEN = "${ROLLOUTS_TEST_UNSET}" }\n')
    assert_config_error_before_prefect(result, '[env.agent.runtime] env.TOKEN = "${ROLLOUTS_TEST_UNSET}": '
                                       "ROLLOUTS_TEST_UNSET is not set", '"${ROLLOUTS_TEST_UNSET:-}"')


def test_retry_errors_takes_only_a_list_of_error_types_as_its_value(tmp_path):
    config = tmp_path / "eval.toml"
    config.write_text(f'bogus_key = 1\n[traces]\npath = "{tmp_path / "traces"}"\n[env.taskset]\nid = "arithmetic"\n'
                      '[env.agent]\nmodel = "m"\n')
    for args in (["--resume", "r1", "--retry-errors", str(config)], ["--retry-errors", str(config), "--resume", "r1"]):
        result = CliRunner().invoke(app, ["eval", *args])   # the config is read (its bad key), not taken as types
        assert_config_error_before_prefect(result, "bogus_key")
    result = CliRunner().invoke(app, ["eval", "--resume", "r1", "--retry-errors", "ProviderError", "TaskError"])
    text = " ".join(result.output.replace("│", " ").split())   # typer's error box wraps the line
    assert result.exit_code == 2 and "--retry-errors: ProviderError TaskError: separate error types with commas: " \
                                     "--retry-errors ProviderError,TaskError" in text, text


@pytest.mark.parametrize("value", [",", "", " , "])
def test_retry_errors_with_an_empty_type_list_is_refused(tmp_path, value):
    result = run_eval(tmp_path, 'id = "arithmetic"', "--resume", "r1", f"--retry-errors={value}")
    assert_config_error_before_prefect(result, f"--retry-errors={value}: names no error type",
                                       "separated by commas", "--retry-errors alone")


def test_retry_errors_is_bare_unless_a_type_list_follows(tmp_path):
    config = tmp_path / "eval.toml"
    config.write_text("")
    assert retry_errors_args(["--retry-errors"]) == ["--retry-errors=all"]
    assert retry_errors_args(["--retry-errors", "--resume", "r"]) == ["--retry-errors=all", "--resume", "r"]
    assert retry_errors_args(["--retry-errors", str(config)]) == ["--retry-errors=all", str(config)]
    assert retry_errors_args(["--retry-errors", "other.toml"]) == ["--retry-errors=all", "other.toml"]
    assert retry_errors_args(["--retry-errors", "ProviderError,TaskError", str(config)]) == [
        "--retry-errors=ProviderError,TaskError", str(config)]

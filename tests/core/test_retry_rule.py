"""The retry rule (retry_rule.py) and what it plans: which errored attempts run again within a run
(max_rollout_attempts), which --retry-errors runs again, which attempt a shard runs, how bad values read,
and the retried/recovered counts of a summary."""

from __future__ import annotations

import pandas as pd
import pytest

import prefect_rollouts as vf
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.config.taskset import EnvironmentSpec
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.plan import Planned, next_attempt, retry_predicate, still_to_run
from prefect_rollouts.evals.prepare import PreparedEval, prepare_eval
from prefect_rollouts.retry_rule import (
    AGENT_FAILURE_STOPS,
    RETRY_ERROR_TYPES,
    ROLLOUT_BACKOFF_CAP_S,
    InRunRetry,
    backoff_s,
    known_error_types,
    retries,
)
from prefect_rollouts.trace import ErrorRecord
from prefect_rollouts.traces.attempt_counts import counts_of
from prefect_rollouts.traces.read import LatestAttempt

pytestmark = pytest.mark.unit

TOML = '[traces]\npath = "{path}"\n[env.taskset]\nid = "arithmetic"\ncount = 3\n[env.agent]\nmodel = "m"\n'


def config(tmp_path, *overrides: str):
    return load_eval_config(TOML.format(path=tmp_path / "traces"), list(overrides))


def test_the_default_rule_retries_provider_runtime_and_infrastructure_errors_only():
    assert RETRY_ERROR_TYPES == {"ProviderError", "RuntimeUnavailableError", "InfrastructureError"}
    assert retries("ProviderError", "provider_error")
    assert retries("RuntimeUnavailableError", "runtime_error")
    assert not retries("TaskError", "task_error")         # the task's own code
    assert not retries("ConfigError", "setup_error")      # the same config fails the same way
    assert not retries(None, "agent_completed")           # no error
    assert not retries(None, "budget")                    # stopped from outside: a resume's business


def test_an_attempt_the_agent_failed_is_never_retried_whatever_the_types():
    for stop in AGENT_FAILURE_STOPS:
        assert not retries("ProviderError", stop)
        assert not retries("TaskError", stop, frozenset({"TaskError"}))
    trace = vf.Trace(task_id="t", model="m")
    trace.record_agent_failure(vf.errors.AgentFailure("exit 1", "program_failed"))
    trace.errors.append(ErrorRecord(type="ProviderError", message="down", stage="scoring"))
    assert not InRunRetry(max_attempts=5).again(trace, 1)


def test_retry_error_types_replaces_the_default_and_max_rollout_attempts_counts_attempts_in_all():
    trace = vf.Trace(task_id="t", model="m")
    trace.record_error(vf.errors.TaskError("reward raised"), "finalize")
    assert not InRunRetry(max_attempts=3).again(trace, 1)
    chosen = InRunRetry(max_attempts=3, types=frozenset({"TaskError"}))
    assert [chosen.again(trace, attempt) for attempt in (1, 2, 3)] == [True, True, False]
    assert not InRunRetry().again(trace, 1)   # the default: one attempt


def test_the_backoff_doubles_from_rollout_backoff_s_up_to_its_cap_with_jitter():
    for retry, nominal in ((1, 10.0), (2, 20.0), (3, 40.0), (9, ROLLOUT_BACKOFF_CAP_S), (200, ROLLOUT_BACKOFF_CAP_S)):
        waits = [backoff_s(retry, 10.0) for _ in range(50)]
        assert all(0.5 * nominal <= wait <= 1.5 * nominal for wait in waits), (retry, min(waits), max(waits))
    assert backoff_s(1, 0.0) == 0.0


def test_an_unknown_error_type_is_a_config_error_that_lists_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"retry_error_types = \['Providererror'\]: 'Providererror' is not an "
                                          r"error type a rollout records\. Use the row's error_type: one of "
                                          r"ConfigError, .*ProviderError, .*or a built-in exception name"):
        config(tmp_path, 'retry_error_types=["Providererror"]')
    assert config(tmp_path, 'retry_error_types=["ProviderError", "ValueError"]').retry_error_types == [
        "ProviderError", "ValueError"]
    with pytest.raises(ConfigError, match="max_rollout_attempts = 0: Input should be greater than or equal to 1"):
        config(tmp_path, "max_rollout_attempts=0")
    assert "AgentFailure" not in known_error_types()   # a stop condition, never an error type


def test_retry_errors_needs_a_run_and_known_types(tmp_path):
    with pytest.raises(ConfigError, match=r"--retry-errors: .* give the run: --resume RUN_ID --retry-errors"):
        prepare_eval(config(tmp_path), run_id="r1", resume=False, dry_run=True, retry_errors=True)
    with pytest.raises(ConfigError, match="--retry-errors Bogus: 'Bogus' is not an error type"):
        prepare_eval(config(tmp_path), run_id="r1", resume=True, dry_run=True, retry_errors=True,
                     retry_error_types=["Bogus"])
    prepared = prepare_eval(config(tmp_path), run_id="r1", resume=True, dry_run=True, retry_errors=True,
                            retry_error_types=["ProviderError"])
    assert prepared.config.retry_error_types == ["ProviderError"]   # --retry-errors TYPE sets the run's rule


def planned(task_id: str, attempt: int = 1) -> Planned:
    env = EnvironmentSpec("arith", "arithmetic", {}, None, vf.AgentConfig(model="m"))
    return Planned(env, vf.Task(vf.TaskData(id=task_id, prompt="p")), 0, attempt)


def written(attempt: int, error: str | None = None, stop: str = "agent_completed") -> LatestAttempt:
    return LatestAttempt(attempt, stop, error)


def test_retry_errors_runs_each_errored_rollout_once_more_and_leaves_the_rest(tmp_path):
    plan = [planned(t) for t in ("ok", "provider", "task", "agent", "none")]
    latest = {("arith", "ok", 0): written(1), ("arith", "provider", 0): written(1, "ProviderError", "provider_error"),
              ("arith", "task", 0): written(2, "TaskError", "task_error"),
              ("arith", "agent", 0): written(1, "ProviderError", "program_failed")}
    every = retry_predicate(config(tmp_path), retry_errors=True)
    assert [(p.task.id, p.attempt) for p in still_to_run(plan, latest, every)] == [
        ("provider", 2), ("task", 3), ("none", 1)]
    only = retry_predicate(config(tmp_path), retry_errors=True, error_types=["TaskError"])
    assert [(p.task.id, p.attempt) for p in still_to_run(plan, latest, only)] == [("task", 3), ("none", 1)]
    assert [(p.task.id, p.attempt) for p in still_to_run(plan, latest)] == [("none", 1)]   # a plain resume


def test_a_resume_continues_the_retries_a_stopped_eval_left_below_max_rollout_attempts(tmp_path):
    plan = [planned("a"), planned("b")]
    latest = {("arith", "a", 0): written(1, "ProviderError", "provider_error"),
              ("arith", "b", 0): written(3, "ProviderError", "provider_error")}
    again = retry_predicate(config(tmp_path, "max_rollout_attempts=3"))
    assert [(p.task.id, p.attempt) for p in still_to_run(plan, latest, again)] == [("a", 2)]


def test_a_shard_runs_its_planned_attempt_once_even_when_submitted_again(tmp_path):
    again = retry_predicate(config(tmp_path))
    error = written(1, "ProviderError", "provider_error")
    assert next_attempt(2, error, again) == 2                        # planned by --retry-errors, not written yet
    assert next_attempt(2, written(2), again) is None                # written: a re-submission runs nothing
    assert next_attempt(2, written(2, "ProviderError", "provider_error"), again) is None   # errored again: no more
    three = retry_predicate(config(tmp_path, "max_rollout_attempts=3"))
    assert next_attempt(2, written(2, "ProviderError", "provider_error"), three) == 3      # the run's own retries
    assert next_attempt(1, None, again) == 1
    assert next_attempt(1, written(1, stop="budget"), again) == 2     # stopped from outside


def test_retried_counts_rollouts_run_again_after_an_error_and_recovered_those_now_fine():
    rows = pd.DataFrame(
        [("r", "e", "a", 0, 1, True), ("r", "e", "a", 0, 2, False),     # retried, recovered
         ("r", "e", "b", 0, 1, True), ("r", "e", "b", 0, 2, True),      # retried, still an error
         ("r", "e", "c", 0, 1, False),                                   # one attempt
         ("r", "e", "d", 0, 1, False), ("r", "e", "d", 0, 2, False)],    # run again after a budget stop: no error
        columns=["run_id", "environment", "task_id", "rollout_index", "attempt", "is_error"])
    assert counts_of(rows) == (2, 1)
    assert counts_of(rows[rows["attempt"] == 1]) == (0, 0)


def test_an_empty_list_of_error_types_is_refused_everywhere_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"retry_error_types = \[\]: names no error type\. Remove the key"):
        config(tmp_path, "retry_error_types=[]")
    with pytest.raises(ConfigError, match=r"retry_error_types = \[\]: names no error type\. .* or None"):
        prepare_eval(config(tmp_path), run_id="r1", resume=True, dry_run=True, retry_errors=True,
                     retry_error_types=[])


def test_retry_errors_says_how_many_errored_rollouts_it_matched_and_which_it_left(tmp_path):
    plan = [planned(t) for t in ("p1", "p2", "task", "ok")]
    latest = {("arith", "p1", 0): written(1, "ProviderError", "provider_error"),
              ("arith", "p2", 0): written(2, "ProviderError", "provider_error"),
              ("arith", "task", 0): written(1, "TaskError", "task_error"), ("arith", "ok", 0): written(1)}

    def line(types):
        prepared = PreparedEval(config(tmp_path), "r", None, plan, set(), latest,
                                retry_predicate(config(tmp_path), True, types), retry_errors=tuple(types or ()))
        return prepared.retry_line()
    assert line(["RuntimeUnavailableError"]) == (
        "--retry-errors RuntimeUnavailableError: 0 errored rollouts run again as new attempts; errored ones left "
        "as they are: 2 ProviderError, 1 TaskError")
    assert line(["TaskError"]) == ("--retry-errors TaskError: 1 errored rollout run again as new attempts; "
                                   "errored ones left as they are: 2 ProviderError")
    assert line(None).startswith("--retry-errors: 3 errored rollouts run again") and line(None).endswith(": none")
    assert PreparedEval(config(tmp_path), "r", None, plan, set(), latest).retry_line() is None


def test_a_rollout_flow_run_past_its_first_attempt_is_named_with_the_attempt():
    from prefect_rollouts.flows.rollout import RUN_NAME, RolloutRequest

    first = RolloutRequest(rollout_id="x", task_id="add-0-2", task_type="t", model="my-model")
    assert first.run_name() == RUN_NAME.format(rollout=first) == "add-0-2 #0 · my-model"
    again = first.model_copy(update={"attempt": 2})
    assert again.run_name() == RUN_NAME.format(rollout=again) == "add-0-2 #0 · attempt 2 · my-model"

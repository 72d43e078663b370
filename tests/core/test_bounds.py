"""Upper bounds of an eval's sizes: a config past one is a config error naming the key, and a plan
within them stays small in memory (issue 19, item 7: rollouts_per_task = 100000000 grew to 4.4 GB)."""

from __future__ import annotations

import tracemalloc

import pytest
from typer.testing import CliRunner

from prefect_rollouts import bounds
from prefect_rollouts.cli import app
from prefect_rollouts.config.agent import load_config
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.plan import plan_rollouts

pytestmark = pytest.mark.unit

BASE = '[env.taskset]\nid = "arithmetic"\ncount = {count}\n[env.agent]\nmodel = "m"\n'


def config(top: str = "", count: int = 10):
    return load_eval_config(top + "\n" + BASE.format(count=count))


@pytest.mark.parametrize(("key", "value", "bound"), [
    ("rollouts_per_task", 100_000_000, bounds.MAX_ROLLOUTS_PER_TASK),
    ("num_tasks", 10_000_000, bounds.MAX_TASKS),
    ("max_concurrent", 100_000, bounds.MAX_CONCURRENT),
    ("batch_size", 1_000_000, bounds.MAX_BATCH),
    ("dispatch.shard_size", 1_000_000, bounds.MAX_BATCH),
    ("dispatch.max_shards_in_flight", 100_000, bounds.MAX_CONCURRENT),
])
def test_a_size_past_its_bound_is_a_config_error_naming_the_key(key, value, bound):
    table, _, name = key.rpartition(".")
    top = f"[{table}]\n{name} = {value}\n" if table else f"{name} = {value}\n"
    with pytest.raises(ConfigError) as caught:
        load_eval_config(BASE.format(count=10) + top if table else top + BASE.format(count=10))
    assert f"{name} = {value}" in str(caught.value) and str(bound) in str(caught.value)
    config(top.replace(str(value), str(bound)) if not table else "")   # the bound itself is allowed


def test_the_issue_s_rollouts_per_task_exits_2_at_once_without_a_traceback(tmp_path):
    path = tmp_path / "eval.toml"
    path.write_text(f'rollouts_per_task = 100000000\n[traces]\npath = "{tmp_path}"\n' + BASE.format(count=10))
    tracemalloc.start()
    try:
        result = CliRunner().invoke(app, ["eval", str(path)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 2 and "rollouts_per_task = 100000000" in result.output, result.output
    assert "Traceback" not in result.output and peak < 50 * 2**20


def test_an_eval_of_more_rollouts_than_the_bound_is_refused_before_its_plan_is_built():
    too_many = config(f"rollouts_per_task = {bounds.MAX_ROLLOUTS_PER_TASK}", count=2_000)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"rollouts_per_task = 1000: \(2000 tasks\) x 1000 = 2,000,000 rollouts"):
            plan_rollouts(too_many)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20   # the tasks, not two million planned rollouts


def test_a_taskset_longer_than_the_bound_without_num_tasks_is_refused_and_with_it_loads(monkeypatch):
    monkeypatch.setattr("prefect_rollouts.environments.MAX_TASKS", 50)   # 100,000 real tasks load slowly
    with pytest.raises(ConfigError, match=r"yields more than 50 tasks.*Set num_tasks"):
        plan_rollouts(config(count=51))
    assert len(plan_rollouts(config(count=50))) == 50
    assert len(plan_rollouts(config("num_tasks = 5", count=51))) == 5


def test_a_planned_rollout_takes_under_100_bytes_beside_its_task():
    tasks_only, planned = config(count=100), config(f"rollouts_per_task = {bounds.MAX_ROLLOUTS_PER_TASK}", count=100)
    sizes = []
    for each in (tasks_only, planned):
        tracemalloc.start()
        try:
            plan = plan_rollouts(each)
            sizes.append(tracemalloc.get_traced_memory()[0])
        finally:
            tracemalloc.stop()
    assert len(plan) == 100_000 and sizes[1] - sizes[0] < 100 * 100_000


# issue 32, item 9: an agent's deadlines and a box's resources past what they can be handed to
@pytest.mark.parametrize(("table", "key", "value", "bound"), [
    ("runtime", "memory_mb", 2**62, bounds.MAX_MEMORY_MB),
    ("runtime", "storage_mb", 2**62, bounds.MAX_STORAGE_MB),
    ("runtime", "cpus", 1e308, bounds.MAX_CPUS),
    ("runtime", "pids_limit", 2**62, bounds.MAX_PIDS),
    ("runtime", "exec_timeout_s", 1e308, bounds.MAX_DEADLINE_S),
    ("timeouts", "agent", 1e308, bounds.MAX_DEADLINE_S),
    ("timeouts", "scoring", 1e308, bounds.MAX_DEADLINE_S),
    ("harness", "timeout_s", 1e308, bounds.MAX_DEADLINE_S),
    ("harness", "tool_timeout_s", 1e308, bounds.MAX_DEADLINE_S),
    ("client", "timeout", 1e308, bounds.MAX_DEADLINE_S),
    ("client.retries", "max_retries", 10**6, bounds.MAX_RETRIES),
    ("client.retries", "max_backoff_s", 1e308, bounds.MAX_DEADLINE_S),
    ("retries", "segment", 10**6, bounds.MAX_RETRIES),
    ("retries", "backoff_s", 1e308, bounds.MAX_DEADLINE_S),
])
def test_an_agent_value_past_its_bound_is_a_config_error_naming_the_key(table, key, value, bound):
    def agent(value: object) -> str:
        harness = 'id = "bash"\n' if table == "harness" else ""
        return f'[env.agent]\nmodel = "m"\n[env.agent.{table}]\n{harness}{key} = {value}\n'
    with pytest.raises(ConfigError) as caught:
        load_config(agent(value))
    assert f"[env.agent.{table}] {key} = {value}" in str(caught.value) and f"equal to {int(bound)}" in str(caught.value)
    load_config(agent(bound))   # the bound itself is allowed


# issue 32 (adversarial pass, e12): cpus = 1e-9 started a container with 1 nano-CPU, and 0.001 failed in runc
# with 'failed to write "100"' naming no key; Docker's own minimum is 0.01
@pytest.mark.parametrize("value", [1e-9, 0.001, 0.009])
def test_cpus_below_dockers_minimum_is_a_config_error_naming_the_key(value):
    def agent(value: object) -> str:
        return f'[env.agent]\nmodel = "m"\n[env.agent.runtime]\ncpus = {value}\n'
    with pytest.raises(ConfigError) as caught:
        load_config(agent(value))
    assert f"[env.agent.runtime] cpus = {value}" in str(caught.value) and "equal to 0.01" in str(caught.value)
    assert load_config(agent(bounds.MIN_CPUS)).runtime.cpus == 0.01   # the bound itself is allowed

"""Issue 14, part 3: eval suites. One config runs several tasksets in one eval flow run, each its own
environment with its own options, task count and agent keys; rows, resume and shards key rollouts
by (environment, task id, rollout index), so two environments may hold the same task ids."""

from __future__ import annotations

import re
from typing import Any

import pytest

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.flows.shard import shard_flow
from prefect_rollouts.traces import durable_keys, read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply

SUITE = '''
[[env.tasksets]]
id = "tests.prefect.tasksets:numbered"
name = "easy"
count = 4
num_tasks = 3

[[env.tasksets]]
id = "tests.prefect.tasksets:numbered"
name = "hard"
count = 6
agent = { model = "scripted-hard" }
'''


def suite_config(tmp_path, base_url: str, **top: Any):
    """The numbered taskset twice: ``easy`` (3 tasks) and ``hard`` (6 tasks, the same ids n0..n2 and
    more, asked of the model ``scripted-hard``), under one ``[env.agent]``."""
    text = eval_toml(tmp_path / "traces", base_url, **top)
    text = text.replace('[env.taskset]\nid = "tests.prefect.tasksets:numbered"\ncount = 10\n', "")
    return load_eval_config(text.replace("[env.agent]", SUITE + "\n[env.agent]", 1))


def right_for_easy_wrong_for_hard(request: Any) -> Any:
    number = int(re.search(r"say (\d+)", request.messages[-1]["content"]).group(1))
    return reply(str(number + (request.body["model"] == "scripted-hard")))


@pytest.mark.prefect
async def test_a_suite_runs_each_environment_with_its_own_tasks_and_agent_and_reports_each_and_all(
        tmp_path, openai_server):
    openai_server.default = right_for_easy_wrong_for_hard
    config = suite_config(tmp_path, openai_server.base_url, rollout_granularity="flow", run_name="suite")
    summary = await eval_flow(config, run_id="suite-1")

    rows = read_rollouts(tmp_path / "traces", run_id="suite-1")
    assert sorted(zip(rows["environment"], rows["task_id"], strict=True)) == sorted(
        [("easy", f"n{i}") for i in range(3)] + [("hard", f"n{i}") for i in range(6)])
    assert set(rows.loc[rows["environment"] == "hard", "model"]) == {"scripted-hard"}
    assert rows.groupby("environment")["config_hash"].nunique().tolist() == [1, 1]
    assert rows["config_hash"].nunique() == 2, "each agent config its own hash"
    assert [(e.environment, e.rollouts, e.mean_reward) for e in summary.environments] == [
        ("easy", 3, 1.0), ("hard", 6, 0.0)]
    assert (summary.overall.environment, summary.overall.rollouts, summary.overall.mean_reward) == (
        "all", 9, pytest.approx(1 / 3))
    assert [row["environment"] for row in summary.table()] == ["easy", "hard", "all"]


@pytest.mark.prefect
async def test_resume_and_shards_key_rollouts_by_environment(tmp_path, openai_server):
    openai_server.default = right_for_easy_wrong_for_hard
    config = suite_config(tmp_path, openai_server.base_url, rollout_granularity="batch", batch_size=2)
    from prefect_rollouts.evals.identity import prepare_run

    prepare_run(config.traces.dataset_root(), "suite-2", config, resume=False)
    ran = await shard_flow("suite-2", config, str(tmp_path / "traces"),
                           [["easy", "n0", 0], ["hard", "n0", 0], ["hard", "n5", 0]])   # n0 in both: two rows
    assert ran == 3
    assert durable_keys(tmp_path / "traces", "suite-2") == {("easy", "n0", 0), ("hard", "n0", 0), ("hard", "n5", 0)}

    summary = await eval_flow(config, resume="suite-2")
    rows = read_rollouts(tmp_path / "traces", run_id="suite-2")
    assert len(rows) == 9 and not rows.duplicated(["environment", "task_id", "rollout_index"]).any()
    assert summary.rollouts == 9 and len(openai_server.requests) == 9, "the resume ran only the 6 without a row"


@pytest.mark.unit
def test_a_suite_config_is_checked_entry_by_entry(tmp_path):
    base = eval_toml(tmp_path, "http://127.0.0.1:9/v1")
    both = base.replace("[env.agent]", '[[env.tasksets]]\nid = "arithmetic"\n[env.agent]', 1)
    with pytest.raises(ConfigError, match=r"give exactly one of \[env.taskset\] .* both are set"):
        load_eval_config(both)
    suite = base.replace('[env.taskset]\nid = "tests.prefect.tasksets:numbered"\ncount = 10\n', "")
    twice = suite.replace("[env.agent]", '[[env.tasksets]]\nid = "arithmetic"\n[[env.tasksets]]\nid = "arithmetic"\n'
                                         "[env.agent]", 1)
    with pytest.raises(ConfigError, match="arithmetic names two environments"):
        load_eval_config(twice)
    client = suite.replace("[env.agent]", '[[env.tasksets]]\nid = "arithmetic"\nagent = { client = { timeout = 1 } }\n'
                                          "[env.agent]", 1)
    with pytest.raises(ConfigError, match=re.escape("agent.client: a suite's environments share")):
        load_eval_config(client)
    bad_agent = suite.replace("[env.agent]", '[[env.tasksets]]\nid = "arithmetic"\nagent = { max_turns = 0 }\n'
                                             "[env.agent]", 1)
    with pytest.raises(ConfigError, match=r"env.tasksets\[0\].agent\] max_turns"):
        load_eval_config(bad_agent)


@pytest.mark.unit
def test_a_suite_entry_holds_no_secret_and_names_no_path(tmp_path):
    suite = eval_toml(tmp_path, "http://127.0.0.1:9/v1").replace(
        '[env.taskset]\nid = "tests.prefect.tasksets:numbered"\ncount = 10\n', "")

    def entry(text: str):
        return load_eval_config(suite.replace("[env.agent]", f'[[env.tasksets]]\nid = "arithmetic"\n{text}\n'
                                                             "[env.agent]", 1))
    with pytest.raises(ConfigError, match=r"agent.runtime.env: T must be \$\{VAR\} templates"):
        entry('agent = { runtime = { env = { T = "sk-literal" } } }')
    assert entry('agent = { runtime = { env = { T = "${T}" } } }').environments()[0].agent.runtime.env == {"T": "${T}"}
    with pytest.raises(ConfigError, match=r"agent.scoring.judges\[0\].client: a suite's environments share"):
        entry('agent = { scoring = { judges = [{ id = "reference", model = "j", client = { headers = '
              '{ Authorization = "Bearer s3cret" } } }] } }')
    with pytest.raises(ConfigError, match=re.escape("agent.orchestrator: an eval's rollout_granularity decides")):
        entry('agent = { orchestrator = "inline" }')
    for name in ("a/b", "all", "x=y"):
        with pytest.raises(ConfigError, match=r"\[env.tasksets\[0\]\] name = .*: an environment's name names rows"):
            entry(f'name = "{name}"')


@pytest.mark.unit
def test_a_taskset_error_in_a_suite_names_the_entry(tmp_path):
    from prefect_rollouts.evals.plan import plan_rollouts

    suite = eval_toml(tmp_path, "http://127.0.0.1:9/v1").replace(
        '[env.taskset]\nid = "tests.prefect.tasksets:numbered"\ncount = 10\n', "")
    config = load_eval_config(suite.replace("[env.agent]", '[[env.tasksets]]\nid = "arithmetic"\n[[env.tasksets]]\n'
                                                           'id = "arithmetic"\nname = "b"\ncolour = "red"\n'
                                                           "[env.agent]", 1))
    with pytest.raises(ConfigError, match=r"^\[\[env.tasksets\]\] entry 1 \(b\): colour: unknown option"):
        plan_rollouts(config)


@pytest.mark.prefect
async def test_traces_show_tells_the_environments_of_one_task_id_apart(tmp_path, openai_server):
    from typer.testing import CliRunner

    from prefect_rollouts.cli import app

    openai_server.default = right_for_easy_wrong_for_hard
    await eval_flow(suite_config(tmp_path, openai_server.base_url, rollout_granularity="batch"), run_id="show-1")
    traces = str(tmp_path / "traces")
    listed = CliRunner().invoke(app, ["traces", "show", traces, "show-1"]).output
    assert listed.splitlines()[1].split()[:3] == ["environment", "task_id", "index"]
    assert "easy         n0" in listed and "hard         n0" in listed
    both = CliRunner().invoke(app, ["traces", "show", traces, "show-1", "n0"]).output
    assert "· environment easy · task n0" in both and "· environment hard · task n0" in both
    one = CliRunner().invoke(app, ["traces", "show", traces, "show-1", "n0", "--environment", "hard"]).output
    assert "environment hard" in one and "environment easy" not in one

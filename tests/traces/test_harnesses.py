"""Comparing harnesses (issue 32, item 13): a run id names its environment, harness and model unless
``run_name`` is set; ``traces summary`` and ``traces compare`` show each run's harness and model,
taken from the run's stored config; a ``--set`` of a table replaces it whole."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import ConfigError
from prefect_rollouts.evals.identity import prepare_run
from prefect_rollouts.evals.prepare import new_run_id
from prefect_rollouts.traces import TraceWriter, summarize_run
from prefect_rollouts.traces.compare import compare_runs
from prefect_rollouts.traces.report import run_rows
from prefect_rollouts.traces.store import dataset_root
from tests.eval_toml import eval_toml

pytestmark = pytest.mark.unit

HARBOR = Path(__file__).parents[2] / "examples" / "harbor-mini-swe-agent.toml"


def test_a_run_id_names_the_environment_harness_and_model_unless_run_name_is_set():
    example = load_eval_config(HARBOR)
    assert example.run_name is None
    assert example.run_prefix == "harbor-mini-swe-agent-local-smollm2"      # the model's / made a dash
    assert new_run_id(example).startswith("harbor-mini-swe-agent-local-smollm2-20")
    oracle = load_eval_config(HARBOR, ['env.agent.harness={id="oracle"}'])   # the table replaced whole
    assert oracle.run_prefix == "harbor-oracle"                             # no model: oracle calls none
    assert load_eval_config(HARBOR, ["env.agent.harness=bash", "env.agent.model=Org/Model-7B"]).run_prefix == (
        "harbor-bash-org-model-7b")
    assert load_eval_config(HARBOR, ["run_name=mine", "env.agent.harness=bash"]).run_prefix == "mine"   # set: it wins
    assert oracle.default_name == example.default_name == "harbor"          # the series stays the taskset's
    fix = """replace the whole table instead, e.g. --set 'env.agent.harness={id="bash"}'"""
    with pytest.raises(ConfigError, match=re.escape(fix)):
        load_eval_config(HARBOR, ["env.agent.harness.id=bash"])            # one key: action_format stays


def test_a_suites_run_id_joins_its_environments_and_harnesses(tmp_path):
    text = ('[traces]\npath = "t"\n[env.agent]\nmodel = "m/x"\nharness = "tools"\n'
            '[[env.tasksets]]\nid = "arithmetic"\n[[env.tasksets]]\nid = "arithmetic"\nname = "arith-chat"\n'
            'agent = { harness = "chat" }\n')
    assert load_eval_config(text).run_prefix == "arithmetic+arith-chat-tools+chat-m-x"


def rollout(task_id: str, reward: float) -> vf.Trace:
    return vf.Trace(task_id=task_id, model="local/smollm2", reward=reward, stop_condition="agent_completed",
                    started_at=1_800_000_000.0 + (0 if reward else 60))


def store_run(root: Path, run_id: str, harness: str, rewards: list[float]) -> None:
    """A run as an eval leaves it: its stored config (``prepare_run``), then its rows."""
    config = load_eval_config(eval_toml(root, "http://127.0.0.1:9/v1", taskset={"id": "arithmetic", "count": 5}),
                              [f"env.agent.harness={harness}", "env.agent.model=local/smollm2"])
    prepare_run(dataset_root(root), run_id, config, resume=False)
    writer = TraceWriter(root, run_id)
    for i, reward in enumerate(rewards):
        writer.add(rollout(f"t{i}", reward), rollout_index=0, environment="arithmetic", config_hash="h", elapsed_s=1.0)
    assert writer.flush() == len(rewards)


def test_summary_and_compare_show_each_runs_harness_and_model(tmp_path):
    store_run(tmp_path, "run-oracle", "oracle", [1.0, 1.0, 1.0])
    store_run(tmp_path, "run-bash", "bash", [0.0, 1.0, 0.0])
    assert {run["run_id"]: (run["harness"], run["model"]) for run in run_rows(tmp_path)} == {
        "run-oracle": ("oracle", "local/smollm2"), "run-bash": ("bash", "local/smollm2")}
    environment = summarize_run(tmp_path, "run-bash").environments[0]
    assert (environment.environment, environment.harness, environment.model) == ("arithmetic", "bash", "local/smollm2")

    runner = CliRunner()
    summary = runner.invoke(app, ["traces", "summary", str(tmp_path)])
    assert summary.exit_code == 0, summary.output
    lines = summary.output.splitlines()
    assert lines[0].split()[:5] == ["date", "run_id", "harness", "model", "environment"]
    assert sorted(line.split()[2:5] for line in lines[1:3]) == [["run-bash", "bash", "local/smollm2"],
                                                               ["run-oracle", "oracle", "local/smollm2"]]
    one = runner.invoke(app, ["traces", "summary", str(tmp_path), "--run-id", "run-oracle"])
    assert one.exit_code == 0 and "harness" in one.output and "oracle" in one.output.split("run run-oracle")[1]

    result = compare_runs(tmp_path, "run-oracle", "run-bash", resamples=100)
    assert (result.harness_a, result.model_a, result.harness_b, result.model_b) == (
        "oracle", "local/smollm2", "bash", "local/smollm2")
    compared = runner.invoke(app, ["traces", "compare", str(tmp_path), "run-oracle", "run-bash", "--resamples", "100"])
    assert compared.exit_code == 0, compared.output
    assert compared.output.splitlines()[:2] == ["run A: run-oracle · harness oracle · model local/smollm2",
                                                "run B: run-bash · harness bash · model local/smollm2"]


def test_a_run_without_a_stored_config_shows_an_unknown_harness(tmp_path):
    writer = TraceWriter(tmp_path, "old")
    writer.add(rollout("t0", 1.0), rollout_index=0, environment="arithmetic", config_hash="h", elapsed_s=1.0)
    writer.flush()
    (tmp_path / "runs" / "run_id=bad").mkdir(parents=True)
    (tmp_path / "runs" / "run_id=bad" / "config.json").write_text("{not json")
    writer = TraceWriter(tmp_path, "bad")
    writer.add(rollout("t0", 1.0), rollout_index=0, environment="arithmetic", config_hash="h", elapsed_s=1.0)
    writer.flush()
    with pytest.warns(UserWarning, match="run bad: its harness is unknown"):
        runs = {run["run_id"]: run["harness"] for run in run_rows(tmp_path)}
    assert runs == {"old": "—", "bad": "—"}
    assert summarize_run(tmp_path, "old").environments[0].harness is None

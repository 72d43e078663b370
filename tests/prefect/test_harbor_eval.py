"""Harbor tasks through the eval flow on Prefect: ``tasks check`` on the shipped tasks, every
granularity giving the same rows, per-category summary lines, a failed build reported in the
summary, and the ``bash`` program harness solving two shipped tasks against scripted replies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.runtimes.docker.engine import LABEL, docker_client
from prefect_rollouts.traces import read_rollouts, read_traces
from tests.docker.test_harbor_docker import task_dir
from tests.fakes.openai_server import reply, tool_call

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("docker_engine", "prefect_harness"), pytest.mark.timeout(900)]

SHIPPED = Path(__file__).parent.parent.parent / "examples" / "harbor-tasks"


def labelled_containers() -> set[str]:
    return {c.id for c in docker_client().containers.list(all=True, sparse=True, filters={"label": f"{LABEL}=1"})}


def harbor_toml(traces: Path, path: Path, harness: str, *, granularity: str = "task", base_url: str = "",
                **top: object) -> str:
    lines = [f'rollout_granularity = "{granularity}"', "max_error_fraction = 1.0",
             *(f"{key} = {value}" for key, value in top.items()),
             f'[traces]\npath = "{traces}"', f'[env.taskset]\nid = "harbor"\npath = "{path}"',
             f'[env.agent]\nharness = "{harness}"',
             *([f'model = "scripted"\n[env.agent.client]\nbase_url = "{base_url}"\napi_key_env = ""'] if base_url
               else []),
             '[env.agent.runtime]\ntype = "docker"']
    return "\n".join(lines) + "\n"


@pytest.mark.serial   # "no container left" is read off all the containers of the engine
def test_tasks_check_passes_every_shipped_task_and_leaves_no_container():
    before = labelled_containers()
    result = CliRunner().invoke(app, ["tasks", "check", str(SHIPPED)])
    assert result.exit_code == 0, result.output
    shipped = sorted(p.name for p in SHIPPED.iterdir() if (p / "task.toml").is_file())
    assert len(shipped) >= 12
    cells = {parts[0]: parts[1:3] for line in result.output.splitlines()
             if len(parts := [cell.strip() for cell in line.split("│")[1:-1]]) == 5}
    assert {name: cells.get(name) for name in shipped} == {name: ["1", "0"] for name in shipped}
    assert f"all {len(shipped)} tasks are sound" in result.output
    assert f"preparing {len(shipped)} tasks" in result.output   # oracle and nop share one image check per task
    assert labelled_containers() - before == set()


def test_tasks_check_names_a_broken_task_and_exits_1(tmp_path):
    task_dir(tmp_path, "sound")
    task_dir(tmp_path, "always-passes", test_sh="echo 1 > /logs/verifier/reward.txt\n")   # nop scores 1
    task_dir(tmp_path, "bad-solution", solve_sh="exit 4\n")
    result = CliRunner().invoke(app, ["tasks", "check", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert "broken: 2 of 3 tasks: always-passes, bad-solution" in " ".join(result.output.split())
    assert "solve.sh exited with code 4" in " ".join(result.output.split())


def test_every_bad_task_directory_is_named_before_prefect_starts(tmp_path):
    task_dir(tmp_path, "fine")
    for name in ("t", "u"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = "soon"\n')
    result = CliRunner().invoke(app, ["tasks", "check", str(tmp_path)])
    output = " ".join(result.output.split())
    assert result.exit_code == 2 and "verifier.timeout_sec" in output
    assert "Harbor task 't'" in output and "Harbor task 'u'" in output and "2 task directories do not load" in output
    assert "[[env.tasksets]]" not in output


@pytest.mark.parametrize("granularity", ["flow", "task", "batch"])
async def test_every_granularity_runs_harbor_tasks_with_per_category_lines(tmp_path, granularity):
    tasks = tmp_path / "tasks"
    task_dir(tasks, "first")
    task_dir(tasks, "second", toml='version = "1.0"\n[metadata]\ncategory = "other"\n')
    broken = task_dir(tasks, "unbuildable")
    (broken / "environment" / "Dockerfile").write_text("FROM prefect-rollouts-sandbox:latest\nRUN exit 9\n")
    config = load_eval_config(harbor_toml(tmp_path / "traces", tasks, "oracle", granularity=granularity))
    summary = await eval_flow(config, run_id=f"harbor-{granularity}")
    rows = read_rollouts(tmp_path / "traces", run_id=f"harbor-{granularity}").set_index("task_id")
    assert rows.loc["first", "reward"] == 1.0 and rows.loc["second", "reward"] == 1.0
    assert rows.loc["unbuildable", "error_type"] == "InfrastructureError"   # never a 0
    env = summary.environments[0]
    assert (env.rollouts, env.scored, env.errored) == (3, 2, 1)
    assert sorted(c.category for c in summary.categories) == ["demo", "other"]
    assert [(e.type, e.count) for e in summary.errors] == [("InfrastructureError", 1)]   # reported once


async def test_the_bash_program_harness_solves_two_shipped_tasks_against_scripted_replies(tmp_path, openai_server):
    chosen = ["python-fix-interval-merge", "shell-log-summary"]   # the order the rollouts run in
    tasks = tmp_path / "tasks"
    for name in chosen:
        shutil.copytree(SHIPPED / name, tasks / name)
    script = []
    for name in chosen:   # in task order, one rollout at a time: run the reference solution, then say done
        solve = (SHIPPED / name / "solution" / "solve.sh").read_text()
        script += [tool_call("bash", command=f"cd /app && bash <<'SOLVE'\n{solve}\nSOLVE"), reply("done")]
    openai_server.play(script)
    config = load_eval_config(harbor_toml(tmp_path / "traces", tasks, "bash", base_url=openai_server.base_url,
                                          max_concurrent=1))
    summary = await eval_flow(config, run_id="harbor-bash")
    rows = read_rollouts(tmp_path / "traces", run_id="harbor-bash").set_index("task_id")
    assert rows["error_type"].isna().all(), rows[["error_type", "error_message"]]
    assert list(rows.loc[chosen, "reward"]) == [1.0, 1.0]
    assert summary.environments[0].mean_reward == 1.0
    for trace in read_traces(tmp_path / "traces", run_id="harbor-bash"):
        assert len(trace.model_calls) == 2 and trace.info["program"][0]["exit_code"] == 0
        assert trace.info["harbor"]["verifier"]["exit_code"] == 0

"""``traces export --format atif`` (issue 39, item 2): each rollout as an ATIF trajectory that the ``atif``
package's own models accept, with every tool call and its observation in place."""

from __future__ import annotations

import json
import re

import atif
import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.traces.view.data import rollout_view
from tests.traces.viewer_runs import bash_rollout, steered_rollout, tools_rollout, write_run

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-test-atif")


def exported(root, run_id: str, out) -> dict[str, atif.Trajectory]:
    """Run the CLI's export; return each file, read back through ``atif.Trajectory``, by its task directory."""
    result = CliRunner().invoke(app, ["traces", "export", str(root), run_id, "--format", "atif", "--out", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(out.rglob("trajectory.json"))
    return {path.parent.parent.name: atif.Trajectory.model_validate(json.loads(path.read_text())) for path in files}


async def test_a_tools_rollout_gives_an_agent_step_with_its_call_and_the_observation_tied_to_it(
        tmp_path, openai_server):
    trace = await tools_rollout(openai_server, "t3", 3, 3)
    write_run(tmp_path / "ds", "tools", [trace])
    document = exported(tmp_path / "ds", "tools", tmp_path / "out")["t3__0"]
    assert [step.source for step in document.steps] == ["user", "agent", "agent"]
    user, call, answer = document.steps
    assert (user.message, answer.message) == ("what is 2 + 1?", "3")
    (tool,) = call.tool_calls
    assert (tool.function_name, tool.arguments) == ("add", {"a": 2, "b": 1})
    (result,) = call.observation.results
    assert (result.source_call_id, result.content) == (tool.tool_call_id, "3")
    first, second = trace.model_calls
    assert (call.metrics.prompt_tokens, call.metrics.completion_tokens) == (
        first.prompt_tokens, first.completion_tokens)
    assert answer.metrics.prompt_tokens == second.prompt_tokens and answer.llm_call_count == 1
    assert document.final_metrics.total_prompt_tokens == trace.usage.prompt_tokens
    assert (document.agent.name, document.agent.model_name) == ("prefect-rollouts", "scripted")
    assert (document.extra["task_id"], document.extra["reward"], document.extra["environment"]) == ("t3", 1.0, "adding")
    assert document.schema_version == "ATIF-v1.8" and document.session_id == trace.id


async def test_a_program_rollout_keeps_its_command_its_output_and_its_launch(tmp_path, openai_server):
    trace = await bash_rollout(openai_server)
    assert trace.errors == [], trace.errors
    write_run(tmp_path / "ds", "program", [trace], environment="shell")
    document = exported(tmp_path / "ds", "program", tmp_path / "out")["program__0"]
    assert [step.source for step in document.steps] == ["user", "agent", "agent"]
    call = document.steps[1]
    assert call.tool_calls[0].function_name == "bash"
    assert call.tool_calls[0].arguments == {"command": "echo hello > out.txt && cat out.txt"}
    assert call.observation.results[0].content.startswith("exit_code: 0\nstdout:\nhello")
    assert call.observation.results[0].source_call_id == call.tool_calls[0].tool_call_id
    assert document.steps[2].message == "done"
    (launch,) = document.agent.extra["program"]
    assert launch["exit_code"] == 0 and launch["model_calls"] == 2
    shown = rollout_view(trace)   # the viewer's rollout page: the launch with its output's tail
    assert [(p["exit_code"], p["stdout_tail"]) for p in shown["programs"]] == [(0, "done\n")]
    assert '"program":' not in (shown["info"] or "")   # shown once, as a launch


async def test_a_steer_is_a_user_step_marked_with_its_provenance_after_the_observation(tmp_path, openai_server):
    trace = await steered_rollout(openai_server)
    write_run(tmp_path / "ds", "steer", [trace])
    document = exported(tmp_path / "ds", "steer", tmp_path / "out")["steered__0"]
    assert [step.source for step in document.steps] == ["user", "agent", "user", "agent"]
    assert document.steps[1].observation.results[0].content == "waited"
    steer = document.steps[2]
    assert (steer.message, steer.extra) == ("use the fast path", {"provenance": "steer", "message_id": "s1"})
    assert document.steps[3].message == "adjusted"


def test_export_names_an_unknown_run_and_an_unknown_format(tmp_path):
    runner = CliRunner()
    unknown = runner.invoke(app, ["traces", "export", str(tmp_path), "nope", "--out", str(tmp_path / "o")])
    assert unknown.exit_code == 1 and "RUN = 'nope': no rollouts of this run" in unknown.output
    wrong = runner.invoke(app, ["traces", "export", str(tmp_path), "r", "--format", "csv", "--out", str(tmp_path)])
    assert wrong.exit_code == 2 and "--format = 'csv'" in wrong.output and "Use --format atif" in wrong.output


def test_names_that_are_not_path_components_get_distinct_safe_ones():
    from prefect_rollouts.traces.atif import _safe

    names = ["a/b", "a_b", "a b", "..", ".", "../../etc", "x" * 130, "x" * 131, "t\u00e9", "t\x00"]
    made = [_safe(name) for name in names]
    assert len(set(made)) == len(names) and made[1] == "a_b"
    assert all(re.fullmatch(r"[A-Za-z0-9._-]{1,120}", part) and part.strip(".") for part in made)

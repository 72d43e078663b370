"""Program harnesses under Prefect: a program segment is a ``segment-<n>`` task run, and an eval of the
``bash`` program writes the same rows as one of the in-process ``tools`` loop."""

from __future__ import annotations

from pathlib import Path

import pytest

import prefect_rollouts as vf
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import read_model_calls, read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply, tool_call
from tests.prefect.test_rollout_flow import task_runs_of

pytestmark = pytest.mark.timeout(240)


class Said(vf.Task):
    @vf.reward
    def said_done(self, trace):
        return float(trace.last_reply == "done")


@pytest.mark.prefect
async def test_a_program_segment_is_a_segment_task_run(openai_server, agent_config):
    openai_server.play([tool_call("bash", command="echo hi"), reply("done")])
    async with vf.make_agent(agent_config(orchestrator="prefect", harness="bash")) as agent:
        trace = await agent.run(Said(vf.TaskData(prompt="go")))
    assert (trace.reward, trace.errors, len(trace.model_calls)) == (1.0, [], 2)
    runs = {r.name: r.state.name for r in await task_runs_of(trace.info["flow_run_id"], 4)}
    assert runs["segment-0"] == "Completed" and runs["scoring"] == "Completed"


def answer_by_number(request):
    return reply(request.messages[-1]["content"].split()[-1])


@pytest.mark.prefect
async def test_an_eval_of_the_bash_program_writes_the_rows_of_the_tools_loop(tmp_path, openai_server):
    openai_server.default = answer_by_number
    frames = {}
    for harness in ("bash", "tools"):
        text = eval_toml(tmp_path, openai_server.base_url, max_concurrent=4).replace(
            'harness = "chat"', f'harness = "{harness}"')
        summary = await eval_flow(load_eval_config(text), run_id=f"h-{harness}")
        assert summary.environments[0].errored == 0
        rows = read_rollouts(tmp_path, run_id=f"h-{harness}")
        columns = ["task_id", "reward", "stop_condition", "is_error", "total_tokens", "num_model_calls"]
        frames[harness] = rows[columns].sort_values("task_id").reset_index(drop=True)
        assert len(read_model_calls(tmp_path, run_id=f"h-{harness}")) == 10
    assert frames["bash"].equals(frames["tools"]) and len(frames["bash"]) == 10
    assert (frames["bash"]["reward"] == 1.0).all()


@pytest.mark.system
@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("example", ["my-program.toml", "bash-program.toml"])
async def test_the_program_examples_run_in_docker_without_network(tmp_path, openai_server, docker_engine,
                                                                  monkeypatch, example):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-example-0123456789abcdef")
    examples = Path(__file__).resolve().parents[2] / "examples"   # noqa: ASYNC240 (one read)
    text = (examples / example).read_text().replace("http://127.0.0.1:8000/v1", openai_server.base_url)
    text = text.replace('path = "./traces"', f'path = "{tmp_path}"').replace("num_tasks = 20", "num_tasks = 2")
    config = examples / f".test-{example}"   # beside the original: its files paths are relative to it
    config.write_text(text)
    openai_server.default = reply("42")
    try:
        summary = await eval_flow(load_eval_config(config), run_id="example")
    finally:
        config.unlink()
    env = summary.environments[0]
    assert (env.rollouts, env.scored, env.errored) == (2, 2, 0)
    assert len(read_model_calls(tmp_path, run_id="example")) == 2
    assert all(r.headers["authorization"] == "Bearer sk-example-0123456789abcdef" for r in openai_server.requests)

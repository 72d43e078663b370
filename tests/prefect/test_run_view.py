"""Seeing a run in the UI and the console (issue 13, item 4): rollout flow runs named with task,
rollout index and model, each ending its logs with its outcome; the summary's reward components
and model in the artifact (one key per series), the eval flow run's log and the console; the
CLI quiet by default, ``--verbose`` bringing Prefect's INFO lines back, the progress bar on its
own line (the CLI in a real pseudo-terminal, its screen read by a terminal emulator)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios

import pyte
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)

from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.flows.eval import eval_flow
from prefect_rollouts.traces import error_text, read_rollouts
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import delayed, reply, status
from tests.support.cli import eval_command, eval_env, run_eval
from tests.support.waiting import wait_for

pytestmark = pytest.mark.prefect

JUDGE = '[[env.agent.scoring.judges]]\nid = "reference"\nname = "judge"\nmodel = "judge"\n'


def wrong_but_judged_right_and_task_1_down(request):
    """The agent answers wrong, a lenient judge (model ``judge``) says yes, task 1's endpoint fails."""
    if request.body.get("model") == "judge":
        return reply("yes")
    return status(400) if "task 1:" in request.messages[-1]["content"] else reply("wrong")


async def logs_of(flow_run_ids: list[str], ended: int) -> list:
    """Logs of the flow runs (their task runs' included), oldest first, once ``ended`` of them logged their end."""
    async def read():
        async with get_client() as client:
            logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=flow_run_ids)))
        done = sum(log.message.startswith("Finished in state") and log.task_run_id is None for log in logs)
        return sorted(logs, key=lambda log: log.timestamp) if done >= ended else None
    return await wait_for(read, timeout_s=30, what=f"{ended} of the flow runs to log their end")


async def test_rollout_runs_are_named_and_end_with_their_outcome_and_the_summary_shows_components(
        tmp_path, openai_server):
    openai_server.default = wrong_but_judged_right_and_task_1_down
    text = eval_toml(tmp_path, openai_server.base_url, run_name="view-series", num_tasks=3, rollouts_per_task=2,
                     rollout_granularity="flow", max_error_fraction=0.5) + JUDGE
    summary = await eval_flow(load_eval_config(text), run_id="view-1")

    env = summary.environments[0]       # the judge's 1.0 no longer hides the exact match's 0.0
    assert (env.model, env.mean_reward, env.reward_components) == ("scripted", 1.0, {"correct": 0.0, "judge": 1.0})
    row = summary.table()[0]
    assert [row[k] for k in ("model", "mean_reward", "reward.correct", "reward.judge")] == ["scripted", 1.0, 0.0, 1.0]

    rows = read_rollouts(tmp_path, run_id="view-1").set_index("flow_run_id")
    async with get_client() as client:
        runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=list(rows.index))))
    assert sorted(run.name for run in runs) == [f"n{t} #{i} · scripted" for t in range(3) for i in range(2)]
    for run in runs:
        assert run.name == f"{rows.loc[str(run.id), 'task_id']} #{rows.loc[str(run.id), 'rollout_index']} · scripted"

    logs = await logs_of(list(rows.index), ended=6)
    for flow_run_id, rollout in rows.iterrows():
        last = [log.message for log in logs if str(log.flow_run_id) == flow_run_id][-2:]
        if rollout.task_id == "n1":
            error = error_text("ProviderError", rollout.error_message)
            assert last[0] == f"reward — · stop provider_error · error {error}"
            assert "returned 400" in last[0] and last[1].startswith("Finished in state Failed")
        else:
            assert last == ["reward 1 (correct 0, judge 1) · stop agent_completed", "Finished in state Completed()"]

    (summary_log,) = [log.message for log in await logs_of([summary.flow_run_id], ended=1)
                      if "summary artifact:" in log.message]
    lines = summary_log.splitlines()
    assert lines[0] == "run view-1: 6 rollouts, 2 errored"
    assert lines[1].split()[:9] == ["environment", "harness", "model", "rollouts", "scored", "mean_reward", "stderr",
                                    "reward.correct", "reward.judge"]
    assert lines[2].split()[:9] == ["tests.prefect.tasksets:numbered", "chat", "scripted", "6", "4", "1.0", "0.0",
                                    "0.0", "1.0"]
    assert lines[-1] == "summary artifact: eval-summary-view-series"

    await eval_flow(load_eval_config(text), run_id="view-2")          # the next run of the series
    async with get_client() as client:
        artifacts = await client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["eval-summary-view-series", "eval-summary-view-1", "eval-summary-view-2"])))
    assert sorted((a.key, a.description.split(" (")[0]) for a in artifacts) == [
        ("eval-summary-view-series", "Summary of run view-1"), ("eval-summary-view-series", "Summary of run view-2")]
    assert all('"model": "scripted"' in a.data and '"reward.correct": 0.0, "reward.judge": 1.0' in a.data
               for a in artifacts)
    assert "6 rollouts of scripted" in artifacts[0].description
    for artifact in artifacts:   # the command that opens the run in the viewer (issue 39)
        run = artifact.description.split(" (")[0].removeprefix("Summary of run ")
        assert artifact.description.endswith(f"Read its rollouts: `prefect-rollouts traces view {tmp_path} {run}`")


def cli_env() -> dict[str, str]:
    return eval_env(COLUMNS="", LINES="")


def test_the_cli_prints_no_prefect_info_lines_by_default_and_ends_with_the_summary_and_the_run_url(
        tmp_path, openai_server):
    openai_server.default = wrong_but_judged_right_and_task_1_down
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, num_tasks=3, rollout_granularity="flow",
                                max_error_fraction=0.5) + JUDGE)
    result = run_eval(config, "--run-id", "quiet", env=cli_env(), timeout_s=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert " | INFO " not in output and "Finished in state Completed" not in output, output
    lines = output.splitlines()
    header = next(line for line in lines if "environment" in line)
    assert re.findall(r"[\w.@]+", header) == ["environment", "harness", "model", "rollouts", "scored", "mean_reward",
                                              "stderr", "reward.correct", "reward.judge", "pass@1", "truncated",
                                              "timed_out", "skipped", "errored"]
    values = lines[lines.index(header) + 2].split()     # the long environment name may wrap (160 columns piped)
    assert "tests.prefect.tasksets:numbered".startswith(values[0])
    assert values[1:] == ["chat", "scripted", "3", "2", "1.0", "0.0", "0.0", "1.0", "1.0", "0", "0", "0", "1"]
    assert re.fullmatch(r"eval flow run: http://127\.0\.0\.1:\d+/runs/flow-run/[0-9a-f-]{36}", lines[-1]), output


BAR = re.compile(r"rollouts [━╸╺ ]+ \d+/\d+ \d:\d\d:\d\d")
LOG = re.compile(r"\d\d:\d\d:\d\d\.\d{3} \| (INFO|WARNING|ERROR) +\| ")


def run_in_terminal(args: list[str], columns: int = 250, rows: int = 1000, timeout_s: float = 240) -> list[str]:
    """Run ``args`` with stdin, stdout and stderr on a pseudo-terminal of ``columns`` x ``rows``;
    return the lines of the emulated screen at the end (trailing blanks dropped)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = {**cli_env(), "TERM": "xterm-256color"}
    process = subprocess.Popen(args, stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    screen = pyte.Screen(columns, rows)
    stream = pyte.ByteStream(screen)
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], timeout_s)
            assert ready, "the CLI printed nothing for too long"
            try:
                data = os.read(leader, 65536)
            except OSError:        # EIO: the CLI exited and closed the terminal
                break
            if not data:
                break
            stream.feed(data)
        assert process.wait(timeout=30) == 0, "\n".join(screen.display)
    finally:
        process.kill()
        os.close(leader)
    lines = [line.rstrip() for line in screen.display]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def test_verbose_brings_prefect_info_lines_back_and_each_prints_above_the_progress_bar(tmp_path, openai_server):
    def slow_answers(request):
        number = re.search(r"task (\d+)", request.messages[-1]["content"]).group(1)
        return delayed(0.3, reply(number))
    openai_server.default = slow_answers
    config = tmp_path / "eval.toml"
    config.write_text(eval_toml(tmp_path / "traces", openai_server.base_url, num_tasks=8, max_concurrent=2,
                                rollout_granularity="flow"))
    lines = run_in_terminal(eval_command(config, "--run-id", "loud", "--verbose"))
    screen = "\n".join(lines)
    assert sum(line.endswith("- reward 1 (correct 1) · stop agent_completed") for line in lines) == 8, screen
    assert sum(bool(LOG.match(line)) for line in lines) > 50, screen     # the INFO lines of every run are back
    bars = [line for line in lines if "rollouts ━" in line or line.startswith("rollouts")]
    assert len(bars) == 1 and BAR.fullmatch(bars[0]) and " 8/8 " in bars[0], screen
    assert all(LOG.match(line) for line in lines if " | INFO " in line), screen   # no record spliced into a line

"""`prefect-rollouts traces summary` (one row per run) and `traces show` (one rollout in full),
on a dataset written by the real TraceWriter."""

from __future__ import annotations

import math

import pytest
from typer.testing import CliRunner

import prefect_rollouts as vf
from prefect_rollouts.cli import app
from prefect_rollouts.trace import ErrorRecord, JudgeCall, ModelCall
from prefect_rollouts.traces import TraceWriter

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0   # 2027-01-15 08:00 UTC


def trace(task_id: str, reward: float | None, *, model: str = "m", started_at: float = T0, **fields) -> vf.Trace:
    t = vf.Trace(task_id=task_id, model=model, reward=reward, started_at=started_at,
                 stop_condition="agent_completed" if reward is not None else "provider_error", **fields)
    t.model_calls.append(ModelCall(segment=0, started_at=started_at, latency_ms=5.0, prompt_tokens=12,
                                   completion_tokens=3, finish_reason="stop"))
    t.usage.add(12, 3)
    if reward is None:
        t.errors.append(ErrorRecord(type="ProviderError", message="connection refused to 127.0.0.1:8000",
                                    stage="segment"))
    else:
        t.rewards, t.reward_weights = {"correct": reward}, {"correct": 1.0}
    return t


def write(root, run_id: str, environment: str, traces: list[vf.Trace], indices: list[int] | None = None) -> None:
    writer = TraceWriter(root, run_id)
    for t, index in zip(traces, indices or [0] * len(traces), strict=True):
        writer.add(t, rollout_index=index, environment=environment, config_hash="h", elapsed_s=1.0)
    assert writer.flush() == len(traces)


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "List the files."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "solution.py\n" + "x" * 3000},
    {"role": "assistant", "content": [{"type": "text", "text": "There is solution.py."}]},
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """run-b (started first): 3 arith rollouts, one errored; run-a (an hour later): 2 bfcl rollouts
    of smollm2, the first with a transcript, a judge, a failure note and a task's own info."""
    root = tmp_path_factory.mktemp("traces")
    write(root, "run-b", "arith", [trace("add-0", 1.0), trace("add-1", 0.0), trace("add-2", None)])
    shown = trace("simple_0", 1.0, model="local/smollm2", started_at=T0 + 3600, messages=CONVERSATION,
                  info={"task": {"category": "simple_python"}, "humaneval_failure": {"exit_code": 1}},
                  metrics={"num_calls": 1.0})
    shown.rewards = {"correct": 0.5, "judge": 1.0}
    shown.reward_weights = {"correct": 1.0, "judge": 0.5}
    shown.judge_calls.append(JudgeCall(judge="judge", model="judge-m", started_at=T0, latency_ms=1.0,
                                       reply="yes, it lists the file", verdict="yes"))
    write(root, "run-a", "bfcl", [shown, trace("simple_0", 1.0, model="local/smollm2", started_at=T0 + 3601)],
          indices=[0, 1])
    return root


def invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["traces", *map(str, args)])
    return result.exit_code, result.output


def test_summary_prints_one_compact_row_per_run_oldest_first(dataset):
    code, output = invoke("summary", dataset)
    assert code == 0
    lines = output.strip().splitlines()
    assert lines[0].split() == ["date", "run_id", "harness", "model", "environment", "rollouts", "mean", "stderr",
                                "errors"]
    assert [line.split() for line in lines[1:]] == [   # no stored config: the harness is unknown
        ["2027-01-15", "08:00", "run-b", "—", "m", "arith", "3", "0.500", "0.500", "1"],   # add-2 errored: not in mean
        ["2027-01-15", "09:00", "run-a", "—", "local/smollm2", "bfcl", "2", "1.000", "0.000", "0"],
    ]


def test_summary_of_one_run_adds_its_full_summary(dataset):
    code, output = invoke("summary", dataset, "--run-id", "run-b")
    assert code == 0
    assert "run-b" in output and "run-a" not in output
    assert "pass@1" in output and "errored" in output    # the per-environment table follows the row


def test_show_prints_the_transcript_rewards_errors_and_info(dataset):
    code, output = invoke("show", dataset, "run-a", "simple_0", "--index", "0")
    assert code == 0
    assert output.startswith("rollout ") and " · task simple_0 · index 0 · model local/smollm2\n" in output
    assert "started 2027-01-15 09:00:00 UTC" in output and "stop agent_completed" in output
    assert "tokens: prompt 12, completion 3\n" in output
    assert "reward: 1\n  correct = 0.5 (weight 1)\n  judge = 1 (weight 0.5)\n" in output
    assert "metrics: num_calls = 1\n" in output
    transcript = output[output.index("── system ──"):output.index("── judge")]
    assert transcript.splitlines()[:8] == [
        "── system ──", "You are terse.", "── user ──", "List the files.", "── assistant ──",
        '→ bash({"cmd": "ls"})  [c1]', "── tool result c1 ──", "solution.py"]
    assert "… (1012 more characters)" in transcript              # a message is cut at 2,000 characters
    assert transcript.rstrip().endswith("── assistant ──\nThere is solution.py.")
    assert "── judge judge (judge-m) ──\nverdict: \"yes\"\nyes, it lists the file\n" in output
    assert "errors: none" in output
    assert "info:\n  humaneval_failure:\n    exit_code: 1\n" in output and "simple_python" not in output


def test_show_names_the_error_of_a_failed_rollout_and_can_show_whole_messages(dataset):
    code, output = invoke("show", dataset, "run-b", "add-2")
    assert code == 0 and "reward: —" in output and "stop provider_error" in output
    assert "errors:\n  ProviderError in segment: connection refused to 127.0.0.1:8000" in output
    code, output = invoke("show", dataset, "run-a", "simple_0", "--max-chars", "0")
    assert code == 0 and "x" * 3000 in output and "more characters" not in output
    assert output.count("rollout ") == 2 and "· index 0 ·" in output and "· index 1 ·" in output   # each rollout


def test_show_without_a_task_lists_the_runs_rollouts(dataset):
    code, output = invoke("show", dataset, "run-b")
    assert code == 0
    lines = output.splitlines()
    assert lines[0] == "run run-b: 3 rollouts"
    assert lines[1].split() == ["task_id", "index", "reward", "stop_condition", "error"]
    assert [line.split()[:4] for line in lines[2:5]] == [
        ["add-0", "0", "1.000", "agent_completed"], ["add-1", "0", "0.000", "agent_completed"],
        ["add-2", "0", "—", "provider_error"]]
    assert lines[4].endswith("ProviderError: connection refused to 127.0.0.1:8000")
    assert f"traces show {dataset} run-b TASK_ID" in output


@pytest.mark.parametrize(("args", "message"), [
    (("run-z",), "no rollouts of run 'run-z' in the trace dataset at {root}. Runs in it: run-a, run-b"),
    (("run-b", "add-9"), "run 'run-b' has no task 'add-9'. Its tasks: add-0, add-1, add-2"),
    (("run-a", "simple_0", "--index", "4"), "task 'simple_0' of run 'run-a' has no rollout index 4; it has 0, 1"),
])
def test_show_names_what_the_dataset_holds_when_the_rollout_is_not_there(dataset, args, message):
    code, output = invoke("show", dataset, *args)
    assert code == 1 and message.format(root=dataset) in " ".join(output.split())


def test_summary_of_an_unknown_run_says_so(dataset):
    code, output = invoke("summary", dataset, "--run-id", "run-z")
    assert code == 1 and "no rollouts in" in output and "for run run-z" in output


def test_the_run_rows_stderr_is_the_sample_standard_error(dataset):
    from prefect_rollouts.traces.report import run_rows

    run_b = next(run for run in run_rows(dataset) if run["run_id"] == "run-b")
    assert run_b["mean"] == 0.5 and run_b["stderr"] == pytest.approx(math.sqrt(0.5) / math.sqrt(2))


def test_show_lists_task_ids_in_natural_order(tmp_path):
    ids = ["simple_python_10", "simple_python_2", "simple_python_1", "multiple_3"]
    write(tmp_path, "r", "bfcl", [trace(task_id, 1.0) for task_id in ids])
    result = CliRunner().invoke(app, ["traces", "show", str(tmp_path), "r"])
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.output.splitlines()[2:] if line.startswith(("simple", "multiple"))]
    assert listed == ["multiple_3", "simple_python_1", "simple_python_2", "simple_python_10"]
    missing = CliRunner().invoke(app, ["traces", "show", str(tmp_path), "r", "nope"])
    assert "Its tasks: multiple_3, simple_python_1, simple_python_2, simple_python_10" in missing.output


def test_comparable_runs_are_the_latest_pair_sharing_a_rollout(tmp_path):
    from prefect_rollouts.traces.report import comparable_runs

    day = 86_400
    write(tmp_path, "night-1", "arith", [trace("t0", 1.0, started_at=T0), trace("t1", 0.0, started_at=T0)])
    write(tmp_path, "night-2", "arith", [trace("t1", 1.0, started_at=T0 + day)])
    write(tmp_path, "bfcl-1", "bfcl", [trace("t0", 1.0, started_at=T0 + 2 * day)])    # same task id, other env
    write(tmp_path, "bfcl-2", "bfcl", [trace("t0", 1.0, started_at=T0 + 3 * day)], indices=[1])   # other index
    assert comparable_runs(tmp_path) == ("night-1", "night-2")          # the two latest share nothing
    assert comparable_runs(tmp_path, run_b="night-1") == (None, "night-1")   # no earlier run to compare with
    assert comparable_runs(tmp_path, run_a="night-1") == ("night-1", "night-2")
    assert comparable_runs(tmp_path, "bfcl-2", "night-1") == ("bfcl-2", "night-1")   # both given: as given
    assert comparable_runs(tmp_path / "none") == (None, None)

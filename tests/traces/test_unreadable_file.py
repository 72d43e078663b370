"""One unreadable Parquet file in run A's directory (issue 32, item 3): every other run reads as before
and opens nothing of A; A's readers skip the file with a warning naming it; a resume of A says what to do."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.config.eval import load_eval_config
from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.evals.engine import inline_runner, run_rollouts
from prefect_rollouts.evals.prepare import prepare_eval
from prefect_rollouts.traces import (
    TraceWriter,
    compare_runs,
    dataset_root,
    durable_keys,
    read_model_calls,
    read_rollouts,
    read_traces,
    summarize_run,
)
from prefect_rollouts.traces.report import format_rollout_list, read_rollout_traces, run_rows
from prefect_rollouts.traces.store import DatasetRoot
from tests.eval_toml import eval_toml
from tests.fakes.openai_server import reply
from tests.traces.test_dataset import add, make_trace

pytestmark = pytest.mark.unit

JUNK = "part-0-junk.parquet"


@pytest.fixture
def dataset(tmp_path):
    """Runs A, B and C of tasks x, y, z (one file each), and a junk ``part-*.parquet`` in A's directory."""
    for run in "ABC":
        writer = TraceWriter(tmp_path, run)
        for task in "xyz":
            add(writer, make_trace(task, 1.0))
        writer.flush()
    junk = next((tmp_path / "rollouts").rglob("run_id=A")) / JUNK
    junk.write_bytes(b"not parquet at all")
    return tmp_path


def skipped_files(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "prefect_rollouts.traces" and "skipped file" in record.getMessage()]


def test_readers_of_other_runs_neither_open_nor_mention_the_unreadable_file(dataset, caplog):
    caplog.set_level(logging.WARNING)
    assert [row["run_id"] for row in run_rows(dataset, "B")] == ["B"]
    assert summarize_run(dataset, "B").environments[0].rollouts == 3
    assert "run B: 3 rollouts" in format_rollout_list(dataset, "B")
    assert [i for _, i, _ in read_rollout_traces(dataset, "B", "x")] == [0]
    assert compare_runs(dataset, "B", "C").environments[0].n_paired == 3
    assert len(read_model_calls(dataset, run_id="B")) == 3 and len(durable_keys(dataset, "C")) == 3
    assert skipped_files(caplog) == []
    from prefect_rollouts.traces.files import partition_files

    root = dataset_root(dataset)
    assert {path.split("/")[2] for path in partition_files(root, "rollouts", {"run_id": ["B", "C"]})} == \
        {"run_id=B", "run_id=C"}


def test_readers_of_the_run_holding_it_skip_it_with_a_warning_naming_it(dataset, caplog):
    caplog.set_level(logging.WARNING)
    assert sorted(read_rollouts(dataset, run_id="A")["task_id"]) == ["x", "y", "z"]
    assert [row["run_id"] for row in run_rows(dataset)] == ["A", "B", "C"]   # the whole dataset: summary
    assert "run A: 3 rollouts" in format_rollout_list(dataset, "A")
    assert compare_runs(dataset, "A", "B").environments[0].n_paired == 3
    [warning] = skipped_files(caplog)   # once per file and meaning in a process
    assert re.search(rf"skipped file rollouts/date=[\d-]+/run_id=A/{JUNK}: it cannot be read as Parquet .*"
                     r"magic bytes.*its rows are left out\. Move the file out of the dataset or delete it", warning)


def test_traces_commands_work_beside_the_unreadable_file(dataset, caplog):
    caplog.set_level(logging.WARNING)
    for args in (["summary", str(dataset)], ["summary", str(dataset), "--run-id", "A"], ["show", str(dataset), "A"],
                 ["show", str(dataset), "B", "x"], ["compare", str(dataset), "A", "B"]):
        result = CliRunner().invoke(app, ["traces", *args])
        assert result.exit_code == 0, (args, result.output)
    result = CliRunner().invoke(app, ["traces", "show", str(dataset), "ghost"])
    assert result.exit_code == 1 and "no rollouts of run 'ghost'" in result.output and "Runs in it: A, B, C" in \
        " ".join(result.output.split())
    assert len(skipped_files(caplog)) == 1 and JUNK in skipped_files(caplog)[0]


def test_a_store_that_does_not_answer_is_an_error_not_a_skipped_file(dataset, monkeypatch):
    def unreachable(self, relative):
        raise TraceStoreError(f"trace dataset {self.uri}: cannot read {relative} (Connection reset by peer)")
    monkeypatch.setattr(DatasetRoot, "read_file", unreachable)
    with pytest.raises(TraceStoreError, match="Connection reset by peer"):
        durable_keys(dataset, "A")


async def test_a_resume_skips_an_unreadable_file_of_its_run_says_what_to_do_and_runs_its_rollouts_again(
        tmp_path, openai_server, caplog):
    caplog.set_level(logging.WARNING)
    openai_server.default = reply("0")
    config = load_eval_config(eval_toml(tmp_path / "traces", openai_server.base_url, max_concurrent=1,
                                        flush_each_rollout=True, num_tasks=3))
    for run_id in ("A", "B"):
        prepared = prepare_eval(config, run_id=run_id, resume=False)
        await run_rollouts(prepared.config, prepared.root, prepared.run_id, prepared.todo, inline_runner(1),
                           total=prepared.total, durable=prepared.durable)
    files_of_a = sorted((tmp_path / "traces" / "rollouts").rglob("run_id=A/part-*.parquet"))
    assert len(files_of_a) == 3   # a file per rollout
    damaged = files_of_a[0]
    lost = set(pq.read_table(damaged, columns=["task_id"])["task_id"].to_pylist())
    damaged.write_bytes(damaged.read_bytes()[:40])   # cut short, as a full disk on another writer might leave it

    resumed_b = prepare_eval(config, run_id="B", resume=True)
    assert resumed_b.todo == [] and skipped_files(caplog) == []
    resumed_a = prepare_eval(config, run_id="A", resume=True)
    assert {planned.task.id for planned in resumed_a.todo} == lost and len(resumed_a.durable) == 2
    [warning] = skipped_files(caplog)
    relative = damaged.relative_to(tmp_path / "traces").as_posix()
    assert f"skipped file {relative}" in warning
    assert "count as not durable, so a --resume of the run runs them again" in warning
    assert warning.endswith("Move the file out of the dataset or delete it")


def test_a_file_removed_between_listing_and_reading_is_listed_again_not_skipped(dataset, monkeypatch, caplog):
    from prefect_rollouts.traces import files

    caplog.set_level(logging.WARNING)
    listed = files.partition_files
    calls = []

    def with_a_file_compaction_removed(root, table, filters):   # listed before a compaction replaced it
        calls.append(table)
        return listed(root, table, filters) + ([f"{table}/date=2026-01-01/run_id=B/part-gone.parquet"]
                                               if len(calls) == 1 else [])
    monkeypatch.setattr(files, "partition_files", with_a_file_compaction_removed)
    assert sorted(read_rollouts(dataset, run_id="B")["task_id"]) == ["x", "y", "z"]
    assert calls == ["rollouts", "rollouts"] and skipped_files(caplog) == []


def _run_a(root) -> Path:
    return next((root / "rollouts").rglob("run_id=A"))


@pytest.fixture
def other_schema(dataset):
    """``dataset`` with its junk file replaced by a readable Parquet file of another schema in run A."""
    (_run_a(dataset) / JUNK).unlink()
    pq.write_table(pa.table({"foo": [1, 2]}), _run_a(dataset) / "part-9-other.parquet")
    return dataset


def test_a_parquet_file_without_the_key_columns_is_skipped_not_read_as_rows_of_nulls(other_schema, caplog):
    caplog.set_level(logging.WARNING)
    rows = read_rollouts(other_schema, run_id="A")
    assert sorted(rows["task_id"]) == ["x", "y", "z"] and rows["reward"].tolist() == [1.0] * 3
    assert durable_keys(other_schema, "A") == {("arith", task, 0) for task in "xyz"}
    assert summarize_run(other_schema, "A").environments[0].rollouts == 3
    assert "run A: 3 rollouts" in format_rollout_list(other_schema, "A")
    warnings = skipped_files(caplog)   # once per meaning: rows left out, rollouts not durable
    assert len(warnings) == 2 and all("part-9-other.parquet" in warning for warning in warnings)
    assert re.search(r"skipped file rollouts/date=[\d-]+/run_id=A/part-9-other\.parquet: it has no key column "
                     r"environment, task_id, rollout_index \(not a file of rollouts rows\); its rows are left out\. "
                     r"Move the file out of the dataset or delete it", warnings[0])


def test_traces_commands_work_beside_a_file_of_another_schema(other_schema):
    for args in (["summary", str(other_schema), "--run-id", "A"], ["compare", str(other_schema), "A", "B"],
                 ["show", str(other_schema), "A"]):
        result = CliRunner().invoke(app, ["traces", *args])
        assert result.exit_code == 0, (args, result.output, result.exception)
        assert "nan" not in result.output, (args, result.output)


def test_rows_with_a_null_key_are_left_out_and_the_rest_of_their_file_read(dataset, caplog):
    caplog.set_level(logging.WARNING)
    (_run_a(dataset) / JUNK).unlink()
    [good] = _run_a(dataset).glob("part-*.parquet")
    table = pq.read_table(good)
    nulled = table.set_column(table.column_names.index("task_id"), "task_id", pa.array(["x", None, "z"]))
    pq.write_table(nulled, good)
    assert sorted(read_rollouts(dataset, run_id="A")["task_id"]) == ["x", "z"]
    assert durable_keys(dataset, "A") == {("arith", "x", 0), ("arith", "z", 0)}
    assert [message for message in skipped_files(caplog)] == []   # the file itself is read
    [warning] = [record.getMessage() for record in caplog.records if "skipped rows of file" in record.getMessage()]
    assert f"skipped rows of file {good.relative_to(dataset).as_posix()}: 1 of its 3 rows have a null key " \
           "(environment, task_id, rollout_index); those rows are left out" in warning


@pytest.mark.parametrize("text", ["{not json", "[" * 100_000 + "]" * 100_000, '{"task_id": 5}'],
                         ids=["junk", "deep", "not a trace"])
def test_show_of_a_row_whose_trace_json_cannot_be_read_shows_its_other_columns(dataset, text):
    (_run_a(dataset) / JUNK).unlink()
    [good] = _run_a(dataset).glob("part-*.parquet")
    table = pq.read_table(good)
    table = table.set_column(table.column_names.index("trace"), "trace", pa.array([text] * 3))
    pq.write_table(table, good)
    result = CliRunner().invoke(app, ["traces", "show", str(dataset), "A", "x"])
    assert result.exit_code == 0, (result.output, result.exception)
    output = " ".join(result.output.split())
    assert "task x · index 0 · model m" in output and "reward: 1" in output and "stop agent_completed" in output
    assert "tokens: prompt 5, completion 2" in output
    assert "TraceNotReadable in read: the row's trace JSON could not be read (" in output
    assert "shown is what the row's other columns hold" in output
    [trace] = read_traces(dataset, run_id="A", task_id="y")
    assert (trace.task_id, trace.reward, trace.errors[-1].type) == ("y", 1.0, "TraceNotReadable")

"""One unreadable Parquet file in run A's directory (issue 32, item 3): every other run reads as before
and opens nothing of A; A's readers skip the file with a warning naming it; a resume of A says what to do."""

from __future__ import annotations

import logging
import re

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

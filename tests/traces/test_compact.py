"""compact_run and `traces compact`: few files per run, never a lost or doubled row."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.traces import TraceWriter, compact_run, read_model_calls, read_rollouts
from prefect_rollouts.traces.store import DatasetRoot, dataset_root
from tests.traces.test_dataset import add, make_trace

COLUMNS = ["task_id", "rollout_index", "reward", "is_error", "total_tokens", "trace"]


def write_one_file_per_rollout(root, run_id: str, count: int) -> None:
    writer = TraceWriter(root, run_id, batch_size=1)
    for i in range(count):
        add(writer, make_trace(f"t{i}", float(i % 2) if i % 7 else None, calls=1 + i % 3), 0)
        writer.flush()


def rows(root, run_id):
    frame = read_rollouts(root, run_id=run_id)
    return frame[COLUMNS].sort_values(["task_id", "rollout_index"]).reset_index(drop=True)


def calls(root, run_id):
    frame = read_model_calls(root, run_id=run_id)
    return frame[["rollout_id", "call_index", "latency_ms"]].sort_values(["rollout_id", "call_index"]).reset_index(
        drop=True)


def run_files(root, table, run_id):
    return [name for name in dataset_root(root).list_files(table) if f"/run_id={run_id}/" in name]


def test_compact_rewrites_a_run_into_one_file_per_table_and_keeps_every_row(tmp_path):
    write_one_file_per_rollout(tmp_path, "r1", 30)
    late = TraceWriter(tmp_path, "r1")
    add(late, make_trace("t3", 0.25), 0)             # t3#0 written twice: readers keep the first row
    late.flush()
    write_one_file_per_rollout(tmp_path, "other", 3)
    before_rows, before_calls = rows(tmp_path, "r1"), calls(tmp_path, "r1")
    other_files = run_files(tmp_path, "rollouts", "other")

    result = compact_run(tmp_path, "r1")

    assert result.files_before == {"rollouts": 31, "model_calls": 31}
    assert result.files_after == {"rollouts": 1, "model_calls": 1} and result.duplicates_dropped == 1
    assert rows(tmp_path, "r1").equals(before_rows) and len(before_rows) == 30
    assert calls(tmp_path, "r1").equals(before_calls) and len(before_calls) == 60
    assert run_files(tmp_path, "rollouts", "other") == other_files              # other runs are not touched
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert compact_run(tmp_path, "r1").files_after == {"rollouts": 1, "model_calls": 1}   # nothing left to do


def test_a_compaction_cut_short_leaves_every_row_readable_once_and_the_next_one_finishes(tmp_path, monkeypatch):
    write_one_file_per_rollout(tmp_path, "r1", 8)
    before_rows, before_calls = rows(tmp_path, "r1"), calls(tmp_path, "r1")
    deletions = []

    def crash_after_two(self, relative):          # the process dies while removing the files it rewrote
        if len(deletions) == 2:
            raise TraceStoreError("killed")
        deletions.append(relative)
        self.filesystem.delete_file(self.join(relative))
    monkeypatch.setattr(DatasetRoot, "delete_file", crash_after_two)
    with pytest.raises(TraceStoreError):
        compact_run(tmp_path, "r1")
    monkeypatch.undo()
    assert len(run_files(tmp_path, "rollouts", "r1")) == 7          # 6 old files left beside the new one
    assert rows(tmp_path, "r1").equals(before_rows) and calls(tmp_path, "r1").equals(before_calls)

    result = compact_run(tmp_path, "r1")
    assert result.files_after == {"rollouts": 1, "model_calls": 1} and result.duplicates_dropped == 6
    assert rows(tmp_path, "r1").equals(before_rows) and calls(tmp_path, "r1").equals(before_calls)


def test_compact_works_on_an_object_store(s3_dataset):
    write_one_file_per_rollout(s3_dataset, "r1", 5)
    before = rows(s3_dataset, "r1")
    assert compact_run(s3_dataset, "r1").files_after == {"rollouts": 1, "model_calls": 1}
    assert rows(s3_dataset, "r1").equals(before)


def test_traces_compact_prints_the_file_counts(tmp_path):
    write_one_file_per_rollout(tmp_path, "r1", 4)
    result = CliRunner().invoke(app, ["traces", "compact", str(tmp_path), "r1"])
    assert result.exit_code == 0, result.output
    assert "rollouts: 4 -> 1 files" in result.output and "model_calls: 4 -> 1 files" in result.output
    missing = CliRunner().invoke(app, ["traces", "compact", str(tmp_path), "nope"])
    assert missing.exit_code == 1 and "no rollouts of run nope" in missing.output

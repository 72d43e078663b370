"""compact_run and `traces compact`: few files per run, never a lost or doubled row."""

from __future__ import annotations

import errno

import duckdb
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from prefect_rollouts.cli import app
from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.traces import TraceWriter, compact_run, read_model_calls, read_rollouts, store
from prefect_rollouts.traces.store import DatasetRoot, dataset_root
from prefect_rollouts.traces.writer import write_table
from tests.traces.test_dataset import add, make_trace

pytestmark = pytest.mark.unit

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


README_QUERY = """select count(*) as calls, count(distinct (rollout_id, call_index)) as distinct_calls,
  sum(c.prompt_tokens) as prompt_tokens
  from read_parquet('{root}/rollouts/**/*.parquet', hive_partitioning = true) r
  join read_parquet('{root}/model_calls/**/*.parquet', hive_partitioning = true) c using (rollout_id)"""


def on_disk(root) -> tuple[int, int, int]:
    """What the README's DuckDB query sees: call rows, distinct calls and prompt tokens, read from the files."""
    return tuple(duckdb.sql(README_QUERY.format(root=root)).fetchall()[0])


def full_disk_for(table: str, monkeypatch) -> None:
    """Every write of a file of ``table`` fails with ENOSPC, below the store (the file system call)."""
    real = store._write_local

    def write(target, data):
        if f"/{table}/" in target.as_posix():
            raise OSError(errno.ENOSPC, "No space left on device")
        real(target, data)
    monkeypatch.setattr(store, "_write_local", write)


def test_a_compaction_that_fails_on_its_second_table_leaves_the_files_as_they_were(tmp_path, monkeypatch):
    write_one_file_per_rollout(tmp_path, "r1", 15)         # 30 model calls
    files_before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet"))
    assert on_disk(tmp_path) == (30, 30, 150)

    full_disk_for("rollouts", monkeypatch)                  # the calls file is written, the rollouts file is not
    with pytest.raises(TraceStoreError, match="No space left on device"):
        compact_run(tmp_path, "r1")
    monkeypatch.undo()

    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.parquet")) == files_before
    assert on_disk(tmp_path) == (30, 30, 150)
    assert compact_run(tmp_path, "r1").files_after == {"rollouts": 1, "model_calls": 1}
    assert on_disk(tmp_path) == (30, 30, 150) and len(calls(tmp_path, "r1")) == 30


def test_compaction_leaves_each_model_call_once_on_disk(tmp_path):
    write_one_file_per_rollout(tmp_path, "r1", 15)
    # a compaction killed (kill -9) after its calls file was written: every call of the run stored twice
    day = run_files(tmp_path, "model_calls", "r1")[0].split("/")[1]
    doubled = pq.read_table(tmp_path / "model_calls" / day / "run_id=r1", partitioning=None)
    write_table(tmp_path, f"model_calls/{day}/run_id=r1/part-0-killed.parquet", doubled)
    assert on_disk(tmp_path) == (60, 30, 300) and len(calls(tmp_path, "r1")) == 30   # readers drop them already

    compact_run(tmp_path, "r1")

    assert on_disk(tmp_path) == (30, 30, 150) and len(calls(tmp_path, "r1")) == 30


def test_a_compaction_refuses_a_file_of_another_schema_and_leaves_the_files_as_they_were(tmp_path):
    import pyarrow as pa

    write_one_file_per_rollout(tmp_path, "r", 3)
    other = next((tmp_path / "rollouts").rglob("run_id=r")) / "part-9-other.parquet"
    pq.write_table(pa.table({"foo": [1, 2]}), other)   # read as rows of nulls, it would be kept in the new file
    before = sorted(p.name for p in tmp_path.rglob("*.parquet"))
    with pytest.raises(TraceStoreError, match=r"part-9-other.parquet has no key column environment, task_id, "
                                              r"rollout_index; it is not a file of rows. Move it out"):
        compact_run(tmp_path, "r", min_files=2)
    assert sorted(p.name for p in tmp_path.rglob("*.parquet")) == before

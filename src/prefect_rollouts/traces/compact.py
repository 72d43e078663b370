"""``compact_run``: rewrite one run's Parquet files into one file per table and day, never losing a row.

Rows become durable in small batches while a run goes (a file per flush, or per rollout with
``flush_each_rollout``), so a long run leaves many small files. Compaction reads every visible
file of the run in a partition (``<table>/date=<day>/run_id=<run>/``), drops duplicate rows (a
rollout written twice keeps its first row, as the readers do; model calls keep those of the kept
rollouts, each ``(rollout_id, call_index)`` once), writes the result as new files (atomically, as
every write: ``traces.store``), and only once every new file of the run is written deletes the
files it read. A write that fails (a full disk) removes the new files already written before the
error is raised, so the run's files are as they were. A crash (``kill -9``) at any point leaves
every row durable: at worst some rows twice, which readers drop and the next compaction removes;
after a compaction that succeeded, each row of the files it read is on disk once. Files written
while it runs are left alone, and two compactions at once only ever delete files whose rows the
other has rewritten too. Must not import Prefect.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.traces.files import partition_files
from prefect_rollouts.traces.schema import FIRST_ATTEMPT, KEY_COLUMNS, MODEL_CALLS, ROLLOUTS, ROW_KEYS
from prefect_rollouts.traces.store import DatasetRoot, dataset_root
from prefect_rollouts.traces.writer import new_part_name, write_table

#: Files read or deleted at once (an object store answers each request in milliseconds; pyarrow releases the GIL).
_PARALLEL = 16


@dataclass(frozen=True)
class CompactResult:
    """What ``compact_run`` did: files per table before and after, and duplicate rollout rows dropped."""

    files_before: dict[str, int]
    files_after: dict[str, int]
    duplicates_dropped: int


def compact_run(root: str | Path | DatasetRoot, run_id: str, *, min_files: int = 2) -> CompactResult:
    """Rewrite the files of run ``run_id`` into one file per table and day.

    Args:
        root: The dataset root (path, object-store URI or ``DatasetRoot``).
        run_id: The run to compact; other runs' files are not read.
        min_files: Rewrite a partition only when it holds at least this many files of a table.

    Returns:
        ``CompactResult`` with the file counts per table (``rollouts``, ``model_calls``) before
        and after, and how many duplicate rollout rows were dropped.

    Raises:
        TraceStoreError: a file cannot be read or written (the files written so far are removed
            again: the run's files are as they were), or an old file cannot be deleted (every row
            stays durable; the files not yet deleted repeat rows, which readers drop).
    """
    store = dataset_root(root)
    files = {table: partition_files(store, table, {"run_id": run_id}) for table in ("rollouts", "model_calls")}
    before = {table: len(names) for table, names in files.items()}
    dropped, written = 0, []
    replaced: dict[str, list[str]] = {"rollouts": [], "model_calls": []}
    try:   # every new file first: the old ones go only once the whole run is rewritten
        for day in sorted({name.split("/")[1] for name in files["rollouts"]}):
            rollout_files = [f for f in files["rollouts"] if f.split("/")[1] == day]
            call_files = [f for f in files["model_calls"] if f.split("/")[1] == day]
            if len(rollout_files) < min_files and len(call_files) < min_files:
                continue
            rollouts = _read_all(store, rollout_files, ROLLOUTS, KEY_COLUMNS["rollouts"])
            rollouts = rollouts.set_column(rollouts.schema.get_field_index("attempt"), "attempt",
                                           pc.fill_null(rollouts["attempt"], FIRST_ATTEMPT))   # older files: 1
            kept = _first_of(rollouts, list(ROW_KEYS["rollouts"]))
            dropped += rollouts.num_rows - kept.num_rows
            calls = _read_all(store, call_files, MODEL_CALLS, KEY_COLUMNS["model_calls"])
            calls = _first_of(calls.filter(pc.is_in(calls["rollout_id"], value_set=kept["rollout_id"])),
                              ["rollout_id", "call_index"])
            partition = f"{day}/run_id={run_id}/{new_part_name()}"
            if calls.num_rows:   # calls first, as the writer does: a durable rollout always has its calls
                written.append(f"model_calls/{partition}")
                write_table(store, written[-1], calls)
            written.append(f"rollouts/{partition}")
            write_table(store, written[-1], kept)
            replaced["rollouts"] += rollout_files
            replaced["model_calls"] += call_files
    except TraceStoreError as exc:
        _remove_written(store, written, exc)
        raise
    with ThreadPoolExecutor(_PARALLEL) as pool:   # rollouts first: their calls must outlive them
        list(pool.map(store.delete_file, replaced["rollouts"]))
        list(pool.map(store.delete_file, replaced["model_calls"]))
    after = {table: len(partition_files(store, table, {"run_id": run_id})) for table in ("rollouts", "model_calls")}
    return CompactResult(files_before=before, files_after=after, duplicates_dropped=dropped)


def _remove_written(store: DatasetRoot, written: list[str], cause: TraceStoreError) -> None:
    """Undo a compaction cut short by ``cause``: remove the new files it wrote (also one whose write
    failed, in case it landed), so no row is left twice; if that fails too, say which files hold
    rows twice (readers drop them, the next compaction removes them).

    Raises:
        TraceStoreError: a new file could not be removed; ``cause`` is chained.
    """
    left = []
    for name in written:
        try:
            store.delete_file(name)
        except TraceStoreError:
            left.append(name)
    if left:
        raise TraceStoreError(f"{cause}; removing the compacted files failed too, so {', '.join(left)} repeat "
                              "rows of the run (readers drop them; the next compaction removes them)") from cause


def _read_all(store: DatasetRoot, names: list[str], schema: pa.Schema, keys: tuple[str, ...]) -> pa.Table:
    """The rows of ``names`` in this order, as ``schema`` (older files' missing columns as nulls); a file
    without the ``keys`` columns is an error, as an unreadable one is."""
    def read(name: str) -> pa.Table:
        try:
            with store.filesystem.open_input_file(store.join(name)) as handle:
                table = pq.read_table(handle, use_threads=False)
        except (OSError, pa.ArrowInvalid) as exc:
            raise TraceStoreError(f"trace dataset {store.uri}: cannot read {name} ({exc}). If the file is damaged or "
                                  "not a file of rows, move it out of the dataset or delete it") from exc
        missing = [key for key in keys if key not in table.column_names]
        if missing:   # another schema: its rows would be nulls, kept in the new file
            raise TraceStoreError(f"trace dataset {store.uri}: {name} has no key column {', '.join(missing)}; "
                                  "it is not a file of rows. Move it out of the dataset or delete it")
        columns = [table[field.name].cast(field.type) if field.name in table.column_names
                   else pa.nulls(table.num_rows, field.type) for field in schema]
        return pa.Table.from_arrays(columns, schema=schema)
    with ThreadPoolExecutor(_PARALLEL) as pool:
        tables = list(pool.map(read, names))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _first_of(table: pa.Table, key: list[str]) -> pa.Table:
    """The first row of each ``key`` (``schema.ROW_KEYS``: rollouts: environment, task id, rollout index,
    attempt; model calls: rollout id, call index), in file order (the readers' rule)."""
    indexed = table.append_column("_row", pa.array(range(table.num_rows), pa.int64()))
    first = indexed.group_by(key, use_threads=False).aggregate([("_row", "min")])
    return table.take(pa.array(sorted(first["_row_min"].to_pylist()), pa.int64()))

"""The files a read of the trace dataset opens: only the partitions it needs, an unreadable file skipped.

A read filtered by ``run_id`` (or ``date``) lists and opens only the files under the matching
``<table>/date=<day>/run_id=<run>/`` directories, so nothing stored for another run can affect it.
A file pyarrow cannot read while the store answers (not Parquet, cut short, another schema: a stray
or damaged file) is skipped, with a warning on the ``prefect_rollouts.traces`` logger that names it
and says what to do; its rows are left out. So is a readable Parquet file without the table's key
columns (``schema.KEY_COLUMNS``; a file of another schema read as the table's was a row of nulls,
which ``traces summary`` failed on and a resume took for a rollout's key), and a row whose key holds
a null. A store that cannot be reached is still an error
(``TraceStoreError``): skipping its files would make durable rollouts look absent (and a resume
run them again). Must not import Prefect.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from prefect_rollouts.errors import TraceStoreError
from prefect_rollouts.traces.schema import KEY_COLUMNS, PARTITIONING
from prefect_rollouts.traces.store import DatasetRoot

logger = logging.getLogger("prefect_rollouts.traces")

LEFT_OUT = "its rows are left out"
"""What skipping a file means for a reader of rows (the warning's middle)."""

_HIVE = ds.partitioning(PARTITIONING, flavor="hive")
_warned: set[tuple[str, str, str]] = set()   # (dataset, file, meaning): each warning once per process


def partition_files(root: DatasetRoot, table: str, filters: dict[str, Any]) -> list[str]:
    """Paths (relative to ``root``, sorted) of the visible files of ``table`` in the partitions that
    ``filters``' ``date`` and ``run_id`` values select (a list, tuple or set means "any of"); every
    file of ``table`` when neither is given.

    Lists the table's ``date=`` directories, then only the chosen ``run_id=`` directories in them:
    nothing of another run is listed or opened. Partition values are read as pyarrow reads them
    (``%XX`` escapes decoded).

    Raises:
        TraceStoreError: the store cannot be listed.
    """
    runs, dates = _wanted(filters.get("run_id")), _wanted(filters.get("date"))
    if runs is None and dates is None:
        return root.list_files(table)
    files: list[str] = []
    for day in _partitions(root, table, "date", dates):
        for run in _partitions(root, day, "run_id", runs):
            files.extend(root.list_files(run))
    return sorted(files)


def run_ids(root: DatasetRoot, table: str = "rollouts") -> list[str]:
    """The run ids of ``table``'s ``run_id=`` directories (sorted, distinct), read from their names only.

    Raises:
        TraceStoreError: the store cannot be listed.
    """
    found = {_value(run) for day in _partitions(root, table, "date", None)
             for run in _partitions(root, day, "run_id", None)}
    return sorted(found)


class FilesChangedError(TraceStoreError):
    """A file listed for a read was gone when it was read (a compaction replaced it): list again."""


def read_partitions(root: DatasetRoot, table: str, filters: dict[str, Any], schema: pa.Schema, expression: Any,
                    columns: list[str] | None, *, skipped: str = LEFT_OUT) -> pa.Table:
    """``scan`` of the files ``partition_files`` lists for ``filters``, listed again (up to 3 times in
    all) when one of them was gone by the time it was read: a compaction writes its new files before
    it deletes the old ones, so a fresh listing holds every row.

    Raises:
        TraceStoreError: as ``scan``; ``FilesChangedError`` when the files changed on every attempt.
    """
    for _ in range(2):
        with contextlib.suppress(FilesChangedError):
            return scan(root, table, partition_files(root, table, filters), schema, expression, columns,
                        skipped=skipped)
    return scan(root, table, partition_files(root, table, filters), schema, expression, columns, skipped=skipped)


def scan(root: DatasetRoot, table: str, files: list[str], schema: pa.Schema, expression: Any,
         columns: list[str] | None, *, skipped: str = LEFT_OUT) -> pa.Table:
    """The rows of ``files`` (of ``table``) that match ``expression``, as ``schema`` (the table's
    columns and the partition columns ``date`` and ``run_id``), only ``columns`` when given.

    One pyarrow scan of all the files; when it fails, or a row it read has a null key column
    (``schema.KEY_COLUMNS``: a file of another schema reads as rows of nulls), each file is read
    whole on its own and a file that cannot be read while the store answers, or has no key
    columns, is skipped with a warning naming it, ``skipped`` saying what that means for the caller
    (default: its rows are left out); rows with a null key are left out with a warning naming their file.

    Raises:
        TraceStoreError: the store did not answer (a file's bytes could not be read), or
            ``expression`` cannot be applied to the rows.
        FilesChangedError: a file of ``files`` is gone.
    """
    if not files:
        return schema.empty_table().select(columns or schema.names)
    keys = KEY_COLUMNS.get(table, ())
    read = None if columns is None else list(dict.fromkeys([*columns, *keys]))   # keys: cheap, and checked
    try:
        rows = _dataset(root, table, files, schema).to_table(filter=expression, columns=read)
    except (OSError, pa.ArrowException):
        pass
    else:
        if not any(rows.column(key).null_count for key in keys):
            return rows.select(columns or schema.names)
    tables = [read for name in files if (read := _read_one(root, table, name, schema, skipped)) is not None]
    try:
        rows = pa.concat_tables(tables) if tables else schema.empty_table()
        return (rows if expression is None else rows.filter(expression)).select(columns or schema.names)
    except (OSError, pa.ArrowException) as exc:   # e.g. a filter value of another type than its column
        raise TraceStoreError(f"trace dataset {root.uri}: cannot read {table}/ ({exc})") from exc


def _read_one(root: DatasetRoot, table: str, name: str, schema: pa.Schema, skipped: str) -> pa.Table | None:
    """Every row of file ``name`` as ``schema`` whose key columns hold values, read whole into memory
    first: an error then is the file's, not the store's. None (and a warning) when it cannot be read
    or has no key columns."""
    data = root.read_file(name)   # TraceStoreError when the store does not answer
    if data is None:
        raise FilesChangedError(f"trace dataset {root.uri}: {name} was removed while it was read (a compaction "
                                "of its run?). Read again")
    try:
        fragment = ds.ParquetFileFormat().make_fragment(
            pa.BufferReader(data), partition_expression=_HIVE.parse(name.removeprefix(f"{table}/")))
        keys = KEY_COLUMNS.get(table, ())
        missing = [key for key in keys if key not in fragment.physical_schema.names]
        if missing:
            _warn(root, name, f"it has no key column {', '.join(missing)} (not a file of {table} rows)", skipped)
            return None
        rows = ds.FileSystemDataset([fragment], schema=schema, format=ds.ParquetFileFormat()).to_table()
    except (OSError, pa.ArrowException) as exc:
        text = str(exc).replace("Could not open Parquet input source '<Buffer>': ", "")
        _warn(root, name, f"it cannot be read as Parquet of this table ({type(exc).__name__}: {text})", skipped)
        return None
    valid = [pc.is_valid(rows.column(key)) for key in keys]
    if not valid:
        return rows
    keyed = functools.reduce(pc.and_, valid)
    kept = pc.sum(keyed).as_py() or 0
    if kept == rows.num_rows:
        return rows
    if not kept:
        _warn(root, name, f"every row has a null key ({', '.join(keys)})", skipped)
        return None
    _warn(root, name, f"{rows.num_rows - kept} of its {rows.num_rows} rows have a null key ({', '.join(keys)})",
          "those rows are left out", what="skipped rows of file", fix="Remove those rows from the file")
    return rows.filter(keyed)


def _warn(root: DatasetRoot, name: str, why: str, skipped: str, what: str = "skipped file",
          fix: str = "Move the file out of the dataset or delete it") -> None:
    if (root.uri, name, skipped) in _warned:
        return
    _warned.add((root.uri, name, skipped))
    logger.warning("trace dataset %s: %s %s: %s; %s. %s", root.uri, what, name, why, skipped, fix)


def _dataset(root: DatasetRoot, table: str, files: list[str], schema: pa.Schema) -> ds.Dataset:
    return ds.dataset([root.join(name) for name in files], filesystem=root.filesystem, format="parquet",
                      schema=schema, partitioning=_HIVE, partition_base_dir=root.join(table))


def _partitions(root: DatasetRoot, relative: str, key: str, wanted: set[str] | None) -> list[str]:
    """``relative/<key>=<value>`` for each such directory whose value is in ``wanted`` (all when None)."""
    return [f"{relative}/{name}" for name in root.list_dirs(relative)
            if name.startswith(f"{key}=") and (wanted is None or _value(name) in wanted)]


def _value(directory: str) -> str:
    return unquote(directory.rsplit("/", 1)[-1].split("=", 1)[1])


def _wanted(value: Any) -> set[str] | None:
    if value is None:
        return None
    values: Iterable[Any] = value if isinstance(value, (list, tuple, set, frozenset)) else [value]
    return {str(item) for item in values}
